"""`eagle3 extract --server URL1 --server URL2` against two loopback stand-ins for SGLang (the
fake of tests/eagle3/extraction: the server and its ForwardBatch are the one fake; the dump
hook, the tiny model's states, the client and the dense format are real), each with its own
dump hook writing its own shard dir: server k takes part k of the host's shard, the union is
every sample once, and equals one server's dump."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpReader  # noqa: E402
from remote_agent.eagle3.extraction.sharding import shard_of  # noqa: E402

LENGTHS = [12, 40, 7, 33, 21, 5, 28, 16, 9, 37, 24, 14]


def _hook(tmp_path_factory, dump_dir, monkeypatch):
    hook = load_hook_package(tmp_path_factory.mktemp("hookpkg"))
    env = {"EAGLE3_DUMP_DIR": str(dump_dir), "EAGLE3_DUMP_SHARD_MB": "0.05",
           "EAGLE3_DUMP_FLUSH_S": "0.5", "EAGLE3_DUMP_QUEUE": "2", "EAGLE3_DUMP_MIN_FREE_MB": "0"}  # fmt: skip
    hook.reset()
    hook._settings = hook.Settings.from_env(env)  # each "server process" its own settings
    monkeypatch.setattr(hook, "_writer_rank", lambda model: 0)
    return hook


def _extract(urls, data, out, *extra) -> int:
    servers = [a for u in urls for a in ("--server", u)]
    return main(
        ["extract", *servers, "--dataset", str(data), "--out", str(out), "--disk-margin-gb", "0",
         "--canary-timeout", "30", "--dump-timeout", "60", "--progress-interval", "0",
         "--allow-no-manifest", *extra]
    )  # fmt: skip


def test_two_servers_split_one_shard(tiny_target, tmp_path, tmp_path_factory, monkeypatch):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    root = tmp_path / "dumps"
    # host shard 1 of 2, two servers: shards 1 and 3 of 4
    dirs = [root / "shard-01-of-04", root / "shard-03-of-04"]
    hooks = [_hook(tmp_path_factory, d, monkeypatch) for d in dirs]
    try:
        with FakeSGLang(hooks[0], tiny_target) as a, FakeSGLang(hooks[1], tiny_target) as b:
            assert _extract([a.url, b.url], data, root, "--shard", "1/2") == 0
            assert a.batches and b.batches  # both servers did work
    finally:
        for h in hooks:
            h.reset()
    for k, d in enumerate(dirs):
        ids = DumpReader(d).ids()
        assert ids and all(shard_of(s, 4) == 1 + 2 * k for s in ids)
    union = DumpReader(root)
    mine = sorted(f"s{i:04d}" for i in range(len(LENGTHS)) if shard_of(f"s{i:04d}", 2) == 1)
    assert sorted(union.ids()) == mine and not union.duplicates


def test_two_servers_refuse_launch_and_repeats(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    u = "http://127.0.0.1:9"
    assert _extract([u, u], data, tmp_path / "o") == 2
    assert "the same URL twice" in capsys.readouterr().err
    assert _extract([u, u + "0"], data, tmp_path / "o", "--launch") == 2
    assert "no --launch" in capsys.readouterr().err
