"""The header: run id, runbook, host, host key fingerprint and connection state per host."""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content
from textual.widgets import Static

from eagle_tui.app.literal import lines as join_lines
from eagle_tui.app.literal import markup
from eagle_tui.app.reachability import UNREACHABLE_AFTER, error_of


@dataclass
class HostLine:
    state: str = "not connected"
    attempt: int = 0
    host_key: str | None = None
    transport: str = ""
    message: str | None = None
    error: str | None = None  # the last failed attempt's error, until connected


class RunHeader(Static):
    DEFAULT_CSS = """
    RunHeader { height: 2; background: $panel; padding: 0 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.run_id = "…"
        self.runbook = ""
        self.resumed = False
        self.default_host = "local"
        self.hosts: dict[str, HostLine] = {}
        self.mode = ""

    def set_run(self, run_id: str, runbook: str, resumed: bool) -> None:
        self.run_id, self.runbook, self.resumed = run_id, runbook, resumed
        self._redraw()

    def set_host(self, host: str, transport: str, host_key: str | None) -> None:
        line = self.hosts.setdefault(host, HostLine())
        line.transport, line.host_key = transport, host_key or line.host_key
        self.default_host = self.default_host or host
        self._redraw()

    def set_connection(
        self, host: str, state: str, attempt: int, message: str | None, host_key: str | None
    ) -> None:
        line = self.hosts.setdefault(host, HostLine())
        line.state, line.attempt, line.message = state, attempt, message
        if state == "connected":
            line.error = None
        elif message:
            line.error = (error_of(message) or "").removeprefix(f"{host}: ")  # host said once
        if host_key:
            line.host_key = host_key
        self._redraw()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self._redraw()

    @staticmethod
    def state_markup(line: HostLine) -> Content:
        unreachable = line.state in ("connecting", "reconnecting") and line.error
        if unreachable and line.attempt >= UNREACHABLE_AFTER:
            return markup(
                f"[$text-error]✗ unreachable, retrying (attempt {line.attempt}): $e[/]",
                e=line.error,
            )
        if line.state == "connected":
            return markup("[$text-success]● connected[/]")
        if line.state == "reconnecting":
            return markup(f"[$text-warning]◌ reconnecting (attempt {line.attempt})[/]")
        if line.state == "connecting":
            return markup(
                "[$text-warning]◌ connecting[/]"
                + (f" (attempt {line.attempt})" if line.attempt > 1 else "")
            )
        if line.state == "failed":
            return markup("[$text-error]✗ connection failed[/]")
        return markup("[dim]○ $v[/]", v=line.state)

    def _redraw(self) -> None:
        how = "resumed" if self.resumed else "new"
        top = markup(
            "[b]eagle-tui[/] ▸ run [b]$run[/] [dim]($how)[/] · runbook [b]$runbook[/]"
            + (" · [$text-primary]$mode[/]" if self.mode else ""),
            run=self.run_id,
            how=how,
            runbook=self.runbook,
            mode=self.mode,
        )
        parts = []
        for host, line in sorted(self.hosts.items(), key=lambda kv: kv[0] != self.default_host):
            key = line.host_key or ("none (local)" if host == "local" else "not known yet")
            parts.append(
                markup("host [b]$host[/] · key [dim]$key[/] · ", host=host, key=key)
                + self.state_markup(line)
            )
        hosts = (
            Content("   ").join(parts)
            if parts
            else markup("host [b]$host[/]", host=self.default_host)
        )
        self.update(join_lines([top, hosts]), layout=False)  # fixed height: no layout pass needed
