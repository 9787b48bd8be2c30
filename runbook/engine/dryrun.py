"""Dry run: every guard evaluated read-only, nothing changed.

A guard whose input an earlier step of this plan produces (a file it writes, the step it names)
cannot be judged against today's disk: it is "pending on" that step, not blocked. Only a guard
nothing earlier can change blocks the dry run (exit 3)."""

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
from runbook.schema import Step

WAITING = ("would run", "pending", "blocked")  # dry-run states of a step that has yet to run


def failed_text(results: list[dict]) -> str:
    return "; ".join(f"{r.get('title') or r['check']}: {r.get('message')}" for r in results)


class DryRunMixin(EngineCore):
    """--dry-run: evaluate and report, write nothing."""

    # the last dry run's verdict per step: (state, why), for the CLI's and the cockpit's summary
    dry_report: dict[str, tuple[str, str]]

    async def dry_run(self) -> int:
        """Evaluate every guard now (read-only probes); change nothing. 0 nothing blocked, 3 some
        step blocked by a guard no earlier step can change (GuardsEvaluated, then DryRunStep)."""
        assert self.state
        self.dry_report = {}
        earlier: list[Step] = []  # steps before this one that have yet to run
        for sid in plan.ordered_steps(self.rb):
            step = self.rb.step(sid)
            if step.hosts is not None:  # its children are evaluated, each on its own host
                continue
            state, why = await self._dry_step(step, earlier)
            self.dry_report[sid] = (state, why)
            if state in WAITING:
                earlier.append(step)
            what = (
                step.shown_command
                if step.launches_job
                else (f"(stops the {step.stop} service)" if step.stop else None)
            )
            self.emit(DryRunStep(sid, self.host_of(step), what, step.destructive, state, why))
        blocked = any(state == "blocked" for state, _ in self.dry_report.values())
        return EXIT_BLOCKED if blocked else EXIT_OK

    async def _dry_step(self, step: Step, earlier: list[Step]) -> tuple[str, str]:
        assert self.state
        if self.state.steps[step.id].status in DONE:
            return "done", ""
        if step.skip_if:  # one an earlier step changes (it creates the path) cannot skip yet
            notes = self._notes(step.skip_if, earlier)
            res = await self.evaluate(step, step.skip_if, "skip_if", notes)
            if all(r["ok"] for r in res) and not any("pending_on" in n for n in notes):
                return "satisfied", "skip_if holds"
        checks = self.pre_checks(step)
        res = await self.evaluate(step, checks, "pre", self._notes(checks, earlier))
        hard = [r for r in res if not r["ok"] and not r.get("pending_on")]
        if hard:
            return "blocked", failed_text(hard)
        waits = [r["pending_on"] for r in res if not r["ok"]]
        waits += [r for r in step.requires if self.dry_report.get(r, ("",))[0] in WAITING[1:]]
        if waits:
            return "pending", "pending on step " + ", ".join(dict.fromkeys(waits))
        return "would run", ""

    @staticmethod
    def _notes(checks: list, earlier: list[Step]) -> list[dict]:
        return [
            {"dry_run": True, **({"pending_on": on} if (on := plan.pending_on(c, earlier)) else {})}
            for c in checks
        ]
