"""What a destructive step asks the operator, and the headless (--auto) answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConfirmRequest:
    step_id: str
    title: str
    prompt: str
    command: Any
    evidence: tuple[dict[str, Any], ...]  # the guards' observed values, shown to the operator


def delete_list(evidence: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured delete targets among a step's guard results (the agent's `delete_target`)."""
    keys = ("path", "target", "kind", "bytes", "files", "dirs", "dev", "ino")
    return [
        {k: (r.get("observed") or {}).get(k) for k in keys}
        for r in evidence
        if r.get("check") == "delete_target"
    ]


def targets_text(evidence: Iterable[dict[str, Any]]) -> str:
    """`deletes /w/old (dir, 8,000,000 bytes in 1 file, 1 dir); ...` for consoles and prompts."""
    parts = []
    for t in delete_list(evidence):
        if t["kind"] == "absent":
            parts.append(f"{t['target']} (already absent)")
        else:
            parts.append(
                f"{t['target']} ({t['kind']}, {t['bytes']:,} bytes in {t['files']:,} "
                f"file(s), {t['dirs']:,} dir(s))"
            )
    return "deletes " + "; ".join(parts)


@dataclass(frozen=True)
class Confirmation:
    mode: str  # "typed" (TUI) | "auto_confirm" (runbook policy + --yes) | "yes_flag" (--yes STEP)
    typed: str | None = None


Confirmer = Callable[[ConfirmRequest], Awaitable[Confirmation | None]]


def headless_confirmer(yes: Iterable[str], auto_confirm: Iterable[str]) -> Confirmer:
    """--auto policy: a destructive step runs only with --yes and the runbook's auto_confirm list,
    or when --yes names the step itself."""
    yes = set(yes)
    policy = set(auto_confirm)

    async def confirm(req: ConfirmRequest) -> Confirmation | None:
        if req.step_id in yes:
            return Confirmation("yes_flag")
        if "*" in yes and req.step_id in policy:
            return Confirmation("auto_confirm")
        return None

    return confirm
