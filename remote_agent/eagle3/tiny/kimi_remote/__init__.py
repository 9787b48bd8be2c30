"""Remote code the tiny Kimi-K2.5 target ships beside its weights (loaded by transformers and
SGLang with trust_remote_code, never imported by eagle-tui itself): a tiktoken tokenizer shaped
like Kimi's `tokenization_kimi.py` and a text-only stand-in for Kimi's processor."""
