"""A client process for the netns stats test: the engine with its stats loop on, printing every
host-stats sample and connection change as a JSON line (the test times their arrival).

    python tests/ssh/stats_client.py RUNBOOK STATE_DIR KNOWN_HOSTS SSH_CONFIG
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runbook.engine import Engine, headless_confirmer  # noqa: E402
from runbook.events import ConnectionChanged, Event, HostStats  # noqa: E402
from runbook.loader import load_runbook  # noqa: E402
from runbook.transports import TransportOptions  # noqa: E402
from runbook.transports.factory import make_transport_factory  # noqa: E402


def printer(event: Event) -> None:
    if isinstance(event, HostStats):
        s = event.sample
        print(json.dumps({"stats": s.get("seq"), "t": s.get("t")}), flush=True)
    elif isinstance(event, ConnectionChanged):
        print(json.dumps({"conn": event.state, "attempt": event.attempt}), flush=True)


async def main(runbook: str, state: str, known: str, config: str) -> int:
    state_dir = Path(state)
    loaded = load_runbook(runbook, {}, run_id="stats", state_dir=state_dir)
    opts = TransportOptions(known_hosts=known, ssh_config=config)
    engine = Engine(
        loaded,
        state_dir,
        transports=make_transport_factory(state_dir, opts),
        confirmer=headless_confirmer([], []),
        listeners=[printer],
        stats=True,
    )
    await engine.open("stats")
    try:
        return await engine.run_all()
    finally:
        await engine.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
