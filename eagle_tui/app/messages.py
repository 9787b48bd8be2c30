"""Engine events as Textual messages, one class per kind, so the screen and the app handle each
with `@on(...)` (no isinstance dispatcher). The engine's listener runs synchronously inside the
engine (same asyncio loop); it only wraps each event and posts it to the main screen, whence it
bubbles to the app: the engine never waits on the UI."""

from __future__ import annotations

from typing import Generic, TypeVar

from textual.message import Message

from runbook import events as ev

E = TypeVar("E", bound=ev.Event)


class EngineEvent(Message, Generic[E]):
    """One engine event. Step-scoped log/progress/metrics events also carry the mirror file and
    its size right after the engine wrote the chunk: the view uses them to splice the on-disk
    log with live chunks without a gap or a repeat."""

    def __init__(self, event: E, log_file: str | None = None, mirror_end: int = 0) -> None:
        super().__init__()
        self.event = event
        self.log_file = log_file
        self.mirror_end = mirror_end


class LogArrived(EngineEvent[ev.LogChunk]):
    pass


class StepChanged(EngineEvent[ev.StepChanged]):
    pass


class ProgressArrived(EngineEvent[ev.ProgressUpdate]):
    pass


class MetricsArrived(EngineEvent[ev.MetricsUpdate]):
    pass


class GuardsArrived(EngineEvent[ev.GuardsEvaluated]):
    pass


class HostStatsArrived(EngineEvent[ev.HostStats]):
    pass


class ConnectionChanged(EngineEvent[ev.ConnectionChanged]):
    pass


class RunStarted(EngineEvent[ev.RunStarted]):
    pass


class RunFinished(EngineEvent[ev.RunFinished]):
    pass


class NoticeArrived(EngineEvent[ev.Notice]):
    pass


MESSAGES: dict[type[ev.Event], type[EngineEvent]] = {
    ev.LogChunk: LogArrived,
    ev.StepChanged: StepChanged,
    ev.ProgressUpdate: ProgressArrived,
    ev.MetricsUpdate: MetricsArrived,
    ev.GuardsEvaluated: GuardsArrived,
    ev.HostStats: HostStatsArrived,
    ev.ConnectionChanged: ConnectionChanged,
    ev.RunStarted: RunStarted,
    ev.RunFinished: RunFinished,
    ev.Notice: NoticeArrived,
}


def message_for(event: ev.Event, log_file: str | None = None, mirror_end: int = 0) -> EngineEvent:
    """The message of an event's kind (a kind without a view of its own: the plain base)."""
    return MESSAGES.get(type(event), EngineEvent)(event, log_file, mirror_end)
