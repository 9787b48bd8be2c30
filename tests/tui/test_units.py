"""The cockpit's data paths without widgets: line index, log tail and feed, metrics scan and
splice, keymaps, host-key messages, formatting."""

from __future__ import annotations

import json
import random

import pytest

from eagle_tui.app.keymap import KeymapError, load_keymap, parse_keymap
from eagle_tui.app.widgets.logs.feed import LogFeed, read_tail
from eagle_tui.app.widgets.logs.line_index import LineIndex
from eagle_tui.app.widgets.progress.metrics import Metrics, StepMetrics, scan_metrics
from eagle_tui.present.guards import summary as guard_summary
from eagle_tui.present.values import observed_text
from runbook.transports import HostKeyRefusal

FP = "SHA256:" + "A" * 43


def write(path, lines, tail=""):
    path.write_bytes(("\n".join(lines) + "\n" + tail).encode())


@pytest.mark.parametrize("block", [7, 100, 4096])
def test_line_index_reads_any_window(tmp_path, block):
    rng = random.Random(block)
    lines = [f"{i}:" + "x" * rng.randint(0, 300) for i in range(3000)]
    p = tmp_path / "log"
    write(p, lines, "partial")
    ix = LineIndex(p, block=block)
    ix.update()
    everything = [*lines, "partial"]
    assert ix.line_count == len(everything)
    for start in [0, 1, block, 1499, 2990, 2999, 3000, 3001]:
        assert ix.read_lines(start, 17) == everything[start : start + 17]
    assert len(ix._lines) < len(lines)  # sparse: one checkpoint per block, not per line


def test_line_index_grows_with_the_file_and_restarts_after_truncation(tmp_path):
    p = tmp_path / "log"
    write(p, ["a", "b"], "c")
    ix = LineIndex(p)
    ix.update()
    assert ix.line_count == 3 and ix.read_lines(2, 1) == ["c"]
    with open(p, "ab") as f:
        f.write(b"ontinued\nd\n")
    ix.update()
    assert ix.read_lines(0, 10) == ["a", "b", "continued", "d"]
    p.write_bytes(b"x\n")  # the engine truncates unconfirmed mirror bytes on reattach
    ix.update()
    assert ix.read_lines(0, 10) == ["x"]


def test_line_index_respects_the_confirmed_size(tmp_path):
    p = tmp_path / "log"
    write(p, ["one", "two", "three"])
    ix = LineIndex(p, limit=8)  # "one\ntwo\n"
    ix.update()
    assert ix.read_lines(0, 10) == ["one", "two"]


