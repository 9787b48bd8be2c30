"""Loading the target's tokenizer and describing it (vocabulary size, content hash).

`vocab_size` and `tokenizer_sha256` read `tokenizer.json` with the `tokenizers` library when it is
there (fast: no transformers import), so verify and vocab stay quick.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

# Files whose bytes decide how text becomes ids (and how conversations render).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "merges.txt",
)


def _dir(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such tokenizer directory")
    return path if path.is_dir() else path.parent


def load_tokenizer(
    path: Path, chat_template_file: Path | None = None, trust_remote_code: bool = False
) -> Any:
    """A transformers tokenizer; `chat_template_file` replaces the tokenizer's template."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(_dir(path)), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: cannot load a tokenizer ({exc})") from None
    if chat_template_file is not None:
        try:
            tok.chat_template = Path(chat_template_file).read_text()
        except OSError as exc:
            raise BadInput(f"{chat_template_file}: cannot read the chat template ({exc})") from None
    if not getattr(tok, "chat_template", None):
        raise BadInput(f"{path}: the tokenizer has no chat template; pass --chat-template FILE")
    return tok


def remote_code_files(d: Path) -> list[str]:
    """The .py files a trust_remote_code tokenizer runs (Kimi: tokenization_kimi.py): named in
    tokenizer_config.json's auto_map, plus any tokenization_*.py beside it."""
    names = {p.name for p in d.glob("tokenization_*.py")}
    try:
        auto = json.loads((d / "tokenizer_config.json").read_text()).get("auto_map") or {}
    except (OSError, ValueError):
        auto = {}
    refs = auto.get("AutoTokenizer") if isinstance(auto, dict) else None
    for ref in refs if isinstance(refs, list) else [refs]:
        if isinstance(ref, str) and "." in ref:
            names.add(ref.split("--")[-1].rsplit(".", 1)[0] + ".py")
    return sorted(n for n in names if (d / n).is_file())


def tokenizer_sha256(path: Path) -> str:
    """sha256 over the tokenizer's defining files (name + bytes), in a fixed order; remote code
    counts (its .py decides how text becomes ids as much as the vocabulary does)."""
    d = _dir(path)
    h = hashlib.sha256()
    found = False
    for name in (*TOKENIZER_FILES, *remote_code_files(d)):
        f = d / name
        if f.is_file():
            found = True
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    if not found:
        raise BadInput(f"{d}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)")
    return h.hexdigest()


def vocab_size(path: Path) -> int:
    """Number of valid token ids: base vocabulary plus added tokens."""
    d = _dir(path)
    tj = d / "tokenizer.json"
    if tj.is_file():
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(tj)).get_vocab_size(with_added_tokens=True)
        except Exception as exc:  # the Rust loader raises its own exception type
            raise BadInput(f"{tj}: cannot load ({exc})") from None
    return len(load_tokenizer(d, trust_remote_code=True))


def model_vocab_size(path: Path) -> int:
    """Rows of the target's lm_head: config.json's vocab_size when present (it may be padded
    beyond the tokenizer), else the tokenizer's size."""
    cfg = _dir(path) / "config.json"
    if cfg.is_file():
        try:
            obj = json.loads(cfg.read_text())
        except ValueError as exc:
            raise BadInput(f"{cfg}: not valid JSON ({exc})") from None
        text_cfg = obj.get("text_config") if isinstance(obj.get("text_config"), dict) else obj
        size = text_cfg.get("vocab_size", obj.get("vocab_size"))
        if isinstance(size, int) and size > 0:
            return size
    return vocab_size(path)
