"""`eagle3 stream-reference`: the HF reference extractor as a stream producer.

It answers the part of SGLang's HTTP API the online trainer uses (`POST /generate` with
pre-tokenised `input_ids`, a `rid` (or a list of both), `max_new_tokens` 0; `GET /health`,
`/server_info`) and streams each request's aux + final rows through the same sender the SGLang
hook uses (stream_wire.StreamSender: bounded queue, deadline, DROPPED notices). One forward per
sample, the reference extractor's capture (extraction/capture.py), so its states equal an
offline reference dump made one sample per forward (`--max-batch 1`) bit for bit. For CPU tests,
benches, and a GPU box without SGLang (`--device cuda`).
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from remote_agent.eagle3.json_handler import JsonHandler

HELP = "serve the HF reference extractor as an online-training stream producer"


class ReferenceProducer:
    def __init__(
        self,
        model_dir: Path,
        stream: str,
        host: str = "127.0.0.1",
        port: int = 0,
        rid_prefix: str = "dump-",
        aux_dtype: str = "bf16",
        layers: list[int] | None = None,
        device: str = "cpu",
        dtype: str = "auto",
        queue_depth: int = 4,
        deadline_s: float = 20.0,
    ) -> None:
        import torch

        from remote_agent.eagle3 import stream_wire
        from remote_agent.eagle3.extraction.capture import (
            AuxCapture,
            decoder_of,
            resolve_layer_ids,
            text_config,
        )
        from remote_agent.eagle3.extraction.identity import model_identity
        from remote_agent.eagle3.extraction.reference import (
            ReferenceOptions,
            build_meta,
            load_model,
            torch_dtype,
        )

        self.torch = torch
        self.device = torch.device(device if device != "auto" else "cpu")
        self.model_dir, self.rid_prefix = Path(model_dir), rid_prefix
        model = load_model(self.model_dir, torch_dtype(dtype, self.device), self.device)
        self.decoder, layer_mods = decoder_of(model)
        cfg = text_config(model.config)
        self.ids = resolve_layer_ids(int(cfg.num_hidden_layers), layers)
        opts = ReferenceOptions(self.model_dir, Path("-"), Path("-"), aux_dtype=aux_dtype)
        self.meta = build_meta(model, self.model_dir, self.ids, opts, 1)
        self.capture = AuxCapture(layer_mods, self.ids)
        self.capture.__enter__()
        hello = {
            "meta": asdict(self.meta),
            "identity": {
                k: v for k, v in model_identity(self.model_dir).items() if k.endswith("sha256")
            },
            "host": "reference",
            "pid": __import__("os").getpid(),
            "rank": 0,
        }
        self.sender = stream_wire.StreamRouter(
            stream, hello, aux_dtype, len(self.ids), queue_depth=queue_depth, deadline_s=deadline_s
        )
        self.forwards = 0
        self._gpu = threading.Lock()  # one forward at a time, as one scheduler
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def states(self, input_ids: list[int]):
        """(ids int32 [T], aux bf16 [T, K*H], final bf16 [T, H]) on the host."""
        from remote_agent.eagle3.extraction.capture import capture_batch

        torch = self.torch
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        mask = torch.ones_like(ids)
        with self._gpu, torch.inference_mode():
            got, aux, final = capture_batch(
                self.decoder, self.capture, ids, mask, torch.bfloat16, [len(input_ids)]
            )
            self.forwards += 1
        return got.to("cpu", torch.int32), aux.to("cpu"), final.to("cpu")

    def info(self) -> dict[str, Any]:
        """What /server_info answers: the model, the sender's counters, this process's peaks."""
        import resource

        torch = self.torch
        out: dict[str, Any] = {
            "model_path": str(self.model_dir),
            "producer": "hf-reference",
            "forwards": self.forwards,
            "stream": dict(self.sender.stats),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        if self.device.type == "cuda":
            out["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return out

    def generate(self, rids: list[str], input_ids: list[list[int]]) -> None:
        samples = []
        for rid, ids in zip(rids, input_ids, strict=True):
            if not rid.startswith(self.rid_prefix):
                continue
            samples.append((rid[len(self.rid_prefix) :], *self.states(ids)))
        self.sender.offer(samples)

    def _handler(self):
        producer = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                if self.path in ("/health", "/server_info", "/get_server_info"):
                    self.reply(200, producer.info())
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                if self.path != "/generate":
                    self.reply(404, {"detail": "Not Found"})
                    return
                try:
                    body = self.read_json()
                    rids, ids = body["rid"], body["input_ids"]
                    if isinstance(rids, str):
                        rids, ids = [rids], [ids]
                    if body.get("sampling_params", {}).get("max_new_tokens") != 0:
                        raise ValueError("prefill-only requests (max_new_tokens 0)")
                    producer.generate(list(rids), [list(map(int, i)) for i in ids])
                except (KeyError, ValueError, TypeError) as exc:
                    self.reply(400, {"error": str(exc)})
                    return
                self.reply(200, [{"text": "", "meta_info": {"id": r}} for r in rids])

        return Handler

    def __enter__(self) -> ReferenceProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.sender.drain(timeout=30)
        self.sender.close()
        self.capture.__exit__(None, None, None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=Path, help="HF target model directory")
    p.add_argument("--stream", required=True, help="the trainer's address: unix:PATH | tcp:H:P")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--rid-prefix", default="dump-")
    p.add_argument("--aux-dtype", choices=("bf16", "fp8_e4m3"), default="bf16")
    p.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32")
    p.add_argument("--deadline-s", type=float, default=20.0)


def run(args: argparse.Namespace) -> int:
    import time

    from remote_agent.eagle3.extraction.reference import torch_dtype  # noqa: F401 (torch check)

    producer = ReferenceProducer(
        args.model, args.stream, args.host, args.port, args.rid_prefix, args.aux_dtype,
        args.layers, args.device, args.dtype, deadline_s=args.deadline_s,
    )  # fmt: skip
    with producer:
        print(f"stream-reference: {producer.url} -> {args.stream}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0
