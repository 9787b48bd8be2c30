"""`eagle3 tokenize`: conversations -> {id, source, input_ids, loss_mask} records.

Loss masks come from chat-template render boundaries (`loss_mask.py`): every assistant turn is
trained as the serving engine sees it. A sample whose template fails (or any of whose turns is
refused; its other turns are still written) is reported by index in the result line and in
OUT.errors.jsonl, never skipped silently;
more than `--max-failed` of them fails the command. Samples with no trainable token are counted
and dropped. Malformed input stops everything with `file:line` (exit 2) before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, Failed

HELP = "conversations -> input_ids + exact assistant loss masks (chat template)"
CHUNK = 64  # conversations per worker task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "input", type=Path, help="JSONL (or JSON list): ShareGPT, OpenAI or SpecForge"
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="target tokenizer/model dir")
    parser.add_argument("--out", type=Path, required=True, help="output OUT.jsonl")
    parser.add_argument("--source", help="source name stored in each record (default: input stem)")
    parser.add_argument(
        "--chat-template", type=Path, help="Jinja chat template file to use instead"
    )
    parser.add_argument(
        "--template-kwargs",
        default="{}",
        help="extra template variables as JSON, e.g. '{\"enable_thinking\": true}'",
    )
    parser.add_argument(
        "--reasoning",
        choices=("train", "mask", "drop"),
        default="train",
        help="assistant reasoning (reasoning_content or <think>): supervise it, keep it in the "
        "input but unsupervised, or remove it (default: train)",
    )
    parser.add_argument(
        "--turns",
        choices=("all", "last", "split"),
        default="all",
        help="supervise every assistant turn (turns share a sample while the template renders "
        "history unchanged; more samples, id#k, where it rewrites it), only the last, or one "
        "sample per assistant turn (default: all)",
    )
    parser.add_argument(
        "--max-failed",
        type=float,
        default=0.01,
        help="fail (exit 1, no output) when more than this fraction of samples fail the template",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="most tokenizer processes (default: the CPUs available, max 8); at most one per "
        "1,000 samples is started",
    )
    parser.add_argument("--trust-remote-code", action="store_true")


# -- worker side (also used in-process with --workers 1) -------------------------------------

_BUILDER: Any = None


def _init_worker(options: dict[str, Any]) -> None:
    global _BUILDER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from remote_agent.eagle3.data.loss_mask import MaskBuilder
    from remote_agent.eagle3.data.tokenizer_files import load_tokenizer

    tok = load_tokenizer(
        Path(options["tokenizer"]),
        Path(options["chat_template"]) if options["chat_template"] else None,
        options["trust_remote_code"],
    )
    _BUILDER = MaskBuilder(
        tok,
        reasoning=options["reasoning"],
        turns=options["turns"],
        template_kwargs=options["template_kwargs"],
    )


Item = tuple[int, int | None, str, list[dict[str, Any]], Any]  # index, line, id, messages, tools


def _work(chunk: list[Item]) -> list[tuple[Any, ...]]:
    from remote_agent.eagle3.data.loss_mask import TemplateError

    out: list[tuple[Any, ...]] = []
    for index, lineno, rid, messages, tools in chunk:
        try:
            samples, stats, errors = _BUILDER.build(rid, messages, tools)
        except TemplateError as exc:
            out.append(("error", (index, lineno, rid, str(exc))))
            continue
        produced = [(s.id, s.input_ids, s.loss_mask) for s in samples]
        out.append(("ok", (index, lineno, rid, "; ".join(errors)), produced, vars(stats)))
    return out


# -- command ---------------------------------------------------------------------------------


def _validate(path: Path) -> None:
    """Parse everything once (cheap next to tokenizing) so bad input costs nothing."""
    from remote_agent.eagle3.data.conversations import iter_conversations

    seen: dict[str, str] = {}
    for conv in iter_conversations(path):
        if conv.id in seen:
            raise BadInput(
                f"{path}:{conv.lineno if conv.lineno is not None else conv.index}: id {conv.id!r} "
                f"repeats (first at {seen[conv.id]}); ids must be unique within a source"
            )
        seen[conv.id] = conv.where


def _chunks(path: Path) -> Iterator[list[Item]]:
    from remote_agent.eagle3.data.conversations import iter_conversations

    chunk: list[Item] = []
    for conv in iter_conversations(path):
        chunk.append((conv.index, conv.lineno, conv.id, conv.messages, conv.tools))
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _count_lines(path: Path) -> int | None:
    if path.suffix == ".json":
        return None
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            n += block.count(b"\n")
    return n


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.atomic import AtomicWriter
    from remote_agent.eagle3.data.loss_mask import MaskStats
    from remote_agent.eagle3.data.records import Record
    from remote_agent.eagle3.progress import Progress, emit

    if not args.input.is_file():
        raise BadInput(f"{args.input}: no such file")
    try:
        kwargs = json.loads(args.template_kwargs)
    except ValueError as exc:
        raise BadInput(f"--template-kwargs: not valid JSON ({exc})") from None
    if not isinstance(kwargs, dict):
        raise BadInput("--template-kwargs: must be a JSON object")
    if not 0 <= args.max_failed <= 1:
        raise BadInput("--max-failed: must be a fraction between 0 and 1")
    source = args.source or args.input.stem
    options = {
        "tokenizer": str(args.tokenizer),
        "chat_template": str(args.chat_template) if args.chat_template else None,
        "trust_remote_code": args.trust_remote_code,
        "reasoning": args.reasoning,
        "turns": args.turns,
        "template_kwargs": kwargs,
    }
    _validate(args.input)

    _init_worker(options)  # also in the parent: a broken tokenizer/template fails fast here
    errors_path = args.out.with_name(args.out.name.removesuffix(".jsonl") + ".errors.jsonl")
    total = MaskStats()
    samples = records = tokens = trainable = dropped = 0
    failures: list[tuple[int, int | None, str, str]] = []
    lines = _count_lines(args.input)
    from remote_agent.eagle3.data.chunks import default_workers

    # a worker costs seconds to start (it imports transformers): at most one per 1,000 samples,
    # so `--workers 16` in a runbook does not make a small source slower
    workers = min(args.workers or default_workers(), max(1, (lines or 0) // 1000))
    progress = Progress("tokenize", lines, "samples")
    pool = None
    if workers > 1:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(
            workers, initializer=_init_worker, initargs=(options,)
        )
    try:
        results = pool.imap(_work, _chunks(args.input)) if pool else map(_work, _chunks(args.input))
        with AtomicWriter(args.out) as out:
            for batch in results:
                for item in batch:
                    samples += 1
                    if item[0] == "error":
                        failures.append(item[1])
                        continue
                    _, where, produced, stats = item
                    if where[3]:  # some turns refused; the others are written below
                        failures.append(where)
                    total.add(MaskStats(**stats))
                    if not produced and not where[3]:  # no assistant turn: nothing to train
                        dropped += 1
                    for rid, ids, mask in produced:
                        n_train = sum(mask)
                        if n_train == 0:
                            dropped += 1
                            continue
                        out.write(Record(rid, source, ids, mask).to_json().encode() + b"\n")
                        records += 1
                        tokens += len(ids)
                        trainable += n_train
                progress.advance(len(batch), failed=len(failures))
            if samples and len(failures) > args.max_failed * samples:
                _write_errors(errors_path, args.input, failures)
                raise Failed(
                    f"{len(failures)} of {samples} samples failed the chat template (more than "
                    f"--max-failed {args.max_failed}); first: sample {failures[0][0]} "
                    f"(id {failures[0][2]!r}): {failures[0][3]}; all in {errors_path}"
                )
    finally:
        if pool is not None:
            pool.terminate()
    if failures:
        _write_errors(errors_path, args.input, failures)
    else:
        errors_path.unlink(missing_ok=True)  # a stale file from an earlier run would mislead
    progress.finish()
    emit(
        "result",
        command="tokenize",
        out=str(args.out),
        source=source,
        samples=samples,
        records=records,
        tokens=tokens,
        trainable_tokens=trainable,
        dropped_no_trainable=dropped,
        template_failures=len(failures),
        failed_indexes=[f[0] for f in failures[:100]],
        errors_file=str(errors_path) if failures else None,
        **vars(total),
    )
    return 0


def _write_errors(
    path: Path, input_path: Path, failures: list[tuple[int, int | None, str, str]]
) -> None:
    from remote_agent.eagle3.atomic import write_bytes_atomic

    lines = [
        json.dumps({"input": str(input_path), "index": i, "line": ln, "id": rid, "error": msg})
        + "\n"
        for i, ln, rid, msg in failures
    ]
    write_bytes_atomic(path, "".join(lines).encode())
