"""EAGLE-3 drafter: model, training-time-test trainer, checkpoints, SGLang export, evaluation.

Modules (each small and separately testable; heavy imports stay inside functions):

    config.py         typed training config (dataclasses, strict JSON/YAML loader)
    model.py          THE drafter model (Llama-style and MLA variants), one readable file
    ttt_attention.py  causal + diagonal attention across TTT steps (flex / chunked / dense)
    loss.py           teacher from stored final hidden x target lm_head; chunked soft CE
    data.py           dump x dataset join, token-budget packing, prefetching loader
    checkpoint.py     atomic, pruned checkpoints with exact resume
    simulate.py       simulated acceptance length from TTT predictions
    train.py          the training loop (linear, visible)
    contract.py       SGLang loader contract (names, shapes, capture ids)
    export.py         SGLang checkpoint writer (refuses to write what fails the contract)
    evaluate.py       torch reference speculative decoder (chain drafting, greedy verify)
"""
