"""Log mirroring: the job's log copied byte-exact to the local mirror, records parsed."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.wire.redact import StreamRedactor
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import Event, LogChunk, MetricsUpdate, ProgressUpdate
from runbook.logsplit import LineSplitter, parse_record
from runbook.mirror import LogMirror
from runbook.schema import Step
from runbook.state import StepRecord


@dataclass
class _Follow:
    """Per-step log mirroring state while a job is followed."""

    step_id: str
    rec: StepRecord
    path: Path
    splitter: LineSplitter = field(default_factory=LineSplitter)


class LogFollower:
    """Follows a job's log from the saved cursor into the mirror file."""

    def __init__(self, record: RunRecord, hosts: Hosts, emit: Callable[[Event], None]) -> None:
        self.record, self.hosts, self.emit = record, hosts, emit

    async def follow(self, step: Step, rec: StepRecord, host: str) -> dict[str, Any]:
        """Mirror the job's log until it ends; its end (exit record, log size, fate)."""
        path = Path(rec.log_file or "")
        # Resume where the mirror durably ends: no byte is shown twice (runbook/mirror.py).
        mirror = LogMirror(path, rec.log_remote_offset, rec.log_mirror_size)
        rec.log_remote_offset, rec.log_mirror_size = mirror.remote, mirror.size
        follow = _Follow(step.id, rec, path)
        unshown = mirror.unshown()
        if unshown:  # mirrored, but the client died while drawing it: draw it now, once
            self.emit(LogChunk(step.id, unshown.decode("utf-8", "replace")))
            mirror.mark_shown()
        session = await self.hosts.session(host)
        # streaming: a secret split across chunks (or in a line of any length) is still caught
        redactor = StreamRedactor(self.record.secrets.values())
        # a character cut by a chunk boundary is decoded whole (never two U+FFFD halves)
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode

        def on_data(start: int, end: int, data: bytes) -> None:
            data = redactor.feed(data)
            # bytes held back (a possible secret's start) are read again after a reattach
            mirror.append(end - redactor.pending, data)  # mirrored first, shown after
            rec.log_remote_offset, rec.log_mirror_size = mirror.remote, mirror.size
            self.emit(LogChunk(step.id, decode(data)))
            mirror.mark_shown()
            for line in follow.splitter.feed(data):
                self._on_line(step.id, rec, line)
            self.record.save(force=False)

        try:
            end = await session.follow_job(rec.job_id or "", rec.log_remote_offset, on_data)
            held = redactor.pending
            tail = redactor.flush()  # the job ended: what was held back is no secret
            if tail:
                mirror.append(mirror.remote + held, tail)
                rec.log_remote_offset, rec.log_mirror_size = mirror.remote, mirror.size
                self.emit(LogChunk(step.id, decode(tail)))
                mirror.mark_shown()
                for line in follow.splitter.feed(tail):
                    self._on_line(step.id, rec, line)
            rest = decode(b"", final=True)  # a last character the job left unfinished
            if rest:
                self.emit(LogChunk(step.id, rest))
        finally:
            mirror.close()
        for line in follow.splitter.flush():
            self._on_line(step.id, rec, line)
        return end

    def _on_line(self, step_id: str, rec: StepRecord, line: bytes) -> None:
        record = parse_record(line)
        if record is None:
            return
        if record["kind"] == "metrics":
            self.emit(MetricsUpdate(step_id, record))
        elif record["kind"] in ("progress", "result"):
            rec.progress = record
            self.emit(ProgressUpdate(step_id, record))
