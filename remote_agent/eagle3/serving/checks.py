"""Checks against a live SGLang server that serves the drafter (stdlib only).

`eagle3 serve-check`: the server really runs EAGLE-3 with our drafter and draft settings. The
classic silent failure is `--speculative-algorithm EAGLE` with an EAGLE-3 drafter: aux capture is
off, the drafter's `fc` is bypassed, and acceptance is exactly 1.0 with no error.

`eagle3 accept`: acceptance length the way SGLang reports it: for each request
completion_tokens / spec_verify_ct (the bonus token included, so 1.0 = nothing accepted), summed
over the requests that reached a verify step (token-weighted, like SpecForge's bench_eagle3),
with the per-request distribution and a 95 % confidence interval (accept_stats.py). Prompts are MT-Bench-style
(`{"question_id", "turns": [...]}`, both turns, each answered in context) or OpenAI `messages`,
rendered with the target's chat template, greedy (temperature 0). The mode is the one published
Kimi numbers use: the template's default (thinking on for Kimi-K2.5), turn 2 sees turn 1's answer
with its reasoning split off into `reasoning_content` (assistant_turn), never raw reasoning text.
"""

from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, Failed, located
from remote_agent.eagle3.http_client import HttpClient, HttpError
from remote_agent.eagle3.progress import Progress, emit


