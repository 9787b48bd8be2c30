"""App-level messages. The engine's listener runs synchronously inside the engine (same asyncio
loop); it only wraps each event in a message, so the engine never waits on the UI."""

from __future__ import annotations

from textual.message import Message

from runbook.events import Event


class EngineEvent(Message):
    """One engine event. Step-scoped log/progress/metrics events also carry the mirror file and
    its size right after the engine wrote the chunk: the view uses them to splice the on-disk
    log with live chunks without a gap or a repeat."""

    def __init__(self, event: Event, log_file: str | None = None, mirror_end: int = 0) -> None:
        super().__init__()
        self.event = event
        self.log_file = log_file
        self.mirror_end = mirror_end
