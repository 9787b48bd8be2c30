"""Attacks on "no secret byte in anything the tool writes or shows" (docs/SAFETY.md, Secrets)."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_agent.wire.redact import StreamRedactor
from runbook.transports.local import scrubbed_env
from tests.faults.jobrig import wait_for
from tests.ssh.conftest import box, ssh_keys  # noqa: F401 - fixtures of the real sshd
from tests.ssh.helpers import SshCli, write_ssh_config
from tests.ssh.sshd import kill_tagged

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


# --- the box's own job log: redacted by the agent before the bytes reach the spool -----------

LEAKER = r"""
import os, sys, time
work, mode, k, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = os.environ["API_TOKEN"].encode()
w = lambda b: os.write(1, b)
w(b"x" * 70000 + s + b" tail\n")  # a secret past 64 KiB in one long line
w(b"start " + s[:k])  # a secret split across two writes, with a pause between
open(os.path.join(work, "mid"), "w").write(str(os.getpid()))
time.sleep(pause)
w(s[k:] + b" end\n")
w(b"".join(b"%d %s\n" % (i, s) for i in range(200)))  # many short lines
time.sleep(0.3 if mode == "none" else 30)  # the kill lands here in the attack trials
"""


def _leak_trial(cli, rb: Path, work: Path, spool: Path, secret: str, mode: str, rng) -> bool:
    """Run the leaking job once; `mode` kills its command or its supervisor mid-secret."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "mid").unlink(missing_ok=True)
    proc = cli.popen("run", "--auto", "--new-run", str(rb))
    try:
        wait_for(lambda: (work / "mid").exists() and (work / "mid").read_text(), what="mid-line")
        time.sleep(rng.uniform(0, 0.3))
        if mode == "job":
            os.kill(int((work / "mid").read_text()), signal.SIGKILL)
        elif mode == "jobwrap":
            jobs = sorted((spool / "jobs").iterdir(), key=lambda d: d.stat().st_mtime)
            os.kill(int((jobs[-1] / "pid").read_text().split()[0]), signal.SIGKILL)
            time.sleep(1.0)  # the rest of the secret arrives after the supervisor died
            os.kill(int((work / "mid").read_text()), signal.SIGKILL)
        console, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    files = [p for base in (spool, cli.state, work) for p in base.rglob("*") if p.is_file()]
    leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
    if secret in console:
        leaked.append("console")
    logs = sorted((spool / "jobs").glob("*/log"), key=lambda p: p.stat().st_mtime)
    box_log = logs[-1].read_bytes()
    mirror = Path(cli.state_json()["steps"]["leak"]["log_file"]).read_bytes()
    # offsets kept: the client mirrors exactly the (redacted) box log, byte for byte
    exact = mirror == box_log and box_log.startswith(b"x" * 70000 + b"*** tail\nstart ")
    if mode == "none":
        expected = b"x" * 70000 + b"*** tail\nstart *** end\n"
        expected += b"".join(b"%d ***\n" % i for i in range(200))
        exact = exact and box_log == expected
    return not leaked and exact


def _leak_runbook(cli, work: Path, host: str, k: int, pause: float) -> Path:
    (work / "leak.py").write_text(LEAKER)
    return cli.runbook(f"""\
        name: leak
        {host}
        secrets:
          TOKEN: {{env: DEMO_TOKEN}}
        steps:
          - id: leak
            title: Print the token
            run: [python3, {work}/leak.py, {work}, "$MODE", "{k}", "{pause}"]
            env: {{API_TOKEN: "${{TOKEN}}"}}
    """)


def _leak_trials(cli, root: Path, spool: Path, host: str, attack: str, n: int, seed: int, tally):
    rng = random.Random(seed)
    breaks = []
    for i in range(n):
        secret = "sk-or-" + "".join(rng.choice("abcdefXYZ0123456789") for _ in range(40))
        cli.env["DEMO_TOKEN"] = secret
        mode = ["none", "job", "jobwrap"][i % 3]
        work = root / f"w{i}"
        work.mkdir(parents=True)
        rb = _leak_runbook(cli, work, host, rng.randint(1, len(secret) - 1), rng.uniform(0, 0.4))
        rb.write_text(rb.read_text().replace("$MODE", mode))
        ok = _leak_trial(cli, rb, work, spool, secret, mode, rng)
        tally.trial(attack, ok)
        if not ok:
            breaks.append((i, mode))
    assert not breaks, breaks


