"""Tiny but real targets, built offline, for the demo, the tests and the GPU runs (`eagle3
build-tiny`).

    deepseek.py        the DeepseekV3 presets (ci, gpu, kimi-gpu), their BPE tokenizer and model
    kimi.py            the Kimi-K2.5-shaped wrapper (kimi-k25-ci, kimi-k25-gpu) in the released layout
    kimi_remote/       the remote code that target ships beside its weights (tokenizer, processor)
    cache.py           ensure_tiny: each target built once, cached by preset, seed and versions
    data.py            chat data from the standard library (ShareGPT, OpenAI, SpecForge shapes)
    train.py           next-token training of a built target, then its own answers to prompts
    build_tiny_cmd.py  `eagle3 build-tiny`: a target, its data, optionally trained

kimi.py builds on deepseek.py's presets; cache.py picks between the two.
"""
