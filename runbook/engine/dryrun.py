"""Dry run: every guard evaluated read-only, nothing changed."""

from __future__ import annotations

from runbook import plan
from runbook.engine.constants import (
    EXIT_BLOCKED,
    EXIT_OK,
)
from runbook.engine.core import EngineCore
from runbook.events import (
    DONE,
    DryRunStep,
)


class DryRunMixin(EngineCore):
    """--dry-run: evaluate and report, write nothing."""

    async def dry_run(self) -> int:
        """Evaluate every guard now (read-only probes); change nothing. 0 all pass, 3 some blocked.

        Every guard's observed value is reported (GuardsEvaluated, then one DryRunStep per step).
        A guard that depends on an earlier step (a file it creates) shows as blocked here.
        """
        assert self.state
        blocked = False
        for sid in plan.ordered_steps(self.rb):
            step = self.rb.step(sid)
            if step.hosts is not None:  # its children are evaluated, each on its own host
                continue
            host = self.host_of(step)
            what = (
                step.run
                if step.run is not None
                else (f"(stops the {step.stop} service)" if step.stop else None)
            )
            if self.state.steps[sid].status in DONE:
                self.emit(DryRunStep(sid, host, what, step.destructive, "done"))
                continue
            if step.skip_if:
                res = await self.evaluate(step, step.skip_if, "skip_if")
                if all(r["ok"] for r in res):
                    self.emit(DryRunStep(sid, host, what, step.destructive, "satisfied"))
                    continue
            res = await self.evaluate(step, self.pre_checks(step), "pre")
            ok = all(r["ok"] for r in res)
            blocked = blocked or not ok
            self.emit(
                DryRunStep(sid, host, step.run, step.destructive, "would run" if ok else "blocked")
            )
        return EXIT_BLOCKED if blocked else EXIT_OK
