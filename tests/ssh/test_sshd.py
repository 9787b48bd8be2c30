"""The SSH transport against a real OpenSSH sshd on loopback, through the real CLI."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runbook.audit import verify
from runbook.transports import FINGERPRINT_RE, TransportError, TransportOptions
from tests.support.paths import REPO
from tests.support.waiting import wait_for

from .helpers import OutputTail, host_block
from .sshd import cmdline, keygen, pubkey_fingerprint

pytestmark = pytest.mark.sshd

DEMO = Path(__file__).with_name("remote_demo.yaml")
# the box's system python (on sshd's default PATH), as .ci/system-deps provides it
BOX_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "/usr/bin/python3"
SIMPLE = """\
    name: simple
    steps:
      - id: hi
        title: Say hi
        run: echo hi from $(hostname)
"""


def sftp_sessions(box) -> int:
    return box.log_text().count("subsystem 'sftp'")


def step_records(audit: list[dict]) -> list[dict]:
    return [r for r in audit if r["event"] in ("step.state", "step.confirmed")]


# ---------------------------------------------------------------------- end to end
def test_demo_runbook_end_to_end(ssh_cli, box, tmp_path):
    shutil.rmtree(box.home / ".cache" / "eagle-tui", ignore_errors=True)
    before = sftp_sessions(box)
    work = tmp_path / "work"
    out = ssh_cli("run", str(DEMO), "--auto", "--yes", "--set", f"work={work}", check=0)
    assert "prepared on" in out.stdout and "exit 0" in out.stdout
    st = ssh_cli.state_json()["steps"]
    assert {k: v["status"] for k, v in st.items()} == dict.fromkeys(st, "succeeded")
    assert not (work / "old").exists() and (work / "manifest.json").exists()
    train = Path(st["train"]["log_file"]).read_text().splitlines()
    assert [ln for ln in train if ln.startswith("step ")] == [
        f"step {i} loss {round(1.0 / (i + 1), 4)}" for i in range(200)
    ]
    assert st["train"]["progress"]["done"] == 200
    payload = Path(st["payload"]["log_file"]).read_text()
    assert "patch entries from" in payload and "/.cache/eagle-tui/agent-" in payload

    # the audit: every step record names the ssh host and its verified key
    audit = ssh_cli.audit()
    records = step_records(audit)
    assert records and all(
        r["where"]["transport"] == "ssh"
        and r["where"]["host"] == "gpu"
        and r["where"]["host_key"] == box.fingerprint
        for r in records
    ), records
    confirmed = [r for r in audit if r["event"] == "step.confirmed"]
    assert [r["step"] for r in confirmed] == ["wipe-old"]
    run_dir = ssh_cli.state / "runs" / audit[0]["run_id"]
    assert verify(run_dir / "audit.jsonl").ok
    md = ssh_cli("audit", "export", "--format", "md", check=0).stdout
    succeeded = md.split("## Succeeded steps", 1)[1].split("\n## ", 1)[0]
    assert "| train | ran | 0 |" in succeeded, md

    # bootstrap: one upload, private files on the box; a second run uploads nothing
    cache = box.home / ".cache" / "eagle-tui"
    (pyz,) = cache.glob("agent-*.pyz")
    local = ssh_cli.state / "cache" / pyz.name  # the client's cached build, content-named
    digest = hashlib.sha256(local.read_bytes()).hexdigest()[:16]
    assert pyz.name == f"agent-{digest}.pyz" and pyz.read_bytes() == local.read_bytes()
    assert stat.S_IMODE(pyz.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    spool = box.home / ".eagle-tui" / "spool"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert stat.S_IMODE((spool / "jobs").stat().st_mode) == 0o700
    assert sftp_sessions(box) == before + 1
    ssh_cli("run", str(DEMO), "--auto", "--yes", "--new-run", "--set", f"work={work}2", check=0)
    assert sftp_sessions(box) == before + 1
    assert [p.name for p in cache.glob("agent-*.pyz")] == [pyz.name]


@pytest.mark.skipif(
    not (REPO / "runbooks" / "demo.yaml").exists() or not os.environ.get("EAGLE_TUI_SSH_DEMO"),
    reason="the full demo takes minutes: set EAGLE_TUI_SSH_DEMO=1 (needs runbooks/demo.yaml)",
)
@pytest.mark.timeout(900)
def test_repo_demo_runbook_over_ssh(ssh_cli, tmp_path):
    """The lead's demo runbook on the box over SSH. The box's python is this venv's (the demo's
    jobs need torch); the runbook is unchanged but for a `hosts:` entry saying so."""
    rb = tmp_path / "demo.yaml"
    rb.write_text(
        (REPO / "runbooks" / "demo.yaml").read_text()
        + f"hosts:\n  gpu: {{ssh: box, python: {sys.executable}}}\n"
    )
    # the copy lives elsewhere: its ${runbook_dir} does not lead to the drafter config
    config = REPO / "remote_agent" / "eagle3" / "drafter" / "examples" / "tiny-cpu.yaml"
    args = ["--auto", "--yes", "--host", "gpu", "--set", f"drafter_config={config}"]
    out = ssh_cli("run", str(rb), *args, timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr
    records = step_records(ssh_cli.audit())
    assert records and all(r["where"]["transport"] == "ssh" for r in records)


# ---------------------------------------------------------------------- security
HOSTILE = [
    "x; touch {m}",
    "$(touch {m})",
    "`touch {m}`",
    "a' ; touch {m}; echo '",
    'b" ; touch {m}; echo "',
    "line1\ntouch {m}\n",
    "&& touch {m} || touch {m} | touch {m} > {m}",
]


def test_hostile_values_run_nothing_extra_on_the_box(ssh_cli, tmp_path):
    """Word variables refuse hostile --set values (exit 2, nothing launched); declared text
    reaches the box's shell and an argv program through env, byte-exact."""
    marker = tmp_path / "pwned"
    values = [v.format(m=marker) for v in HOSTILE]
    n = len(values)
    env = ", ".join(f'V{i}: "${{v{i}}}"' for i in range(n))
    shell = "; ".join(f"printf '%s|' \"$V{i}\" >> shell.out" for i in range(n))
    rb = ssh_cli.runbook(f"""\
        name: inject
        host: box
        vars:
          w: plain
          {"".join(f"v{i}: {{type: text, value: plain}}{chr(10)}          " for i in range(n))}
        steps:
          - id: shell
            title: Shell string with every value
            cwd: {tmp_path}
            env: {{{env}}}
            run: {shell}
          - id: argv
            title: Argv with every value
            cwd: {tmp_path}
            env: {{{env}}}
            run: [python3, -c, "import os; open('argv.out', 'w').write('|'.join(os.environ['V%d' % i] for i in range({n})))"]
    """)
    for v in values:
        ssh_cli("run", str(rb), "--auto", "--set", f"w={v}", check=2)
    sets = [a for i, v in enumerate(values) for a in ("--set", f"v{i}={v}")]
    ssh_cli("run", str(rb), "--auto", *sets, check=0)
    assert not marker.exists()
    assert (tmp_path / "shell.out").read_text() == "".join(f"{v}|" for v in values)
    assert (tmp_path / "argv.out").read_text() == "|".join(values)


