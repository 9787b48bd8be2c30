"""The check vocabulary, the one definition both sides use (a wire contract, stdlib only):
the names a runbook's `check:` may take (runbook/schema.py builds its models on them) and the
names the agent's `probe` op answers (remote_agent/agent/probes.py, one function each).
tests/runbook/test_check_vocabulary.py ties the schema's models and the probes to these names.
"""

from __future__ import annotations

# every `check:` a runbook may write, in the order error messages list them
RUNBOOK_CHECKS = (
    "path_exists",
    "path_absent",
    "sha256",
    "disk_free",
    "dir_size",
    "jsonl_records",
    "manifest",
    "step_succeeded",
    "command",
    "http_ok",
    "gpu_idle",
)
# evaluated by the engine from the run record, never sent to a box
ENGINE_CHECKS = ("step_succeeded",)
# probed on the box but never written in a runbook: the engine derives it from `delete:`
DERIVED_CHECKS = ("delete_target",)
# what the agent's `probe` op evaluates
BOX_CHECKS = tuple(c for c in RUNBOOK_CHECKS if c not in ENGINE_CHECKS) + DERIVED_CHECKS
