"""The drafter model and what its forward and loss are made of (no training loop, no data).

    model.py          THE drafter (Llama-style and MLA variants), one readable file
    ttt_attention.py  causal + diagonal attention across TTT steps (flex / chunked / dense)
    merge.py          the TTT diagonal merge in closed form (plain, compiled, recomputed)
    memory.py         exact memory savings of the unroll (shared casts, recompute, host weight)
    loss.py           teacher from stored final hidden x target lm_head; fused chunked soft CE
    compiled.py       torch.compile'd functions made once per process
    contract.py       SGLang's loader contract (names, shapes, capture ids)
    context.py        the drafter's context length, from the target's config

Imports nothing from the other drafter packages (parallel/, train/, export/, eval/ build on it).
"""
