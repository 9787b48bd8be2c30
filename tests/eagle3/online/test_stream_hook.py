"""The SGLang hook's stream mode and its deadline rule (patches/eagle3_dump/hook.py), on CPU.

The one fake is SGLang itself (a stand-in ForwardBatch and model, tests/eagle3/extraction/
eagle3_standins.py); the hook package is the shipped code, the consumer the trainer's real
StreamListener on a real unix socket.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tests.support.paths import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "eagle3" / "extraction"))
from eagle3_standins import load_hook_package, standin_batch, standin_model  # noqa: E402

from remote_agent.eagle3.dense import DumpReader, read_error_markers  # noqa: E402
from remote_agent.eagle3.online.listener import StreamListener  # noqa: E402

H, L, IDS = 16, 8, [2, 4, 5]


@pytest.fixture(scope="module")
def hookmod(tmp_path_factory):
    return load_hook_package(tmp_path_factory.mktemp("hookpkg"))


@pytest.fixture
def env(hookmod, tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("EAGLE3_DUMP_", "EAGLE3_STREAM_")):
            monkeypatch.delenv(key)
    sock = Path(f"/tmp/e3s-{os.getpid()}-{random.randrange(1 << 30)}.sock")  # AF_UNIX: short
    monkeypatch.setenv("EAGLE3_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("EAGLE3_DUMP_MIN_FREE_MB", "0")
    monkeypatch.setenv("EAGLE3_DUMP_MODE", "stream")
    monkeypatch.setenv("EAGLE3_STREAM_ADDR", f"unix:{sock}")
    hookmod.reset()
    monkeypatch.setattr(hookmod, "_writer_rank", lambda model: 0)
    yield SimpleNamespace(hook=hookmod, addr=f"unix:{sock}", sock=sock, root=tmp_path / "dump")
    hookmod.reset()
    sock.unlink(missing_ok=True)


def batch(rids, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    final, aux = torch.randn(n + 2, H, generator=g), torch.randn(n + 2, 3 * H, generator=g)
    ids = torch.randint(0, 100, (n + 2,), generator=g)
    return standin_batch(rids, lens, ids, None), final, aux


class Inbox:
    def __init__(self, addr, expect=None, identity=None):
        self.samples, self.dropped, self.lost = {}, [], []
        self.listener = StreamListener(
            addr, expect or {}, identity or {}, self.on_sample, self.on_dropped, self.lost.append
        )

    def on_sample(self, sid, sample, meta):
        self.samples[sid] = sample

    def on_dropped(self, sid, reason):
        self.dropped.append((sid, reason))


def wait_for(pred, what, deadline=30.0):
    end = time.monotonic() + deadline
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def served(monkeypatch, hook, tmp_path) -> Path:
    """A served model directory named by the (stand-in) server args, as SGLang's are."""
    model_dir = tmp_path / "Kimi-K2.5"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "kimi_k25"}')
    compat = sys.modules[hook.__name__.rsplit(".", 1)[0] + ".compat"]
    args = SimpleNamespace(model_path=str(model_dir), tokenizer_path=str(model_dir))
    monkeypatch.setattr(compat, "_server_args", lambda: args)
    return model_dir


def test_stream_carries_rows_ids_and_identity_and_writes_no_shards(env, monkeypatch, tmp_path):
    model_dir = served(monkeypatch, env.hook, tmp_path)
    inbox = Inbox(env.addr, {"hidden_size": H, "num_layers": L, "aux_layer_ids": IDS})
    try:
        fb, final, aux = batch(["dump-a", "warmup", "dump-b"], [3, 2, 4])
        # the Kimi wrapper's language model: a text config without _name_or_path
        model = standin_model(H, L, IDS, name="")
        env.hook.dump(model, fb, final, aux)
        wait_for(lambda: len(inbox.samples) == 2, "two streamed samples")
        a, b = inbox.samples["a"], inbox.samples["b"]
        assert a["input_ids"].tolist() == fb.input_ids[:3].tolist()
        assert torch.equal(a["final"], final[:3].to(torch.bfloat16))
        assert torch.equal(b["aux"], aux[5:9].to(torch.bfloat16))
        meta = inbox.listener.meta
        assert meta.model == str(model_dir)  # the metadata names the model
        assert meta.extra["config_sha256"] and meta.extra["model_class"] == "SimpleNamespace"
        assert not (env.root / "shards").exists() or not list((env.root / "shards").iterdir())
    finally:
        inbox.listener.close()