def test_hostile_host_config_is_quoted(ssh_cli, tmp_path):
    """python/spool from the runbook reach the box's shell quoted."""
    marker = tmp_path / "pwned"
    spool = tmp_path / f"spool; touch {marker}; $(touch {marker})"
    rb = ssh_cli.runbook(f"""\
        name: hostile-host
        host: gpu
        hosts:
          gpu: {{ssh: box, spool: "{spool}"}}
        steps:
          - {{id: hi, title: Hi, run: echo hi}}
    """)
    ssh_cli("run", str(rb), "--auto", check=0)
    assert not marker.exists()
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700 and (spool / "jobs").is_dir()


def test_secrets_reach_the_box_only_through_the_channel(ssh_cli, box, tmp_path):
    secret = "s3cr3t-" + os.urandom(8).hex()
    ssh_cli.env["DEMO_TOKEN"] = secret
    rb = ssh_cli.runbook(f"""\
        name: secrets
        host: box
        secrets:
          TOKEN: {{env: DEMO_TOKEN}}
        steps:
          - id: use
            title: Use the token while the test looks at every process
            detach: true
            env: {{API_TOKEN: "${{TOKEN}}"}}
            run: [python3, -c, "import hashlib,os,time; print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest(), flush=True); [time.sleep(0.05) for _ in iter(lambda: os.path.exists('{tmp_path}/stop'), True)]"]
    """)
    proc = ssh_cli.popen("run", str(rb), "--auto")
    tail = OutputTail(proc)
    wait_for(lambda: tail.count(hashlib.sha256(secret.encode()).hexdigest()), what="the job")
    # while the job runs: no process on the machine (box or client side) has it in argv
    seen = [pid for pid in os.listdir("/proc") if pid.isdigit() and secret in cmdline(int(pid))]
    assert seen == []
    (tmp_path / "stop").touch()
    assert tail.wait(60) == 0, tail.text()
    for root in (box.home, ssh_cli.state):
        for path in root.rglob("*"):
            if path.is_file() and not path.name.endswith(".pyz"):
                assert secret.encode() not in path.read_bytes(), path
    assert secret not in tail.text()


