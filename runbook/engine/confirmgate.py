"""The confirmation gate of a destructive step: ask once per engine session, audit the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runbook.engine.confirm import Confirmer, ConfirmRequest, delete_list, targets_text
from runbook.engine.record import RunRecord
from runbook.events import BLOCKED, Event, Notice
from runbook.schema import Step


class ConfirmGate:
    """Asks the confirmer before a destructive step's first launch in this engine session."""

    def __init__(
        self, record: RunRecord, confirmer: Confirmer, emit: Callable[[Event], None]
    ) -> None:
        self.record, self.confirmer, self.emit = record, confirmer, emit
        self.confirmed: set[str] = set()

    def forget(self, step_id: str) -> None:
        """The next launch of `step_id` asks again (a retry, or evidence that moved)."""
        self.confirmed.discard(step_id)

    async def ask(self, step: Step, pre: list[dict[str, Any]]) -> bool:
        """True when the step may go ahead; False after recording it blocked."""
        if step.id in self.confirmed:
            return True
        req = ConfirmRequest(
            step.id, step.title, step.confirm or "", step.shown_command, tuple(pre)
        )
        decision = await self.confirmer(req)
        if decision is None:
            self.record.set(
                step.id,
                BLOCKED,
                "confirmation_required",
                f"destructive step: confirm it (TUI: type its id; --auto: --yes {step.id})",
                {"guards": pre},
            )
            return False
        assert self.record.audit
        self.record.audit.append(
            "step.confirmed",
            step=step.id,
            mode=decision.mode,
            typed=decision.typed,
            prompt=step.confirm,
            command=step.shown_command,
            evidence=pre,
            **({"targets": delete_list(pre)} if step.delete else {}),
            where=self.record.where(step),
        )
        self.confirmed.add(step.id)
        if step.delete:  # the headless console shows what was confirmed, as measured
            self.emit(
                Notice("info", f"{step.id}: confirmed ({decision.mode}): " + targets_text(pre))
            )
        return True
