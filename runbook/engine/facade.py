"""The engine: the operator's verbs over a few composed parts, and read-only views of the run.

Each part takes the parts it needs at construction (runbook/engine/__init__.py lists them); the
façade builds them once, in dependency order, and is the only thing callers hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from runbook import audit_seal, plan
from runbook.agent_client import HostSession
from runbook.audit import AuditLog
from runbook.engine.confirm import Confirmer
from runbook.engine.confirmgate import ConfirmGate
from runbook.engine.constants import EXIT_BLOCKED, EXIT_FAILED, EXIT_OK, LOCAL, TransportFactory
from runbook.engine.dryrun import DryRun
from runbook.engine.fanout import FanOut
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.jobs import Jobs
from runbook.engine.launchguards import LaunchGuards
from runbook.engine.logmirror import LogFollower
from runbook.engine.operator import Operator
from runbook.engine.outcome import Outcome
from runbook.engine.record import RunRecord
from runbook.engine.services import Services
from runbook.engine.steps import StepRunner
from runbook.events import BLOCKED, DONE, PENDING, Event
from runbook.loader import LoadedRunbook
from runbook.runs import Selection
from runbook.schema import Runbook, Step
from runbook.state import RunState, RunStore


class Engine:
    """Drives one run of a loaded runbook through the agents (see the package docstring)."""

    def __init__(
        self,
        loaded: LoadedRunbook,
        state_dir: Path,
        transports: TransportFactory,
        confirmer: Confirmer,
        secrets: dict[str, str] | None = None,
        default_host: str | None = None,
        listeners: Iterable[Callable[[Event], None]] = (),
        stats: bool = False,
        accept_audit_break: bool = False,
        selection: Selection | None = None,
    ) -> None:
        """`selection` (runbook/runs.py): the run chosen before the claim, for `loaded`; `open`
        chooses again under the claim. Without one, `open(run_id)` opens exactly that run."""
        if selection is not None and selection.loaded is not loaded:
            raise ValueError("an engine with a selection runs the selection's runbook")
        self.listeners = list(listeners)
        self.selection = selection
        self.accept_audit_break = accept_audit_break
        emit = self.emit
        self.hosts = Hosts(
            self._runbook, default_host or loaded.runbook.host or LOCAL, transports, emit, stats
        )
        self.record = RunRecord(loaded, state_dir, secrets or {}, emit, self.hosts.where_of)
        self.guards = Guards(self.record, self.hosts, emit)
        self.gate = ConfirmGate(self.record, confirmer, emit)
        launch_guards = LaunchGuards(self.guards, self.record, self.gate)
        follower = LogFollower(self.record, self.hosts, emit)
        outcome = Outcome(self.record, self.hosts, self.guards)
        jobs = Jobs(self.record, self.hosts, self.guards, launch_guards, follower, outcome, emit)
        services = Services(self.record, self.hosts, self.guards, jobs, follower, outcome, emit)
        fanout = FanOut(self.record, self.hosts)
        self.steps = StepRunner(
            self.record, self.hosts, self.guards, self.gate, jobs, outcome, services, fanout, emit
        )
        self.operator = Operator(self.record, self.hosts, self.gate, fanout, emit)
        self.dry = DryRun(self.record, self.hosts, self.guards, emit)

    def _runbook(self) -> Runbook:
        return self.record.rb

    def emit(self, event: Event) -> None:
        for listener in list(self.listeners):
            listener(event)

    # ------------------------------------------------------------------ views (read-only)
    @property
    def loaded(self) -> LoadedRunbook:
        return self.record.loaded

    @property
    def rb(self) -> Runbook:
        return self.record.rb

    @property
    def state_dir(self) -> Path:
        return self.record.state_dir

    @property
    def state(self) -> RunState | None:
        return self.record.state

    @property
    def store(self) -> RunStore | None:
        return self.record.store

    @property
    def audit(self) -> AuditLog | None:
        return self.record.audit

    @property
    def default_host(self) -> str:
        return self.hosts.default_host

    @property
    def sessions(self) -> dict[str, HostSession]:
        return self.hosts.sessions

    @property
    def closed(self) -> bool:
        return self.hosts.closed

    @property
    def dry_report(self) -> dict[str, tuple[str, str]]:
        """The last dry run's verdict per step: (state, why)."""
        return self.dry.report

    @property
    def dry_unreachable(self) -> dict[str, str]:
        """The hosts the last dry run could not reach: host -> the one-line cause."""
        return self.dry.unreachable

    @property
    def _stats_tasks(self) -> list:  # the cockpit's tests watch a replaced session's loop end
        return self.hosts.stats_tasks

    # the cockpit's switches, set before the run opens
    @property
    def transports(self) -> TransportFactory:
        return self.hosts.transports

    @property
    def want_stats(self) -> bool:
        return self.hosts.want_stats

    @want_stats.setter
    def want_stats(self, on: bool) -> None:
        self.hosts.want_stats = on

    def host_of(self, step: Step) -> str:
        return self.hosts.host_of(step)

    async def session(self, host: str) -> HostSession:
        return await self.hosts.session(host)

    async def reconnect(self, host: str, transports: TransportFactory) -> None:
        """`host` again through `transports` (the cockpit trusted its key): Hosts.reconnect."""
        await self.hosts.reconnect(host, transports)

    # ------------------------------------------------------------------ lifecycle
    async def open_readonly(self) -> str:
        """For --dry-run: the latest run's state (or a fresh one) in memory; nothing is written."""
        return self.record.open_readonly()

    async def open(self, run_id: str) -> str:
        """Create the run, or resume it if its state exists; the run directory stays locked.
        With a selection, `run_id` is the one it showed and the run opened is the one chosen
        again under the claim (returned)."""
        await self.hosts.claim()  # one driver per work on the box, before the run id
        loaded = self.record.loaded
        if self.selection is not None:
            if run_id != self.selection.run_id:
                raise ValueError(f"{run_id}: not the run this engine was built for")
            settled = self.selection.under_claim()
            run_id, loaded = settled.run_id, settled.loaded
        store = self.record.lock(run_id, loaded)
        box_head = await self.hosts.box_head(run_id)
        spool_id = await self.hosts.spool_id(self.default_host)
        opened = audit_seal.check_run(store, box_head, self.accept_audit_break, spool_id)
        resumed = self.record.begin(opened)
        # the spool is named only once a head for the run is on it: a box keeping none on this
        # same spool later had it deleted (audit_seal.missing_head_problem)
        pushed = await self._push_head()
        self.record.started(resumed, self.default_host, spool_id if pushed else None)
        await self._push_head()
        self.record.announce(resumed)
        return run_id

    async def _push_head(self, clean: bool = False) -> bool:
        state, audit = self.record.state, self.record.audit
        if audit is None or state is None:
            return False
        return await self.hosts.push_head(state.run_id, audit.head, clean)

    async def close(self) -> None:
        """Leave every job running; just let go of the connections and the run lock. A cancel
        that lands in the head push still closes the sessions and releases the lock."""
        self.hosts.stop_stats()
        self.record.note_closed()
        try:
            await self._push_head(clean=True)
        finally:
            try:
                await self.hosts.close()
            finally:
                self.record.release()

    # ------------------------------------------------------------------ running
    async def run_all(
        self, start: str | None = None, only: str | None = None, by: str = "auto"
    ) -> int:
        """Run the selected steps in order; stop at the first that does not end done.

        The request is saved as the run's intent first (state + audit) and cleared when it
        ends; a driver killed in between leaves it for the next one. Without start/only a
        saved intent says where to go on. Clearing it (`clear_intent`) stops after the
        running step, which is never killed for it."""
        state = self.record.state
        assert state
        saved = state.intent
        if start is None and only is None and saved is not None:
            start, only = saved.start, saved.only
        self.set_intent(start, only, by)
        for sid in plan.select(self.rb, start, only):
            if state.intent is None:  # the operator stopped run-all: the run stays open
                return EXIT_BLOCKED
            status = await self.run_step(sid)
            await self._push_head()
            if status not in DONE:
                self.clear_intent(f"{sid} ended {status}")
                return self.finish(EXIT_BLOCKED if status in (BLOCKED, PENDING) else EXIT_FAILED)
        self.clear_intent("every step done")
        return self.finish(EXIT_OK)

    async def run_step(self, step_id: str) -> str:
        """Run one step to an end state (or reattach to it); returns its final status."""
        return await self.steps.run(step_id)

    async def dry_run(self) -> int:
        """Evaluate every guard now (read-only probes); change nothing. 0 nothing blocked, 3 some
        step blocked by a guard no earlier step can change, 5 a host was unreachable."""
        return await self.dry.run()

    def set_intent(self, start: str | None, only: str | None, by: str) -> None:
        self.record.set_intent(start, only, by)

    def clear_intent(self, why: str) -> bool:
        """Forget the run-all intent (audited); False when there was none."""
        return self.record.clear_intent(why)

    def finish(self, code: int) -> int:
        """Record the run's end (exit code, summary) and emit RunFinished."""
        return self.record.finish(code)

    # ------------------------------------------------------------------ operator actions
    async def skip(self, step_id: str, reason: str) -> None:
        await self.operator.skip(step_id, reason)

    def unskip(self, step_id: str, reason: str | None = None) -> None:
        self.operator.unskip(step_id, reason)

    def reset(self, step_id: str) -> None:
        """Make a blocked/failed/lost/cancelled step runnable again (operator's retry)."""
        self.operator.reset(step_id)

    async def cancel(self, step_id: str, grace_s: float = 10.0) -> None:
        await self.operator.cancel(step_id, grace_s)
