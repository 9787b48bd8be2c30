"""Fan-out through the real CLI and the real local agent: `local` and `localhost-agent` are two
host names (two sessions, two agents) on this machine, enough to check the engine's side:
one job per host with its rank, the step done only when all are, per-host records and logs,
located load errors. The two-box runs over real sshd in network namespaces are in
test_two_hosts.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runbook.conftest import Cli

HOSTS = "[local, localhost-agent]"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def _rb(cli: Cli, fail_rank: int = -1) -> Path:
    return cli.runbook(f"""\
        name: fan
        steps:
          - id: hello
            title: one job per host
            hosts: {HOSTS}
            run: >-
              echo rank ${{host_rank}} of ${{host_count}} on ${{host}};
              test ${{host_rank}} != {fail_rank}
          - id: after
            title: needs every host
            requires: [hello]
            run: echo after
        """)


def test_one_job_per_host_with_its_rank(cli):
    out = cli("run", str(_rb(cli)), "--auto", check=0)
    steps = cli.state_json()["steps"]
    assert {k: v["status"] for k, v in steps.items()} == {
        "hello": "succeeded",
        "hello.local": "succeeded",
        "hello.localhost-agent": "succeeded",
        "after": "succeeded",
    }
    for rank, host in enumerate(["local", "localhost-agent"]):
        rec = steps[f"hello.{host}"]
        assert rec["host"] == host
        assert Path(rec["log_file"]).read_text() == f"rank {rank} of 2 on {host}\n"
        # headless: each host's lines under its own prefix
        assert f"hello.{host} │ rank {rank} of 2 on {host}" in out.stdout
    audit = cli.audit()
    final = [r for r in audit if r.get("step") == "hello" and r.get("status") == "succeeded"]
    assert [h["host"] for h in final[-1]["hosts"]] == ["local", "localhost-agent"]
    assert [h["rank"] for h in final[-1]["hosts"]] == [0, 1]
    for host in ("local", "localhost-agent"):
        recs = [r for r in audit if r.get("step") == f"hello.{host}"]
        assert recs and all(r["where"]["host"] == host for r in recs)


def test_the_step_fails_when_one_host_fails(cli):
    out = cli("run", str(_rb(cli, fail_rank=1)), "--auto")
    assert out.returncode == 1, out.stdout
    steps = cli.state_json()["steps"]
    assert steps["hello.local"]["status"] == "succeeded"
    assert steps["hello.localhost-agent"]["status"] == "failed"
    assert steps["hello"]["status"] == "failed"
    assert "localhost-agent did not succeed" in steps["hello"]["message"]
    assert steps["after"]["status"] == "pending"  # never ran
    # a re-run relaunches only the host that failed (the other stays done)
    cli.runbook(_rb(cli).read_text().replace("!= 1", "!= -1"))
    cli("run", str(_rb(cli)), "--auto", check=0)
    steps = cli.state_json()["steps"]
    assert steps["hello.local"]["attempt"] == 1
    assert steps["hello.localhost-agent"]["attempt"] == 2
    assert steps["after"]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("body", "where", "message"),
    [
        ("    host: local\n    hosts: [a, b]\n", "steps[0]", "not both"),
        ("    hosts: [a, a]\n", "steps[0]", "more than once"),
        ("    hosts: []\n", "steps[0].hosts", "at least one host"),
        ("    hosts: [user@a]\n", "steps[0]", "cannot name a fan-out job"),
        ("    hosts: {a: 1}\n", "steps[0].hosts", "list of host names"),
        (
            "    hosts: [a]\n    destructive: true\n    confirm: sure?\n",
            "steps[0].hosts",
            "runs on one box",
        ),
        ("    hosts: [a]\n    fanout_of: x\n", "steps[0].fanout_of", "set by the loader"),
    ],
)
def test_bad_fanouts_are_located(cli, body, where, message):
    rb = cli.runbook("name: bad\nsteps:\n  - id: s\n    title: t\n    run: echo hi\n" + body)
    out = cli("validate", str(rb))
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout + out.stderr
    line = next(ln for ln in text.splitlines() if message in ln)
    assert f"{rb}:" in line and f": {where}" in line, line


def test_host_vars_only_in_a_fanout(cli):
    rb = cli.runbook("name: bad\nsteps:\n  - id: s\n    title: t\n    run: echo ${host_rank}\n")
    out = cli("validate", str(rb))
    assert out.returncode == 2
    assert f"{rb}:5:" in out.stdout + out.stderr and "host_rank" in out.stdout + out.stderr


def test_hosts_from_a_variable(cli):
    rb = cli.runbook("""\
        name: fan
        vars: {boxes: "local,localhost-agent"}
        steps:
          - id: s
            title: t
            hosts: ${boxes}
            run: echo ${host}
        """)
    cli("run", str(rb), "--auto", check=0)
    steps = cli.state_json()["steps"]
    assert steps["s.localhost-agent"]["status"] == "succeeded"


def test_host_vars_give_each_box_its_values():
    from runbook.loader import load_text

    text = """\
