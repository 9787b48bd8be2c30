"""From a training checkpoint to a drafter SGLang loads: `eagle3 export`.

    export_cmd.py   `eagle3 export RUN_OR_CKPT --out DIR` (and `--init`)
    export.py       checkpoint -> SGLang drafter directory, checked against model/contract.py
                    (refuses to write what fails it); reading an export back
    untrained.py    `export --init`: an untrained drafter for a target, made without any dump
    serve_dtype.py  the dtype SGLang will run target and drafter in, refused when they differ

Builds on model/ and train/ (checkpoints, config, vocabulary).
"""
