"""The target model's identity, recorded in a dump (DUMP/model_identity.json) at extraction and
checked wherever the dump meets a model again: extraction resume (reference and SGLang),
`verify-dumps --model` and `train` (target.path).

Shapes alone (hidden size, layer count, meta.json) do not tell two checkpoints of one
architecture apart: a dump extracted from checkpoint A and resumed against checkpoint B mixes
two models' hidden states without an error. The identity is
  - config_sha256     sha256 of config.json,
  - tokenizer_sha256  data/tokenizer_files.py's hash of the tokenizer files (None: none there),
  - weights_sha256    sha256 over every *.safetensors file's name, size and CHUNKS byte
                      samples spread evenly over its tensor data (1 MiB per file: ~64 MiB for
                      Kimi-K2.5's 64 shards). Retrained or fine-tuned weights differ in every
                      sample; one differing in only a few small tensors can slip by;
and the resolved path (reported, not compared: a copy of the model elsewhere is the same).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

FILE = "model_identity.json"
CHUNK, CHUNKS = 1 << 16, 16  # 1 MiB read per safetensors file
KEYS = ("config_sha256", "tokenizer_sha256", "weights_sha256")


def model_identity(model_dir: Path) -> dict[str, Any]:
    from remote_agent.eagle3.data.tokenizer_files import tokenizer_sha256
    from remote_agent.eagle3.patching.hashes import sha256_file

    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    if not config.is_file():
        raise BadInput(f"{model_dir}: no config.json (need the Hugging Face model directory)")
    try:
        tok: str | None = tokenizer_sha256(model_dir)
    except BadInput:
        tok = None  # a weights-only directory: the other two still identify it
    return {
        "path": str(model_dir.resolve()),
        "config_sha256": sha256_file(config),
        "tokenizer_sha256": tok,
        "weights_sha256": weights_sha256(model_dir),
    }


def weights_sha256(model_dir: Path) -> str | None:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0")
        with open(f, "rb") as fh:
            head = fh.read(8)
            start = 8 + struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            start = min(start, size)  # a truncated file still hashes (its size differs)
            span = max(size - start - CHUNK, 0)
            for i in range(CHUNKS):  # evenly spaced over the tensor data, both ends included
                fh.seek(start + span * i // (CHUNKS - 1))
                h.update(fh.read(CHUNK))
    return h.hexdigest()


def read_identity(dump: Path) -> dict[str, Any] | None:
    path = Path(dump) / FILE
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except ValueError as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None
    if not isinstance(obj, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return obj


def differences(recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
    return [k for k in KEYS if recorded.get(k) != given.get(k)]


def check_identity(dump: Path, model_dir: Path, what: str) -> dict[str, Any] | None:
    """Refuses (BadInput) a dump whose recorded identity differs from `model_dir`'s; returns
    the recorded identity (None: an older dump without one, said on stderr)."""
    recorded = read_identity(dump)
    if recorded is None:
        print(
            f"{what}: {dump} records no model identity (made before identities were recorded); "
            f"not checked against {model_dir}",
            file=sys.stderr,
        )
        return None
    given = model_identity(model_dir)
    diff = differences(recorded, given)
    if diff:
        raise BadInput(
            f"{what}: {dump} was extracted from {recorded.get('path')} but the model given is "
            f"{given['path']}; they differ in "
            + ", ".join(f"{k} ({str(recorded.get(k))[:12]} vs {str(given[k])[:12]})" for k in diff)
            + " (use the dump's model, or a new dump directory)"
        )
    return recorded


def record_identity(dump: Path, model_dir: Path, what: str) -> dict[str, Any]:
    """At extraction: check an existing record (resume), else write one. Returns it."""
    from remote_agent.eagle3.data.records import write_json_atomic

    recorded = read_identity(dump)
    if recorded is not None:
        check_identity(dump, model_dir, what)
        return recorded
    ident = model_identity(model_dir)
    Path(dump).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(dump) / FILE, ident)
    return ident
