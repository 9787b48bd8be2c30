"""The python parts of the real-SGLang GPU check (bench/gpu_sglang.sh, runbooks/gpu-sglang-check.yaml),
kept here so they run and are tested on CPU too (tests/eagle3/serving/test_gpu_sglang_check.py).

    python bench/gpu_sglang_check.py sglang-keys MODEL
    python bench/gpu_sglang_check.py prompts DATA.jsonl --out P.jsonl --limit N
    python bench/gpu_sglang_check.py server-info URL --out F.json
    python bench/gpu_sglang_check.py compare-dumps REF SGL --out F.json
    python bench/gpu_sglang_check.py reference-accept --target T --drafter D --prompts P --out F
    python bench/gpu_sglang_check.py report --work W --state S --out sglang-real.json
    python bench/gpu_sglang_check.py diag-launch --state S --step ID --out F.json [--variant V]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# the per-token verdict of two dumps (torch imported only when it compares)
from remote_agent.eagle3.extraction.agreement import (  # noqa: E402
    MAX_FLIP_SHARE,
    REL_TOL,
    dumps_agree,
    flip_share,
    token_rel_errs,
)

# keys Kimi-K2.5's config.json carries that transformers 5.17's DeepseekV3Config drops on save,
# but SGLang 0.5.14's deepseek_v2.py reads (the last run died on moe_layer_freq without them);
# the values are what transformers' DeepseekV3 computes anyway (sigmoid scores, noaux_tc routing)
SGLANG_KEYS = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
}


def sglang_keys(model: Path) -> dict[str, Any]:
    path = Path(model) / "config.json"
    top = json.loads(path.read_text())
    # a Kimi-K2.5 wrapper keeps the DeepSeek-V3 keys in text_config, as the real checkpoint does
    cfg = top["text_config"] if isinstance(top.get("text_config"), dict) else top
    added = {k: v for k, v in SGLANG_KEYS.items() if k not in cfg}
    rope = cfg.get("rope_parameters")
    if (
        cfg.get("rope_scaling") is None
        and isinstance(rope, dict)
        and rope.get("rope_type") != "default"
    ):
        # Kimi's config.json spells it rope_scaling; SGLang's MLA reads that name for its mscale
        added["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if added:
        cfg.update(added)
        path.write_text(json.dumps(top, indent=2) + "\n")
    return added


def _first_user_turn(rec: dict[str, Any]) -> str | None:
    for m in rec.get("messages") or []:
        if m.get("role") == "user" and m.get("content"):
            return str(m["content"])
    for m in rec.get("conversations") or []:
        if m.get("from") in ("human", "user") and m.get("value"):
            return str(m["value"])
    return None


def write_prompts(data: Path, out: Path, limit: int, max_chars: int = 1500) -> int:
    """MT-Bench-style single-turn prompts (`{"turns": [text]}`) from a conversation JSONL: one
    user turn each, so SGLang and the reference decoder see the very same tokens."""
    rows = []
    with open(data, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            text = _first_user_turn(json.loads(line))
            if text:
                rows.append(json.dumps({"turns": [text[:max_chars]]}))
            if len(rows) >= limit:
                break
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(rows) + "\n")
    return len(rows)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def save_server_info(url: str, out: Path) -> dict[str, Any]:
    """/server_info plus the context length SGLang derived (0.5.14's server_info has none at the
    top level: /v1/models reports it as max_model_len)."""
    info = _get(url.rstrip("/") + "/server_info")
    if info.get("context_length") is None:
        try:
            cards = _get(url.rstrip("/") + "/v1/models").get("data") or [{}]
            info["served_context_length"] = cards[0].get("max_model_len")
        except (OSError, ValueError) as exc:
            info["served_context_length_error"] = str(exc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=1, default=str))
    return info


def compare_dumps(
    ref: Path, sgl: Path, rel_tol: float = REL_TOL["bf16"], max_flip_share: float = MAX_FLIP_SHARE
) -> dict[str, Any]:
    """Token ids and per-tensor errors of the SGLang dumps against the HF reference extractor's.

    rel err is per sample max|sgl - ref| / max|ref| (a norm-relative figure: elementwise ratios
    explode on values near 0), the max over samples reported. The verdict is per token
    (extraction/agreement.py): `beyond_share` is the share of tokens whose relative L2 error
    exceeds `rel_tol`, and the dumps agree when the ids are identical and that share is at most
    `max_flip_share` for each tensor."""

    from remote_agent.eagle3.dense import DumpReader

    a, b = DumpReader(ref), DumpReader(sgl)
    common = sorted(set(a.ids()) & set(b.ids()))
    out: dict[str, Any] = {
        "samples_reference": len(a),
        "samples_sglang": len(b),
        "samples_compared": len(common),
        "ids_identical": bool(common) and len(a) == len(b),
        "aux_layer_ids": {"reference": a.meta.aux_layer_ids, "sglang": b.meta.aux_layer_ids},
        "max_abs_err": {},
        "max_rel_err": {},
        "mean_abs_err": {},
    }
    if a.meta.aux_layer_ids != b.meta.aux_layer_ids:
        out["ids_identical"] = False
        out["error"] = "the two dumps captured different layers"
        return out
    sums: dict[str, float] = {"aux": 0.0, "final": 0.0}
    count: dict[str, int] = {"aux": 0, "final": 0}
    beyond: dict[str, int] = {"aux": 0, "final": 0}
    tokens = 0
    for sid in common:
        x, y = a.get(sid), b.get(sid)
        if x["input_ids"].tolist() != y["input_ids"].tolist():
            out["ids_identical"] = False
            out.setdefault("ids_differ", []).append(sid)
            continue
        tokens += int(x["input_ids"].numel())
        for name in ("aux", "final"):
            r, s = x[name].float(), y[name].float()
            d = (s - r).abs()
            out["max_abs_err"][name] = max(out["max_abs_err"].get(name, 0.0), float(d.max()))
            rel = float(d.max() / r.abs().max().clamp_min(1e-12))
            out["max_rel_err"][name] = max(out["max_rel_err"].get(name, 0.0), rel)
            sums[name] += float(d.sum())
            count[name] += d.numel()
            beyond[name] += int((token_rel_errs(s, r) > rel_tol).sum())
    for name in sums:
        if count[name]:
            out["mean_abs_err"][name] = sums[name] / count[name]
    share = {k: flip_share(v, tokens) for k, v in beyond.items()}
    out.update(
        tokens_compared=tokens,
        rel_tol=rel_tol,
        max_flip_share=max_flip_share,
        tokens_beyond_tolerance=beyond,
        beyond_share=share,
        within_tolerance=bool(out["ids_identical"])
        and all(dumps_agree(v, max_flip_share) for v in share.values()),
    )
    a.close()
    b.close()
    return out


def reference_accept(
    target: Path,
    drafter: Path,
    prompts: Path,
    max_new_tokens: int,
    steps: int,
    device: str,
    dtype: str,
) -> dict[str, Any]:
    """The torch reference decoder's accept length on the prompts `eagle3 accept` sends, rendered
    the same way (serving.run_conversation), with the same estimator and CI (accept_stats)."""
    import torch

    from remote_agent.eagle3.drafter.eval.evaluate import Target, speculative_decode
    from remote_agent.eagle3.drafter.eval.synthetic import end_ids, load_target, text_config
    from remote_agent.eagle3.drafter.export.export import load_export
    from remote_agent.eagle3.drafter.model.contract import resolve_capture_ids
    from remote_agent.eagle3.serving.accept_stats import accept_stats
    from remote_agent.eagle3.serving.checks import load_prompts

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model, tok = load_target(Path(target), device, tdtype)
    draft, config = load_export(Path(drafter), device, tdtype)
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    aux = resolve_capture_ids(ids, text_config(model).num_hidden_layers)
    if config["hidden_size"] == config["target_hidden_size"]:
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight.to(tdtype))
    tgt, eos = Target(model, aux), end_ids(Path(target), tok)
    per, t0, outputs = [], time.time(), []
    for turns in load_prompts(Path(prompts), None):
        text = tok.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        dec = speculative_decode(tgt, draft, prompt, max_new_tokens, steps, eos)
        per.append({"completion_tokens": len(dec.tokens), "spec_verify_ct": dec.verify_steps})
        outputs.append(dec.tokens)
    out = accept_stats(per)
    out.update(seconds=round(time.time() - t0, 1), device=device, dtype=dtype, steps=steps)
    # why an accept length is what it is: a drafter can only ever propose draft-vocab tokens
    in_vocab = draft.t2d.cpu()
    flat = [t for o in outputs for t in o]
    out["outputs"] = {
        "in_draft_vocab": round(sum(bool(in_vocab[t]) for t in flat) / max(len(flat), 1), 4),
        "distinct_tokens": len(set(flat)),
        "first": outputs[0][:32] if outputs else [],
        "first_text": tok.decode(outputs[0][:32]) if outputs else "",
    }
    return out


def agree(sglang: dict[str, Any] | None, reference: dict[str, Any] | None) -> dict[str, Any]:
    """Both accept lengths with their CI95; they agree when either lies in the other's interval."""
    s = (sglang or {}).get("accept_length")
    r = (reference or {}).get("accept_length")
    s_ci, r_ci = (
        (sglang or {}).get("accept_length_ci95"),
        (reference or {}).get("accept_length_ci95"),
    )
    within = None
    if s is not None and r is not None and s_ci and r_ci:
        # the bounds are rounded to 4 decimals (accept_stats): a value on its own degenerate
        # interval (every request alike, e.g. [1.1429, 1.1429] around 1.142857) is inside it
        tol = 5e-5
        within = bool(r_ci[0] - tol <= s <= r_ci[1] + tol or s_ci[0] - tol <= r <= s_ci[1] + tol)
    return {
        "sglang": s,
        "reference": r,
        "ci95": {"sglang": s_ci, "reference": r_ci},
        "agree": within,
    }


