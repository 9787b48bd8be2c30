"""Dry run: every guard evaluated read-only, nothing changed.

A guard whose input an earlier step of this plan produces (a file it writes, the step it names)
cannot be judged against today's disk: it is "pending on" that step, not blocked. Only a guard
nothing earlier can change blocks the dry run (exit 3).

A host that cannot be reached is tried once (each connection phase bounded by the transport):
its steps are still listed with where they would run and their resolved command, and its
guards are "not evaluated: host unreachable" (exit 5), never silently passed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runbook import plan
from runbook.engine.constants import (
    EXIT_BLOCKED,
    EXIT_OK,
    EXIT_UNREACHABLE,
)
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import DONE, DryRunStep, Event, GuardsEvaluated, Notice
from runbook.schema import Step, StepSucceeded
from runbook.transports import TransportError
from runbook.transports.ssh_target import unreachable_hint

# dry-run states of a step that has yet to run
WAITING = ("would run", "pending", "blocked", "not evaluated")
NOT_EVALUATED = "not evaluated"


def failed_text(results: list[dict]) -> str:
    return "; ".join(f"{r.get('title') or r['check']}: {r.get('message')}" for r in results)


class DryRun:
    """--dry-run: evaluate and report, write nothing."""

    def __init__(
        self, record: RunRecord, hosts: Hosts, guards: Guards, emit: Callable[[Event], None]
    ) -> None:
        self.record, self.hosts, self.guards, self.emit = record, hosts, guards, emit
        # the last dry run's verdict per step: (state, why), for the CLI's and cockpit's summary
        self.report: dict[str, tuple[str, str]] = {}
        # the hosts the last dry run could not reach: host -> the one-line cause
        self.unreachable: dict[str, str] = {}

    async def run(self) -> int:
        """Evaluate every guard now (read-only probes); change nothing. 0 nothing blocked, 3 some
        step blocked by a guard no earlier step can change, 5 a host was unreachable (its
        guards not evaluated) (GuardsEvaluated, then DryRunStep)."""
        assert self.record.state
        rb = self.record.rb
        self.report = {}
        self.unreachable = {}
        earlier: list[Step] = []  # steps before this one that have yet to run
        for host in dict.fromkeys(self.hosts.host_of(s) for s in rb.steps if s.hosts is None):
            if any(self._probes(s) for s in rb.steps if self.hosts.host_of(s) == host):
                await self._reach(host)  # an unreachable host is said first, once
        for sid in plan.ordered_steps(rb):
            step = rb.step(sid)
            if step.hosts is not None:  # its children are evaluated, each on its own host
                continue
            state, why = await self._dry_step(step, earlier)
            self.report[sid] = (state, why)
            if state in WAITING:
                earlier.append(step)
            what = (
                step.shown_command
                if step.launches_job
                else (f"(stops the {step.stop} service)" if step.stop else None)
            )
            self.emit(DryRunStep(sid, self.hosts.host_of(step), what, step.destructive, state, why))
        if self.unreachable:
            return EXIT_UNREACHABLE
        blocked = any(state == "blocked" for state, _ in self.report.values())
        return EXIT_BLOCKED if blocked else EXIT_OK

    async def _reach(self, host: str) -> str | None:
        """None when `host` answers; else why not. One attempt (its phases bounded by the
        transport), never the endless retry of a run; a session some other caller is already
        retrying is not waited for: its last error says why."""
        if host in self.unreachable:
            return self.unreachable[host]
        try:
            session = await self.hosts.session(host)
            if session.connected:
                return None
            if session.connecting:
                why = session.last_error or "still connecting"
            else:
                await session.connection(attempts=1)
                return None
        except TransportError as exc:
            why = str(exc)
        self.unreachable[host] = why
        why = why.removeprefix(f"{host}: ")  # said once, at the front
        self.emit(
            Notice(
                "error",
                f"{host}: not evaluated: host unreachable: {why}. "
                f"What to try: {self._unreachable_hint(host)}",
            )
        )
        return why

    def _probes(self, step: Step) -> list:
        """The checks that need the step's box (step_succeeded reads the run's own records)."""
        return [
            c
            for c in (*step.skip_if, *self.guards.pre_checks(step))
            if not isinstance(c, StepSucceeded)
        ]

    def _unreachable_hint(self, host: str) -> str:
        config = self.record.rb.hosts.get(host)
        target = getattr(config, "ssh", None) or host
        return unreachable_hint(host, target)

    def _not_evaluated(
        self, step: Step, checks: list, phase: str, notes: list[dict], host: str
    ) -> list[dict[str, Any]]:
        """The guards of a step on an unreachable host: those the run's own records decide
        (step_succeeded) are evaluated, the others say they were not."""
        results: list[dict[str, Any]] = []
        for check, note in zip(checks, notes, strict=True):
            if isinstance(check, StepSucceeded):
                res = self.guards.step_succeeded(check)
            else:
                res = {
                    "ok": False,
                    "observed": None,
                    "message": f"host {host} unreachable",
                    "not_evaluated": True,
                }
            results.append(
                {"check": check.check, "title": check.title, "phase": phase, **res, **note}
            )
        self.emit(GuardsEvaluated(step.id, phase, tuple(results)))
        return results

    async def _dry_step(self, step: Step, earlier: list[Step]) -> tuple[str, str]:
        state = self.record.state
        assert state
        if state.steps[step.id].status in DONE:
            return "done", ""
        host = self.hosts.host_of(step)
        if self._probes(step) and await self._reach(host) is not None:
            checks = self.guards.pre_checks(step)
            res = self._not_evaluated(step, checks, "pre", self._notes(checks, earlier), host)
            hard = [
                r
                for r in res
                if not r["ok"] and not r.get("pending_on") and not r.get("not_evaluated")
            ]
            if hard:
                return "blocked", failed_text(hard)
            return NOT_EVALUATED, f"host {host} unreachable: its guards were not evaluated"
        if step.skip_if:  # one an earlier step changes (it creates the path) cannot skip yet
            notes = self._notes(step.skip_if, earlier)
            res = await self.guards.evaluate(step, step.skip_if, "skip_if", notes)
            if all(r["ok"] for r in res) and not any("pending_on" in n for n in notes):
                return "satisfied", "skip_if holds"
        checks = self.guards.pre_checks(step)
        res = await self.guards.evaluate(step, checks, "pre", self._notes(checks, earlier))
        hard = [r for r in res if not r["ok"] and not r.get("pending_on")]
        if hard:
            return "blocked", failed_text(hard)
        waits = [r["pending_on"] for r in res if not r["ok"]]
        waits += [r for r in step.requires if self.report.get(r, ("",))[0] in WAITING[1:]]
        if waits:
            return "pending", "pending on step " + ", ".join(dict.fromkeys(waits))
        return "would run", ""

    @staticmethod
    def _notes(checks: list, earlier: list[Step]) -> list[dict]:
        return [
            {"dry_run": True, **({"pending_on": on} if (on := plan.pending_on(c, earlier)) else {})}
            for c in checks
        ]
