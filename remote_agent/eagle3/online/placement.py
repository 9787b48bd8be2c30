"""`eagle3 online-check`: does the one-box online placement fit, stated before anything starts?

One box: SGLang and the trainer share each GPU. SGLang takes `--mem-fraction-static` of the
GPU's memory for weights + KV cache (plus its CUDA graphs, activations and NCCL buffers outside
that fraction: `--server-overhead-gb`); the trainer needs `--trainer-gb` (drafter, fp32
masters, AdamW states, the TTT unroll's activations at data.max_tokens: read it off an offline
step, e.g. bench/memory_breakdown.py, or `torch.cuda.max_memory_allocated` of a short run).
Both must fit with `--margin-gb` to spare, on every GPU the check sees. Exit 0 = fits, 1 = not
(the numbers and the remedy printed), 2 = bad input. Two boxes need no such check: the server
box serves alone (its usual fraction), the trainer box trains alone.
"""

from __future__ import annotations

import argparse
import json
import math

HELP = "one-box online placement: SGLang memory fraction + trainer budget fit"
GIB = 1 << 30


def check(
    total_gb: float,
    mem_fraction: float,
    trainer_gb: float,
    server_overhead_gb: float = 6.0,
    margin_gb: float = 4.0,
) -> dict:
    """The placement's arithmetic; `fits` and, if not, what to change."""
    server = mem_fraction * total_gb + server_overhead_gb
    need = server + trainer_gb + margin_gb
    out = {
        "gpu_gb": round(total_gb, 2),
        "server_gb": round(server, 2),
        "trainer_gb": round(trainer_gb, 2),
        "margin_gb": margin_gb,
        "need_gb": round(need, 2),
        "fits": need <= total_gb,
    }
    if not out["fits"]:
        room = total_gb - trainer_gb - margin_gb - server_overhead_gb
        fraction = max(math.floor(room / total_gb * 100) / 100, 0.0)  # rounded down: it fits
        out["remedy"] = (
            f"lower --mem-fraction-static to {fraction:.2f} or below (the weights must still "
            "fit), lower data.max_tokens, or use two boxes (one serves, one trains)"
        )
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mem-fraction-static", type=float, required=True, help="SGLang's fraction")
    p.add_argument("--trainer-gb", type=float, required=True, help="trainer peak per GPU, GB")
    p.add_argument("--gpu-gb", type=float, help="GPU memory in GB (default: measured, smallest)")
    p.add_argument("--server-overhead-gb", type=float, default=6.0)
    p.add_argument("--margin-gb", type=float, default=4.0)


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.errors import BadInput
    from remote_agent.eagle3.progress import emit

    if not 0 < args.mem_fraction_static < 1 or args.trainer_gb < 0:
        raise BadInput("--mem-fraction-static must be in (0, 1) and --trainer-gb >= 0")
    total = args.gpu_gb
    if total is None:
        import torch

        if not torch.cuda.is_available():
            raise BadInput("no CUDA device visible: pass --gpu-gb")
        total = min(
            torch.cuda.get_device_properties(i).total_memory / 1e9
            for i in range(torch.cuda.device_count())
        )
    result = check(
        total, args.mem_fraction_static, args.trainer_gb, args.server_overhead_gb, args.margin_gb
    )
    print(
        f"online-check: GPU {result['gpu_gb']} GB; SGLang {result['server_gb']} GB "
        f"(fraction {args.mem_fraction_static} + {args.server_overhead_gb} GB outside it) + "
        f"trainer {result['trainer_gb']} GB + margin {args.margin_gb} GB = {result['need_gb']} GB"
        f": {'fits' if result['fits'] else 'DOES NOT FIT; ' + result['remedy']}",
        flush=True,
    )
    emit("result", command="online-check", **json.loads(json.dumps(result)))
    return 0 if result["fits"] else 1
