"""The tiny targets, built once and cached on disk: `ensure_tiny(preset)` returns the directory.

The DeepseekV3 presets are deepseek.py's, the Kimi-K2.5-shaped ones kimi.py's (`KIMI_WRAPPED`);
a built target is kept under `cache_root()` by preset, seed and the versions that change its bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from remote_agent.eagle3.tiny import deepseek, kimi
from remote_agent.eagle3.tiny.deepseek import PRESETS
from remote_agent.eagle3.tiny.kimi import KIMI_WRAPPED


@dataclass(frozen=True)
class TinyKey:
    preset: str
    seed: int
    python: str
    transformers: str
    tokenizers: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE3_CACHE", Path.home() / ".cache" / "eagle3"))


def ensure_tiny(preset_name: str = "ci", seed: int = 0, root: Path | None = None) -> Path:
    """Build (once) and return the directory of a tiny target: config, safetensors, tokenizer.

    Cached by preset, seed and the versions that change the bytes; safe against concurrent
    builders (build in a temp dir, then rename).
    """
    import platform

    import tokenizers
    import transformers

    if preset_name not in PRESETS and preset_name not in KIMI_WRAPPED:
        raise ValueError(f"unknown tiny preset {preset_name!r}")
    key = TinyKey(
        preset_name,
        seed,
        platform.python_version(),
        transformers.__version__,
        tokenizers.__version__,
    )
    root = root or cache_root()
    final = root / f"tiny-{preset_name}-{key.digest()}"
    tok_file = "tiktoken.model" if preset_name in KIMI_WRAPPED else "tokenizer.json"
    if (final / "config.json").exists() and (final / tok_file).exists():
        return final
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tok_dir = tmp / "tokenizer"
    if preset_name in KIMI_WRAPPED:
        base = KIMI_WRAPPED[preset_name]
        kimi.build_tokenizer(tok_dir, PRESETS[base].vocab_size - kimi.RESERVED)
        kimi.build_target(tmp / "model", tok_dir, base, seed)
    else:
        deepseek.build_tokenizer(tok_dir, PRESETS[preset_name].vocab_size)
        deepseek.build_target(tmp / "model", tok_dir, preset_name, seed)
    (tmp / "model" / "tiny.json").write_text(json.dumps(asdict(key), indent=1))
    try:
        os.replace(tmp / "model", final)
    except OSError:
        if not (final / "config.json").exists():
            raise
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return final