name: fan
vars: {nic: eth0}
hosts:
  a: {ssh: box-a, vars: {addr: 198.18.0.1, nic: ib0}}
  b: {ssh: box-b, vars: {addr: 198.18.0.5}}
steps:
  - id: s
    title: t
    hosts: [a, b]
    run: echo ${host_rank}/${host_count} ${addr} ${nic}
"""
    rb = load_text(text, "rb.yaml").runbook
    assert [s.id for s in rb.steps] == ["s", "s.a", "s.b"]
    assert rb.step("s.a").run == "echo 0/2 198.18.0.1 ib0"
    assert rb.step("s.b").run == "echo 1/2 198.18.0.5 eth0"  # the runbook's value otherwise
    assert (rb.step("s.b").host, rb.step("s.b").fanout_of, rb.step("s.b").host_rank) == (
        "b",
        "s",
        1,
    )


def test_the_two_box_runbook():
    from runbook.loader import load_runbook

    repo = Path(__file__).resolve().parents[2]
    rb = load_runbook(repo / "runbooks" / "kimi-k25-eagle3-2box.yaml").runbook
    for rank, host in enumerate(("gpu-a", "gpu-b")):
        extract = rb.step(f"extract.{host}")
        assert extract.host == host and f"--shard {rank}/2" in extract.run
        server = rb.step(f"extraction-server.{host}")
        assert f"printf 'shard-%02d-of-%02d' {rank} 2" in server.run and server.service
        assert rb.step(f"stop-extraction-server.{host}").stop == f"extraction-server.{host}"
        train = rb.step(f"train.{host}")
        assert "--nnodes 2" in train.run and "--rdzv-backend c10d" in train.run
        assert f"[ {rank} = 0 ]" in train.run and "--local-addr 10.0.0.1" in train.run
        assert train.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert rb.step("verify-dumps").hosts is None  # the union, checked once


def test_cancel_and_reset_act_on_every_host(tmp_path, monkeypatch):
    import asyncio

    from runbook.engine import Engine, headless_confirmer
    from runbook.loader import load_runbook
    from runbook.transports.factory import make_transport_factory

    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "spool"))
    rb = tmp_path / "rb.yaml"
    rb.write_text(
        f"name: fan\nsteps:\n  - id: slow\n    title: t\n    hosts: {HOSTS}\n"
        "    detach: true\n    run: echo up; sleep 60\n"
    )
    state = tmp_path / "state"
    loaded = load_runbook(rb, state_dir=state)

    async def main() -> dict:
        engine = Engine(loaded, state, make_transport_factory(state), headless_confirmer((), ()))
        await engine.open("r1")
        try:
            task = asyncio.ensure_future(engine.run_step("slow"))
            recs = engine.state.steps
            for _ in range(300):
                if all(recs[f"slow.{h}"].status == "running" for h in ("local", "localhost-agent")):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await engine.cancel("slow", grace_s=1.0)
            status = await asyncio.wait_for(task, 30)
            seen = {k: v.status for k, v in recs.items()}
            engine.reset("slow")
            return {"end": status, "seen": seen, "after": {k: v.status for k, v in recs.items()}}
        finally:
            await engine.close()

    out = asyncio.run(main())
    assert out["end"] == "cancelled", out
    assert out["seen"] == {"slow": "cancelled", "slow.local": "cancelled",
                           "slow.localhost-agent": "cancelled"}  # fmt: skip
    assert set(out["after"].values()) == {"pending"}
