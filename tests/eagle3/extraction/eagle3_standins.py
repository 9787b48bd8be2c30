"""Test helpers for the extraction tests.

The ONE fake in these tests is SGLang itself: a stand-in `ForwardBatch` (a SimpleNamespace with
the fields the hook reads, per sglang-dump-patch.md §2.1) and a stand-in model object exposing
`capture_aux_hidden_states`, `config`, `model.layers_to_capture` and `pp_group`. Everything else
is real: the hook package is the shipped code (copied the way `eagle3 patch apply` installs it),
the states come from the real tiny HF DeepseekV3, the HTTP client is the real client.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import queue
import random
import shutil
import sys
import threading
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from remote_agent.eagle3.json_handler import JsonHandler
from tests.support.paths import REPO


def load_hook_package(dest: Path):
    """Copy patches/eagle3_dump + dense.py into dest/<unique pkg> and import it as a package."""
    name = f"eagle3_dump_under_test_{uuid.uuid4().hex[:8]}"
    pkg = dest / name
    pkg.mkdir(parents=True)
    for f in ("__init__.py", "hook.py", "compat.py"):
        shutil.copy(REPO / "patches" / "eagle3_dump" / f, pkg / f)
    for f in ("dense.py", "stream_wire.py"):  # shipped from remote_agent/eagle3/
        shutil.copy(REPO / "remote_agent" / "eagle3" / f, pkg / f)
    spec = importlib.util.spec_from_file_location(
        name, pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return sys.modules[f"{name}.hook"]


class Mode:
    """Stand-in for sglang's ForwardMode (only the predicates the hook calls)."""

    def __init__(self, name: str = "EXTEND") -> None:
        self.name = name

    def is_extend(self) -> bool:
        return self.name in ("EXTEND", "MIXED", "TARGET_VERIFY", "SPLIT_PREFILL")

    def is_target_verify(self) -> bool:
        return self.name == "TARGET_VERIFY"

    def is_mixed(self) -> bool:
        return self.name == "MIXED"

    def is_idle(self) -> bool:
        return self.name == "IDLE"

    def is_split_prefill(self) -> bool:
        return self.name == "SPLIT_PREFILL"


def standin_model(
    hidden: int, layers: int, ids: list[int], capture: bool = True, name: str = "tiny"
):
    return SimpleNamespace(
        capture_aux_hidden_states=capture,
        config=SimpleNamespace(hidden_size=hidden, num_hidden_layers=layers, _name_or_path=name),
        model=SimpleNamespace(layers_to_capture=list(ids)),
        pp_group=SimpleNamespace(is_last_rank=True),
    )


def standin_batch(
    rids: list[str],
    seq_lens: list[int],
    input_ids,
    prefix_lens: list[int] | None = None,
    mode: str = "EXTEND",
    cpu_lists: bool = True,
):
    import torch

    prefix_lens = prefix_lens or [0] * len(rids)
    return SimpleNamespace(
        forward_mode=Mode(mode),
        batch_size=len(rids),
        rids=list(rids),
        input_ids=input_ids,
        extend_seq_lens_cpu=list(seq_lens) if cpu_lists else None,
        extend_prefix_lens_cpu=list(prefix_lens) if cpu_lists else None,
        extend_seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
    )


def write_dataset(path: Path, lengths: list[int], seed: int = 0, vocab: int = 2000) -> Path:
    """A merged-dataset JSONL with its manifest (random ids from the tiny vocabulary)."""
    rng = random.Random(seed)
    records = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(11, vocab) for _ in range(n)]
        records.append(
            {"id": f"s{i:04d}", "source": "test", "input_ids": ids, "loss_mask": [1] * n}
        )
    return write_records(path, records)


def write_records(path: Path, records: list[dict]) -> Path:
    """Records (id, source, input_ids, loss_mask) as a merged-dataset JSONL with its manifest."""
    lengths = [len(r["input_ids"]) for r in records]
    lines = [json.dumps(r, separators=(",", ":")) for r in records]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    manifest = {
        "format": "eagle3-merged",
        "version": 1,
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(lengths),
        "tokens": sum(lengths),
    }
    path.with_name(path.name.removesuffix(".jsonl") + ".manifest.json").write_text(
        json.dumps(manifest)
    )
    return path