def test_line_index_carriage_returns_and_bad_utf8(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(b"10%\r50%\r100%\nbad \xff byte\n")
    ix = LineIndex(p)
    ix.update()
    assert ix.read_lines(0, 5) == ["100%", "bad \ufffd byte"]


def test_read_tail_stops_at_the_confirmed_size_and_keeps_the_partial(tmp_path):
    p = tmp_path / "log"
    data = "".join(f"line {i}\n" for i in range(1000)) + "half"
    p.write_text(data + " more bytes not yet confirmed")
    lines, partial = read_tail(p, len(data), 5, block=64)
    assert lines == [f"line {i}" for i in range(995, 1000)] and partial == "half"
    lines, partial = read_tail(p, len(data), 5000)
    assert len(lines) == 1000 and lines[0] == "line 0"
    assert read_tail(tmp_path / "missing", 10, 5) == ([], "")


def test_log_feed_batches_bounded_lines():
    feed = LogFeed(max_batch=3)
    feed.feed("a\nb")
    assert feed.take() == ["a"]
    feed.feed("c\nd\ne\nf\ng\n")  # a flood: the oldest of the batch are skipped, visibly
    assert feed.take() == [
        "⋯ 2 lines skipped at this rate; the full log (l) has every line ⋯",
        "e",
        "f",
        "g",
    ]
    assert feed.total_lines == 6 and feed.dropped == 2
    feed.feed("progress 1%\rprogress 99%\nend")
    feed.flush_partial()
    assert feed.take() == ["progress 99%", "end"]


def _metrics_line(step):
    rec = {
        "kind": "metrics",
        "step": step,
        "loss": 1.0 / step,
        "acc_k": [0.5, 0.4],
        "sim_accept_len": 2.0,
    }
    return "@@eagle3 " + json.dumps(rec)


def test_scan_metrics_leaves_out_an_unfinished_line(tmp_path):
    p = tmp_path / "log"
    body = "\n".join(["text", _metrics_line(1), "more", _metrics_line(2)]) + "\n"
    p.write_text(body + _metrics_line(3)[:20])
    recs = scan_metrics(p, p.stat().st_size, block=16)
    assert [r["step"] for r in recs] == [1, 2]


def test_step_metrics_splices_scan_and_live_events_exactly_once(tmp_path):
    m = StepMetrics("log", scan_end=100)
    assert not m.add_live(
        {"kind": "metrics", "step": 2, "loss": 1.0}, mirror_end=100
    )  # in the scan
    assert m.add_live({"kind": "metrics", "step": 3, "loss": 1.0}, mirror_end=150)  # beyond it
    m.scanned(
        [{"kind": "metrics", "step": 1, "loss": 1.0}, {"kind": "metrics", "step": 2, "loss": 1.0}]
    )
    assert m.metrics.loss.x == [1.0, 2.0, 3.0]


def test_metrics_per_position_accuracy_and_thinning():
    m = Metrics()
    for i in range(5000):
        m.add(
            {
                "kind": "metrics",
                "step": i,
                "loss": float("nan") if i == 3 else 1.0,
                "acc_k": [0.1, 0.2, 0.3],
            }
        )
    assert sorted(m.acc) == [0, 1, 2]
    assert len(m.loss.x) <= 2000 and m.count == 5000
    m.add({"kind": "metrics", "acc": 0.7})  # a scalar accuracy is position 0
    assert m.acc[0].y[-1] == 0.7


def test_keymap_files(tmp_path):
    ids = {"run-selected", "quit"}
    assert parse_keymap('run-selected = "g,ctrl+r"', ".toml") == {"run-selected": "g,ctrl+r"}
    assert parse_keymap('{"keymap": {"quit": ["ctrl+q", "Q"]}}', ".json") == {"quit": "ctrl+q,Q"}
    with pytest.raises(KeymapError):
        parse_keymap('quit = ""', ".toml")
    f = tmp_path / "keymap.toml"
    f.write_text('run-selected = "g"\nno-such-action = "z"\n')
    keymap, problems = load_keymap(ids, [f])
    assert keymap == {"run-selected": "g"} and "no-such-action" in problems[0]
    f.write_text("not = [valid")
    assert load_keymap(ids, [f])[0] == {} and load_keymap(ids, [f])[1]
    assert load_keymap(ids, [tmp_path / "none.toml"]) == ({}, [])


def test_observed_values_are_readable():
    assert (
        observed_text({"exists": True, "type": "dir", "size": 4096})
        == "exists=yes type=dir size=4.0 KiB"
    )
    assert observed_text({"bytes": 924 << 30, "files": 37312}) == "bytes=924.0 GiB files=37312"
    assert observed_text(None) == "—"
    assert str(guard_summary([{"ok": True}, {"ok": False}])) == "✗1/2"


def test_the_ssh_transports_refusals_carry_typed_fields(tmp_path):
    hk = pytest.importorskip("runbook.transports.hostkeys")
    unknown = hk.HostKeyUnknown(
        "box", "10.0.0.2", 2222, FP, tmp_path / "known_hosts", key_type="ssh-ed25519"
    )
    assert unknown.host_key == HostKeyRefusal("unknown", "[10.0.0.2]:2222", FP, "ssh-ed25519")
    changed = hk.HostKeyChanged(
        "box", "10.0.0.2", 2222, [FP], "SHA256:" + "B" * 43, tmp_path / "kh", "ssh-rsa"
    )
    assert changed.host_key == HostKeyRefusal(
        "changed", "[10.0.0.2]:2222", "SHA256:" + "B" * 43, "ssh-rsa", (FP,)
    )