def http_json(url: str, payload: dict | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """GET (no payload) or POST one JSON object; anything else is Failed, with the URL."""
    try:
        reply = HttpClient(url, timeout).request("GET" if payload is None else "POST", "", payload)
    except (HttpError, ValueError) as exc:
        raise Failed(str(exc)) from None
    if not isinstance(reply, dict):
        raise Failed(f"{url}: expected a JSON object, got {str(reply)[:200]!r}")
    return reply


def server_info(base: str) -> dict[str, Any]:
    """The server's settings: the one reader, extraction/server.py's (/server_info, else the
    deprecated /get_server_info)."""
    from remote_agent.eagle3.extraction.server import Http
    from remote_agent.eagle3.extraction.server import server_info as read

    return read(Http(base, timeout=30))


def check_server(info: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """Mismatches between the running server and what the runbook expects (empty = fine)."""
    problems = []
    for key, want in expect.items():
        if want is None:
            continue
        got = info.get(key)
        if key == "speculative_draft_model_path" and got is not None:
            same = Path(str(got)).resolve() == Path(str(want)).resolve()
        else:
            same = got == want or str(got) == str(want)
        if not same:
            problems.append(f"{key} is {got!r}, expected {want!r}")
    algo = info.get("speculative_algorithm")
    if expect.get("speculative_algorithm") == "EAGLE3" and algo == "EAGLE":
        problems.append(
            "the server runs EAGLE, not EAGLE3: an EAGLE-3 drafter then silently accepts "
            "nothing (acceptance exactly 1.0); relaunch with --speculative-algorithm EAGLE3"
        )
    return problems


def load_prompts(path: Path, limit: int | None) -> list[list[dict[str, str]]]:
    """Each prompt is a list of user turns (MT-Bench) or a message list ending with a user turn."""
    out: list[list[dict[str, str]]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise BadInput(located(path, lineno, "not valid JSON")) from None
            if isinstance(obj, dict) and isinstance(obj.get("turns"), list):
                out.append([{"role": "user", "content": str(t)} for t in obj["turns"]])
            elif isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                msgs = [m for m in obj["messages"] if m.get("role") != "assistant"]
                out.append(
                    [{"role": m["role"], "content": str(m.get("content", ""))} for m in msgs]
                )
            else:
                raise BadInput(
                    located(
                        path, lineno, "expected {'turns': [...]} (MT-Bench) or {'messages': [...]}"
                    )
                )
            if limit and len(out) >= limit:
                break
    if not out:
        raise BadInput(f"{path}: no prompts")
    return out


def run_conversation(
    base: str, tok: Any, turns: list[dict[str, str]], max_new_tokens: int
) -> list[dict]:
    """Answer each user turn in context; returns per-turn meta (completion tokens, verify steps)."""
    history: list[dict[str, str]] = []
    stats = []
    for turn in turns:
        history.append(turn)
        if turn["role"] != "user":
            continue
        text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        resp = http_json(
            base.rstrip("/") + "/generate",
            {
                "input_ids": ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
            },
        )
        meta = resp.get("meta_info") or {}
        stats.append(
            {
                "completion_tokens": int(meta.get("completion_tokens", 0)),
                "spec_verify_ct": meta.get("spec_verify_ct"),  # absent: never verified
            }
        )
        history.append(assistant_turn(tok, resp))
    return stats


def assistant_turn(tok: Any, resp: dict[str, Any]) -> dict[str, str]:
    """The answer as the next turn's history, the way Kimi's published multi-turn numbers are
    run (thinking mode, the chat template's own rendering of past turns): the reasoning before
    `</think>` goes to `reasoning_content` (Kimi's template drops it from earlier turns), only
    the answer is `content`. Split on the generated ids, not the text: `</think>` is a special
    token, so the server's text has no marker left between reasoning and answer."""
    ids = resp.get("output_ids")
    end = tok.convert_tokens_to_ids("</think>") if "</think>" in tok.get_vocab() else None
    if isinstance(ids, list) and end is not None and end in ids:
        k = ids.index(end)
        reasoning = tok.decode(ids[:k], skip_special_tokens=True).strip()
        answer = tok.decode(ids[k + 1 :], skip_special_tokens=True).strip()
        return {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    return {"role": "assistant", "content": resp.get("text", "")}


def measure(
    base: str,
    tokenizer: str,
    prompts: list[list[dict[str, str]]],
    max_new_tokens: int,
    concurrency: int,
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=True)
    progress = Progress("accept", len(prompts), "prompts")
    lock = threading.Lock()
    per_request: list[dict] = []

    def one(turns: list[dict[str, str]]) -> None:
        stats = run_conversation(base, tok, turns, max_new_tokens)
        with lock:
            per_request.extend(stats)
            progress.advance(1)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for fut in [pool.submit(one, t) for t in prompts]:
            fut.result()
    progress.finish()
    from remote_agent.eagle3.serving.accept_stats import accept_stats

    return accept_stats(per_request)


# ------------------------------------------------------------------------------ commands
def add_serve_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--algorithm", default="EAGLE3", help="expected speculative_algorithm")
    p.add_argument("--draft", help="expected speculative_draft_model_path")
    p.add_argument("--steps", type=int, help="expected speculative_num_steps")
    p.add_argument("--topk", type=int, help="expected speculative_eagle_topk")
    p.add_argument("--draft-tokens", type=int, help="expected speculative_num_draft_tokens")


def run_serve_check(args: argparse.Namespace) -> int:
    info = server_info(args.url)
    expect = {
        "speculative_algorithm": args.algorithm,
        "speculative_draft_model_path": args.draft,
        "speculative_num_steps": args.steps,
        "speculative_eagle_topk": args.topk,
        "speculative_num_draft_tokens": args.draft_tokens,
    }
    problems = check_server(info, expect)
    emit(
        "result",
        stage="serve-check",
        ok=not problems,
        problems=problems,
        **{k: info.get(k) for k in expect},
    )
    if problems:
        raise Failed("; ".join(problems))
    print(
        f"{args.url}: serving {info.get('speculative_algorithm')} with {info.get('speculative_draft_model_path')}"
    )
    return 0


def add_accept_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument(
        "--prompts", type=Path, required=True, help="MT-Bench question.jsonl or messages JSONL"
    )
    p.add_argument("--tokenizer", required=True, help="the target's tokenizer (its chat template)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--limit", type=int, help="first N prompts only")
    p.add_argument(
        "--min-accept-length",
        type=float,
        default=1.0,
        help="fail (exit 1) below this; exactly 1.0 always fails (nothing accepted)",
    )
    p.add_argument("--out", type=Path, help="write the report JSON here")


def run_accept(args: argparse.Namespace) -> int:
    if not args.prompts.exists():
        raise BadInput(f"{args.prompts}: no such file")
    prompts = load_prompts(args.prompts, args.limit)
    info = server_info(args.url)
    report = measure(args.url, args.tokenizer, prompts, args.max_new_tokens, args.concurrency)
    report.update(
        {
            "server": {
                k: info.get(k)
                for k in (
                    "speculative_algorithm",
                    "speculative_draft_model_path",
                    "speculative_num_steps",
                    "speculative_eagle_topk",
                    "speculative_num_draft_tokens",
                )
            },
            "prompts": str(args.prompts),
        }
    )
    states = info.get("internal_states") or [{}]
    report["server_avg_spec_accept_length"] = (states[0] or {}).get("avg_spec_accept_length")
    if args.out:
        from remote_agent.eagle3.atomic import write_bytes_atomic

        write_bytes_atomic(args.out, (json.dumps(report, indent=1) + "\n").encode())
    emit("result", stage="accept", **{k: v for k, v in report.items() if k != "server"})
    acc = report["accept_length"]
    print(json.dumps(report, indent=1))
    if acc is None:
        raise Failed(
            "the server reported no verification steps: speculative decoding is not running"
        )
    if acc <= 1.0:
        raise Failed(
            f"acceptance length is {acc:.3f}: no draft token was ever accepted (a drafter served "
            "with --speculative-algorithm EAGLE instead of EAGLE3 looks exactly like this)"
        )
    if acc < args.min_accept_length:
        raise Failed(
            f"acceptance length {acc:.3f} is below --min-accept-length {args.min_accept_length}"
        )
    return 0