# ---------------------------------------------------------------------- host keys
def test_unknown_host_refused_then_trusted(ssh_cli, box, ssh_keys):
    rb = ssh_cli.runbook(SIMPLE)
    ssh_cli.known_hosts.write_text("")
    conns = box.connections()
    out = ssh_cli("run", str(rb), "--auto", "--host", "box", check=1)
    fp = box.fingerprint
    text = out.stdout + out.stderr
    assert f"--trust-host {fp}" in out.stderr and text.count("unknown host key") == 1
    assert box.connections() == conns + 1  # refused once, not retried
    assert set(FINGERPRINT_RE.findall(out.stderr)) == {fp}  # names the presented key only

    ssh_cli("run", str(rb), "--auto", "--host", "box", "--trust-host", fp, check=0)
    assert ssh_cli.known_hosts.read_text() == box.known_hosts_line()
    ssh_cli("run", str(rb), "--auto", "--host", "box", "--new-run", check=0)  # now known
    # OpenSSH itself accepts what we recorded
    subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={ssh_cli.known_hosts}", "-i", str(ssh_keys["user"]),
         "-p", str(box.port), f"root@{box.address}", "true"],
        check=True, timeout=30,
    )  # fmt: skip


def test_unknown_host_with_another_fingerprint_stays_refused(ssh_cli, box):
    rb = ssh_cli.runbook(SIMPLE)
    ssh_cli.known_hosts.write_text("")
    other = "SHA256:" + "A" * 43
    out = ssh_cli("run", str(rb), "--auto", "--host", "box", "--trust-host", other, check=1)
    assert (
        box.fingerprint in out.stderr and "No --trust-host fingerprint given matches" in out.stderr
    )
    assert ssh_cli.known_hosts.read_text() == ""


def test_trust_host_needs_a_fingerprint(ssh_cli):
    rb = ssh_cli.runbook(SIMPLE)
    out = ssh_cli("run", str(rb), "--auto", "--host", "box", "--trust-host", "yes", check=2)
    assert "--trust-host yes: expected SHA256:" in out.stderr


def test_changed_host_key_refused_with_both_fingerprints(ssh_cli, box, tmp_path):
    old = keygen(tmp_path / "old_host_key")
    alg, data = old.with_suffix(".pub").read_text().split()[:2]
    ssh_cli.known_hosts.write_text(f"[{box.address}]:{box.port} {alg} {data}\n")
    rb = ssh_cli.runbook(SIMPLE)
    conns = box.connections()
    for extra in ([], ["--trust-host", box.fingerprint]):  # trusting the new key changes nothing
        out = ssh_cli("run", str(rb), "--auto", "--host", "box", *extra, check=1)
        assert "HOST KEY CHANGED" in out.stderr
        assert pubkey_fingerprint(old.with_suffix(".pub")) in out.stderr
        assert box.fingerprint in out.stderr and "ssh-keygen -R" in out.stderr
    assert box.connections() == conns + 2
    assert ssh_cli.known_hosts.read_text() == f"[{box.address}]:{box.port} {alg} {data}\n"


