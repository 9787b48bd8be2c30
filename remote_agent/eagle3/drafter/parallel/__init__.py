"""Training over several processes: how the step module is wrapped and how a sequence is split.

    data_parallel.py  DDP or FSDP2 wrapping of the step module, full state across wrappings
    seq_attention.py  sequence parallelism's attention: a long sequence's rows split over ranks
    multinode.py      what a multi-node run needs beyond one node's (a shared train.out)

Builds on model/ only; the training step that runs under sequence parallelism is
train/seq_parallel_step.py.
"""
