"""Export the run's audit log (Markdown, JSONL or CSV) to a file; the exporters are
runbook/audit.py's, the same as `eagle-tui audit export`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet

from eagle_tui.present.audit_md import export_markdown
from remote_agent.wire.atomic_write import write_atomic
from runbook import audit as audit_mod

FORMATS = ("md", "jsonl", "csv")


@dataclass(frozen=True)
class ExportRequest:
    fmt: str
    path: Path


@dataclass(frozen=True)
class ExportResult:
    path: Path
    records: int
    chain_ok: bool
    problem: str | None


def export_audit(audit_path: Path, head: audit_mod.Head | None, req: ExportRequest) -> ExportResult:
    """Write the export atomically (blocking: run it in a thread worker)."""
    result = audit_mod.verify(audit_path, head)
    # the cockpit checks the chain against the run's state only: the header says so plainly
    checked = audit_mod.local_only(
        result, "exported from the cockpit; `eagle-tui audit verify` checks it"
    )
    records = audit_mod.read_records(audit_path) if audit_path.exists() else []
    if req.fmt == "md":
        text = export_markdown(records, checked)
    elif req.fmt == "csv":
        text = audit_mod.export_csv(records, checked)
    else:
        text = audit_mod.export_jsonl(records)
    write_atomic(req.path, text)
    return ExportResult(req.path, len(records), result.ok, result.problem)


class ExportScreen(ModalScreen[ExportRequest | None]):
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 90; max-width: 95%; height: auto; border: thick $primary;
        background: $surface; padding: 1 2; }
    ExportScreen RadioSet { layout: horizontal; height: auto; }
    ExportScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ExportScreen Button { margin-left: 2; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="export-cancel")]

    def __init__(self, run_id: str, directory: Path) -> None:
        super().__init__()
        self.run_id = run_id
        self.directory = directory
        self.fmt = "md"

    def _default(self, fmt: str) -> str:
        return str(self.directory / f"{self.run_id}.audit.{fmt}")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Export the audit log", classes="dialog-title")
            with RadioSet(id="export-format"):
                for fmt in FORMATS:
                    yield RadioButton(fmt, value=fmt == self.fmt, id=f"fmt-{fmt}")
            yield Label("to file (Enter writes it):")
            yield Input(self._default(self.fmt), id="export-path")
            with Horizontal():
                yield Button("Cancel", id="export-no")
                yield Button("Export", id="export-yes", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(RadioSet.Changed)
    def _format(self, event: RadioSet.Changed) -> None:
        new = FORMATS[event.index]
        box = self.query_one(Input)
        if box.value == self._default(self.fmt) or box.value.endswith(f".{self.fmt}"):
            box.value = box.value[: -len(self.fmt)] + new
        self.fmt = new

    def _done(self) -> None:
        value = self.query_one(Input).value.strip()
        if not value:
            self.notify("give a file name", severity="warning")
            return
        path = Path(value).expanduser()
        suffix = path.suffix.lstrip(".")
        fmt = suffix if suffix in FORMATS else self.fmt  # the file name wins: audit.csv is CSV
        self.dismiss(ExportRequest(fmt, path))

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self._done()

    @on(Button.Pressed, "#export-yes")
    def _yes(self) -> None:
        self._done()

    @on(Button.Pressed, "#export-no")
    def _no(self) -> None:
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