def _load(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{path}: {exc}"}


def _text(path: Path, tail: int = 2000) -> str | None:
    try:
        return Path(path).read_text(errors="replace")[-tail:]
    except OSError:
        return None


def _stages(state: Path) -> dict[str, Any]:
    """Per-step status, seconds and message from the runbook's state (eagle-tui status --json)."""
    data = _load(state)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict):
        return {"error": data.get("error") if isinstance(data, dict) else "no state"}
    out = {}
    for sid, rec in steps.items():
        start, end = rec.get("started_at"), rec.get("ended_at")
        out[sid] = {
            "status": rec.get("status"),
            "seconds": round(end - start, 1) if start and end else None,
            "exit_code": rec.get("exit_code"),
            "message": (rec.get("reason") or "")
            + (f": {rec['message']}" if rec.get("message") else ""),
        }
        if rec.get("status") in ("failed", "lost") and rec.get("log_file"):
            # the why, in the report itself: the last lines of the step's log
            out[sid]["log_tail"] = (_text(Path(rec["log_file"]), 6000) or "").splitlines()[-40:]
    return out


def report(work: Path, state: Path, extra: dict) -> dict:
    w = Path(work)
    info = _load(w / "server-info-extract.json")
    serve_info = _load(w / "server-info-serve.json")
    vs = _load(w / "sglang-dumps" / "canary" / "vs-sglang.json")
    accept = _load(w / "accept.json")
    ref = _load(w / "reference-accept.json")
    res: dict[str, Any] = {
        # what the extraction server said it is (/server_info), never assumed
        "sglang_version": info.get("version") or extra.get("sglang_version") or "not recorded",
        "target_context_length": _context_length(info),
        "serve_context_length": _context_length(serve_info),
        "dumps_vs_reference": _load(w / "dumps-vs-reference.json"),
        "dumps_vs_sglang_hidden_states": {
            k: vs.get(k)
            for k in (
                "bit_exact",
                "samples",
                "shared_forward",
                "compared",
                "not_compared",
                "max_abs_err",
                "error",
            )
            if k in vs
        },
        "accept_length": agree(
            accept if "error" not in accept else None, ref if "error" not in ref else None
        ),
        "accept_report": accept,
        "reference_accept_report": ref,
        "serve_check": _text(w / "serve-check.txt"),
        "patch": {"apply": _load(w / "patch-apply.json"), "revert": _load(w / "patch-revert.json")},
        "stages": _stages(state),
        "commands": {"script": "bash bench/gpu_sglang.sh", **_commands(state)},
        **extra,
    }
    return res


