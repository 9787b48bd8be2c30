"""A text-only stand-in for Kimi-K2.5's processor (remote code of eagle-tui's tiny target, not
Moonshot's): what SGLang's Kimi-K2.5 multimodal processor reads at startup (`tokenizer`,
`image_processor`, `media_processor.media_proc_cfg`), loaded by `AutoProcessor` with
trust_remote_code exactly as the real checkpoint's processor is. Images are refused."""

from __future__ import annotations

import json
import os
from typing import Any

from transformers import AutoTokenizer


class KimiK25MediaProcessor:
    def __init__(self, media_proc_cfg: dict[str, Any]) -> None:
        self.media_proc_cfg = media_proc_cfg

    def media_tokens_calculator(self, *args: Any, **kwargs: Any) -> int:
        raise NotImplementedError("the tiny Kimi-K2.5 target is text-only")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the tiny Kimi-K2.5 target is text-only")


class KimiK25Processor:
    attributes = ["tokenizer"]

    def __init__(self, tokenizer: Any, media_proc_cfg: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.media_processor = KimiK25MediaProcessor(media_proc_cfg)
        self.image_processor = self.media_processor
        self.chat_template = getattr(tokenizer, "chat_template", None)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoProcessor") -> None:
        """AutoProcessor calls this on remote classes; nothing to register for a stand-in."""

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> KimiK25Processor:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        with open(os.path.join(path, "preprocessor_config.json")) as f:
            cfg = json.load(f)["media_proc_cfg"]
        return cls(tok, cfg)

    def __call__(self, text: Any = None, medias: Any = None, **kwargs: Any) -> Any:
        if medias:
            raise NotImplementedError("the tiny Kimi-K2.5 target is text-only")
        return self.tokenizer(text, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.decode(*args, **kwargs)

    def batch_decode(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.batch_decode(*args, **kwargs)