def test_dense_dump_meta_names_the_served_model(env, monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3_DUMP_MODE", "dense")
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "1")
    env.hook.reset()
    model_dir = served(monkeypatch, env.hook, tmp_path)
    fb, final, aux = batch(["dump-a"], [3])
    env.hook.dump(standin_model(H, L, IDS, name=""), fb, final, aux)
    env.hook.reset()
    meta = json.loads((env.root / "meta.json").read_text())
    assert meta["model"] == str(model_dir)
    assert meta["extra"]["model_path"] == str(model_dir)
    assert meta["extra"]["config_sha256"]
    assert DumpReader(env.root).ids() == ["a"]


def test_slow_consumer_never_blocks_a_forward_past_the_deadline(env, monkeypatch, tally, tmp_path):
    """A consumer that accepts and never reads: forwards return within the deadline; the
    samples that did not fit are counted and announced DROPPED once it reads again."""
    served(monkeypatch, env.hook, tmp_path)
    monkeypatch.setenv("EAGLE3_DUMP_DEADLINE_S", "0.3")
    monkeypatch.setenv("EAGLE3_DUMP_QUEUE", "1")
    monkeypatch.setenv("EAGLE3_STREAM_SEND_TIMEOUT_S", "120")
    env.hook.reset()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(env.sock))
    server.listen(1)
    rng = random.Random(32)
    sent: list[str] = []
    worst = 0.0
    try:
        for i in range(12):
            n = rng.randrange(2000, 6000)  # rows big enough to fill the socket buffer quickly
            fb, final, aux = batch([f"dump-s{i}"], [n], seed=i)
            t0 = time.monotonic()
            env.hook.dump(standin_model(H, L, IDS), fb, final, aux)
            took = time.monotonic() - t0
            worst = max(worst, took)
            sent.append(f"s{i}")
            # the promise: the deadline (0.3 s) plus scheduling slack on a loaded box, never
            # the unbounded wait that would trip SGLang's 300 s watchdog
            held = took < 5.0
            assert tally.trial("online stream: slow consumer, forward within deadline", held)
        stats = env.hook.stats()
        assert stats["stream_overflow"] >= 1, stats
    finally:
        server.close()  # the stuck consumer goes away (its pending connection is reset)
        env.sock.unlink(missing_ok=True)
    # a real listener on the same address gets the DROPPED notices after the reconnect
    inbox = Inbox(env.addr)
    try:
        fb, final, aux = batch(["dump-late"], [4], seed=99)
        env.hook.dump(standin_model(H, L, IDS), fb, final, aux)
        try:
            wait_for(lambda: "late" in inbox.samples, "the sample after the reconnect")
        except AssertionError:
            detail = (env.hook.stats(), inbox.listener.stats, inbox.lost)
            raise AssertionError(f"no sample after the reconnect: {detail}") from None
        got = {sid for sid, _ in inbox.dropped} | set(inbox.samples)
        dropped = {sid for sid, _ in inbox.dropped}
        assert len(dropped) == env.hook.stats()["stream_overflow"]
        assert all("back-pressure" in reason for _, reason in inbox.dropped)
        # every sample is accounted for: streamed, announced dropped, or lost with the
        # consumer that never read (the trainer asks again for those after its timeout)
        assert dropped <= set(sent) and "late" in got
    finally:
        inbox.listener.close()
    assert worst < 5.0