W4A16_NOTE = (
    "not run: Kimi-K2.5's INT4 checkpoint is compressed-tensors W4A16 (pack-quantized, group 32); "
    "SGLang 0.5.14 serves it on Hopper through the Marlin/MoE-WNA16 kernels of sglang-kernel, but a "
    "tiny target needs every quantized dimension to be a multiple of the kernel tile (hidden and "
    "moe_intermediate >= 128-aligned per group) and a packer (llm-compressor) that is not in what "
    "one device call can carry beside SGLang; the check stays on the bf16 wrapper"
)


def _tokenizer_kind(model: Path) -> dict[str, Any]:
    cfg = _load(model / "tokenizer_config.json")
    auto = (cfg.get("auto_map") or {}).get("AutoTokenizer") if isinstance(cfg, dict) else None
    return {
        "kind": "tiktoken" if (model / "tiktoken.model").exists() else "tokenizers",
        "class": cfg.get("tokenizer_class") if isinstance(cfg, dict) else None,
        "remote_code": (auto[0] if isinstance(auto, list) else auto) if auto else None,
    }


def kimi_report(work: Path, base: dict[str, Any], flavours: list[str]) -> dict[str, Any]:
    """issue 26's keys: the wrapper, the tokenizer, the final-state check, both drafters."""
    w = Path(work)
    model = w / "target" / "model"
    cfg = _load(model / "config.json")
    vs = _load(w / "sglang-dumps" / "canary" / "vs-sglang.json")
    verify = _load(w / "verify-dumps.json")
    ref = base.get("dumps_vs_reference") or {}
    drafters: dict[str, Any] = {}
    for f in flavours:
        acc, rac = _load(w / f"accept-{f}.json"), _load(w / f"reference-accept-{f}.json")
        ag = agree(acc if "error" not in acc else None, rac if "error" not in rac else None)
        info = _load(w / f"server-info-serve-{f}.json")
        drafters[f] = {
            "accept_length": ag.get("sglang"),
            "reference_accept_length": ag.get("reference"),
            "ci95": ag.get("ci95"),
            "agree": ag.get("agree"),
            "serve_check": _text(w / f"serve-check-{f}.txt"),
            "architecture": (
                _load(w / f"drafter-{f}" / "config.json").get("architectures") or [None]
            )[0],
            "serve_context_length": _context_length(info),
            "accept_report": acc,
            "reference_accept_report": rac,
            "training": _last_metrics(w / f"drafter-run-{f}" / "metrics.jsonl"),
        }
    fsc = vs.get("final_state_check") or {}
    return {
        "target_architecture": (cfg.get("architectures") or [None])[0],
        "target_model_type": cfg.get("model_type"),
        "tokenizer": _tokenizer_kind(model),
        "sglang_version": base.get("sglang_version"),
        "target_context_length": base.get("target_context_length"),
        "dumps_vs_reference": {
            k: ref.get(k)
            for k in (
                "ids_identical",
                "samples_compared",
                "max_abs_err",
                "max_rel_err",
                "mean_abs_err",
                "tokens_compared",
                "rel_tol",
                "max_flip_share",
                "tokens_beyond_tolerance",
                "beyond_share",
                "within_tolerance",
                "aux_layer_ids",
                "error",
            )
            if k in ref
        },
        "dumps_vs_sglang_hidden_states": base.get("dumps_vs_sglang_hidden_states"),
        "final_state_check": {
            "prompts": fsc.get("prompts"),
            "argmax_matches": fsc.get("argmax_matches"),
            "exact_matches": fsc.get("exact_matches"),
            "vs_data": verify.get("final_state"),
        },
        "drafters": drafters,
        "online": online_summary(w / "online.json"),
        "revert_byte_identical": base.get("revert_byte_identical"),
        "calls": base.get("calls"),
        "w4a16": W4A16_NOTE,
        "patch": base.get("patch"),
        "stages": base.get("stages"),
        "commands": {**(base.get("commands") or {}), "script": "bash bench/gpu_sglang_kimi.sh"},
        **{
            k: v
            for k, v in base.items()
            if k
            in ("stubbed_modules", "script_seconds", "wall_seconds", "runbook_exit_code", "run")
        },
    }


