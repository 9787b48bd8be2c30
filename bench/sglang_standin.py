"""A stand-in for `python -m sglang.launch_server` where SGLang cannot run (a CPU box): the CPU
rehearsal of the GPU checks (bench/rehearse_kimi_cpu.sh) runs the same runbook, script and
report code with it. The rehearsal's site holds the real 0.5.14 `deepseek_v2.py` (hash-guarded,
patched and reverted by `eagle3 patch` as on the GPU) and, as `sglang/launch_server.py`, a
two-line launcher of this file.

Real: the patched hook (`sglang.srt.eagle3_dump`, the helper `eagle3 patch apply` installed next
to that file), called once per scheduled batch the way the patched forward calls it (several
requests in one ForwardBatch, a 0.5.14-style list of aux tensors, padding rows after the real
ones); its env (EAGLE3_DUMP_*, EAGLE3_STREAM_ADDR: dense, stream or both); the tiny target's
hidden states (HF, fp32); every client, the runbook engine, the reports.

Stands in: SGLang's HTTP API (the endpoints our clients use: /health, /server_info,
/get_server_info, /model_info, /generate), its scheduler (requests queued together share a
forward), its `/server_info` (built from the flags it was started with, so a wrong launch is
seen by the real checks), and in serve mode its EAGLE-3 worker: the torch reference decoder
(drafter/eval/evaluate.py) answers instead, so SGLang's acceptance equals the reference decoder's by
construction (the rehearsal checks wiring, not acceptance). It never hides what it is:
`version` is "<the site's release>+cpu-standin".
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from remote_agent.eagle3.json_handler import JsonHandler  # noqa: E402 (the repo is on the path now)

FLAGS = (  # launch_server flags the stand-in reads (the rest are recorded as given)
    ("--model-path", str, None),
    ("--host", str, "127.0.0.1"),
    ("--port", int, 30000),
    ("--tp-size", int, 1),
    ("--speculative-algorithm", str, None),
    ("--speculative-draft-model-path", str, None),
    ("--speculative-num-steps", int, None),
    ("--speculative-eagle-topk", int, None),
    ("--speculative-num-draft-tokens", int, None),
    ("--chunked-prefill-size", int, None),
    ("--mem-fraction-static", float, None),
    ("--attention-backend", str, None),
    ("--context-length", int, None),
)
SWITCHES = (
    "--disable-radix-cache",
    "--disable-prefill-cuda-graph",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--enable-return-hidden-states",
    "--trust-remote-code",
)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    for flag, kind, default in FLAGS:
        p.add_argument(flag, type=kind, default=default)
    for flag in SWITCHES:
        p.add_argument(flag, action="store_true")
    return p.parse_known_args(argv)


def site_version() -> str:
    try:  # the rehearsal site's real version.py
        from sglang.version import __version__  # pyright: ignore[reportMissingImports]

        return str(__version__)
    except Exception:
        return "unknown"


def server_info(args: argparse.Namespace, rest: list[str], context: int | None) -> dict:
    """0.5.14's /server_info keys, from the flags this process got (never invented)."""
    from remote_agent.eagle3 import sglang_versions as sv

    prefill = sv.prefill_backend_from_args(sys.argv[1:]) or "full"
    info = {k.lstrip("-").replace("-", "_"): getattr(args, k.lstrip("-").replace("-", "_"))
            for k, _, _ in FLAGS}  # fmt: skip
    info.update({s.lstrip("-").replace("-", "_"): getattr(args, s.lstrip("-").replace("-", "_"))
                 for s in SWITCHES})  # fmt: skip
    info.update(
        tokenizer_path=args.model_path,
        pp_size=1,
        dp_size=1,
        enable_dp_attention=False,
        context_length=args.context_length or context,
        max_total_num_tokens=65536,
        max_req_input_len=65535,
        cuda_graph_config={"prefill": {"backend": prefill}, "decode": {"backend": "disabled"}},
        unparsed_args=rest,
        version=f"{site_version()}+cpu-standin",
    )
    return info


# ---- the model: extraction (hook) or serving (the reference decoder) ----


