"""Is a recorded job safe to launch? Only when the box proves it never started.

The engine records a step `running` with its job id before `job.start`, so after a crash it
asks the agent for that id. "not found" used to mean "never started, start it now"; but a
wiped spool (a reboot with the spool on tmpfs, an `rm -rf`) also answers "not found", and the
relaunch then ran the job twice. The spool carries a random id (`hello.spool_id`) recorded with
the launch: the same id and no output seen means the launch never happened (the agent's atomic
`mkdir` would have left the job dir); anything else means the job's fate is unknown, and it is
recorded `lost` with that evidence instead of being relaunched.
"""

from __future__ import annotations

from typing import Any

from runbook.state import StepRecord

ADVICE = "its fate is unknown, so it is not relaunched: check the box, then retry or skip the step"
NEVER_RAN = "nothing ran, so retrying the step is safe; it is not relaunched without you"


class FateUnknown(Exception):
    """The recorded job is not (or no longer fully) on the box; `reason` names the evidence."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def check_missing(rec: StepRecord, hello: dict[str, Any]) -> None:
    """The agent has no job `rec.job_id`: return if it never started, else raise FateUnknown."""
    now = hello.get("spool_id")
    where = hello.get("spool") or "the agent's spool"
    if rec.spool_id and rec.spool_id != now:
        raise FateUnknown(
            "spool_wiped",
            f"job {rec.job_id} is not in {where}: the spool was wiped or replaced since the "
            f"launch (spool id {rec.spool_id} then, {now or 'none'} now; a reboot with the spool "
            f"on tmpfs does this); {ADVICE}",
        )
    if rec.log_remote_offset > 0:
        raise FateUnknown(
            "job_vanished",
            f"job {rec.job_id} had written {rec.log_remote_offset} log bytes but is no longer "
            f"in {where}; {ADVICE}",
        )


def check_found(rec: StepRecord, info: dict[str, Any]) -> None:
    """The agent has the job: its log must still hold what was mirrored from it."""
    size = int(info.get("log_size") or 0)
    if size < rec.log_remote_offset:
        raise FateUnknown(
            "log_truncated",
            f"job {rec.job_id}'s log on the box has {size} bytes, but {rec.log_remote_offset} "
            f"were mirrored from it: the spool was altered; {ADVICE}",
        )


def lost_evidence(fate: dict[str, Any] | None) -> tuple[str, str]:
    """(reason, message) for a job the box reports `lost`, from the agent's evidence: a job
    that provably never ran its command is `never_started`, distinct from one lost while it ran."""
    fate = fate or {}
    reason = str(fate.get("reason") or "lost")
    evidence = str(fate.get("evidence") or "the job's process is gone and left no exit record")
    if reason == "never_started":
        return reason, f"{evidence}; {NEVER_RAN}"
    return ("lost" if reason == "unknown" else reason), f"{evidence}; {ADVICE}"