def _last_metrics(path: Path) -> dict[str, Any] | None:
    """The trainer's last metrics record (loss, acc_k, simulated accept length): tells a drafter
    that did not learn from one that learned and is served wrong."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line.split("@@eagle3 ", 1)[-1])
        except ValueError:
            continue
        keep = ("step", "loss", "acc_k", "sim_accept_len", "tokens_per_s", "peak_mem_gb")
        return {k: rec[k] for k in keep if k in rec}
    return None


def online_summary(path: Path) -> dict[str, Any]:
    """issue 30's figures from the online bench's own file (bench_online.py, step online-bench),
    which travels beside this report as online.json."""
    r = _load(path)
    if not r or "error" in r:
        return {"status": "not run", **({"error": r["error"]} if "error" in r else {})}
    keys = ("tokens_per_s", "steady_tokens_per_s", "disk_bytes_written", "accept_length")
    return {
        "online": {k: (r.get("online") or {}).get(k) for k in keys},
        "offline": {k: (r.get("offline") or {}).get(k) for k in keys},
        "equal_to_offline": r.get("equal_to_offline"),
        "max_abs_diff_final_weights": r.get("max_abs_diff_final_weights"),
        "sglang_version": r.get("sglang_version"),
        "sglang_rows_vs_extraction": r.get("sglang_rows_vs_extraction"),
    }


def _context_length(info: Any) -> int | None:
    if not isinstance(info, dict):
        return None
    value = info.get("context_length") or info.get("served_context_length")
    return int(value) if value else None


def _commands(state: Path) -> dict[str, Any]:
    """The commands each step ran, interpolated, from the runbook's state."""
    data = _load(state)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict):
        return {}
    return {sid: rec.get("command") for sid, rec in steps.items() if rec.get("command")}


