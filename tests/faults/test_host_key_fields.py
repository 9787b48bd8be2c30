"""Attack on "a changed host key is never offered for trust" now that the refusal travels as fields
(HostKeyRefusal), not text: a hostile target name or message that reads like an unknown-key
refusal, naming another fingerprint, must not change what the cockpit offers.

Real parts: the SSH transport's refusal exceptions, the engine's HostSession retry loop (which
emits the status the cockpit listens to), and the cockpit's trust part in a real Textual app."""

from __future__ import annotations

import asyncio
import random
import string

import pytest
from textual.app import App

from eagle_tui.app.screens.dialogs import AskScreen
from eagle_tui.app.trust import HostTrust
from runbook.agent_client import HostSession
from runbook.transports import Endpoint, HostKeyRefusal, TransportError
from tests.faults.tally import trials

hk = pytest.importorskip("runbook.transports.hostkeys")


def _fp(rng: random.Random) -> str:
    return "SHA256:" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(43))


class Refusing:
    """A transport whose every open() raises the given refusal (as the SSH transport does)."""

    def __init__(self, refusal: TransportError) -> None:
        self.refusal = refusal
        self.endpoint = Endpoint("ssh", "gpu")

    async def open(self):
        raise self.refusal

    async def close(self) -> None:
        pass


class Cockpit(App[int]):
    """A real Textual app holding the cockpit's trust part (engine and options are unused until
    the operator says yes)."""

    def __init__(self) -> None:
        super().__init__()
        self.trust = HostTrust(self)  # type: ignore[arg-type]


async def _status_of(refusal: TransportError) -> list[tuple]:
    seen: list[tuple] = []
    session = HostSession("gpu", Refusing(refusal), lambda *s: seen.append(s), max_attempts=3)
    with pytest.raises(TransportError):
        await session.connection()
    return seen


def test_hostile_text_never_turns_a_changed_key_into_a_trust_offer(tmp_path, tally) -> None:
    asyncio.run(_attack(tmp_path, tally))


async def _attack(tmp_path, tally) -> None:
    rng = random.Random(19)
    for trial in range(trials(12)):
        presented, known, decoy = _fp(rng), _fp(rng), _fp(rng)
        hostile = f"gpu: unknown host key {decoy} (not in known_hosts); --trust-host {decoy}"
        if trial % 2:
            refusal = hk.HostKeyChanged(
                hostile, "10.0.0.2", 2222, [known], presented, tmp_path / "kh", "ssh-ed25519"
            )
        else:
            refusal = hk.HostKeyUnknown(
                hostile, "10.0.0.2", 2222, presented, tmp_path / "kh", "", "ssh-ed25519"
            )
        statuses = await _status_of(refusal)
        failed = [s for s in statuses if s[0] == "failed"]
        refused = failed[0][3] if len(failed) == 1 else None
        want = HostKeyRefusal(
            "changed" if trial % 2 else "unknown",
            "[10.0.0.2]:2222",
            presented,
            "ssh-ed25519",
            (known,) if trial % 2 else (),
        )
        app = Cockpit()
        async with app.run_test() as pilot:
            if refused is not None:
                app.trust.offer_trust("gpu", refused, failed[0][2])
            await pilot.pause()
            asked = isinstance(app.screen, AskScreen)
            body = app.screen.body if asked else ""
        held = (
            refused == want
            and len(statuses) == 2  # connecting, failed: permanent, not retried
            and asked == (want.kind == "unknown")
            and (not asked or f"Trust {presented} for gpu?" in body)
            and (not asked or f"Trust {decoy}" not in body)
        )
        assert tally.trial("host key refusal as fields: hostile text ignored", held), (
            trial,
            statuses,
            body,
        )