def test_wrong_key_one_message_no_retry_storm(ssh_cli, box, ssh_keys):
    ssh_cli.ssh_config.write_text(host_block("box", box.address, box.port, ssh_keys["stranger"]))
    rb = ssh_cli.runbook(SIMPLE)
    conns = box.connections()
    t0 = time.monotonic()
    out = ssh_cli("run", str(rb), "--auto", "--host", "box", check=1)
    text = out.stdout + out.stderr
    assert text.count("authentication failed") == 1 and "not retrying" in text
    assert "reconnecting" not in text and "retrying in" not in text
    time.sleep(0.3)  # let sshd finish logging
    assert box.connections() == conns + 1
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------------- the box's python
def test_missing_python_is_one_clear_message(ssh_cli, box, tmp_path):
    rb = ssh_cli.runbook("""\
        name: nopy
        host: gpu
        hosts:
          gpu: {ssh: box, python: /nonexistent/venv/bin/python}
        steps:
          - {id: hi, title: Hi, run: echo hi}
    """)
    conns = box.connections()
    out = ssh_cli("run", str(rb), "--auto", check=1)
    assert out.stderr.count("no python on the box") == 1
    assert "/nonexistent/venv/bin/python" in out.stderr and "python:" in out.stderr
    assert box.connections() == conns + 1


def test_too_old_python_is_one_clear_message(ssh_cli, tmp_path):
    fake = tmp_path / "python3.8"
    fake.write_text(  # the real python with its version reported as 3.8.18
        "#!/bin/sh\n"
        f"exec {BOX_PYTHON} -c \"import sys; sys.version_info = (3, 8, 18, 'final', 0); "
        'exec(sys.argv[1])" "$2"\n'
    )
    fake.chmod(0o755)
    rb = ssh_cli.runbook(f"""\
        name: oldpy
        host: gpu
        hosts:
          gpu: {{ssh: box, python: {fake}}}
        steps:
          - {{id: hi, title: Hi, run: echo hi}}
    """)
    out = ssh_cli("run", str(rb), "--auto", check=1)
    assert "is Python 3.8.18; the agent needs Python >= 3.10" in out.stderr


