"""How good a drafter is: `eagle3 eval` and the measurements beside it.

    eval_cmd.py          `eagle3 eval --target DIR --drafter EXPORT --data JSONL`
    evaluate.py          torch reference speculative decoder (chain drafting, greedy verify,
                         SGLang's accept-length accounting)
    teacher_forced.py    the training-time simulation on eval's own greedy outputs
    position_accept.py   acceptance by context position (long contexts)
    synthetic.py         small end-to-end inputs from a (tiny) target: tests, benches, GPU checks

Builds on model/, train/ (data, simulate, the step's pieces) and export/ (reading an export).
"""
