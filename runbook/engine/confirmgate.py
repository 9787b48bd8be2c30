"""The confirmation gate of a destructive step: ask once per engine session, audit the answer."""

from __future__ import annotations

from typing import Any

from runbook.engine.confirm import ConfirmRequest, delete_list, targets_text
from runbook.engine.core import EngineCore
from runbook.events import BLOCKED, Notice
from runbook.schema import Step


class ConfirmGateMixin(EngineCore):
    """Asks the confirmer before a destructive step's first launch in this engine session."""

    async def _confirm(self, step: Step, pre: list[dict[str, Any]]) -> bool:
        """True when the step may go ahead; False after recording it blocked."""
        if step.id in self._confirmed:
            return True
        req = ConfirmRequest(
            step.id, step.title, step.confirm or "", step.shown_command, tuple(pre)
        )
        decision = await self.confirmer(req)
        if decision is None:
            self._set(
                step.id,
                BLOCKED,
                "confirmation_required",
                f"destructive step: confirm it (TUI: type its id; --auto: --yes {step.id})",
                {"guards": pre},
            )
            return False
        assert self.audit
        self.audit.append(
            "step.confirmed",
            step=step.id,
            mode=decision.mode,
            typed=decision.typed,
            prompt=step.confirm,
            command=step.shown_command,
            evidence=pre,
            **({"targets": delete_list(pre)} if step.delete else {}),
            where=self._where(self.host_of(step)),
        )
        self._confirmed.add(step.id)
        if step.delete:  # the headless console shows what was confirmed, as measured
            self.emit(
                Notice("info", f"{step.id}: confirmed ({decision.mode}): " + targets_text(pre))
            )
        return True