def test_agent_that_cannot_start_is_one_clear_message(ssh_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the spool's parent should be")
    rb = ssh_cli.runbook(f"""\
        name: nostart
        host: gpu
        hosts:
          gpu: {{ssh: box, spool: {blocker}/spool}}
        steps:
          - {{id: hi, title: Hi, run: echo hi}}
    """)
    out = ssh_cli("run", str(rb), "--auto", check=1)
    # the agent serves and refuses the handshake with the reason (spool_unusable), once
    assert f"the agent's spool {blocker}/spool cannot be written: Not a directory" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stdout.count("reconnecting") + out.stdout.count("connecting (attempt") <= 2


# ---------------------------------------------------------------------- reaching boxes
def test_jump_host(ssh_cli, box, box2):
    rb = ssh_cli.runbook(SIMPLE)
    # the hop is verified like the box: its unknown key is refused, then trusted
    ssh_cli.known_hosts.write_text(box.known_hosts_line())
    out = ssh_cli("run", str(rb), "--auto", "--host", "boxj", check=1)
    assert f"--trust-host {box2.fingerprint}" in out.stderr and "jump host box2" in out.stderr
    mark = len(box2.log_text())
    ssh_cli("run", str(rb), "--auto", "--host", "boxj", "--trust-host", box2.fingerprint, check=0)
    assert box2.known_hosts_line() in ssh_cli.known_hosts.read_text()
    hop = box2.log_text()[mark:]
    assert f"target {box.address} port {box.port}" in hop  # the box was reached via box2
    st = ssh_cli.state_json()["steps"]["hi"]
    assert Path(st["log_file"]).read_text().startswith("hi from")


def test_per_step_hosts_audit_host_and_key(ssh_cli, box, box2, tmp_path):
    rb = ssh_cli.runbook(f"""\
        name: twoboxes
        hosts:
          a: {{ssh: box}}
          b: {{ssh: box2, python: {BOX_PYTHON}, spool: {tmp_path}/spool-b}}
        steps:
          - {{id: one, title: On a, host: a, run: "echo on a $HOME"}}
          - {{id: two, title: On b, host: b, run: "echo on b $HOME",
              preconditions: [{{check: path_exists, path: {tmp_path}}}]}}
          - {{id: three, title: Locally, host: local, run: echo here}}
    """)
    ssh_cli("run", str(rb), "--auto", check=0)
    want = {
        "one": ("ssh", "a", box.fingerprint),
        "two": ("ssh", "b", box2.fingerprint),
        "three": ("local", "local", None),
    }
    records = step_records(ssh_cli.audit())
    assert {r["step"] for r in records} == set(want)
    for r in records:
        w = r["where"]
        assert (w["transport"], w["host"], w["host_key"]) == want[r["step"]], r
    st = ssh_cli.state_json()["steps"]
    assert Path(st["one"]["log_file"]).read_text() == f"on a {box.home}\n"
    assert Path(st["two"]["log_file"]).read_text() == f"on b {box2.home}\n"
    assert (tmp_path / "spool-b" / "jobs").is_dir()  # HostConfig.spool used on b


def test_hosts_python_comes_first_for_jobs_and_guards(ssh_cli, tmp_path):
    """`python:` of a host (here this venv's) is what `python` means on the box, in jobs and in
    `command` guards alike, and the payload imports from the archive in both."""
    venv_bin = str(Path(sys.executable).parent)
    rb = ssh_cli.runbook(f"""\
        name: venvpy
        host: gpu
        hosts:
          gpu: {{ssh: box, python: {sys.executable}}}
        steps:
          - id: which
            title: Which python
            run: python -c "import sys, remote_agent.eagle3; print(sys.executable)"
            preconditions:
              - check: command
                run: [python, -c, "import sys, remote_agent.eagle3; print(sys.executable)"]
                stdout_regex: "^{venv_bin}/"
    """)
    ssh_cli("run", str(rb), "--auto", check=0)
    st = ssh_cli.state_json()["steps"]["which"]
    assert Path(st["log_file"]).read_text().startswith(venv_bin + "/")


def test_user_host_port_target_with_ssh_agent(ssh_cli, box, ssh_keys, tmp_path):
    """`user@host:port` with no ssh config at all; the key comes from an ssh-agent."""
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, what="ssh-agent socket")
        env = dict(ssh_cli.env, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(ssh_keys["user"])], env=env, check=True)
        ssh_cli.env = env
        ssh_cli.ssh_config.write_text("")
        rb = ssh_cli.runbook(SIMPLE)
        ssh_cli("run", str(rb), "--auto", "--host", f"root@{box.address}:{box.port}", check=0)
        records = step_records(ssh_cli.audit())
        assert all(r["where"]["host_key"] == box.fingerprint for r in records)
    finally:
        agent.kill()
        agent.wait()


def test_keepalive_default_and_from_config(box, ssh_keys, tmp_path):
    """15 s x 3 unless the config sets ServerAliveInterval (then its values)."""
    from runbook.transports.ssh import SshTransport

    config = tmp_path / "ssh_config"
    config.write_text(
        host_block("plain", box.address, box.port, ssh_keys["user"])
        + host_block(
            "tuned", box.address, box.port, ssh_keys["user"],
            "  ServerAliveInterval 7\n  ServerAliveCountMax 4\n",
        )
    )  # fmt: skip
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line())
    opts = TransportOptions(known_hosts=str(known), ssh_config=str(config))

    async def keepalive(alias: str) -> tuple[float, int]:
        t = SshTransport.from_options(alias, tmp_path / "state", opts)
        try:
            conn = await t._connection()
            return conn._keepalive_interval, conn._keepalive_count_max
        finally:
            await t.close()

    assert asyncio.run(keepalive("plain")) == (15.0, 3)
    assert asyncio.run(keepalive("tuned")) == (7.0, 4)