def runnable(state: Path, runbook: Path, tried: set[str], lost: bool = False) -> list[str]:
    """Steps not yet run whose `requires` all succeeded: what still makes sense after a failure
    (the script runs them one by one; asking the engine for a blocked step costs a start-up).
    `lost`: also steps left `lost`, for a resumed call whose predecessor's budget cut them (the
    2026-12-04 Kimi run lost train-mla that way, and the resume never retried it)."""
    import yaml

    data = _load(state)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict):
        return []
    spec = yaml.safe_load(Path(runbook).read_text())
    requires = {s["id"]: s.get("requires") or [] for s in spec["steps"]}
    done = {k for k, v in steps.items() if v.get("status") == "succeeded"}
    return [
        sid
        for sid, rec in steps.items()
        if rec.get("status") in (("pending", "blocked", "lost") if lost else ("pending", "blocked"))
        and sid not in tried
        and all(r in done for r in requires.get(sid, []))
    ]


# ---- when a server step died: the same launch by hand, variant by variant, with its log ----

SPEC_FLAGS = {  # flag -> how many values follow it
    "--speculative-algorithm": 1,
    "--speculative-draft-model-path": 1,
    "--speculative-num-steps": 1,
    "--speculative-eagle-topk": 1,
    "--speculative-num-draft-tokens": 1,
}


