"""Trusting an unknown SSH host key from the TUI (runbook/transports/hostkeys.py refuses it).

The refusal arrives as fields (HostKeyRefusal, on the TransportError or the ConnectionChanged
event). On "trust" the app makes new transport options trusting the fingerprint (as if
`--trust-host` had been given), drops the refused session and connects again; the transport then
records the key in known_hosts. A *changed* key is never offered for trust.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from eagle_tui.app.actions import ENGINE_GROUP
from eagle_tui.app.screens.dialogs import AskScreen
from runbook.transports import HostKeyRefusal, TransportOptions
from runbook.transports.factory import HostTransports

if TYPE_CHECKING:
    from eagle_tui.app.app import CockpitApp


class HostTrust:
    """A composed object of CockpitApp (`app.trust`): ask once per (host, fingerprint); on
    yes, reconnect trusting it."""

    def __init__(self, app: CockpitApp) -> None:
        self.app = app
        self._trust_offered: set[tuple[str, str]] = set()

    def offer_trust(self, host: str, found: HostKeyRefusal, message: str) -> None:
        if found.kind != "unknown" or (host, found.fingerprint) in self._trust_offered:
            return
        self._trust_offered.add((host, found.fingerprint))

        def done(yes: bool | None) -> None:
            if yes:
                self.app.run_worker(
                    self.trust_host(host, found.fingerprint),
                    name=f"trust:{host}",
                    group=ENGINE_GROUP,
                    exit_on_error=False,
                )
            else:
                self.app.notify(
                    f"{host}: host key not trusted; steps on it cannot run", severity="warning"
                )

        self.app.push_screen(
            AskScreen(
                f"Unknown host key for {host}",
                f"{message}\n\nTrust {found.fingerprint} for {host}? It is recorded in "
                f"known_hosts, as with `--trust-host {found.fingerprint}`. Check it against the "
                "box's real key first.",
                yes="Trust and connect",
                no="Do not trust",
            ),
            done,
        )

    async def trust_host(self, host: str, fingerprint: str) -> None:
        """Reconnect with the fingerprint trusted: new options, and a factory that uses them."""
        app = self.app
        app.options = (app.options or TransportOptions()).trusting(fingerprint)
        factory = app.engine.transports
        if isinstance(factory, HostTransports):
            factory = dataclasses.replace(factory, options=app.options)
        await app.engine.reconnect(host, factory)
        app.notify(f"{host}: trusted {fingerprint}; connected")
        if not app.opened:  # the open needs the box (the driver claim): try it again now
            app.run_worker(app._open(), name="open", group=ENGINE_GROUP, exit_on_error=False)