def test_box_job_log_is_redacted_local(tmp_path, tally):
    from tests.runbook.conftest import Cli

    cli = Cli(tmp_path)
    _leak_trials(
        cli, tmp_path, tmp_path / "spool", "", "secret in the box's job log (local)", 12, 31, tally
    )


@pytest.mark.sshd
def test_box_job_log_is_redacted_over_ssh(tmp_path, box, ssh_keys, tally):  # noqa: F811
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box)
    cli = SshCli(tmp_path, known, config)
    spool = box.home / ".eagle-tui" / "spool"
    try:
        _leak_trials(
            cli, tmp_path, spool, "host: box", "secret in the box's job log (ssh)", 9, 32, tally
        )
    finally:
        cli.cleanup()
        kill_tagged(box.tag)


# --- a declared secret's value given as a value (issue 25): never written raw anywhere -------

SECRET_RB = """\
name: sv
vars:
  note: plain
  {default}
secrets:
  TOKEN: {{env: DEMO_TOKEN}}
steps:
  - id: use
    title: "Uses ${{note}}"
    run: [python3, -c, "import os, sys; print(sys.argv[1], os.environ['API_TOKEN'])", "${{note}}"{literal}]
    env: {{API_TOKEN: "${{TOKEN}}"}}
  - id: shell
    title: The same through /bin/sh
    run: 'printf "%s %s\n" "${{note}}" "$API_TOKEN"; printf %s "$${{BASH_VERSION:-dash}}" > {sh_file}'
    env: {{API_TOKEN: "${{TOKEN}}"}}
"""


def _leaks(cli, secret: str, outputs: list[bytes]) -> list[str]:
    """Every file of the state dir and the spool (the box), and every output, that holds the
    secret raw, in base64 or in hex."""
    import base64

    forms = [secret.encode(), base64.b64encode(secret.encode()), secret.encode().hex().encode()]
    spool = Path(cli.env["EAGLE_TUI_SPOOL"])
    files = [p for base in (cli.state, spool) if base.exists() for p in base.rglob("*")]
    found = [str(p) for p in files if p.is_file() and any(f in p.read_bytes() for f in forms)]
    found += [f"output {i}" for i, o in enumerate(outputs) if any(f in o for f in forms)]
    return found


def test_a_secret_given_as_a_value_is_refused_and_written_nowhere(tmp_path, tally, bin_sh):
    """Under dash and under bash as /bin/sh (the second step prints the secret through it)."""
    import subprocess

    from tests.faults.binsh import ran_under
    from tests.runbook.conftest import Cli

    rng = random.Random(2525)
    ways = ["--set equal", "--set inside", "var default", "command literal", "env only"]
    breaks = []
    for i in range(10):
        way = ways[i % len(ways)]
        root = tmp_path / f"s{i}"
        root.mkdir()
        cli = Cli(root)
        secret = "sk-" + "".join(rng.choice("abcdefXYZ0123456789") for _ in range(32))
        cli.env["DEMO_TOKEN"] = secret
        default = f"other: {secret}" if way == "var default" else ""
        literal = f', "{secret}"' if way == "command literal" else ""
        sh_file = root / "sh"
        rb = cli.runbook(SECRET_RB.format(default=default, literal=literal, sh_file=sh_file))
        args = ["run", "--auto", str(rb)]
        if way == "--set equal":
            args += ["--set", f"note={secret}"]
        elif way == "--set inside":
            args += ["--set", f"note=https://user:{secret}@example.com/x"]
        cmd = bin_sh[1](cli.cmd(*args))
        run = subprocess.run(cmd, env=cli.env, capture_output=True, timeout=120)
        status = subprocess.run(cli.cmd("status"), env=cli.env, capture_output=True, timeout=60)
        sjson = subprocess.run(
            cli.cmd("status", "--json"), env=cli.env, capture_output=True, timeout=60
        )
        leaks = _leaks(cli, secret, [run.stdout, run.stderr, status.stdout, sjson.stdout])
        if way == "env only":  # the one allowed way: runs, the job's output redacted
            held = run.returncode == 0 and not leaks
            held = held and ran_under(bin_sh[0], sh_file.read_text())
        else:
            held = (
                run.returncode == 2
                and b"holds the value of secret 'TOKEN'" in run.stderr
                and not (cli.state / "runs").exists()  # refused before anything was written
                and not leaks
            )
        tally.trial("secret given as a value (--set, default, literal): written raw", held)
        if not held:
            breaks.append((way, run.returncode, leaks, run.stderr[-400:]))
    assert not breaks, breaks
