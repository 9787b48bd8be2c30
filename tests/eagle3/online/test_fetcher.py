"""The online fetcher's bookkeeping when the loader thread outruns the requester thread: every
turn of the training order is asked for exactly once, and nothing waits for a retry.

Both races were seen in the full suite after the trainer got faster (2026-12-04): a sample due
again next epoch was handed out, the loader reached its next turn before the requester's next
round, and waited 0.5 s for a "retry" of a sample nobody had asked for yet."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from remote_agent.eagle3.drafter.train.config import OnlineSection
from remote_agent.eagle3.online.source import OnlineFetcher


class Index:
    def read(self, sid: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[1, 2, 3])


@pytest.fixture
def fetcher(tmp_path: Path):
    opts = OnlineSection(server="http://127.0.0.1:9", window=8, concurrency=1,
                         producer_wait_s=5.0)  # fmt: skip
    f = OnlineFetcher(opts, f"unix:{tmp_path}/s.sock", {}, {}, Index())
    asked: list[list[str]] = []

    def request(sids: list[str]) -> None:  # what the producer was asked, no HTTP
        with f._cond:
            f.stats["requested"] += len(sids)
        asked.append(list(sids))

    f._request = request  # type: ignore[method-assign]
    f.asked = asked  # type: ignore[attr-defined]
    yield f
    f.close()


def deliver(f: OnlineFetcher, sid: str) -> None:
    f._arrived(sid, {"sid": sid}, None)  # type: ignore[arg-type]


def requester_round(f: OnlineFetcher) -> None:
    """One round of the requester thread (run by hand: the test decides who comes first)."""
    batch = f._next_requests()
    if batch:
        f._request(batch)


def test_a_sample_due_again_is_asked_for_when_handed_out(fetcher):
    """Order a, b | a: `a` is still held when its next-epoch turn enters the window. Handing
    it out asks for it at once, so the loader's next turn needs no requester round."""
    fetcher._order = iter(["a", "b", "a"])
    requester_round(fetcher)
    assert fetcher.asked == [["a", "b"]]
    deliver(fetcher, "a")
    deliver(fetcher, "b")
    assert fetcher.get("a") == {"sid": "a"}
    assert fetcher.asked == [["a", "b"], ["a"]]  # asked now, not on a later round
    deliver(fetcher, "a")
    assert fetcher.get("b") == {"sid": "b"}
    t0 = time.monotonic()
    assert fetcher.get("a") == {"sid": "a"}  # no requester round ran in between
    assert time.monotonic() - t0 < 0.2
    requester_round(fetcher)
    assert fetcher.asked == [["a", "b"], ["a"]]
    assert fetcher.stats["retries"] == 0 and fetcher.stats["requested"] == 3
    assert not fetcher._want and not fetcher._have


def test_a_turn_the_loader_reaches_first_is_asked_once(fetcher):
    """The loader asks for `x` before the requester has pulled it from the order: it is asked
    for at once (not a retry), and the requester skips that turn when it gets there."""
    fetcher._order = iter(["x", "y", "x"])
    got: list[dict] = []
    loader = threading.Thread(target=lambda: got.append(fetcher.get("x")))
    loader.start()
    end = time.monotonic() + 5
    while not fetcher.asked and time.monotonic() < end:
        time.sleep(0.01)
    assert fetcher.asked == [["x"]]
    deliver(fetcher, "x")
    loader.join(5)
    assert got == [{"sid": "x"}]
    requester_round(fetcher)  # pulls x (served already: skipped), y, and x's next turn
    assert fetcher.asked == [["x"], ["y", "x"]]
    deliver(fetcher, "y")
    deliver(fetcher, "x")
    assert fetcher.get("y") == {"sid": "y"} and fetcher.get("x") == {"sid": "x"}
    assert fetcher.stats["retries"] == 0 and fetcher.stats["duplicates"] == 0
    assert fetcher.stats["unrequested"] == 0 and fetcher.stats["requested"] == 3
    assert not fetcher._want and not fetcher._have and not fetcher._ahead
