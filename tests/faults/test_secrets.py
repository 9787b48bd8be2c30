"""Attacks on "no secret byte in anything the tool writes or shows" (docs/SAFETY.md, Secrets)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from remote_agent.redact import StreamRedactor
from runbook.transports.local import scrubbed_env

ALPHA = "abcdefgh\n xyz"  # small alphabet: secrets overlap the text and each other often
secrets_st = st.lists(st.text(ALPHA, min_size=1, max_size=300), min_size=1, max_size=3)


def _stream(redactor: StreamRedactor, data: bytes, cuts: list[int]) -> bytes:
    out, pos = [], 0
    for c in sorted(set(cuts)):
        out.append(redactor.feed(data[pos:c]))
        pos = c
    out.append(redactor.feed(data[pos:]))
    out.append(redactor.flush())
    return b"".join(out)


@settings(max_examples=400, deadline=None)
@given(
    secrets_st,
    st.text(ALPHA, max_size=400),
    st.lists(st.integers(0, 2000), max_size=30),
    st.randoms(),
)
def test_streaming_redaction_any_chunking(secrets, filler, cuts, rnd):
    from tests.faults.tally import TALLY

    # a long line (well over 64 KiB when the secret is long) with secrets planted at random
    parts = [filler]
    for s in secrets:
        parts.insert(rnd.randint(0, len(parts)), s)
    data = ("x" * rnd.choice([0, 70_000]) + "".join(parts)).encode()
    cuts = [c * max(1, len(data) // 2000) for c in cuts]
    out = _stream(StreamRedactor(secrets), data, cuts)
    held = not any(s.encode() in out for s in secrets)
    TALLY.trial("secret split across log chunks / long line", held)
    assert held
    # nothing is lost: text without secrets passes byte-exact
    clean = filler.encode()
    if not any(s.encode() in clean for s in secrets):
        assert _stream(StreamRedactor(["*!never!*"]), clean, cuts) == clean


def test_local_agent_env_is_scrubbed(tally):
    rnd = random.Random(7)
    for _ in range(50):
        name = rnd.choice(["OPENROUTER_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "X_TOKEN"])
        env = {"PATH": "/usr/bin", "HOME": "/root", name: "sk-" + str(rnd.random())}
        out = scrubbed_env(env)
        held = name not in out and out["PATH"] == "/usr/bin"
        tally.trial("client env secret inherited by local agent", held)
        assert held
