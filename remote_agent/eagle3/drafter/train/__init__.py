"""Training the drafter: `eagle3 train`, read top-down from loop.py.

    train_cmd.py          `eagle3 train --config FILE` (argument parsing, then loop.train)
    config.py             typed training config (dataclasses, strict JSON/YAML loader, examples)
    loop.py               THE training loop: setup, then per batch step, clip, AdamW, log, save
    step.py               one optimisation step: teacher, TTT unroll, weighted soft CE, backward
    shards.py             the step of a long batch in query shards (one process)
    seq_parallel_step.py  the step of one batch split over ranks (sequence parallelism)
    data.py               dump x dataset join, token-budget packing, prefetching loader
    simulate.py           simulated acceptance length from the TTT predictions
    metrics.py            the metrics window (one sync per emitted line)
    metrics_breakdown.py  the two accuracy denominators, acceptance by data source
    state.py              what a checkpoint holds and the checks that make a resume the same run
    checkpoint.py         atomic, pruned checkpoints with exact resume
    finite.py             stop a run whose gradients stopped being numbers

Builds on model/ and parallel/; export/ and eval/ build on it.
"""
