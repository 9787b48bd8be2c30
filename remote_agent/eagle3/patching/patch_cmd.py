"""`eagle3 patch status|apply|revert|fetch-pristine`: the hash-guarded SGLang dump patch.

Exit codes: 0 pristine/patched (status), applied or already applied (apply), reverted or already
pristine (revert); 1 refused (the file is neither pristine nor the reviewed patched file, or the
version is unknown), with both hashes and the reason; 2 bad input (no target).
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, Failed

HELP = "status|apply|revert the SGLang deepseek_v2.py hidden-state dump patch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("status", "apply", "revert", "fetch-pristine"))
    parser.add_argument(
        "--target",
        type=Path,
        help="deepseek_v2.py to check/patch (default: the installed sglang's, found "
        "through importlib.metadata without importing sglang)",
    )
    parser.add_argument("--version", help="sglang version (default: dist-info, else the hash)")
    parser.add_argument(
        "--helper-dir",
        type=Path,
        help="where the helper package goes (default <site>/sglang/srt/eagle3_dump)",
    )
    parser.add_argument("--no-helper", action="store_true", help="apply without the helper")
    parser.add_argument("--out", type=Path, help="fetch-pristine: where to write the file")
    parser.add_argument("--wheel", type=Path, help="fetch-pristine: use this wheel file")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _target(args: argparse.Namespace) -> Path:
    from remote_agent.eagle3.patching.hashes import default_target

    target = args.target or default_target()
    if target is None:
        raise BadInput("sglang is not installed in this environment; pass --target PATH")
    if not Path(target).is_file():
        raise BadInput(f"{target}: no such file")
    return Path(target)


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.progress import emit

    if args.action == "fetch-pristine":
        from remote_agent.eagle3.patching.wheel import fetch_pristine

        if args.out is None:
            raise BadInput("fetch-pristine needs --out FILE")
        info: dict[str, Any] = fetch_pristine(args.version or "0.5.23", args.out, args.wheel)
        print(json.dumps(info) if args.json else f"wrote {info['out']} ({info['sha256']})")
        emit("result", ok=True, action="fetch-pristine", **info)
        return 0

    from remote_agent.eagle3.patching import patcher

    target = _target(args)
    if args.action == "status":
        outcome = patcher.status(target, args.version, args.helper_dir)
    else:
        try:
            if args.action == "apply":
                outcome = patcher.apply(target, args.version, args.helper_dir, not args.no_helper)
            else:
                outcome = patcher.revert(target, args.version, args.helper_dir)
        except OSError as exc:  # root-owned / read-only site-packages
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise Failed(
                f"{target}: cannot {args.action} the patch: {exc.strerror} ({exc.filename}); "
                "run as the owner of the SGLang install (or make it writable); the file is unchanged"
            ) from None
    record = outcome.to_json()
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        check = outcome.check
        print(f"{outcome.action}: {target}")
        print(f"  state    {check.state} (sglang {check.version}, from {check.version_source})")
        print(f"  sha256   {check.sha256}")
        print(f"  pristine {check.pristine_sha256}")
        print(f"  patched  {check.patched_sha256}")
        print(f"  helper   {outcome.helper.get('state')} at {outcome.helper.get('dir')}")
        if outcome.backup:
            print(f"  backup   {outcome.backup}")
        for d in check.drift:
            print(f"  warning: {d['path']} changed ({d['actual']} != {d['expected']})")
        print(outcome.message, file=sys.stderr if not outcome.ok else sys.stdout)
    emit(
        "result",
        ok=outcome.ok,
        action=outcome.action,
        state=outcome.check.state,
        sha256=outcome.check.sha256,
        target=str(target),
    )
    return 0 if outcome.ok else 1
