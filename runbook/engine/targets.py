"""Delete targets: each path of a `delete:` step becomes a `delete_target` guard on the box.

The agent measures each target with the code that deletes it (remote_agent/agent/deletion.py) and
refuses what the rules of remote_agent/wire/targets.py forbid, including any ancestor of an artifact
a guard verified in this run (collected here as guards pass, sent as `protected`). The same
list goes with the job's launch (`delete_request`), so the deletion protects the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook.schema import Step

# checks whose passing means "this file is a verified artifact": a delete must not contain it
# (`path_exists` says only that a path is there: often the very thing a later step deletes)
VERIFYING = frozenset({"manifest", "sha256", "jsonl_records"})


@dataclass(frozen=True)
class DeleteTarget:
    """A guard built by the engine (not written in the runbook); quacks like a schema check."""

    path: str
    root: str | None
    protected: set[str]  # the engine's live set: read when the probe is sent, not when built
    check: str = "delete_target"

    @property
    def title(self) -> str:
        return f"delete target {self.path}"

    def probe(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "path": self.path,
            "root": self.root,
            "protected": sorted(self.protected),
        }


def verified_paths(check: Any, res: dict[str, Any]) -> list[str]:
    """The artifacts a passing guard vouched for (its path; a manifest's described file too)."""
    if not res.get("ok") or getattr(check, "check", None) not in VERIFYING:
        return []
    out = [check.path]
    observed = res.get("observed")
    if isinstance(observed, dict) and isinstance(observed.get("file"), str):
        out.append(observed["file"])
    return out


def pre_checks(step: Step, verified: set[str]) -> list[Any]:
    """The step's guards in evaluation order: those that verify artifacts (so the targets know
    what to protect), one delete_target per `delete:` path, then the rest (so a refused target
    is not walked by a dir_size guard). `verified` is the live set the targets protect."""
    targets = [DeleteTarget(p, step.delete_within, verified) for p in step.delete]
    if not targets:
        return list(step.preconditions)
    first = [c for c in step.preconditions if c.check in VERIFYING | {"step_succeeded"}]
    rest = [c for c in step.preconditions if c not in first]
    return [*first, *targets, *rest]


def delete_request(step: Step, verified: set[str]) -> dict[str, Any]:
    """`job.start`'s args.delete: the targets and what they must not contain."""
    return {
        "targets": [{"path": p, "root": step.delete_within} for p in step.delete],
        "protected": sorted(verified),
    }
