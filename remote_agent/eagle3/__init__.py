"""The EAGLE-3 ML payload that runs on the GPU box.

Imports only torch, safetensors, transformers, tokenizers and numpy (lazily, per command), so it
runs inside the user's training environment; never textual, asyncssh or pydantic.
"""