def launch_line(step_command: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv `eagle3 sglang-launch ...` would exec, from its own `--print`."""
    out = subprocess.run(
        ["bash", "-c", step_command + " --print"], capture_output=True, text=True, timeout=120
    )
    for line in out.stdout.splitlines():
        if line.startswith("launching: "):
            words = shlex.split(line[len("launching: ") :])
            env = {}
            while words and "=" in words[0] and not words[0].startswith("-"):
                k, _, v = words.pop(0).partition("=")
                env[k] = v
            # this interpreter: the step's `python` may be a link that only the job's PATH
            # resolves to the environment holding torch
            return env, [sys.executable, *words[1:]]
    raise SystemExit(
        f"no launch line from {step_command!r}: {out.stdout[-500:]}{out.stderr[-2000:]}"
    )


def variant_argv(argv: list[str], variant: str, port: int) -> list[str]:
    """`hook-off`: as launched; `no-spec`: without the speculative flags (the plain target)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--port":
            out += [a, str(port)]
            i += 2
            continue
        if variant == "no-spec" and a in SPEC_FLAGS:
            i += 1 + SPEC_FLAGS[a]
            continue
        out.append(a)
        i += 1
    return out


def try_launch(
    env: dict[str, str], argv: list[str], log: Path, port: int, wait_s: float
) -> dict[str, Any]:
    """Start it in its own group, wait for /health (or its exit), stop the group, report."""
    t0 = time.time()
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ready = False
    while time.time() - t0 < wait_s and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                ready = r.status == 200
        except OSError:
            pass
        if ready:
            break
        time.sleep(2)
    code = proc.poll()
    if code is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {
        "ready": ready,
        "exit_code": code,
        "seconds": round(time.time() - t0, 1),
        "log_tail": (_text(log, 8000) or "").splitlines()[-60:],
    }


def diag_launch(
    state: Path, step: str, out_dir: Path, variants: list[str], port: int, wait_s: float
) -> dict[str, Any]:
    rec = (_load(state).get("steps") or {}).get(step) or {}
    if not rec.get("command"):
        return {"error": f"no command recorded for {step}"}
    env, argv = launch_line(rec["command"])
    res: dict[str, Any] = {"step": step, "env": env, "argv": argv, "variants": {}}
    for v in variants:
        venv = {} if v in ("hook-off", "no-spec") else env
        out_dir.mkdir(parents=True, exist_ok=True)
        r = try_launch(venv, variant_argv(argv, v, port), out_dir / f"diag-{v}.log", port, wait_s)
        res["variants"][v] = r
        print(f"== diag {step} [{v}]: ready={r['ready']} exit={r['exit_code']} {r['seconds']}s")
        print("\n".join(r["log_tail"][-40:]), flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sglang-keys")
    s.add_argument("model", type=Path)
    s = sub.add_parser("prompts")
    s.add_argument("data", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--limit", type=int, default=32)
    s = sub.add_parser("server-info")
    s.add_argument("url")
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("compare-dumps")
    s.add_argument("ref", type=Path)
    s.add_argument("sgl", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument(
        "--rel-tol", type=float, default=REL_TOL["bf16"], help="per-token relative L2 error"
    )
    s.add_argument(
        "--max-flip-share", type=float, default=MAX_FLIP_SHARE,
        help="fail (exit 1) when more tokens than this share are beyond --rel-tol",
    )  # fmt: skip
    s = sub.add_parser("reference-accept")
    s.add_argument("--target", type=Path, required=True)
    s.add_argument("--drafter", type=Path, required=True)
    s.add_argument("--prompts", type=Path, required=True)
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--device", default="cuda")
    s.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("runnable")
    s.add_argument("--state", type=Path, required=True)
    s.add_argument("--runbook", type=Path, default=REPO / "runbooks" / "gpu-sglang-check.yaml")
    s.add_argument("--tried", default="", help="space-separated ids already tried")
    s.add_argument("--lost", action="store_true", help="also steps left lost (a resumed call)")
    s = sub.add_parser("diag-launch")
    s.add_argument("--state", type=Path, required=True)
    s.add_argument("--step", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--variant", action="append", default=[])
    s.add_argument("--port", type=int, default=30011)
    s.add_argument("--wait-s", type=float, default=100)
    s = sub.add_parser("report")
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--state", type=Path, required=True, help="eagle-tui status --json output")
    s.add_argument("--extra", type=Path, help="JSON merged into the report (staging facts)")
    s.add_argument("--flavours", help="comma list (llama,mla): issue 26's Kimi report layout")
    s.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "sglang-keys":
        print(json.dumps({"added": sglang_keys(a.model)}))
        return 0
    if a.cmd == "prompts":
        n = write_prompts(a.data, a.out, a.limit)
        print(f"{a.out}: {n} prompts")
        return 0 if n else 1
    if a.cmd == "server-info":
        info = save_server_info(a.url, a.out)
        print(
            json.dumps(
                {k: info.get(k) for k in ("version", "context_length", "speculative_algorithm")}
            )
        )
        return 0
    if a.cmd == "runnable":
        print(" ".join(runnable(a.state, a.runbook, set(a.tried.split()), a.lost)))
        return 0
    if a.cmd == "diag-launch":
        variants = a.variant or ["hook-off", "no-spec"]
        r = diag_launch(a.state, a.step, a.out.parent, variants, a.port, a.wait_s)
    elif a.cmd == "compare-dumps":
        r = compare_dumps(a.ref, a.sgl, a.rel_tol, a.max_flip_share)
    elif a.cmd == "reference-accept":
        r = reference_accept(
            a.target, a.drafter, a.prompts, a.max_new_tokens, a.steps, a.device, a.dtype
        )
    else:
        extra = _load(a.extra) if a.extra else {}
        r = report(a.work, a.state, extra if isinstance(extra, dict) else {})
        if a.flavours:
            r = kimi_report(a.work, r, a.flavours.split(","))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(r, indent=1, default=str) + "\n")
    print(
        json.dumps(
            {
                k: v
                for k, v in r.items()
                if k
                not in (
                    "stages",
                    "commands",
                    "accept_report",
                    "reference_accept_report",
                    "per_sample",
                )
            },
            default=str,
        )[:2000]
    )
    if a.cmd == "compare-dumps":
        return 0 if r.get("within_tolerance") else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
