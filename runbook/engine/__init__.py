"""The executor: drives a loaded runbook through the agents, one step at a time.

State machine (DESIGN.md): pending -> blocked (a guard failed or a confirmation was not given:
nothing ran) | running -> succeeded | failed | lost | cancelled; skipped by the operator.
Status and termination reason are separate fields.

Resumption is the normal path, not a special case: every decision reads the run's state file,
which is written *before* anything happens on the box (a step is recorded `running` with its job
id before `job.start`), so an engine killed at any point and started again either finds the job
(and follows its log from the saved cursor) or finds it was never started (and starts it, under
the same job id, which the agent refuses to start twice).

`Engine` (facade.py) is the operator's verbs over parts that each take what they need:
- the run record (record.py): runbook, state file, audit; every status change;
- hosts (hosts.py): a session per box, its stats (stats.py), the driver claim (box_claim.py);
- guards (guards.py, targets.py): evaluation on the box, delete targets; the confirmation gate
  (confirmgate.py, confirm.py) and the guards re-checked at launch (launchguards.py);
- jobs (jobs.py): launch once, follow the log into the mirror (logmirror.py), classify the end
  (outcome.py); services (services.py); fan-out over hosts (fanout.py);
- the step runner (steps.py: requirements, skip_if, retries, one attempt), the operator's
  actions (operator.py) and the dry run (dryrun.py).
"""

from __future__ import annotations

from runbook.engine.confirm import Confirmation, Confirmer, ConfirmRequest, headless_confirmer
from runbook.engine.constants import (
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    LOCAL,
    TOOL_VERSION,
    TransportFactory,
)
from runbook.engine.facade import Engine

__all__ = [
    "EXIT_BLOCKED",
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "LOCAL",
    "TOOL_VERSION",
    "Confirmation",
    "ConfirmRequest",
    "Confirmer",
    "Engine",
    "TransportFactory",
    "headless_confirmer",
]
