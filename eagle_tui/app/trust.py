"""Trusting an unknown SSH host key from the TUI (the hook of eagle_tui/app/hostkeys.py)."""

from __future__ import annotations

from typing import Any

from textual.app import App

from eagle_tui.app.actions import ENGINE_GROUP
from eagle_tui.app.hostkeys import unknown_host_key
from eagle_tui.app.screens.dialogs import AskScreen
from runbook.engine import Engine


class HostTrust(App[int]):
    """Mixin of CockpitApp: ask once per (host, fingerprint); on yes, reconnect trusting it."""

    engine: Engine
    options: Any
    _trust_offered: set[tuple[str, str]]

    def offer_trust(self, host: str, refusal: BaseException | str) -> None:
        found = unknown_host_key(refusal)
        if found is None or (host, found.fingerprint) in self._trust_offered:
            return
        self._trust_offered.add((host, found.fingerprint))

        def done(yes: bool | None) -> None:
            if yes:
                self.run_worker(
                    self.trust_host(host, found.fingerprint),
                    name=f"trust:{host}",
                    group=ENGINE_GROUP,
                    exit_on_error=False,
                )
            else:
                self.notify(
                    f"{host}: host key not trusted; steps on it cannot run", severity="warning"
                )

        self.push_screen(
            AskScreen(
                f"Unknown host key for {host}",
                f"{found.message}\n\nTrust {found.fingerprint} for {host}? It is recorded in "
                f"known_hosts, as with `--trust-host {found.fingerprint}`. Check it against the "
                "box's real key first.",
                yes="Trust and connect",
                no="Do not trust",
            ),
            done,
        )

    async def trust_host(self, host: str, fingerprint: str) -> None:
        """Reconnect with the fingerprint trusted: the transport factory reads `trust_host`."""
        if self.options is not None:
            trusted = list(getattr(self.options, "trust_host", None) or [])
            if fingerprint not in trusted:
                trusted.append(fingerprint)
            self.options.trust_host = trusted
        old = self.engine.sessions.pop(host, None)
        if old is not None:
            await old.close()
        await (await self.engine.session(host)).connection()
        self.notify(f"{host}: trusted {fingerprint}; connected")
        if not self.opened:  # the open needs the box (the driver claim): try it again now
            self.run_worker(self._open(), name="open", group=ENGINE_GROUP, exit_on_error=False)
