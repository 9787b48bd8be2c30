"""Talking to an SGLang server: a tiny stdlib HTTP client, the extraction-mode flag check on
`/server_info`, and (optionally) launching the server with those flags and the hook's env.

Required for extraction (reference §2.6): capture-only aux hidden states for EAGLE3, radix cache
off, chunked prefill off (-1: a large chunk size still splits requests), prefill CUDA graph off,
pipeline parallel 1, and none of the layouts that split rows across ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from remote_agent.eagle3 import sglang_versions as sv
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.eagle3.http_client import HttpClient, HttpError, backoff_delay

# the shared client's error under the name the extraction code uses
ServerError = HttpError


def Http(url: str, timeout: float = 600.0) -> HttpClient:  # noqa: N802 (was a class)
    """The SGLang server at `url` (`HOST:PORT` means http), one connection per request."""
    try:
        return HttpClient(url if "://" in url else f"http://{url}", timeout)
    except ValueError:
        raise BadInput(f"--server {url!r}: expected http://HOST:PORT") from None


def server_info(http_: HttpClient) -> dict[str, Any]:
    """`/server_info` (0.5.23), falling back to the deprecated `/get_server_info`."""
    try:
        info = http_.get("/server_info", timeout=30)
    except ServerError as exc:
        if exc.status != 404:
            raise Failed(f"cannot read the SGLang server's flags: {exc}") from None
        try:
            info = http_.get("/get_server_info", timeout=30)
        except ServerError as exc2:
            raise Failed(f"cannot read the SGLang server's flags: {exc2}") from None
    if not isinstance(info, dict):
        raise Failed(f"{http_.url}/server_info: expected a JSON object")
    return info


def model_info(http_: HttpClient) -> dict[str, Any]:
    try:
        info = http_.get("/model_info", timeout=30)
    except ServerError:
        try:
            info = http_.get("/get_model_info", timeout=30)
        except ServerError:
            return {}
    return info if isinstance(info, dict) else {}


def sglang_layer_ids(ids: list[int]) -> list[int]:
    """SGLang's rule: +1 on every id only when the first id is 1."""
    return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)


def check_flags(
    info: dict[str, Any], tp: int | None = None, layers: list[int] | None = None
) -> list[str]:
    """What is wrong with the server for extraction, each with the flag that fixes it."""
    problems: list[str] = []

    def need(key: str, ok, fix: str) -> None:
        if key not in info:
            problems.append(f"server_info has no {key!r} (not SGLang 0.5.23?); need {fix}")
        elif not ok(info[key]):
            problems.append(f"{key} = {info[key]!r}; start SGLang with {fix}")

    problems += sv.capture_problems(info)  # per release (sglang_versions.py)
    need("disable_radix_cache", lambda v: v is True, "--disable-radix-cache")
    need("chunked_prefill_size", lambda v: v == -1, "--chunked-prefill-size -1")
    why = sv.prefill_graph_problem(sv.prefill_backend_from_info(info), "server_info")
    if why:
        problems.append(why + "; start SGLang with --disable-prefill-cuda-graph")
    for key, fix in (
        ("enable_layernorm_sp", "drop --enable-layernorm-sp"),
        ("enable_attn_tp_input_scattered", "drop --enable-attn-tp-input-scattered"),
        ("enable_two_batch_overlap", "drop --enable-two-batch-overlap"),
        ("enable_mixed_chunk", "drop --enable-mixed-chunk"),
        ("enable_prefill_cp", "drop --enable-prefill-cp"),
        # rows of DP-attention batches are not laid out as the dump hook assumes (unvalidated)
        ("enable_dp_attention", "drop --enable-dp-attention (its row layout is not validated)"),
    ):
        if info.get(key) is True:
            problems.append(f"{key} is on; {fix}")
    if info.get("pp_size", 1) not in (None, 1):
        problems.append(f"pp_size = {info['pp_size']}; extraction needs --pp-size 1")
    if info.get("attn_cp_size", 1) not in (None, 1):
        problems.append(f"attn_cp_size = {info['attn_cp_size']}; extraction needs 1")
    if tp is not None and info.get("tp_size") != tp:
        problems.append(f"tp_size = {info.get('tp_size')!r}, expected --tp-size {tp}")
    served = info.get("return_aux_hidden_state_layer_ids")
    if layers and served and sglang_layer_ids(list(served)) != sglang_layer_ids(layers):
        problems.append(
            f"the server captures layers {sglang_layer_ids(list(served))}, expected "
            f"{sglang_layer_ids(layers)} (--return-aux-hidden-state-layer-ids)"
        )
    return problems


