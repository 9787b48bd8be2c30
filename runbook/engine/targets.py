"""Delete targets: a destructive step's `removes:` become `removal_target` guards on the box.

The agent resolves each target as the command will (remote_agent/targets.py) and refuses /,
$HOME, the declared root (`removes_within:`) or an ancestor of it, a link out of that root,
and any ancestor of an artifact a guard verified in this run (collected here as guards pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runbook.engine.core import EngineCore
from runbook.schema import Step

# checks whose passing means "this file is a verified artifact": a delete must not contain it
VERIFYING = frozenset({"manifest", "sha256", "jsonl_records", "path_exists"})


@dataclass(frozen=True)
class RemovalTarget:
    """A guard built by the engine (not written in the runbook); quacks like a schema check."""

    path: str
    root: str | None
    protected: set[str]  # the engine's live set: read when the probe is sent, not when built
    check: str = "removal_target"

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


class TargetsMixin(EngineCore):
    def pre_checks(self, step: Step) -> list[Any]:
        """The step's guards in evaluation order: those that verify artifacts (so the targets
        know what to protect), one removal_target per `removes:` path, then the rest (so a
        refused target is not walked by a dir_size guard)."""
        targets = [RemovalTarget(p, step.removes_within, self._verified) for p in step.removes]
        if not targets:
            return list(step.preconditions)
        first = [c for c in step.preconditions if c.check in VERIFYING | {"step_succeeded"}]
        rest = [c for c in step.preconditions if c not in first]
        return [*first, *targets, *rest]
