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