def test_dense_writer_deadline_drops_with_markers_instead_of_blocking(env, monkeypatch, tally):
    monkeypatch.setenv("EAGLE3_DUMP_MODE", "dense")
    monkeypatch.setenv("EAGLE3_DUMP_DEADLINE_S", "0.2")
    monkeypatch.setenv("EAGLE3_DUMP_QUEUE", "1")
    env.hook.reset()
    dense = sys.modules[env.hook.__name__.rsplit(".", 1)[0] + ".dense"]
    release = threading.Event()
    real_add = dense.ShardWriter.add

    def stuck_add(self, *args, **kw):  # a disk that hangs
        release.wait(60)
        return real_add(self, *args, **kw)

    monkeypatch.setattr(dense.ShardWriter, "add", stuck_add)
    for i in range(6):
        fb, final, aux = batch([f"dump-d{i}"], [3], seed=i)
        t0 = time.monotonic()
        env.hook.dump(standin_model(H, L, IDS), fb, final, aux)
        took = time.monotonic() - t0
        held = took < 5.0  # deadline 0.2 s + scheduling slack
        assert tally.trial("dump writer: stuck disk, forward within deadline", held), took
    overflow = env.hook.stats()["overflow"]
    assert overflow >= 3
    release.set()
    env.hook.reset()
    markers = read_error_markers(env.root)
    done = set(DumpReader(env.root).ids())
    assert {s for s, m in markers.items() if m.get("kind") == "overflow"} | done == {
        f"d{i}" for i in range(6)
    }
    assert len([m for m in markers.values() if m.get("kind") == "overflow"]) == overflow


def test_bad_stream_settings_fail_at_the_first_dump(env, monkeypatch):
    for key, value, words in (
        ("EAGLE3_STREAM_ADDR", "udp:x", "EAGLE3_STREAM_ADDR"),
        ("EAGLE3_DUMP_DEADLINE_S", "400", "watchdog"),
        ("EAGLE3_DUMP_MODE", "tape", "dense, stream or both"),
    ):
        monkeypatch.setenv(key, value)
        env.hook.reset()
        fb, final, aux = batch(["dump-a"], [3])
        with pytest.raises(env.hook.DumpConfigError, match=words):
            env.hook.dump(standin_model(H, L, IDS), fb, final, aux)
        monkeypatch.undo()
        for k, v in (("EAGLE3_DUMP_DIR", str(env.root)), ("EAGLE3_DUMP_MODE", "stream"),
                     ("EAGLE3_STREAM_ADDR", env.addr)):  # fmt: skip
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(env.hook, "_writer_rank", lambda model: 0)


def test_both_modes_route_the_stream_and_dump_plain_ids(env, monkeypatch, tmp_path):
    """EAGLE3_DUMP_MODE=both with a per-rank template: `@1/b` streams to rank 1's address as
    sample `b`, and the dense dump holds `a` and `b` under their dataset ids."""
    served(monkeypatch, env.hook, tmp_path)
    template = str(env.addr).replace(".sock", "-{k}.sock")
    monkeypatch.setenv("EAGLE3_DUMP_MODE", "both")
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "1")
    monkeypatch.setenv("EAGLE3_STREAM_ADDR", template)
    env.hook.reset()
    ranks = [Inbox(template.replace("{k}", str(k))) for k in (0, 1)]
    try:
        fb, final, aux = batch(["dump-@0/a", "dump-@1/b"], [3, 4])
        env.hook.dump(standin_model(H, L, IDS), fb, final, aux)
        wait_for(lambda: "a" in ranks[0].samples and "b" in ranks[1].samples, "routed samples")
        assert "b" not in ranks[0].samples and "a" not in ranks[1].samples
        env.hook.reset()
        assert sorted(DumpReader(env.root).ids()) == ["a", "b"]
    finally:
        for inbox in ranks:
            inbox.listener.close()
