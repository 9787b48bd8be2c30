"""Maintainer tool: recompute the hash table entry (and the review diff) from the real wheel.

    python -m remote_agent.eagle3.patching.rehash [--version 0.5.23] [--wheel PATH]

Run it only after reviewing a change to the patch spec or the helper files; the CPU tests fail
until the table matches what the spec and the helper sources produce.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import zipfile
from pathlib import Path

from remote_agent.eagle3.patching.blocks import apply_blocks, load_spec
from remote_agent.eagle3.patching.hashes import (
    TABLE_NAME,
    TARGET_RELPATH,
    parse_record,
    patches_dir,
    sha256_bytes,
    sha256_file,
)
from remote_agent.eagle3.patching.wheel import find_or_download_wheel

SPEC_NAME = "deepseek_v2.eagle3-dump.json"
_DRIFT_COMMON = (  # relied on, not patched (reference §6.6 plus what the hook and client read)
    "sglang/srt/models/kimi_k25.py",
    "sglang/srt/models/kimi_k25_eagle3.py",
    "sglang/srt/layers/logits_processor.py",
    "sglang/srt/model_executor/forward_batch_info.py",
    "sglang/srt/runtime_context.py",
)
# per version: 0.5.14 has neither aux_hidden_states.py nor arg_groups/fields/ (its server args
# are one dataclass in server_args.py)
DRIFT_FILES_BY_VERSION = {
    "0.5.14": (
        *_DRIFT_COMMON,
        "sglang/srt/server_args.py",
        # extraction through a drafter: eagle_config layer ids, target prefill capture mode,
        # the rows return_hidden_states hands back (the canary's reference)
        "sglang/srt/model_executor/model_runner.py",
        "sglang/srt/speculative/eagle_worker_v2.py",
        "sglang/srt/managers/scheduler_components/batch_result_processor.py",
    ),
    "0.5.23": (
        *_DRIFT_COMMON,
        "sglang/srt/layers/aux_hidden_states.py",
        "sglang/srt/arg_groups/fields/exec_.py",
        "sglang/srt/arg_groups/fields/memory.py",
        "sglang/srt/arg_groups/fields/schedule.py",
    ),
}
DRIFT_FILES = DRIFT_FILES_BY_VERSION["0.5.23"]


def drift_files(version: str) -> tuple[str, ...]:
    if version not in DRIFT_FILES_BY_VERSION:
        raise SystemExit(f"sglang {version}: no drift file list; add one to DRIFT_FILES_BY_VERSION")
    return DRIFT_FILES_BY_VERSION[version]


HELPER_FILES = {
    "__init__.py": "patches/eagle3_dump/__init__.py",
    "hook.py": "patches/eagle3_dump/hook.py",
    "compat.py": "patches/eagle3_dump/compat.py",
    "dense.py": "remote_agent/eagle3/dense.py",
    "stream_wire.py": "remote_agent/eagle3/stream_wire.py",
}


def diff_name(version: str) -> str:
    return f"sglang-{version}-deepseek_v2.eagle3-dump.diff"


def review_diff(pristine: bytes, patched: bytes) -> str:
    return "".join(
        difflib.unified_diff(
            pristine.decode().splitlines(keepends=True),
            patched.decode().splitlines(keepends=True),
            fromfile=f"a/{TARGET_RELPATH}",
            tofile=f"b/{TARGET_RELPATH}",
        )
    )


def build_entry(version: str, wheel: Path, root: Path) -> tuple[dict, dict, bytes, bytes]:
    spec = load_spec(root / SPEC_NAME)
    with zipfile.ZipFile(wheel) as zf:
        record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        record = parse_record(zf.read(record_name).decode())
        pristine = zf.read(TARGET_RELPATH)
        drift = {rel: sha256_bytes(zf.read(rel)) for rel in drift_files(version)}
    if record[TARGET_RELPATH] != sha256_bytes(pristine):
        raise SystemExit(f"{wheel}: RECORD disagrees with {TARGET_RELPATH}")
    patched = apply_blocks(pristine.decode(), spec).encode()
    entry = {
        "sglang": version,
        "path": TARGET_RELPATH,
        "pristine_sha256": sha256_bytes(pristine),
        "pristine_size": len(pristine),
        "patched_sha256": sha256_bytes(patched),
        "patch": SPEC_NAME,
        "patch_version": spec.patch_version,
        "wheel": wheel.name,
    }
    return entry, drift, pristine, patched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "rehash").splitlines()[0])
    parser.add_argument("--version", default="0.5.23")
    parser.add_argument("--wheel", type=Path)
    args = parser.parse_args(argv)
    root = patches_dir()
    wheel = args.wheel or find_or_download_wheel(args.version)
    entry, drift, pristine, patched = build_entry(args.version, wheel, root)
    path = root / TABLE_NAME
    table = json.loads(path.read_text()) if path.exists() else {}
    entries = [e for e in table.get("entries", []) if e["sglang"] != args.version]
    table = {
        "format": "eagle3-patch-hashes",
        "version": 1,
        "entries": sorted([*entries, entry], key=lambda e: (e["sglang"], e["path"])),
        "drift": {**table.get("drift", {}), args.version: drift},
        "helper": {
            "install_dir": "sglang/srt/eagle3_dump",
            "files": {
                name: {"source": src, "sha256": sha256_file(root.parent / src)}
                for name, src in HELPER_FILES.items()
            },
        },
    }
    path.write_text(json.dumps(table, indent=1) + "\n")
    (root / diff_name(args.version)).write_text(review_diff(pristine, patched))
    print(f"{path}: sglang {args.version} patched sha256 {entry['patched_sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
