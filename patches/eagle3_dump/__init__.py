"""EAGLE-3 hidden-state dump helper for SGLang, installed by `eagle3 patch apply` as the package
`sglang/srt/eagle3_dump/` (outside `sglang/srt/models/`, whose modules the model registry imports).
The patched `deepseek_v2.py` calls `dump(...)` only when EAGLE3_DUMP_DIR was set at launch."""

from .hook import dump, reset

__all__ = ["dump", "reset"]
