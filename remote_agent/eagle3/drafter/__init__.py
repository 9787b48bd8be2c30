"""EAGLE-3 drafter: model, training-time-test trainer, checkpoints, SGLang export, evaluation.

Sub-packages, torchtitan-style (each small and separately testable, each importing only those
before it in this list: tests/test_import_graph.py; heavy imports stay inside functions):

    model/      the drafter (model/model.py, one readable file), the TTT attention and its merge,
                the exact memory options, the fused loss, SGLang's loader contract, the context
    parallel/   data parallelism (DDP / FSDP2), sequence-parallel attention, multi-node checks
    train/      `eagle3 train`: config, the loop (train/loop.py) and one step (train/step.py),
                both read top-down; data, metrics, checkpoints and resume
    export/     `eagle3 export`: checkpoint -> SGLang drafter (refuses what fails the contract)
    eval/       `eagle3 eval`: torch reference speculative decoder, acceptance by position,
                synthetic inputs from a tiny target
    examples/   shipped training configs

README.md in this directory: the commands, what a run writes, the conventions.
"""