def test_unreachable_box_is_retried_not_permanent(ssh_keys, tmp_path):
    """A refused TCP connection is a network failure: transient, so HostSession retries it."""
    from runbook.transports.ssh import SshTransport

    from .sshd import free_port

    config = tmp_path / "ssh_config"
    config.write_text(host_block("gone", "127.0.0.1", free_port(), ssh_keys["user"]))
    opts = TransportOptions(known_hosts=str(tmp_path / "kh"), ssh_config=str(config))
    t = SshTransport.from_options("gone", tmp_path / "state", opts)
    with pytest.raises(TransportError) as err:
        asyncio.run(t.open())
    said = str(err.value)  # the phase, once, with the target the alias names
    assert not err.value.permanent and said.startswith("gone (root@127.0.0.1:"), said
    assert "TCP connection refused: nothing listens on port" in said


def test_ui_trust_flow_on_the_same_session(box, ssh_keys, tmp_path):
    """What the TUI does: catch HostKeyUnknown, ask, `transport.trust(fp)`, connect again."""
    from runbook.agent_client import HostSession
    from runbook.transports.hostkeys import HostKeyUnknown
    from runbook.transports.ssh import SshTransport

    config = tmp_path / "ssh_config"
    config.write_text(host_block("box", box.address, box.port, ssh_keys["user"]))
    opts = TransportOptions(known_hosts=str(tmp_path / "kh"), ssh_config=str(config))
    states: list[tuple[str, int]] = []

    async def go() -> str:
        transport = SshTransport.from_options("box", tmp_path / "state", opts)
        session = HostSession("box", transport, lambda st, n, msg, refused: states.append((st, n)))
        try:
            with pytest.raises(HostKeyUnknown) as err:
                await session.connection()
            e = err.value
            assert (e.host, e.port, e.fingerprint) == (box.address, box.port, box.fingerprint)
            transport.trust(e.fingerprint)
            await session.connection()
            assert session.endpoint.host_key == box.fingerprint
            return (await session.call("hello", protocol=1, client="t"))["hostname"]
        finally:
            await session.close()

    assert asyncio.run(go())
    assert states == [("connecting", 1), ("failed", 1), ("connecting", 1), ("connected", 1)]
    assert (tmp_path / "kh").read_text() == box.known_hosts_line()


def test_python_on_the_command_line_for_a_host_not_in_hosts(ssh_cli, tmp_path):
    """`--host box --python PATH` (Ansible's interpreter setting): the agent, jobs and `command`
    guards on the box use PATH; without it the box's python3; a wrong one is one clear line."""
    venv_bin = str(Path(sys.executable).parent)
    rb = ssh_cli.runbook(f"""\
        name: clipy
        steps:
          - id: which
            title: Which python
            run: python -c "import sys, remote_agent.eagle3; print(sys.executable)"
            preconditions:
              - check: command
                run: [python, -c, "import sys; print(sys.executable)"]
                stdout_regex: "^{venv_bin}/"
    """)
    ssh_cli("run", str(rb), "--auto", "--host", "box", "--python", sys.executable, check=0)
    st = ssh_cli.state_json()["steps"]["which"]
    assert Path(st["log_file"]).read_text().startswith(venv_bin + "/")
    ssh_cli("run", str(rb), "--auto", "--host", "box", "--new-run", check=3)  # the box's python3
    assert ssh_cli.state_json()["steps"]["which"]["reason"] == "precondition_failed"
    bad = ssh_cli(
        "run",
        str(rb),
        "--auto",
        "--host",
        "box",
        "--new-run",
        "--python",
        "/nope/bin/python",
        check=1,
    )
    assert bad.stderr.count("no python on the box") == 1 and "/nope/bin/python" in bad.stderr
    assert "--python" in bad.stderr
    empty = ssh_cli("run", str(rb), "--auto", "--host", "box", "--python", " ", check=2)
    assert "--python: expected the path of a python on the box" in empty.stderr