def prefill_limit(info: dict[str, Any]) -> tuple[int | None, str]:
    """The longest sample this server can take as one prefill (chunked prefill is off): its KV
    pool (`max_total_num_tokens`, what --mem-fraction-static left after the weights), its input
    limit (`max_req_input_len`) and context length; the smallest wins, named."""
    limits = {
        k: int(info[k])
        for k in ("max_total_num_tokens", "max_req_input_len", "context_length")
        if isinstance(info.get(k), (int, float)) and info[k] > 0
    }
    if not limits:
        return None, ""
    key = min(limits, key=lambda k: limits[k])
    return limits[key], ", ".join(f"{k}={v}" for k, v in limits.items())


def long_sample_problem(info: dict[str, Any], lengths: dict[str, int]) -> str | None:
    """Refuse, before anything is sent, samples longer than one prefill can hold: SGLang would
    otherwise stall them in its queue or run out of memory mid-run (a 32-64K-token sample is one
    prefill here)."""
    limit, where = prefill_limit(info)
    if limit is None:
        return None
    over = sorted(((n, sid) for sid, n in lengths.items() if n > limit), reverse=True)
    if not over:
        return None
    shown = ", ".join(f"{sid} ({n} tokens)" for n, sid in over[:5])
    return (
        f"{len(over)} samples are longer than this server can prefill in one request "
        f"({limit} tokens: {where}), e.g. {shown}. Split or drop them (`eagle3 merge --max-len "
        f"{limit}`), or give the server more KV memory (--mem-fraction-static, a larger --tp)"
    )


# ---- optional: launch SGLang ourselves ----


def launch_command(
    model: Path,
    port: int,
    tp: int | None,
    layers: list[int] | None,
    extra_args: list[str],
    python: str = sys.executable,
    capture: list[str] | None = None,
) -> list[str]:
    """`capture`: the release's capture flags (sglang_versions.capture_flags; default 0.5.23's)."""
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(capture if capture is not None else sv.capture_flags(None, layers, None)),
        "--disable-radix-cache",
        "--chunked-prefill-size",
        "-1",
        "--disable-prefill-cuda-graph",
        "--skip-server-warmup",
        "--enable-return-hidden-states",  # the canary compares with SGLang's own rows
        # prefill-only requests never decode: decode graphs would be captured (GPU memory,
        # startup minutes on a big target) and never replayed; SpecForge disables them too
        "--disable-cuda-graph",
    ]
    if tp:
        cmd += ["--tp-size", str(tp)]
    return cmd + list(extra_args)


def dump_env(
    out: Path, rid_prefix: str, layers: list[int] | None, aux_dtype: str
) -> dict[str, str]:
    env = {
        "EAGLE3_DUMP_DIR": str(Path(out).resolve()),
        "EAGLE3_DUMP_RID_PREFIX": rid_prefix,
        "EAGLE3_DUMP_AUX_DTYPE": aux_dtype,
    }
    if layers:
        env["EAGLE3_DUMP_LAYER_IDS"] = ",".join(map(str, sglang_layer_ids(layers)))
    return env


class LaunchedServer:
    """SGLang started in its own process group, logging to a file; stopped with the group."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_healthy(self, http_: HttpClient, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        attempt = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(
                    f"SGLang exited with {self.proc.returncode}; see {self.log}:\n{self.tail()}"
                )
            try:
                http_.get("/health", timeout=5)
                return
            except ServerError:
                time.sleep(backoff_delay(attempt, base=0.5, cap=4.0))
                attempt += 1
        raise Failed(f"SGLang not healthy after {timeout:.0f}s; see {self.log}:\n{self.tail()}")

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log.close()
