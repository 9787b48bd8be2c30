"""Log mirroring: the job's log copied byte-exact to the local mirror, records parsed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.engine.core import EngineCore
from runbook.events import (
    LogChunk,
    MetricsUpdate,
    ProgressUpdate,
)
from runbook.logsplit import LineSplitter, parse_record
from runbook.schema import Step
from runbook.state import StepRecord


@dataclass
class _Follow:
    """Per-step log mirroring state while a job is followed."""

    step_id: str
    rec: StepRecord
    path: Path
    splitter: LineSplitter = field(default_factory=LineSplitter)


class LogMirrorMixin(EngineCore):
    """Follows a job's log from the saved cursor into the mirror file."""

    async def _follow(self, step: Step, rec: StepRecord, host: str) -> dict[str, Any]:
        path = Path(rec.log_file or "")
        path.parent.mkdir(parents=True, exist_ok=True)
        # The mirror may hold bytes written after the last saved cursor: drop them, they come again.
        with open(path, "ab") as f:
            f.truncate(rec.log_mirror_size)
        follow = _Follow(step.id, rec, path)
        session = await self.session(host)
        secrets = [s.encode() for s in self.secrets.values() if s]

        def on_data(start: int, end: int, data: bytes) -> None:
            for s in secrets:
                data = data.replace(s, b"***")
            with open(path, "ab") as f:
                f.write(data)
            rec.log_remote_offset, rec.log_mirror_size = end, rec.log_mirror_size + len(data)
            self.emit(LogChunk(step.id, data.decode("utf-8", "replace")))
            for line in follow.splitter.feed(data):
                self._on_line(step.id, rec, line)
            self._save(force=False)

        end = await session.follow_job(rec.job_id or "", rec.log_remote_offset, on_data)
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
