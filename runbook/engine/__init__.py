"""The executor: drives a loaded runbook through the agents, one step at a time.

State machine (DESIGN.md): pending -> blocked (a guard failed or a confirmation was not given:
nothing ran) | running -> succeeded | failed | lost | cancelled; skipped by the operator.
Status and termination reason are separate fields.

Resumption is the normal path, not a special case: every decision reads the run's state file,
which is written *before* anything happens on the box (a step is recorded `running` with its job
id before `job.start`), so an engine killed at any point and started again either finds the job
(and follows its log from the saved cursor) or finds it was never started (and starts it, under
the same job id, which the agent refuses to start twice).

One concern per module: core (state, audit, sessions), guards, targets, launchguards, confirm + confirmgate, runner (attempts and
launches), fanout (one step on several hosts), services, logmirror, outcome (exit classification), operator, dryrun, stats.
"""

from __future__ import annotations

from runbook.engine.confirm import Confirmation, Confirmer, ConfirmRequest, headless_confirmer
from runbook.engine.confirmgate import ConfirmGateMixin
from runbook.engine.constants import (
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    LOCAL,
    TOOL_VERSION,
    TransportFactory,
)
from runbook.engine.core import EngineCore
from runbook.engine.dryrun import DryRunMixin
from runbook.engine.fanout import FanoutMixin
from runbook.engine.guards import GuardsMixin
from runbook.engine.launchguards import LaunchGuardsMixin
from runbook.engine.logmirror import LogMirrorMixin
from runbook.engine.operator import OperatorMixin
from runbook.engine.outcome import OutcomeMixin
from runbook.engine.runner import RunnerMixin
from runbook.engine.services import ServiceMixin
from runbook.engine.stats import StatsMixin
from runbook.engine.targets import TargetsMixin


class Engine(
    RunnerMixin,
    FanoutMixin,
    ServiceMixin,
    LogMirrorMixin,
    OutcomeMixin,
    GuardsMixin,
    ConfirmGateMixin,
    LaunchGuardsMixin,
    TargetsMixin,
    OperatorMixin,
    DryRunMixin,
    StatsMixin,
    EngineCore,
):
    """The whole engine: each concern lives in its own module (see the package docstring)."""


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
