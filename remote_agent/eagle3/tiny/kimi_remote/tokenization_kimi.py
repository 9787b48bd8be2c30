"""A tiktoken tokenizer in the shape of Kimi-K2.5's `tokenization_kimi.py` (written for eagle-tui's
tiny target, not Moonshot's code): a `tiktoken.model` BPE file (base64 token bytes + rank per
line), Kimi's split pattern, and 256 reserved special ids right after the base vocabulary whose
names come from `added_tokens_decoder` in tokenizer_config.json. Like Kimi's, it is a slow
(python) tokenizer: no offset mapping."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
RESERVED_SPECIAL = 256
# Kimi's pre-tokenisation: Han runs, cased words with English contractions, 1-3 digit numbers,
# punctuation runs, newlines, whitespace
PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (token strings stay printable)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: Any = "[BOS]",
        eos_token: Any = "[EOS]",
        unk_token: Any = "[UNK]",
        pad_token: Any = "[PAD]",
        added_tokens_decoder: dict | None = None,
        **kwargs: Any,
    ) -> None:
        if not os.path.isfile(vocab_file):
            raise ValueError(f"{vocab_file}: no tiktoken.model")
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        base = len(ranks)
        names = {}
        for i, tok in (added_tokens_decoder or {}).items():
            names[int(i)] = tok["content"] if isinstance(tok, dict) else str(tok)
        self.special_tokens = {
            names.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + RESERVED_SPECIAL)
        }
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name,
            pat_str=PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words = self.model.n_vocab
        alphabet = byte_alphabet()
        self._byte_of = {c: b for b, c in alphabet.items()}
        self._str_of: dict[int, str] = {}
        for token_bytes, rank in ranks.items():
            self._str_of[rank] = "".join(alphabet[b] for b in token_bytes)
        for name, i in self.special_tokens.items():
            self._str_of[i] = name
        self._id_of = {s: i for i, s in self._str_of.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self._id_of)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # special tokens were split off by the base class; the rest is plain BPE text
        return [self._str_of[i] for i in self.model.encode(text, disallowed_special=())]

    def _convert_token_to_id(self, token: str) -> int:
        return self._id_of.get(token, self.special_tokens[str(self.unk_token)])

    def _convert_id_to_token(self, index: int) -> str:
        return self._str_of[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = bytearray()
        for t in tokens:
            if t in self.special_tokens:
                out += t.encode()
            else:
                out += bytes(self._byte_of[c] for c in t)
        return out.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None):
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(self.vocab_file) != os.path.abspath(out):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
