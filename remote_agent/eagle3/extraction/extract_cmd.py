"""`eagle3 extract`: dump aux + final hidden states of every dataset sample.

    eagle3 extract --server http://127.0.0.1:30000 --dataset OUT.jsonl --out DUMP [--launch --model M]
    eagle3 extract --backend hf --model M --dataset OUT.jsonl --out DUMP   (torchrun for data parallel)

Both write the dense format (`eagle3/dense.py`) and resume by running the same command again.
Exit codes: 0 done, 1 failed (no canary, disk full, error markers, ids mismatch), 2 bad input
(missing dataset/manifest, server flags, hidden size / layer count mismatch).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from remote_agent.eagle3.errors import BadInput

HELP = "dump aux + final hidden states (SGLang server or the HF reference backend)"


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("sglang", "hf"), default="sglang")
    parser.add_argument("--dataset", type=Path, required=True, help="merged OUT.jsonl (+ manifest)")
    parser.add_argument("--out", type=Path, required=True, help="dump directory")
    parser.add_argument(
        "--model", type=Path, help="HF model dir (hf: the model; sglang: shapes, --launch)"
    )
    parser.add_argument(
        "--layers", type=_ids, help="capture ids, e.g. 2,30,58 (default [2, L//2, L-3])"
    )
    parser.add_argument("--aux-dtype", choices=("bf16", "fp8_e4m3"), default="bf16")
    parser.add_argument("--limit", type=int, help="only the first N dataset samples")
    parser.add_argument(
        "--shard",
        help="I/N: dump only the samples of shard I of N (sha256 of the id mod N) into "
        "OUT/shard-I-of-N; e.g. --shard ${host_rank}/${host_count} in a fan-out step",
    )
    parser.add_argument(
        "--disk-margin-gb", type=float, default=1.0, help="free space kept (default 1)"
    )
    parser.add_argument(
        "--allow-no-manifest", action="store_true", help="extract an unverified dataset"
    )
    parser.add_argument(
        "--progress-interval", type=float, default=5.0, help="seconds between progress lines"
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="only compare the estimated dump size (samples not yet dumped) with the free disk; "
        "exit 0 when it fits, 1 when it does not",
    )
    s = parser.add_argument_group("sglang backend")
    s.add_argument(
        "--server",
        action="append",
        help="SGLang URL (default http://127.0.0.1:30000); repeat it for several servers: "
        "server k of K takes part k of the shard and dumps into its own OUT/shard-*-of-* "
        "(start server k with that EAGLE3_DUMP_DIR; `--launch` starts one server only)",
    )
    s.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    s.add_argument(
        "--rid-prefix", default="dump-", help="must equal the server's EAGLE3_DUMP_RID_PREFIX"
    )
    s.add_argument("--tp", type=int, help="expected (or launched) tensor-parallel size")
    s.add_argument(
        "--hidden-size", type=int, help="expected hidden size (default: the model config)"
    )
    s.add_argument(
        "--num-layers", type=int, help="expected layer count (default: the model config)"
    )
    s.add_argument("--canary-timeout", type=float, default=120.0)
    s.add_argument("--dump-timeout", type=float, default=600.0, help="max seconds without progress")
    s.add_argument("--request-timeout", type=float, default=1800.0)
    s.add_argument("--retries", type=int, default=2)
    s.add_argument("--launch", action="store_true", help="start SGLang with the extraction flags")
    s.add_argument(
        "--canary-only",
        action="store_true",
        help="check the server's flags and send the canary, then stop (the runbook's canary step)",
    )
    s.add_argument("--launch-timeout", type=float, default=1800.0)
    s.add_argument("--launch-arg", action="append", default=[], help="extra launch_server argument")
    h = parser.add_argument_group("hf backend")
    h.add_argument("--token-budget", type=int, default=16384, help="padded tokens per forward")
    h.add_argument("--max-batch", type=int, default=512)
    h.add_argument("--dtype", default="auto", help="auto (bf16 GPU, fp32 CPU) | bf16 | fp16 | fp32")
    h.add_argument("--device", default="auto", help="auto | cuda | cpu")
    h.add_argument("--shard-mb", type=float, default=2048.0)
    h.add_argument("--min-free-gb", type=float, default=1.0, help="refuse shards below this free")
    h.add_argument("--attn-implementation", help="e.g. sdpa, eager, flash_attention_2")
    h.add_argument("--trust-remote-code", action="store_true")


def _preflight(args: argparse.Namespace) -> int:
    """The disk check extraction itself runs first, on its own: the runbook's preflight step."""
    import json

    from remote_agent.eagle3.dense import DumpMeta
    from remote_agent.eagle3.extraction.common import disk_preflight, existing_samples, human_bytes
    from remote_agent.eagle3.extraction.dataset import open_dataset
    from remote_agent.eagle3.progress import emit

    hidden, layers = args.hidden_size, args.num_layers
    if args.model is not None:
        cfg = json.loads((Path(args.model) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        hidden, layers = hidden or cfg["hidden_size"], layers or cfg["num_hidden_layers"]
    if not hidden or not layers:
        raise BadInput("--preflight needs --model PATH, or --hidden-size and --num-layers")
    ids = args.layers or [2, layers // 2, layers - 3]
    meta = DumpMeta(
        model=str(args.model),
        hidden_size=hidden,
        num_layers=layers,
        aux_layer_ids=ids,
        aux_dtype=args.aux_dtype,
    )
    from remote_agent.eagle3.extraction import sharding

    dataset = open_dataset(args.dataset, require_manifest=not args.allow_no_manifest)
    out = args.out
    if args.shard:
        shard = sharding.parse_shard(args.shard)
        out = sharding.prepare_dir(args.out, shard, args.dataset, write=False)
        dataset = sharding.restrict(dataset, shard)
    done, _ = existing_samples(out, dataset)
    wanted = dataset.ids()[: args.limit] if args.limit else dataset.ids()
    pending = [s for s in wanted if s not in done]
    tokens = dataset.total_tokens(pending)
    report = disk_preflight(out, tokens, meta.bytes_per_token(), args.disk_margin_gb)
    print(
        f"{len(pending)} samples to dump ({len(done)} already done), {tokens} tokens x "
        f"{meta.bytes_per_token()} B/token = {human_bytes(report['estimate_bytes'])} "
        f"+ {human_bytes(report['margin_bytes'])} margin; {human_bytes(report['free_bytes'])} free: fits"
    )
    emit(
        "result",
        stage="preflight",
        samples=len(pending),
        tokens=tokens,
        bytes_per_token=meta.bytes_per_token(),
        **report,
    )
    return 0


def _shards(args: argparse.Namespace, servers: int) -> list[tuple[str | None, Path]]:
    """(shard spec, dump dir) per worker: the whole dataset into --out, or with --shard and/or
    several servers one shard each under --out (extraction/sharding.py)."""
    from remote_agent.eagle3.extraction import sharding

    if not args.shard and servers == 1:
        return [(None, args.out)]
    host = sharding.parse_shard(args.shard or "0/1")
    parts = [host.split(k, servers) for k in range(servers)]
    main = os.environ.get("RANK", "0") == "0"  # under torchrun one rank writes shard.json
    return [
        (f"{p.index}/{p.count}", sharding.prepare_dir(args.out, p, args.dataset, write=main))
        for p in parts
    ]


def run(args: argparse.Namespace) -> int:
    if args.preflight:
        return _preflight(args)
    servers = args.server or ["http://127.0.0.1:30000"]
    if len(set(servers)) != len(servers):
        raise BadInput("--server: the same URL twice")
    if len(servers) > 1 and (args.launch or args.backend == "hf"):
        raise BadInput("several --server URLs drive running SGLang servers (no --launch, no hf)")
    shards = _shards(args, len(servers))
    if args.backend == "hf":
        from remote_agent.eagle3.extraction.reference import ReferenceOptions, run_reference

        if args.model is None:
            raise BadInput("--backend hf needs --model PATH")
        run_reference(
            ReferenceOptions(
                model=args.model,
                dataset=args.dataset,
                out=shards[0][1],
                shard=shards[0][0],
                layers=args.layers,
                token_budget=args.token_budget,
                max_batch=args.max_batch,
                dtype=args.dtype,
                aux_dtype=args.aux_dtype,
                shard_mb=args.shard_mb,
                device=args.device,
                limit=args.limit,
                min_free_gb=args.min_free_gb,
                disk_margin_gb=args.disk_margin_gb,
                attn_implementation=args.attn_implementation,
                trust_remote_code=args.trust_remote_code,
                require_manifest=not args.allow_no_manifest,
                progress_interval=args.progress_interval,
            )
        )
        return 0
    from remote_agent.eagle3.extraction.client import ClientOptions, Extraction

    def one(server: str, shard: str | None, out: Path) -> None:
        _client(args, ClientOptions, Extraction, server, shard, out)

    if len(servers) == 1:
        one(servers[0], *shards[0])
        return 0
    import threading

    from remote_agent.eagle3.extraction.dataset import open_dataset

    # build the dataset's index file once, before the workers each open the dataset
    open_dataset(args.dataset, require_manifest=not args.allow_no_manifest)
    errors: list[BaseException] = []

    def worker(server: str, shard: str | None, out: Path) -> None:
        try:
            one(server, shard, out)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, the first one wins
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(url, *part), name=f"extract-{url}")
        for url, part in zip(servers, shards, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return 0


def _client(args, ClientOptions, Extraction, server: str, shard: str | None, out: Path) -> None:  # noqa: N803
    Extraction(
        ClientOptions(
            server=server,
            shard=shard,
            dataset=args.dataset,
            out=out,
            concurrency=args.concurrency,
            rid_prefix=args.rid_prefix,
            model=args.model,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            layers=args.layers,
            tp=args.tp,
            aux_dtype=args.aux_dtype,
            canary_timeout=args.canary_timeout,
            dump_timeout=args.dump_timeout,
            request_timeout=args.request_timeout,
            retries=args.retries,
            disk_margin_gb=args.disk_margin_gb,
            limit=args.limit,
            require_manifest=not args.allow_no_manifest,
            launch=args.launch,
            launch_timeout=args.launch_timeout,
            launch_args=args.launch_arg,
            progress_interval=args.progress_interval,
            canary_only=args.canary_only,
        )
    ).run()