class Extraction:
    """Prefill-only forwards of the target; each scheduled batch goes to the real hook."""

    def __init__(self, model_path: Path, draft: str | None, info: dict) -> None:
        import torch

        from remote_agent.eagle3 import sglang_versions as sv
        from remote_agent.eagle3.extraction.capture import AuxCapture, decoder_of, text_config
        from remote_agent.eagle3.extraction.reference import load_model

        self.torch = torch
        model = load_model(model_path, torch.float32, torch.device("cpu"), trust_remote_code=True)
        self.lm_head = model.get_output_embeddings()
        self.decoder, layers = decoder_of(model)
        cfg = text_config(model.config)
        n = int(cfg.num_hidden_layers)
        # 0.5.14 captures what its EAGLE3 drafter's eagle_config says (SGLang's +1 rule)
        self.ids = sv.drafter_capture_ids(Path(draft), n) if draft else [2, n // 2, n - 3]
        self.capture = AuxCapture(layers, self.ids)
        self.capture.__enter__()
        self.model = SimpleNamespace(  # what the hook reads off DeepseekV2ForCausalLM
            capture_aux_hidden_states=True,
            config=SimpleNamespace(hidden_size=int(cfg.hidden_size), num_hidden_layers=n),
            model=SimpleNamespace(layers_to_capture=list(self.ids)),
            pp_group=SimpleNamespace(is_last_rank=True),
        )
        self.info = info

    def states(self, ids: list[int]):
        """(aux [T, K*H], final [T, H]) fp32 of one request's own forward."""
        torch = self.torch
        self.capture.states.clear()
        with torch.no_grad():
            out = self.decoder(input_ids=torch.tensor([ids]), use_cache=False)
        aux = torch.cat([self.capture.states[i][0] for i in self.ids], dim=-1)
        return aux, out.last_hidden_state[0]

    def forward(self, reqs: list[Request], pad: int = 2) -> None:
        """One ForwardBatch for the queued requests, as SGLang's scheduler would make it."""
        torch = self.torch
        from tests.eagle3.extraction.eagle3_standins import standin_batch

        auxs, finals, ids = [], [], []
        for r in reqs:
            aux, final = self.states(r.ids)
            auxs.append(aux)
            finals.append(final)
            ids.extend(r.ids)
            with torch.no_grad():  # greedy: what SGLang generates with max_new_tokens 1
                r.token = int(self.lm_head(final[-1]).argmax())
        aux = torch.cat([*auxs, torch.randn(pad, auxs[0].shape[1])])
        final = torch.cat([*finals, torch.randn(pad, finals[0].shape[1])])
        offsets = [sum(len(r.ids) for r in reqs[:i]) for i in range(len(reqs))]
        for r, off in zip(reqs, offsets, strict=True):
            if r.hidden:  # return_hidden_states: the bf16 values of the request's aux rows
                r.rows = [aux[off : off + len(r.ids)].to(torch.bfloat16).float().tolist()]
        fb = standin_batch(
            [r.rid for r in reqs],
            [len(r.ids) for r in reqs],
            torch.tensor(ids + [0] * pad, dtype=torch.int64),
        )
        if os.environ.get("EAGLE3_DUMP_DIR"):  # the patched forward's two lines
            from sglang.srt.eagle3_dump import dump as _eagle3_dump  # pyright: ignore[reportMissingImports]

            k = len(self.ids)
            h = aux.shape[1] // k
            _eagle3_dump(self.model, fb, final, [aux[:, i * h : (i + 1) * h] for i in range(k)])


class Serving:
    """EAGLE-3 speculative decoding by the torch reference decoder (greedy)."""

    def __init__(self, model_path: Path, draft: str, steps: int) -> None:
        import torch

        from remote_agent.eagle3.drafter.eval.evaluate import Target
        from remote_agent.eagle3.drafter.eval.synthetic import end_ids, load_target, text_config
        from remote_agent.eagle3.drafter.export.export import load_export
        from remote_agent.eagle3.drafter.model.contract import resolve_capture_ids

        model, self.tok = load_target(model_path, "cpu", torch.float32)
        self.draft, config = load_export(Path(draft), "cpu", torch.float32)
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux = resolve_capture_ids(ids, text_config(model).num_hidden_layers)
        if config["hidden_size"] == config["target_hidden_size"]:  # as reference-accept does
            with torch.no_grad():
                self.draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        self.target, self.eos, self.steps = Target(model, aux), end_ids(model_path, self.tok), steps
        self.completion = self.verify = 0

    def generate(self, ids: list[int], max_new: int) -> dict[str, Any]:
        from remote_agent.eagle3.drafter.eval.evaluate import speculative_decode

        d = speculative_decode(self.target, self.draft, ids, max(1, max_new), self.steps, self.eos)
        self.completion += len(d.tokens)
        self.verify += d.verify_steps
        meta = {"completion_tokens": len(d.tokens), "prompt_tokens": len(ids)}
        if d.verify_steps:  # SGLang leaves it out for a request never verified
            meta["spec_verify_ct"] = d.verify_steps
        text = self.tok.decode(d.tokens, skip_special_tokens=True)
        return {"text": text, "output_ids": d.tokens, "meta_info": meta}


class Request:
    def __init__(self, rid: str, ids: list[int], hidden: bool, max_new: int) -> None:
        self.rid, self.ids, self.hidden, self.max_new = rid, ids, hidden, max_new
        self.done = threading.Event()
        self.error: str | None = None
        self.rows: list | None = None
        self.token = 0
        self.answer: dict[str, Any] | None = None


class Server:
    def __init__(self, args: argparse.Namespace, rest: list[str]) -> None:
        model = Path(args.model_path)
        cfg = json.loads((model / "config.json").read_text())
        context = (cfg.get("text_config") or cfg).get("max_position_embeddings")
        self.info = server_info(args, rest, context)
        try:  # what the hook reads of the server's args (the rehearsal site's runtime_context)
            import sglang.srt.runtime_context as rc  # pyright: ignore[reportMissingImports]

            rc.SERVER_ARGS = SimpleNamespace(  # type: ignore[attr-defined]
                model_path=str(model), tokenizer_path=str(model), dp_size=1,
                enable_dp_attention=False,
            )  # fmt: skip
        except ImportError:
            pass
        self.extracting = bool(os.environ.get("EAGLE3_DUMP_DIR"))
        draft = args.speculative_draft_model_path
        if self.extracting:
            self.engine: Extraction | Serving = Extraction(model, draft, self.info)
        else:
            if not draft or str(args.speculative_algorithm).upper() != "EAGLE3":
                raise SystemExit("stand-in: serve mode needs --speculative-algorithm EAGLE3 "
                                 "--speculative-draft-model-path DIR")  # fmt: skip
            self.engine = Serving(model, draft, int(args.speculative_num_steps or 3))
        self.requests: queue.Queue[Request] = queue.Queue()
        self.httpd = ThreadingHTTPServer((args.host, args.port), self._handler())
        threading.Thread(target=self._schedule, daemon=True).start()

    def _schedule(self) -> None:
        while True:
            batch = [self.requests.get()]
            while len(batch) < 4:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            try:
                if isinstance(self.engine, Extraction):
                    self.engine.forward(batch)
                else:
                    for r in batch:
                        r.answer = self.engine.generate(r.ids, r.max_new)
            except Exception as exc:  # SGLang's scheduler would die; the requests fail
                for r in batch:
                    r.error = f"{type(exc).__name__}: {exc}"
            for r in batch:
                r.done.set()

    def state(self) -> dict[str, Any]:
        info = dict(self.info)
        internal: dict[str, Any] = {"memory_usage": {"weight": 0.0, "kvcache": 0.0}}
        if isinstance(self.engine, Serving) and self.engine.verify:
            internal["avg_spec_accept_length"] = self.engine.completion / self.engine.verify
        info["internal_states"] = [internal]
        return info

    def _handler(self):
        server = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                if self.path in ("/server_info", "/get_server_info"):
                    self.reply(200, server.state())
                elif self.path in ("/model_info", "/get_model_info"):
                    self.reply(200, {"model_path": server.info["model_path"]})
                elif self.path == "/health":
                    self.reply(200, {})
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                if self.path != "/generate":
                    self.reply(404, {"detail": "Not Found"})
                    return
                body = self.read_json()
                sp = body.get("sampling_params") or {}
                max_new = int(sp.get("max_new_tokens", 16))
                one = not isinstance(body.get("input_ids", [[0]])[0], list)
                ids = [body["input_ids"]] if one else body["input_ids"]
                rids = body.get("rid") or [f"req-{id(body)}-{i}" for i in range(len(ids))]
                rids = [rids] if isinstance(rids, str) else rids
                if server.extracting and max_new > 1:
                    self.reply(400, {"error": "stand-in: extraction serves prefill only"})
                    return
                hidden = bool(body.get("return_hidden_states"))
                reqs = [Request(r, list(map(int, i)), hidden, max_new) for r, i in zip(rids, ids, strict=True)]  # fmt: skip
                for r in reqs:  # queued together: the scheduler takes them into one forward
                    server.requests.put(r)
                for r in reqs:
                    r.done.wait(600)
                errors = [r.error for r in reqs if r.error]
                if errors:
                    self.reply(500, {"error": errors[0]})
                    return
                answers = []
                for r in reqs:
                    if r.answer is not None:
                        answers.append({**r.answer, "meta_info": {"id": r.rid, **r.answer["meta_info"]}})  # fmt: skip
                        continue
                    meta: dict[str, Any] = {"id": r.rid, "prompt_tokens": len(r.ids)}
                    if r.rows is not None:
                        meta["hidden_states"] = r.rows
                    out_ids = [r.token] if r.max_new > 0 else []
                    answers.append({"text": "", "output_ids": out_ids, "meta_info": meta})
                self.reply(200, answers[0] if one else answers)

        return Handler


def main(argv: list[str] | None = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    if not args.model_path:
        raise SystemExit("stand-in: --model-path is required")
    server = Server(args, rest)
    mode = "extraction" if server.extracting else "EAGLE3 serving (reference decoder)"
    print(f"sglang stand-in ({server.info['version']}): {mode} on {args.host}:{args.port}",
          flush=True)  # fmt: skip
    server.httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
