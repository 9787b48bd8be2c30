"""`eagle3 extract --server URL`: drive a patched SGLang server to dump every dataset sample.

1. check the server's flags (`/server_info`), refuse with the flags to add;
2. send a canary (`<prefix>__eagle3__:canary:<nonce>`) and wait for its dump under
   `<out>/canary/`: no canary means an unpatched server, a server started without
   EAGLE3_DUMP_DIR=<out>, or a broken hook; check its ids, shape and meta (hidden size, layer
   count, layer ids) against the expectations and against an existing dump in <out>;
3. resume: samples already in <out> whose ids equal the dataset's are skipped;
4. refuse when tokens x bytes/token + margin exceeds the free disk (both numbers printed);
5. send prefill-only requests (`input_ids`, `max_new_tokens` 0, rid = prefix + sample id) with
   bounded concurrency; an HTTP 200 means "computed", so completion is watched on disk: a sample
   is done when a sealed shard holds it and its echoed input_ids equal the dataset's; an error
   marker or a mismatch stops the run (exit 1, resumable);
6. at the end ask the hook to seal its shard (`__eagle3__:flush:`) and wait for the rest.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import (
    CANARY_DIR,
    DumpFormatError,
    DumpMeta,
    DumpReader,
    clear_error_marker,
    read_error_markers,
)
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.eagle3.extraction.common import disk_preflight, existing_samples, human_bytes
from remote_agent.eagle3.extraction.dataset import CONTROL_PREFIX, Dataset, open_dataset
from remote_agent.eagle3.extraction.identity import record_identity
from remote_agent.eagle3.extraction.server import (
    Http,
    LaunchedServer,
    ServerError,
    check_flags,
    dump_env,
    launch_command,
    long_sample_problem,
    model_info,
    server_info,
    sglang_layer_ids,
)
from remote_agent.eagle3.extraction.sharding import parse_shard, restrict
from remote_agent.eagle3.progress import Progress, emit
from remote_agent.eagle3.sglang_versions import served_capture_ids

CANARY = CONTROL_PREFIX + "canary:"
FLUSH = CONTROL_PREFIX + "flush:"
CANARY_TOKENS = 64
FINAL_CHECK_PROMPTS = 4  # batched canary requests, each also checked on its final state


@dataclass
class ClientOptions:
    server: str
    dataset: Path
    out: Path
    concurrency: int = 8
    rid_prefix: str = "dump-"
    model: Path | None = None  # HF dir whose config.json gives the expected shapes
    hidden_size: int | None = None
    num_layers: int | None = None
    layers: list[int] | None = None
    tp: int | None = None
    aux_dtype: str = "bf16"  # only used with --launch (the hook's env)
    canary_timeout: float = 120.0
    canary_only: bool = False
    dump_timeout: float = 600.0
    request_timeout: float = 1800.0
    retries: int = 2
    disk_margin_gb: float = 1.0
    poll_s: float = 0.5
    limit: int | None = None
    require_manifest: bool = True
    launch: bool = False
    launch_timeout: float = 1800.0
    launch_args: list[str] = field(default_factory=list)
    progress_interval: float = 5.0
    shard: str | None = None  # "I/N": only that shard's samples (extraction/sharding.py)


def generate_body(rid: str, input_ids: list[int]) -> dict[str, Any]:
    return {
        "input_ids": input_ids,
        "rid": rid,
        "sampling_params": {"max_new_tokens": 0},
        "stream": False,
    }


def expected_shapes(opts: ClientOptions, info: dict[str, Any]) -> dict[str, Any]:
    """hidden size / layer count / capture ids we expect, from flags or the model's config.json."""
    exp: dict[str, Any] = {"hidden_size": opts.hidden_size, "num_layers": opts.num_layers}
    path = opts.model or (Path(info["model_path"]) if info.get("model_path") else None)
    cfg_path = path / "config.json" if path is not None else None
    if cfg_path is not None and cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        cfg = cfg.get("text_config") or cfg
        exp["hidden_size"] = exp["hidden_size"] or cfg.get("hidden_size")
        exp["num_layers"] = exp["num_layers"] or cfg.get("num_hidden_layers")
        exp["config"] = str(cfg_path)
    elif opts.model is not None:
        raise BadInput(f"{opts.model}: no config.json (--model must be a Hugging Face model dir)")
    if opts.layers:
        exp["layer_ids"] = sorted(sglang_layer_ids(opts.layers))
    elif exp["num_layers"]:
        n = int(exp["num_layers"])
        exp["layer_ids"] = served_capture_ids(info, n) or [2, n // 2, n - 3]
    return exp


def check_meta(meta: DumpMeta, exp: dict[str, Any]) -> list[str]:
    problems = []
    if exp.get("hidden_size") and meta.hidden_size != exp["hidden_size"]:
        problems.append(f"hidden size {meta.hidden_size} != expected {exp['hidden_size']}")
    if exp.get("num_layers") and meta.num_layers != exp["num_layers"]:
        problems.append(f"layer count {meta.num_layers} != expected {exp['num_layers']}")
    if exp.get("layer_ids") and list(meta.aux_layer_ids) != exp["layer_ids"]:
        problems.append(f"capture layers {meta.aux_layer_ids} != expected {exp['layer_ids']}")
    return problems


class Extraction:
    def __init__(self, opts: ClientOptions) -> None:
        self.opts = opts
        self.http = Http(opts.server, opts.request_timeout)
        self.out = Path(opts.out)
        self.server: LaunchedServer | None = None

    # -- set-up --

    def run(self) -> dict[str, Any]:
        opts = self.opts
        dataset = open_dataset(opts.dataset, opts.require_manifest)
        dataset = restrict(dataset, parse_shard(opts.shard) if opts.shard else None)
        if len(dataset) == 0:
            raise BadInput(f"{opts.dataset}: no samples")
        self.out.mkdir(parents=True, exist_ok=True)
        if opts.launch:
            self._launch()
        try:
            return self._run(dataset)
        finally:
            if self.server is not None:
                self.server.stop()

    def _launch(self) -> None:
        opts = self.opts
        if opts.model is None:
            raise BadInput("--launch needs --model PATH (the model SGLang serves)")
        cmd = launch_command(opts.model, self.http.port, opts.tp, opts.layers, opts.launch_args)
        env = dump_env(self.out, opts.rid_prefix, opts.layers, opts.aux_dtype)
        print("launching: " + " ".join(cmd), flush=True)
        self.server = LaunchedServer(cmd, env, self.out / "sglang-server.log")
        self.server.wait_healthy(self.http, opts.launch_timeout)

    def _run(self, dataset: Dataset) -> dict[str, Any]:
        opts = self.opts
        info = server_info(self.http)
        problems = check_flags(info, opts.tp, opts.layers)
        if problems:
            raise BadInput(
                f"SGLang at {self.http.url} is not in extraction mode:\n  - "
                + "\n  - ".join(problems)
            )
        exp = expected_shapes(opts, {**model_info(self.http), **info})
        self._record_identity(info)
        ids = dataset.ids()[: opts.limit] if opts.limit else dataset.ids()
        too_long = long_sample_problem(info, {s: dataset.length(s) for s in ids})
        if too_long:
            raise BadInput(f"SGLang at {self.http.url}: {too_long}")
        meta = self.canary(dataset.input_ids(ids[0])[:CANARY_TOKENS], exp)
        vs_sglang = self.canary_vs_sglang(dataset, ids, info)
        if opts.canary_only:
            summary = {
                "ok": True,
                "stage": "canary",
                "server": self.http.url,
                "layer_ids": meta.aux_layer_ids,
                "bytes_per_token": meta.bytes_per_token(),
                "vs_sglang": vs_sglang,
            }
            print(
                f"canary: dumped and checked ({meta.aux_layer_ids}, {meta.bytes_per_token()} B/token)",
                flush=True,
            )
            emit("result", **summary)
            return summary
        done, mismatched = existing_samples(self.out, dataset)
        if mismatched:
            raise Failed(
                f"{self.out}: {len(mismatched)} dumped samples differ from the dataset, e.g. "
                + "; ".join(mismatched[:3])
            )
        pending = [s for s in ids if s not in done]
        tokens = dataset.total_tokens(pending)
        disk = disk_preflight(self.out, tokens, meta.bytes_per_token(), opts.disk_margin_gb)
        print(
            f"extract: {len(pending)} samples ({tokens} tokens) to dump, {len(ids) - len(pending)} "
            f"already done; ~{human_bytes(disk['estimate_bytes'])} of "
            f"{human_bytes(disk['free_bytes'])} free",
            flush=True,
        )
        for sid in pending:  # a retry starts clean
            clear_error_marker(self.out, sid)
        stats = self.extract(dataset, pending) if pending else {"samples": 0, "tokens": 0}
        summary = {
            "ok": True,
            "backend": "sglang",
            "server": self.http.url,
            "out": str(self.out),
            "skipped_existing": len(ids) - len(pending),
            "bytes_per_token": meta.bytes_per_token(),
            "layer_ids": meta.aux_layer_ids,
            **stats,
        }
        emit("result", **summary)
        return summary

    def _record_identity(self, info: dict[str, Any]) -> None:
        """The served model's identity into the dump (checked against it on a resume)."""
        model = self.opts.model or (Path(info["model_path"]) if info.get("model_path") else None)
        if model is None or not (model / "config.json").is_file():
            raise BadInput(
                f"cannot record the model's identity: the server serves {info.get('model_path')!r}, "
                "not a local model directory; pass --model DIR (the directory SGLang loaded)"
            )
        record_identity(self.out, model, "extract")

    # -- canary --

    def canary(self, input_ids: list[int], exp: dict[str, Any]) -> DumpMeta:
        opts = self.opts
        sid = CANARY + uuid.uuid4().hex[:12]
        root = self.out / CANARY_DIR
        try:
            self.http.post("/generate", generate_body(opts.rid_prefix + sid, input_ids))
        except ServerError as exc:
            raise Failed(
                f"the canary request failed: {exc}. If the hook refused the configuration, the "
                "SGLang log says why (eagle3 dump: ...)"
            ) from None
        deadline = time.monotonic() + opts.canary_timeout
        while True:
            marker = read_error_markers(self.out).get(sid)
            if marker is not None:
                raise Failed(f"the canary failed in the hook: {marker.get('reason')}")
            if (root / "meta.json").exists():
                try:
                    reader = DumpReader(root)
                except DumpFormatError:
                    reader = None
                if reader is not None and sid in reader:
                    return self._check_canary(reader, sid, input_ids, exp)
            if time.monotonic() > deadline:
                raise Failed(
                    f"no canary dump in {root} within {opts.canary_timeout:.0f}s: the server is "
                    "not dumping. Check that deepseek_v2.py is patched (`eagle3 patch status`), "
                    f"that SGLang was started with EAGLE3_DUMP_DIR={self.out.resolve()} and "
                    f"EAGLE3_DUMP_RID_PREFIX={opts.rid_prefix!r}, and the server log"
                )
            time.sleep(opts.poll_s)

    def canary_vs_sglang(self, dataset: Dataset, ids: list[str], info: dict[str, Any]):
        """Two samples batched, dumped vs SGLang's return_hidden_states (canary_sglang.py);
        only on a server started with --enable-return-hidden-states."""
        if info.get("enable_return_hidden_states") is not True:
            return None
        from remote_agent.eagle3.extraction.canary_sglang import compare_with_sglang

        # four requests of different lengths in one forward (the first a full canary window)
        picks = [ids[i % len(ids)] for i in range(FINAL_CHECK_PROMPTS)]
        prompts = [dataset.input_ids(picks[0])[:CANARY_TOKENS]]
        for k, sid in enumerate(picks[1:], start=1):
            p = dataset.input_ids(sid)
            prompts.append(p[: max(1, min(len(p), CANARY_TOKENS // (k + 1) + 3))])
        opts = self.opts
        lm_head = None
        if opts.model is not None:
            from remote_agent.eagle3.extraction.final_check import load_lm_head

            lm_head = load_lm_head(opts.model)
        result = compare_with_sglang(
            self.http, self.out, opts.rid_prefix, prompts, opts.canary_timeout, opts.poll_s, lm_head
        )
        line = (
            f"canary vs SGLang return_hidden_states: {result['samples']} batched requests, "
            f"{'bit-exact' if result['bit_exact'] else 'DIFFERENT'} on {result['compared']} "
            f"(shared forward: {result['shared_forward']}, max abs err {result['max_abs_err']})"
        )
        print(line, flush=True)
        if not result["bit_exact"]:
            raise Failed(line + f"; see {self.out / CANARY_DIR}")
        fsc = result.get("final_state_check")
        if fsc is not None:
            print(
                f"final-state check: argmax(final[-1] @ lm_head^T) equals SGLang's token on "
                f"{fsc['argmax_matches']}/{fsc['prompts']} prompts",
                flush=True,
            )
            if not fsc["ok"]:
                bad = next(p for p in fsc["per_prompt"] if not p["match"])
                raise Failed(
                    f"the dumped final state is not the one SGLang decodes from: canary "
                    f"{bad['sample']} predicts token {bad['dump_argmax']}, SGLang generated "
                    f"{bad['sglang_token']} ({fsc['argmax_matches']}/{fsc['prompts']} agree); "
                    f"extraction stopped, see {self.out / CANARY_DIR / 'vs-sglang.json'}"
                )
        return result

    def _check_canary(self, reader: DumpReader, sid: str, input_ids: list[int], exp) -> DumpMeta:
        import torch

        meta = reader.meta
        sample = reader.get(sid)
        got = sample["input_ids"].tolist()
        if len(got) != len(input_ids):
            raise Failed(
                f"the canary dump holds {len(got)} of the {len(input_ids)} tokens sent: the server "
                "split the request (chunked prefill? start it with --chunked-prefill-size -1)"
            )
        if got != input_ids:
            raise Failed(f"the canary's echoed input_ids differ from what was sent ({got[:8]}...)")
        t, k, h = len(input_ids), meta.num_aux, meta.hidden_size
        if tuple(sample["aux"].shape) != (t, k * h) or tuple(sample["final"].shape) != (t, h):
            raise Failed(
                f"the canary dump has shapes {tuple(sample['aux'].shape)}/{tuple(sample['final'].shape)}"
            )
        if not (
            torch.isfinite(sample["aux"].float()).all()
            and torch.isfinite(sample["final"].float()).all()
        ):
            raise Failed("the canary dump holds NaN/Inf")
        problems = check_meta(meta, exp)
        if problems:
            raise BadInput(
                "hidden size or layer count mismatch between the server and the expected model "
                f"({exp.get('config') or 'flags'}): " + "; ".join(problems)
            )
        if (self.out / "meta.json").exists():
            existing = DumpMeta.load(self.out)
            diff = meta.compatible_with(existing)
            if diff:
                raise BadInput(
                    f"{self.out}: the existing dump differs from what the server writes in "
                    f"{', '.join(diff)} (existing: hidden {existing.hidden_size}, layers "
                    f"{existing.num_layers}, ids {existing.aux_layer_ids}); use a new --out"
                )
        reader.close()
        return meta

    # -- the main loop --

    def extract(self, dataset: Dataset, pending: list[str]) -> dict[str, Any]:
        opts = self.opts
        work: queue.Queue = queue.Queue(maxsize=max(2 * opts.concurrency, 1))
        replies: queue.Queue = queue.Queue()
        expected: dict[str, list[int]] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def produce() -> None:
            for sid in sorted(
                pending, key=lambda s: dataset.index.entries[dataset.index.by_id[s]][1]
            ):
                if stop.is_set():
                    break
                ids = dataset.input_ids(sid)  # only this thread reads the dataset file
                with lock:
                    expected[sid] = ids
                while not stop.is_set():
                    try:
                        work.put((sid, ids), timeout=0.2)
                        break
                    except queue.Full:
                        continue
            for _ in range(opts.concurrency):
                work.put(None)

        def send() -> None:
            while True:
                item = work.get()
                if item is None:
                    return
                sid, ids = item
                if stop.is_set():
                    replies.put((sid, "skipped"))
                    continue
                replies.put((sid, self._post(opts.rid_prefix + sid, ids)))

        flush_ids = dataset.input_ids(pending[0])[:1]  # read now: later only `produce` reads
        threads = [threading.Thread(target=produce, name="eagle3-extract-reader", daemon=True)]
        threads += [
            threading.Thread(target=send, name=f"eagle3-extract-send-{i}", daemon=True)
            for i in range(opts.concurrency)
        ]
        for th in threads:
            th.start()
        try:
            return self._watch(dataset, pending, expected, lock, replies, stop, flush_ids)
        finally:
            stop.set()  # senders finish their request in flight; daemon threads never block exit
            for th in threads:
                th.join(timeout=10)

    def _post(self, rid: str, ids: list[int]) -> str | None:
        """None on success, else the error (after retries with the same rid)."""
        from remote_agent.eagle3.http_client import backoff_delay

        err = None
        for attempt in range(self.opts.retries + 1):
            try:
                self.http.post("/generate", generate_body(rid, ids))
                return None
            except ServerError as exc:
                err = str(exc)
                # after a timeout the first request with this rid may still run on the server:
                # SGLang refuses the retry as a duplicate until it finishes, so wait and retry
                duplicate = "Duplicate request ID" in err
                if exc.status is not None and 400 <= exc.status < 500 and not duplicate:
                    return err  # the request itself is wrong: retrying will not help
                time.sleep(backoff_delay(attempt, base=1.0, cap=10.0))
        return err

    def _watch(self, dataset, pending, expected, lock, replies, stop, flush_ids) -> dict[str, Any]:
        opts = self.opts
        todo = set(pending)
        total_tokens = dataset.total_tokens(pending)
        progress = Progress("extract", len(pending), "samples", interval=opts.progress_interval)
        reader: DumpReader | None = None
        base_bytes = 0
        answered = 0
        tokens = 0
        flushed_at: float | None = None
        start = last_change = time.monotonic()
        problems: list[str] = []
        while todo and not problems:
            while True:  # HTTP outcomes
                try:
                    sid, err = replies.get_nowait()
                except queue.Empty:
                    break
                answered += 1
                last_change = time.monotonic()
                if err is not None and err != "skipped":
                    problems.append(f"{sid}: request failed: {err}")
            if reader is None and (self.out / "meta.json").exists():
                reader = DumpReader(self.out)
                base_bytes = reader.total_bytes()
                new = [s for s in reader.ids() if s in todo]
            else:
                new = reader.refresh() if reader is not None else []
            confirmed = 0
            for sid in new:
                if sid not in todo:
                    continue
                assert reader is not None  # the new ids are its
                confirmed += 1
                with lock:
                    want = expected.pop(sid, None)
                got = reader.input_ids(sid).tolist()
                if want is not None and got != want:
                    problems.append(
                        f"{sid}: the dump's input_ids ({len(got)} tokens) differ from the "
                        f"dataset's ({len(want)} tokens): chunked prefill or a tokenization mismatch"
                    )
                todo.discard(sid)
                tokens += len(got)
                last_change = time.monotonic()
            if confirmed:
                assert reader is not None
                elapsed = max(time.monotonic() - start, 1e-9)
                progress.advance(
                    confirmed,
                    tokens=tokens,
                    tokens_per_s=round(tokens / elapsed, 1),
                    gb_written=round((reader.total_bytes() - base_bytes) / 1e9, 6),
                    token_eta_s=round((total_tokens - tokens) / max(tokens / elapsed, 1e-9), 1),
                )
            markers = read_error_markers(self.out)
            for sid in todo & markers.keys():
                problems.append(f"{sid}: {markers[sid].get('reason')}")
            if problems or not todo:
                break
            now = time.monotonic()
            if answered >= len(pending) and flushed_at is None:
                flushed_at = now  # all computed: ask the hook to seal what it buffers
                self._post(opts.rid_prefix + FLUSH + uuid.uuid4().hex[:12], flush_ids)
            if now - last_change > opts.dump_timeout:
                problems.append(
                    f"{len(todo)} samples not dumped {opts.dump_timeout:.0f}s after the last "
                    "progress (is the server still dumping? see its log)"
                )
                break
            time.sleep(opts.poll_s)
        stop.set()
        elapsed = time.monotonic() - start
        gb = ((reader.total_bytes() - base_bytes) / 1e9) if reader is not None else 0.0
        progress.finish(
            tokens=tokens,
            tokens_per_s=round(tokens / max(elapsed, 1e-9), 1),
            gb_written=round(gb, 6),
        )
        if problems:
            raise Failed(
                f"extraction stopped: {len(problems)} problem(s), {len(pending) - len(todo)} of "
                f"{len(pending)} samples dumped (run again to resume):\n  - "
                + "\n  - ".join(problems[:10])
            )
        return {
            "samples": len(pending),
            "tokens": tokens,
            "seconds": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else None,
            "gb_written": round(gb, 6),
        }
