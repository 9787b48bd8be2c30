"""`eagle3 regenerate`: rewrite assistant turns with the target model's own answers.

Turn by turn: each user turn is sent with the *regenerated* history and the answer replaces the
original assistant turn (what the drafter must learn is the target's distribution, not another
model's). Output is append-only JSONL, one line per finished sample, flushed and fsynced, in the
SpecForge shape `{id, conversations: [{role, content, reasoning_content?}], meta}` that
`eagle3 tokenize` reads. Resume is by id: a sample with a line in OUT is never sent again; a torn
last line (killed mid-write) is cut off. Samples that fail after all retries go to
OUT.errors.jsonl and are retried by the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, Failed

HELP = "rewrite assistant turns through an OpenAI-compatible endpoint (resumable)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, help="conversations (ShareGPT, OpenAI or SpecForge)")
    parser.add_argument(
        "--out", type=Path, required=True, help="output JSONL (appended, resumable)"
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        help="base URL, e.g. http://127.0.0.1:30000/v1 or https://openrouter.ai/api/v1; "
        "repeat to spread requests round-robin (default http://127.0.0.1:30000/v1)",
    )
    parser.add_argument("--model", default="default", help="model name sent in each request")
    parser.add_argument(
        "--api-key-env", metavar="NAME", help="environment variable holding the API key"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="samples in flight (16)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request seconds (600)")
    parser.add_argument("--retries", type=int, default=6, help="retries per request (6)")
    parser.add_argument("--backoff", type=float, default=1.0, help="first backoff seconds (1.0)")
    parser.add_argument("--backoff-max", type=float, default=60.0, help="backoff cap seconds (60)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--extra-body", default="{}", help="JSON merged into every request body (e.g. top_p)"
    )
    parser.add_argument(
        "--reasoning",
        choices=("keep", "drop"),
        default="keep",
        help="store the server's reasoning_content with each answer, or drop it (keep)",
    )
    parser.add_argument("--limit", type=int, help="stop after this many samples of the input")
    parser.add_argument(
        "--max-failed",
        type=float,
        default=0.01,
        help="exit 1 when more than this fraction of the samples sent failed (0.01)",
    )


# -- conversation logic ------------------------------------------------------------------------


def regenerate_conversation(
    client: Any, messages: list[dict[str, Any]], keep_reasoning: bool
) -> tuple[list[dict[str, Any]], list[str | None]]:
    """The conversation with every assistant turn replaced by the model's answer to the
    regenerated history; a trailing user turn gets an answer too."""
    history: list[dict[str, Any]] = []  # what is sent: role/content only (no past reasoning)
    turns: list[dict[str, Any]] = []  # what is stored
    finish: list[str | None] = []

    def answer() -> None:
        c = client.complete(history)
        stored: dict[str, Any] = {"role": "assistant", "content": c.content}
        if keep_reasoning and c.reasoning:
            stored["reasoning_content"] = c.reasoning
        history.append({"role": "assistant", "content": c.content})
        turns.append(stored)
        finish.append(c.finish_reason)

    for m in messages:
        if m["role"] == "assistant":
            if history and history[-1]["role"] in ("user", "tool"):
                answer()
            continue  # the original answer is replaced (or dropped after another assistant turn)
        sent = {k: v for k, v in m.items() if k != "reasoning_content"}
        history.append(sent)
        turns.append(sent)
    if history and history[-1]["role"] == "user":
        answer()
    return turns, finish


# -- resume ------------------------------------------------------------------------------------


def load_done(out: Path) -> set[str]:
    """Ids already answered in OUT; a torn last line (no newline, not JSON) is cut off."""
    done: set[str] = set()
    if not out.exists():
        return done
    good_end = 0
    with open(out, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                obj = json.loads(raw)
                ok = isinstance(obj, dict) and isinstance(obj.get("id"), str)
            except (ValueError, RecursionError):
                ok = False
            if ok and raw.endswith(b"\n"):
                done.add(obj["id"])
                good_end += len(raw)
                continue
            if f.read(1):  # a bad line in the middle: not something we wrote
                raise BadInput(
                    f"{out}:{lineno}: not a line written by eagle3 regenerate; "
                    "move the file away or fix the line"
                )
    if good_end != out.stat().st_size:
        with open(out, "rb+") as f:
            f.truncate(good_end)
            os.fsync(f.fileno())
    return done


# -- command -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.atomic import write_bytes_atomic
    from remote_agent.eagle3.data.conversations import iter_conversations
    from remote_agent.eagle3.data.openai_client import ChatClient, FatalRequestError, RequestFailed
    from remote_agent.eagle3.progress import Progress, emit

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise BadInput(
                f"--api-key-env {args.api_key_env}: that environment variable is not set"
            )
    try:
        extra = json.loads(args.extra_body)
    except ValueError as exc:
        raise BadInput(f"--extra-body: not valid JSON ({exc})") from None
    if not isinstance(extra, dict):
        raise BadInput("--extra-body: must be a JSON object")
    if args.concurrency < 1 or args.retries < 0 or args.timeout <= 0:
        raise BadInput("--concurrency must be >= 1, --retries >= 0 and --timeout > 0")
    try:
        client = ChatClient(
            args.endpoint or ["http://127.0.0.1:30000/v1"],
            args.model,
            api_key=api_key,
            timeout=args.timeout,
            retries=args.retries,
            backoff=args.backoff,
            backoff_max=args.backoff_max,
            params={"temperature": args.temperature, "max_tokens": args.max_tokens, **extra},
        )
    except ValueError as exc:
        raise BadInput(f"--endpoint: {exc}") from None

    # Read (and validate) all input first: bad input must fail before any request is paid for.
    convs = []
    seen: set[str] = set()
    for conv in iter_conversations(args.input):
        if conv.id in seen:
            raise BadInput(
                f"{args.input}: {conv.where}: id {conv.id!r} repeats; ids must be unique"
            )
        seen.add(conv.id)
        convs.append(conv)
        if args.limit is not None and len(convs) >= args.limit:
            break
    done = load_done(args.out)
    todo = [c for c in convs if c.id not in done]
    errors_path = args.out.with_name(args.out.name.removesuffix(".jsonl") + ".errors.jsonl")
    keep = args.reasoning == "keep"

    progress = Progress("regenerate", len(todo), "samples")
    failures: list[dict[str, Any]] = []
    answered = 0
    stop = threading.Event()
    fatal: list[str] = []

    def work(conv: Any) -> tuple[Any, list[dict[str, Any]], list[str | None]]:
        if stop.is_set():
            raise RequestFailed("not sent: the run was stopped")
        turns, finish = regenerate_conversation(client, conv.messages, keep)
        return conv, turns, finish

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "ab") as out, ThreadPoolExecutor(args.concurrency) as pool:
        pending: set[Future] = set()
        conv_of: dict[Future, Any] = {}
        queue = iter(todo)
        exhausted = False
        while pending or not exhausted:
            # Keep at most 2x concurrency samples submitted: memory stays flat on big inputs.
            while not exhausted and not stop.is_set() and len(pending) < 2 * args.concurrency:
                conv = next(queue, None)
                if conv is None:
                    exhausted = True
                    break
                fut = pool.submit(work, conv)
                conv_of[fut] = conv
                pending.add(fut)
            if stop.is_set():
                exhausted = True
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                conv = conv_of.pop(fut)
                try:
                    conv, turns, finish = fut.result()
                except FatalRequestError as exc:
                    stop.set()
                    fatal.append(str(exc))
                    continue
                except RequestFailed as exc:
                    if not stop.is_set():
                        failures.append({"index": conv.index, "id": conv.id, "error": str(exc)})
                    continue
                line = {
                    "id": conv.id,
                    "conversations": turns,
                    "meta": {"model": args.model, "finish_reasons": finish},
                }
                out.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
                out.flush()
                os.fsync(out.fileno())
                answered += 1
                stats = client.stats
                progress.advance(
                    requests=stats.requests, retries=stats.retries, failed=len(failures)
                )
    client.close()
    progress.finish(requests=client.stats.requests, retries=client.stats.retries)
    if failures:
        lines = "".join(json.dumps(f) + "\n" for f in failures)
        write_bytes_atomic(errors_path, lines.encode())
    else:
        errors_path.unlink(missing_ok=True)
    summary = {
        "command": "regenerate",
        "out": str(args.out),
        "samples": len(convs),
        "already_done": len(convs) - len(todo),
        "answered": answered,
        "failed": len(failures),
        "requests": client.stats.requests,
        "retries": client.stats.retries,
        "retry_reasons": client.stats.by_reason,
        "errors_file": str(errors_path) if failures else None,
    }
    emit("result", **summary)
    if fatal:
        raise Failed(f"stopped: {fatal[0]}")
    sent = answered + len(failures)
    if failures and len(failures) > args.max_failed * max(sent, 1):
        raise Failed(
            f"{len(failures)} of {sent} samples failed (first: {failures[0]['id']}: "
            f"{failures[0]['error']}); see {errors_path}; run again to retry them"
        )
    return 0