EXTRACTION_FLAGS = {
    "version": "0.5.23",
    "model_path": None,
    "tp_size": 1,
    "pp_size": 1,
    "enable_return_aux_hidden_states": True,
    "aux_hidden_state_capture": "EAGLE3",
    "speculative_algorithm": None,
    "disable_radix_cache": True,
    "chunked_prefill_size": -1,
    "disable_prefill_cuda_graph": True,
    "cuda_graph_config": {"decode": {"backend": "full"}, "prefill": {"backend": "disabled"}},
    "enable_layernorm_sp": False,
    "enable_two_batch_overlap": False,
    "enable_mixed_chunk": False,
}


class _Req:
    def __init__(self, rid: str, ids: list[int], hidden: bool = False) -> None:
        self.rid, self.ids = rid, ids
        self.done = threading.Event()
        self.error: str | None = None
        self.hidden = hidden  # return_hidden_states: rows of the batch tensor, as SGLang does
        self.rows: list | None = None
        self.token = 0  # the greedy next token after the prompt (what SGLang generates)


class FakeSGLang:
    """An HTTP server that answers like SGLang in extraction mode and, per scheduled batch,
    runs the real tiny HF model and calls the real dump hook with a stand-in ForwardBatch
    (several requests per batch, padding rows after the real ones)."""

    def __init__(
        self,
        hook,
        model_dir: Path,
        flags: dict[str, Any] | None = None,
        patched: bool = True,
        max_batch: int = 4,
        pad_rows: int = 3,
        chunk: int | None = None,
        on_first_request=None,
        rows_fault: str | None = None,
        final_fault: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.hook, self.model_dir = hook, Path(model_dir)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32
        ).eval()
        cfg = self.model.config
        n = cfg.num_hidden_layers
        self.capture_ids = [2, n // 2, n - 3]
        self.standin = standin_model(cfg.hidden_size, n, self.capture_ids, name=str(model_dir))
        self.flags = {**EXTRACTION_FLAGS, "model_path": str(model_dir), **(flags or {})}
        self.patched, self.max_batch, self.pad_rows, self.chunk = (
            patched,
            max_batch,
            pad_rows,
            chunk,
        )
        self.on_first_request = on_first_request
        # how return_hidden_states picks a request's rows: None as SGLang (its own offset);
        # "swap": the next request's rows, "shift": one row late, "ulp": one value one bf16 step
        # off (the bugs the canary must catch)
        self.rows_fault = rows_fault
        # final_fault: the dumped `final` of batched (canary) requests gets a wrong last row
        # while the generated token stays right (what the final-state check must catch)
        self.final_fault = final_fault
        self.requests: queue.Queue = queue.Queue()
        self.batches = 0
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, daemon=True),
            threading.Thread(target=self._schedule, daemon=True),
        ]

    def __enter__(self) -> FakeSGLang:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=10)

    def states(self, ids: list[int]):
        """(aux [T, K*H], final [T, H]) in fp32 from a real forward of one request."""
        torch = self.torch
        with torch.no_grad():
            out = self.model.model(torch.tensor([ids]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i][0] for i in self.capture_ids], dim=-1)
        return aux, out.last_hidden_state[0]

    def _schedule(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.requests.get(timeout=0.05)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            try:
                if self.on_first_request is not None and any(
                    "__eagle3__" not in r.rid for r in batch
                ):
                    hook, self.on_first_request = self.on_first_request, None
                    hook()
                for step in self._steps(batch):
                    self._forward(step)
            except Exception as exc:  # the scheduler would crash: the request fails
                for r in batch:
                    r.error = f"{type(exc).__name__}: {exc}"
            for r in batch:
                r.done.set()

    def _steps(self, batch):
        """One forward for the batch, or (chunked prefill) several, each a list of pieces."""
        if not self.chunk:
            return [[(r, 0, len(r.ids)) for r in batch]]
        longest = max(len(r.ids) for r in batch)
        return [
            [(r, s, min(len(r.ids), s + self.chunk)) for r in batch if s < len(r.ids)]
            for s in range(0, longest, self.chunk)
        ]

    def _forward(self, pieces) -> None:
        torch = self.torch
        auxs, finals, ids, rids, lens, prefixes = [], [], [], [], [], []
        for r, lo, hi in pieces:
            aux, final = self.states(r.ids)
            auxs.append(aux[lo:hi])
            finals.append(final[lo:hi])
            ids.extend(r.ids[lo:hi])
            rids.append(r.rid)
            lens.append(hi - lo)
            prefixes.append(lo)
        pad = self.pad_rows
        aux = torch.cat([*auxs, torch.randn(pad, auxs[0].shape[1])])
        final = torch.cat([*finals, torch.randn(pad, finals[0].shape[1])])
        input_ids = torch.tensor(ids + [0] * pad, dtype=torch.int64)
        fb = standin_batch(rids, lens, input_ids, prefixes)
        self.batches += 1
        offsets = [sum(lens[:i]) for i in range(len(lens))]
        for i, (r, _, hi) in enumerate(pieces):
            last = offsets[i] + lens[i] - 1
            with torch.no_grad():  # greedy: the argmax of the real lm_head at the last position
                r.token = int(self.model.lm_head(final[last]).argmax())
            if self.final_fault and "__eagle3__" in r.rid and hi == len(r.ids):
                final[last] = torch.randn_like(final[last]) * 10
            if r.hidden:  # what SGLang returns: bf16 values of the batch's aux rows
                j = (i + 1) % len(pieces) if self.rows_fault == "swap" else i
                lo = offsets[j] + (1 if self.rows_fault == "shift" else 0)
                rows = aux[lo : lo + len(r.ids)].to(torch.bfloat16)
                if self.rows_fault == "ulp":  # one value one bf16 step off
                    flat = rows.reshape(-1).view(torch.int16)
                    flat[-1] += 1
                r.rows = [rows.float().tolist()]
        if self.patched:
            self.hook.dump(self.standin, fb, final, aux)

    def _handler(self):
        server = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                if self.path in ("/server_info", "/get_server_info"):
                    self.reply(200, server.flags)
                elif self.path in ("/model_info", "/get_model_info"):
                    self.reply(200, {"model_path": str(server.model_dir)})
                elif self.path == "/health":
                    self.reply(200, {})
                else:
                    self.reply(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                if self.path != "/generate":
                    self.reply(404, {"detail": "Not Found"})
                    return
                body = self.read_json()
                if isinstance(body.get("rid"), list):  # a batched call (the SGLang canary)
                    self._batched(body)
                    return
                if body.get("sampling_params", {}).get("max_new_tokens") != 0:
                    self.reply(400, {"error": "extraction requests are prefill-only"})
                    return
                req = _Req(body["rid"], list(body["input_ids"]))
                server.requests.put(req)
                req.done.wait(60)
                if req.error:
                    self.reply(500, {"error": req.error})
                else:
                    self.reply(
                        200,
                        {"text": "", "meta_info": {"id": req.rid, "prompt_tokens": len(req.ids)}},
                    )

            def _batched(self, body: dict) -> None:
                hidden = bool(body.get("return_hidden_states"))
                if hidden and not server.flags.get("enable_return_hidden_states"):
                    self.reply(400, {"error": "enable_return_hidden_states is off"})
                    return
                pairs = zip(body["rid"], body["input_ids"], strict=True)
                reqs = [_Req(r, list(i), hidden) for r, i in pairs]
                for r in reqs:  # queued together: the scheduler takes them into one forward
                    server.requests.put(r)
                for r in reqs:
                    r.done.wait(60)
                errors = [r.error for r in reqs if r.error]
                if errors:
                    self.reply(500, {"error": errors[0]})
                    return
                answers = []
                for r in reqs:
                    meta = {"id": r.rid, "prompt_tokens": len(r.ids)}
                    if r.rows is not None:
                        meta["hidden_states"] = r.rows
                    answers.append({"text": "", "output_ids": [r.token], "meta_info": meta})
                self.reply(200, answers)

        return Handler
