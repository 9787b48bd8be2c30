"""The SGLang dump hook (patches/eagle3_dump/hook.py) on CPU.

The hook is driven by a stand-in `ForwardBatch` (SimpleNamespace with the fields of sglang 0.5.23
§2.1) and a stand-in model object: that is the one fake here; the hook code and the dense
format are the real shipped files. Rows encode (request j, position p) as j*32 + p (exact in
bf16), padding rows are -1, so any slicing mistake shows as a wrong value.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import load_hook_package, standin_batch, standin_model  # noqa: E402

from remote_agent.eagle3.dense import DumpReader, read_error_markers  # noqa: E402

H, L, IDS = 16, 8, [2, 4, 5]
_real_link = os.link


@pytest.fixture(scope="module")
def hookmod(tmp_path_factory):
    return load_hook_package(tmp_path_factory.mktemp("hookpkg"))


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "dump"


@pytest.fixture
def hook(hookmod, root, monkeypatch):
    for key in list(os.environ):
        if key.startswith("EAGLE3_DUMP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("EAGLE3_DUMP_DIR", str(root))
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "1")
    monkeypatch.setenv("EAGLE3_DUMP_MIN_FREE_MB", "0")
    hookmod.reset()
    monkeypatch.setattr(hookmod, "_writer_rank", lambda model: 0)
    yield hookmod
    hookmod.reset()


def encoded(rids, lens, pad=0, prefix_lens=None, cpu_lists=True, mode="EXTEND"):
    values = [j * 32 + p for j, n in enumerate(lens) for p in range(n)]
    vals = torch.tensor(values + [-1] * pad, dtype=torch.float32)
    final = vals[:, None].repeat(1, H)
    aux = vals[:, None].repeat(1, 3 * H)
    aux[:, [0, H, 2 * H]] = torch.tensor([0.0, 1.0, 2.0])  # column block k starts with k
    ids = torch.tensor(values + [0] * pad, dtype=torch.int64)
    fb = standin_batch(rids, lens, ids, prefix_lens, mode=mode, cpu_lists=cpu_lists)
    return fb, final, aux


def model(**kw):
    return standin_model(H, L, kw.pop("ids", IDS), **kw)


def check_sample(reader, sid, j, n):
    s = reader.get(sid)
    expect = torch.tensor([j * 32 + p for p in range(n)], dtype=torch.float32)
    assert s["input_ids"].tolist() == expect.long().tolist()
    assert torch.equal(s["final"].float(), expect[:, None].repeat(1, H))
    aux = s["aux"].float()
    assert aux.shape == (n, 3 * H)
    assert aux[:, [0, H, 2 * H]].tolist() == [[0.0, 1.0, 2.0]] * n
    assert torch.equal(aux[:, 1:H], expect[:, None].repeat(1, H - 1))


def test_splits_requests_drops_padding_and_writes_meta(hook, root):
    fb, final, aux = encoded(["dump-a", "dump-b", "dump-c"], [5, 3, 7], pad=4)
    hook.dump(model(), fb, final, aux)
    hook.reset()  # seals the shard
    reader = DumpReader(root)
    assert sorted(reader.ids()) == ["a", "b", "c"]
    for j, (sid, n) in enumerate(zip("abc", [5, 3, 7], strict=True)):
        check_sample(reader, sid, j, n)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["producer"] == "sglang-patch"
    assert (meta["hidden_size"], meta["num_layers"], meta["aux_layer_ids"]) == (H, L, IDS)
    assert (meta["final_norm"], meta["aux_norm"], meta["aux_dtype"]) == ("post", "pre", "bf16")
    assert meta["versions"]["eagle3_dump_patch"] == "1"
    assert meta["extra"]["output_layer_ids"] == [1, 3, 4]
    assert meta["extra"]["writer_rank"] == 0
    from safetensors import safe_open

    with safe_open(str(reader.shards[0]), framework="pt") as f:
        md = f.metadata()
    assert md["producer"] == "sglang-patch" and md["rank"] == "0"
    assert json.loads(md["samples"]) == [["a", 0, 5], ["b", 5, 3], ["c", 8, 7]]


def test_gpu_only_path_reads_lengths_from_tensors(hook, root):
    fb, final, aux = encoded(["dump-a", "dump-b"], [4, 6], pad=2, cpu_lists=False)
    hook.dump(model(), fb, final, aux)
    hook.reset()
    reader = DumpReader(root)
    check_sample(reader, "a", 0, 4)
    check_sample(reader, "b", 1, 6)


def test_warmup_rids_modes_and_missing_rids_are_ignored(hook, root):
    fb, final, aux = encoded(["warmup-1", "HEALTH_CHECK"], [3, 2])
    hook.dump(model(), fb, final, aux)
    for mode in ("DECODE", "IDLE", "TARGET_VERIFY", "MIXED", "SPLIT_PREFILL"):
        fb, final, aux = encoded(["dump-x"], [3], mode=mode)
        hook.dump(model(), fb, final, aux)
    fb, final, aux = encoded(["dump-x"], [3])
    fb.rids = None
    hook.dump(model(), fb, final, aux)
    hook.reset()
    assert not root.exists()  # nothing qualified: not even a directory
    # a warm-up request before a dump request in one batch: offsets still right
    fb, final, aux = encoded(["warmup-1", "dump-b"], [3, 4], pad=1)
    hook.dump(model(), fb, final, aux)
    hook.reset()
    reader = DumpReader(root)
    assert reader.ids() == ["b"]
    check_sample(reader, "b", 1, 4)


def test_custom_prefix(hook, root, monkeypatch):
    monkeypatch.setenv("EAGLE3_DUMP_RID_PREFIX", "x/")
    hook.reset()
    fb, final, aux = encoded(["dump-a", "x/b"], [2, 3])
    hook.dump(model(), fb, final, aux)
    hook.reset()
    assert DumpReader(root).ids() == ["b"]


def test_non_writer_ranks_do_nothing(hook, root, monkeypatch):
    monkeypatch.setattr(hook, "_writer_rank", lambda model: None)
    fb, final, aux = encoded(["dump-a"], [3])
    hook.dump(model(capture=False), fb, None, None)  # would be a config error on a writer
    hook.dump(model(), fb, final, aux)
    hook.reset()
    assert not root.exists()


def _standin_runtime(monkeypatch, state: dict, server_args: dict | None) -> None:
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: types.SimpleNamespace(**state)
    if server_args is not None:  # 0.5.23's accessor; absent on 0.5.14 (server_args module)
        rc.get_server_args = lambda: types.SimpleNamespace(**server_args)
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.srt", types.ModuleType("sglang.srt"))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)


def test_writer_rank_is_attn_tp_rank0_of_each_dp_group(hookmod, monkeypatch):
    """The real accessor (no `hook` fixture here) against a stand-in sglang runtime_context."""
    state: dict = {"attn_cp_rank": 0}
    _standin_runtime(monkeypatch, state, {"dp_size": 1})
    m = model()
    state.update(attn_tp_rank=1, attn_dp_rank=0, attn_dp_size=1, dp_rank=None)
    assert hookmod._writer_rank(m) is None
    state.update(attn_tp_rank=0, attn_dp_rank=3, attn_dp_size=4, dp_rank=1)
    assert hookmod._writer_rank(m) == 7
    state.update(attn_cp_rank=1)
    assert hookmod._writer_rank(m) is None
    state.update(attn_cp_rank=0)
    m.pp_group.is_last_rank = False
    assert hookmod._writer_rank(m) is None


def test_writer_rank_fails_closed(hookmod, monkeypatch):
    """Every field the lookup cannot read is a DumpConfigError naming it, never rank 0."""
    err = hookmod.DumpConfigError
    full = {"attn_tp_rank": 0, "attn_cp_rank": 0, "attn_dp_rank": 0, "attn_dp_size": 1}
    for missing in ("attn_tp_rank", "attn_cp_rank", "attn_dp_rank", "attn_dp_size"):
        state = {k: v for k, v in full.items() if k != missing}
        _standin_runtime(monkeypatch, state, {"dp_size": 1})
        with pytest.raises(err, match=f"get_parallel\\(\\).{missing}"):
            hookmod._writer_rank(model())
        _standin_runtime(monkeypatch, {**full, missing: None}, {"dp_size": 1})
        with pytest.raises(err, match=f"{missing} is None"):
            hookmod._writer_rank(model())
    # no dp_rank (0.5.14): one replica is a fact from the server args, two cannot be told apart
    _standin_runtime(monkeypatch, full, {"dp_size": 1})
    assert hookmod._writer_rank(model()) == 0
    _standin_runtime(monkeypatch, full, {"dp_size": 2, "enable_dp_attention": False})
    with pytest.raises(err, match="DP replicas"):
        hookmod._writer_rank(model())
    _standin_runtime(monkeypatch, full, None)  # and no server args readable at all
    with pytest.raises(err, match="DP replicas"):
        hookmod._writer_rank(model())
    m = model()
    del m.pp_group
    with pytest.raises(err, match="pp_group"):
        hookmod._writer_rank(m)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", None)  # import fails
    with pytest.raises(err, match="0.5.14 and 0.5.23"):
        hookmod._writer_rank(model())


def test_a_rank_that_cannot_be_read_refuses_the_dump(hookmod, root, monkeypatch):
    """Through dump(): the forward gets the error, nothing is written as rank 0."""
    for key in list(os.environ):
        if key.startswith("EAGLE3_DUMP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("EAGLE3_DUMP_DIR", str(root))
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "1")
    hookmod.reset()
    _standin_runtime(monkeypatch, {"attn_tp_rank": 0}, {"dp_size": 1})
    fb, final, aux = encoded(["dump-a"], [3])
    with pytest.raises(hookmod.DumpConfigError):
        hookmod.dump(model(), fb, final, aux)
    hookmod.reset()
    assert not root.exists()


def test_aux_as_a_list_of_layers_is_packed_like_sglang_0_5_14(hook, root):
    """0.5.14 hands K tensors [T, H] (its logits processor cats them on the last dim)."""
    fb, final, aux = encoded(["dump-a", "dump-b"], [4, 3], pad=1)
    hook.dump(model(), fb, final, list(aux.split(H, dim=1)))
    hook.reset()
    reader = DumpReader(root)
    check_sample(reader, "a", 0, 4)
    check_sample(reader, "b", 1, 3)


def test_partial_request_becomes_an_error_marker(hook, root):
    fb, final, aux = encoded(["dump-a", "dump-b"], [4, 5], prefix_lens=[0, 16], pad=2)
    hook.dump(model(), fb, final, aux)
    hook.reset()
    reader = DumpReader(root)
    assert reader.ids() == ["a"]
    check_sample(reader, "a", 0, 4)
    marker = read_error_markers(root)["b"]
    assert marker["kind"] == "partial" and marker["prefix_len"] == 16 and marker["seq_len"] == 5
    assert "chunked-prefill-size -1" in marker["reason"] and marker["rid"] == "dump-b"


def test_unsafe_rid_gets_a_hashed_marker_name(hook, root, tmp_path):
    evil = "../../escape me"
    fb, final, aux = encoded([f"dump-{evil}", "dump-ok"], [3, 2], prefix_lens=[7, 0])
    hook.dump(model(), fb, final, aux)
    hook.reset()
    markers = list((root / "errors").iterdir())
    assert len(markers) == 1 and markers[0].name.startswith("h-")
    assert read_error_markers(root)[evil]["rid"] == f"dump-{evil}"
    assert not (tmp_path / "escape me.error.json").exists()
    # an unsafe id is fine as a dumped sample: it lives in the shard index, not in a file name
    fb, final, aux = encoded([f"dump-{evil}"], [3])
    hook.dump(model(), fb, final, aux)
    hook.reset()
    assert evil in DumpReader(root)


def test_duplicates_are_skipped_within_and_across_restarts(hook, root):
    for _ in range(2):
        fb, final, aux = encoded(["dump-a"], [3])
        hook.dump(model(), fb, final, aux)
    assert hook.stats()["duplicates"] == 1
    hook.reset()
    fb, final, aux = encoded(["dump-a", "dump-b"], [3, 2])
    hook.dump(model(), fb, final, aux)  # a restarted server: "a" is already on disk
    hook.reset()
    reader = DumpReader(root)
    assert sorted(reader.ids()) == ["a", "b"] and not reader.duplicates


def test_io_errors_never_raise_leave_nothing_partial_and_resume(hook, root, monkeypatch):
    def broken_link(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "link", broken_link)
    fb, final, aux = encoded(["dump-a", "dump-b"], [3, 4])
    hook.dump(model(), fb, final, aux)  # buffered
    stats = hook.stats()
    hook.reset()  # the seal fails: counted, markers written, nothing raised
    assert stats["io_errors"] == 0
    assert list((root / "shards").iterdir()) == []  # no shard, no temporary file left
    markers = read_error_markers(root)
    assert set(markers) == {"a", "b"} and markers["a"]["kind"] == "io"
    assert markers["a"]["errno"] == errno.EIO
    monkeypatch.setattr(os, "link", _real_link)
    fb, final, aux = encoded(["dump-a", "dump-b"], [3, 4])
    hook.dump(model(), fb, final, aux)  # the retry succeeds
    hook.reset()
    assert sorted(DumpReader(root).ids()) == ["a", "b"]


def test_full_disk_reserve_refuses_shards_with_markers(hook, root, monkeypatch):
    monkeypatch.setenv("EAGLE3_DUMP_MIN_FREE_MB", str(10**12))
    hook.reset()
    fb, final, aux = encoded(["dump-a"], [3])
    hook.dump(model(), fb, final, aux)
    hook.reset()
    marker = read_error_markers(root)["a"]
    assert marker["errno"] == errno.ENOSPC and "reserve" in marker["reason"]
    assert list((root / "shards").iterdir()) == []


def test_config_errors_fail_fast_with_a_clear_message(hook, root, monkeypatch):
    fb, final, aux = encoded(["dump-a"], [3])
    with pytest.raises(hook.DumpConfigError, match="enable-return-aux-hidden-states"):
        hook.dump(model(capture=False), fb, final, None)
    with pytest.raises(hook.DumpConfigError, match="enable-return-aux-hidden-states"):
        hook.dump(model(), fb, final, aux)  # remembered: the server stays refused
    hook.reset()
    with pytest.raises(hook.DumpConfigError, match=r"expected \[tokens, 3 x 16 = 48\]"):
        hook.dump(model(), fb, final, aux[:, :40])
    hook.reset()
    with pytest.raises(hook.DumpConfigError, match=r"captures layers \[1, 4, 5\] but \[2, 4, 5\]"):
        hook.dump(model(ids=[1, 4, 5]), fb, final, aux)
    hook.reset()
    monkeypatch.setenv("EAGLE3_DUMP_LAYER_IDS", "2,4,6")
    with pytest.raises(hook.DumpConfigError, match="expected"):
        hook.dump(model(), fb, final, aux)
    monkeypatch.delenv("EAGLE3_DUMP_LAYER_IDS")
    hook.reset()
    fb2, final2, aux2 = encoded(["dump-a", "dump-b"], [3, 4])
    with pytest.raises(hook.DumpConfigError, match="splits rows across ranks"):
        hook.dump(model(), fb2, final2[:5], aux2[:5])  # fewer rows than the batch extends
    hook.reset()
    monkeypatch.setenv("EAGLE3_DUMP_AUX_DTYPE", "int4")
    with pytest.raises(hook.DumpConfigError, match="EAGLE3_DUMP_AUX_DTYPE"):
        hook.dump(model(), fb, final, aux)


def test_no_dump_while_capturing_or_compiling(hook, root, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fb, final, aux = encoded(["dump-a"], [3])
    hook.dump(model(), fb, final, aux)
    hook.reset()
    assert not root.exists()


def _wait_for(pred, what: str, deadline_s: float = 30.0):
    end = time.monotonic() + deadline_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_background_writer_backpressure(hook, root, monkeypatch):
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "0")
    monkeypatch.setenv("EAGLE3_DUMP_QUEUE", "1")
    hook.reset()
    dense = sys.modules[hook.__name__.rsplit(".", 1)[0] + ".dense"]
    release, entered = threading.Event(), threading.Event()
    real_add = dense.ShardWriter.add

    def slow_add(self, *args, **kw):
        entered.set()
        release.wait(60)
        return real_add(self, *args, **kw)

    monkeypatch.setattr(dense.ShardWriter, "add", slow_add)
    calls = []

    def forward_loop():
        for i in range(3):
            fb, final, aux = encoded([f"dump-s{i}"], [2])
            hook.dump(model(), fb, final, aux)
            calls.append(i)

    t = threading.Thread(target=forward_loop)
    t.start()
    entered.wait(30)  # batch 0 is in the (stuck) writer
    _wait_for(lambda: len(calls) == 2, "the second forward to return (it fits the queue)")
    t.join(0.3)
    assert len(calls) == 2 and t.is_alive()  # the third forward waits: backpressure
    release.set()
    t.join(30)
    assert calls == [0, 1, 2]
    hook.reset()
    assert sorted(DumpReader(root).ids()) == ["s0", "s1", "s2"]


def test_canary_flush_request_and_idle_timer(hook, root, monkeypatch):
    monkeypatch.setenv("EAGLE3_DUMP_SYNC", "0")
    monkeypatch.setenv("EAGLE3_DUMP_FLUSH_S", "1000")
    hook.reset()
    fb, final, aux = encoded(["dump-a", "dump-__eagle3__:canary:n1"], [3, 4])
    hook.dump(model(), fb, final, aux)
    _wait_for(
        lambda: (
            (root / "canary" / "meta.json").exists()
            and "__eagle3__:canary:n1" in DumpReader(root / "canary")
        ),
        "the canary",
    )
    assert "a" not in DumpReader(root)  # the data shard stays open ...
    fb, final, aux = encoded(["dump-__eagle3__:flush:n2"], [1])
    hook.dump(model(), fb, final, aux)
    _wait_for(lambda: "a" in DumpReader(root), "the flushed shard")  # ... until asked to seal
    assert "__eagle3__:flush:n2" not in DumpReader(root)
    hook.reset()
    monkeypatch.setenv("EAGLE3_DUMP_FLUSH_S", "0.2")
    hook.reset()
    fb, final, aux = encoded(["dump-b"], [2])
    hook.dump(model(), fb, final, aux)
    _wait_for(lambda: "b" in DumpReader(root), "the idle-timer seal")


def test_fp8_aux(hook, root, monkeypatch):
    monkeypatch.setenv("EAGLE3_DUMP_AUX_DTYPE", "fp8_e4m3")
    hook.reset()
    fb, final, aux = encoded(["dump-a", "dump-b"], [5, 6], pad=1)
    hook.dump(model(), fb, final, aux)
    hook.reset()
    reader = DumpReader(root)
    assert reader.meta.aux_dtype == "fp8_e4m3"
    got = reader.get("b")["aux"].float()
    torch.testing.assert_close(got, aux[5:11].to(torch.bfloat16).float(), rtol=0.07, atol=0.05)
