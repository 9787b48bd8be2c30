"""The stream's frames (remote_agent/eagle3/stream_wire.py): round trips equal a dense shard's
read-back, and every truncated or corrupted frame is refused whole (seeded attack loops)."""

from __future__ import annotations

import io
import random

import pytest

torch = pytest.importorskip("torch")

from remote_agent.eagle3 import dense  # noqa: E402
from remote_agent.eagle3 import stream_wire as wire  # noqa: E402


def _sample(t: int = 7, h: int = 16, k: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (t,), generator=g, dtype=torch.int32)
    aux = torch.randn(t, k * h, generator=g).to(torch.bfloat16)
    final = torch.randn(t, h, generator=g).to(torch.bfloat16)
    return ids, aux, final


def _bytes(buffers) -> bytes:
    return b"".join(bytes(memoryview(b).cast("B")) for b in buffers)


def _reader(data: bytes):
    f = io.BytesIO(data)
    return f.readinto


@pytest.mark.parametrize("aux_dtype", ["bf16", "fp8_e4m3"])
def test_round_trip_equals_what_a_dense_shard_reads_back(tmp_path, aux_dtype):
    ids, aux, final = _sample()
    meta = dense.DumpMeta("m", 16, 8, [2, 4, 5], aux_dtype=aux_dtype)
    with dense.ShardWriter(tmp_path, meta) as w:
        w.add("a", ids, aux, final)
    want = dense.DumpReader(tmp_path).get("a")
    frame = wire.read_frame(_reader(_bytes(wire.sample_frame("a", ids, aux, final, aux_dtype, 3))))
    assert frame is not None and frame.kind == wire.SAMPLE and frame.header["sample_id"] == "a"
    got = wire.decode_sample(frame)
    for key in ("input_ids", "aux", "final"):
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key


def test_clean_end_between_frames_is_none_and_frames_follow_each_other():
    ids, aux, final = _sample()
    data = _bytes(wire.frame_buffers(wire.HELLO, {"meta": {}}, [])) + _bytes(
        wire.sample_frame("x", ids, aux, final, "bf16", 3)
    )
    read = _reader(data)
    assert wire.read_frame(read).kind == wire.HELLO
    assert wire.read_frame(read).kind == wire.SAMPLE
    assert wire.read_frame(read) is None


def test_truncated_frames_are_refused_whole(tally):
    """Cut a SAMPLE frame at random offsets: never a sample, always TruncatedFrame."""
    ids, aux, final = _sample(t=9)
    data = _bytes(wire.sample_frame("cut", ids, aux, final, "bf16", 3))
    rng = random.Random(30)
    cuts = sorted(
        {rng.randrange(1, len(data)) for _ in range(60)} | {1, wire.HEAD.size, len(data) - 1}
    )
    for cut in cuts:
        try:
            wire.read_frame(_reader(data[:cut]))
            held = False
        except wire.TruncatedFrame:
            held = True
        assert tally.trial("online stream: truncated frame refused whole", held), cut


def test_corrupted_frames_are_refused(tally):
    """Flip one random byte: a StreamError (bad magic, version, size, crc or a short read)."""
    ids, aux, final = _sample(t=5)
    data = bytearray(_bytes(wire.sample_frame("flip", ids, aux, final, "bf16", 3)))
    rng = random.Random(31)
    for _ in range(60):
        bad = bytearray(data)
        at = rng.randrange(len(bad))
        bad[at] ^= 1 << rng.randrange(8)
        try:
            frame = wire.read_frame(_reader(bytes(bad)))
            held = False
            if frame is not None:
                wire.decode_sample(frame)
        except wire.StreamError:
            held = True
        assert tally.trial("online stream: corrupted frame refused", held), at


def test_addresses():
    assert wire.parse_address("unix:/tmp/x.sock")[1] == "/tmp/x.sock"
    assert wire.parse_address("tcp:10.0.0.2:7000")[1] == ("10.0.0.2", 7000)
    for bad in ("", "unix:", "tcp:host", "udp:1.2.3.4:5", "tcp::80"):
        with pytest.raises(ValueError, match="unix:PATH or tcp:HOST:PORT"):
            wire.parse_address(bad)
