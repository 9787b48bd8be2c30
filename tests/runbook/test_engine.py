"""The executor end to end through the CLI, the real local agent and real processes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from runbook.audit import verify
from tests.support.waiting import wait_for

GUARDED = """\
name: guarded
vars:
  work: {work}
auto_confirm: [wipe]
steps:
  - id: make
    title: Make the data
    run: mkdir -p ${{work}}/old && echo keep > ${{work}}/old/data && echo made
  - id: verify
    title: Verify a manifest that does not exist
    preconditions:
      - {{check: path_exists, path: "${{work}}/manifest.json"}}
  - id: wipe
    title: Delete the old data
    destructive: true
    confirm: delete ${{work}}/old?
    delete: ["${{work}}/old"]
    delete_within: "${{work}}"
    preconditions:
      - {{check: step_succeeded, step: verify}}
"""


def test_failed_guard_blocks_and_leaves_data_untouched(cli, tmp_path):
    work = tmp_path / "work"
    rb = cli.runbook(GUARDED.format(work=work))
    out = cli("run", str(rb), "--auto", "--yes", check=3)
    assert (work / "old" / "data").read_text() == "keep\n"
    state = cli.state_json()["steps"]
    assert state["make"]["status"] == "succeeded"
    assert (
        state["verify"]["status"] == "blocked"
        and state["verify"]["reason"] == "precondition_failed"
    )
    assert state["wipe"]["status"] == "pending"
    guard = state["verify"]["guards"][0]
    assert guard["ok"] is False and guard["observed"]["exists"] is False
    assert "exit 3" in out.stdout
    # even when the operator runs the destructive step alone, its own guard holds it back
    cli("run", str(rb), "--auto", "--yes", "--only", "wipe", check=3)
    assert (work / "old" / "data").read_text() == "keep\n"
    assert cli.state_json()["steps"]["wipe"]["reason"] == "precondition_failed"


def test_destructive_step_needs_confirmation_in_auto(cli, tmp_path):
    work = tmp_path / "work"
    rb = cli.runbook(
        GUARDED.format(work=work).replace(
            '      - {check: path_exists, path: "${work}/manifest.json"}',
            '      - {check: path_exists, path: "${work}/old"}',
        )
    )
    cli("run", str(rb), "--auto", check=3)  # no --yes: held back
    assert (work / "old" / "data").exists()
    assert cli.state_json()["steps"]["wipe"]["reason"] == "confirmation_required"
    cli("run", str(rb), "--auto", "--yes", "verify", check=3)  # --yes naming another step
    assert (work / "old").exists()
    cli("run", str(rb), "--auto", "--yes", check=0)  # --yes + auto_confirm policy
    assert not (work / "old").exists()
    confirmed = [r for r in cli.audit() if r["event"] == "step.confirmed"]
    assert (
        len(confirmed) == 1
        and confirmed[0]["step"] == "wipe"
        and confirmed[0]["mode"] == "auto_confirm"
    )
    assert confirmed[0]["evidence"][0]["check"] == "step_succeeded"


def test_set_injection_runs_nothing_extra(cli, tmp_path):
    """A word-typed variable refuses a --set value with shell syntax (exit 2, one line); text
    declared as such goes through env and arrives byte-exact."""
    marker = tmp_path / "pwned"
    rb = cli.runbook(
        f"""\
        name: inject
        vars:
          name: world
          text: {{type: text, value: world}}
        steps:
          - id: greet
            title: Greet
            run: echo hello ${{name}} "$T" > greeting
            env: {{T: "${{text}}"}}
            cwd: {tmp_path}
    """
    )
    hostile = f"x; touch {marker}; echo $(touch {marker}) `touch {marker}`"
    refused = cli("run", str(rb), "--auto", "--set", f"name={hostile}", check=2)
    assert refused.stderr.startswith("--set name=") and "is a path" in refused.stderr
    cli("run", str(rb), "--auto", "--set", f"text={hostile}", check=0)
    assert not marker.exists()
    assert (tmp_path / "greeting").read_text() == f"hello world {hostile}\n"


def test_cli_killed_mid_run_resumes_without_rerunning(cli, tmp_path):
    counter = tmp_path / "counter"
    rb = cli.runbook(f"""\
        name: resume
        steps:
          - id: first
            title: Count once
            run: echo run >> {counter}
          - id: slow
            title: A detached job
            detach: true
            run: [python3, -c, "import time\\nfor i in range(40):\\n    print('tick', i, flush=True)\\n    time.sleep(0.05)"]
          - id: last
            title: Count again
            run: echo last >> {counter}
    """)
    proc = cli.popen("run", str(rb), "--auto")
    wait_for(
        lambda: (
            counter.exists()
            and (cli.state / "runs").exists()
            and any(
                json.loads(p.read_text())["steps"]["slow"]["status"] == "running"
                for p in (cli.state / "runs").glob("*/state.json")
            )
        ),
        what="the detached job to start",
    )
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    cli("run", str(rb), "--auto", check=0)
    assert counter.read_text() == "run\nlast\n"  # `first` was not re-run
    st = cli.state_json()["steps"]
    assert st["slow"]["attempt"] == 1 and st["slow"]["exit_code"] == 0
    log = Path(st["slow"]["log_file"]).read_text().splitlines()
    assert log == [f"tick {i}" for i in range(40)]  # every line exactly once


def test_agent_killed_during_detached_job(cli, tmp_path):
    rb = cli.runbook("""\
        name: agentkill
        steps:
          - id: job
            title: Detached job that outlives its agent
            detach: true
            run: [python3, -c, "import time,sys\\nfor i in range(60):\\n    print('line', i, flush=True)\\n    time.sleep(0.03)\\nsys.exit(7)"]
            retry: {max: 1, on: [lost]}
            idempotent: true
    """)
    proc = cli.popen("run", str(rb), "--auto")
    spool = tmp_path / "spool"
    jobdir = wait_for(
        lambda: next(iter((spool / "jobs").glob("*")), None) if (spool / "jobs").exists() else None,
        what="job dir",
    )
    wait_for(
        lambda: (jobdir / "log").exists() and (jobdir / "log").stat().st_size > 40,
        what="some output",
    )
    # only this test's agent (other runs on the machine have other spools)
    agents = [
        int(p) for p in os.popen(f"pgrep -f 'remote_agent serve --spool {spool}'").read().split()
    ]
    assert agents
    for pid in agents:
        os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out  # the job exits 7: failed, not lost
    st = cli.state_json()["steps"]["job"]
    assert st["status"] == "failed" and st["reason"] == "exit_code" and st["exit_code"] == 7
    assert st["attempt"] == 1  # not relaunched: the job was never lost
    assert Path(st["log_file"]).read_text().splitlines() == [f"line {i}" for i in range(60)]
    assert "reconnecting" in out


def test_retry_on_exit_code_and_timeout(cli, tmp_path):
    attempts = tmp_path / "attempts"
    rb = cli.runbook(f"""\
        name: retry
        steps:
          - id: flaky
            title: Fails twice then works
            run: echo x >> {attempts}; test $(wc -l < {attempts}) -ge 3 || exit 75
            retry: {{max: 3, on: [75], backoff: 0.1s}}
          - id: hang
            title: Times out
            run: [sleep, "30"]
            timeout: 0.5s
    """)
    cli("run", str(rb), "--auto", check=1)
    st = cli.state_json()["steps"]
    assert st["flaky"]["status"] == "succeeded" and st["flaky"]["attempt"] == 3
    assert st["hang"]["status"] == "failed" and st["hang"]["reason"] == "timeout"


def test_secrets_never_reach_state_audit_or_logs(cli, tmp_path):
    secret = "s3cr3t-" + os.urandom(6).hex()
    cli.env["DEMO_TOKEN"] = secret
    rb = cli.runbook("""\
        name: secrets
        secrets:
          TOKEN: {env: DEMO_TOKEN}
        steps:
          - id: use
            title: Use the token
            run: echo "token is $API_TOKEN"; test -n "$API_TOKEN"
            env: {API_TOKEN: "${TOKEN}"}
    """)
    cli("run", str(rb), "--auto", check=0)
    for path in list(cli.state.rglob("*")) + list((tmp_path / "spool").rglob("*")):
        if path.is_file() and path.name != "log":  # the box's raw log is the job's own output
            assert secret not in path.read_text(errors="replace"), path
    mirror = Path(cli.state_json()["steps"]["use"]["log_file"]).read_text()
    assert mirror == "token is ***\n"


def test_dry_run_changes_nothing(cli, tmp_path):
    work = tmp_path / "work"
    rb = cli.runbook(GUARDED.format(work=work))
    out = cli("run", str(rb), "--dry-run", check=3)
    assert not work.exists() and not (cli.state / "runs").exists()
    assert "path_exists" in out.stdout and "nothing changed" in out.stdout


def test_from_and_only(cli, tmp_path):
    log = tmp_path / "log"
    rb = cli.runbook(f"""\
        name: select
        steps:
          - {{id: a, title: A, run: echo a >> {log}}}
          - {{id: b, title: B, run: echo b >> {log}}}
          - {{id: c, title: C, run: echo c >> {log}, requires: [a]}}
    """)
    cli("run", str(rb), "--auto", "--only", "b", check=0)
    assert log.read_text() == "b\n"
    cli("run", str(rb), "--auto", "--from", "c", check=3)  # c requires a, which never ran
    assert cli.state_json()["steps"]["c"]["reason"] == "requires_unmet"
    cli("run", str(rb), "--auto", check=0)
    assert log.read_text() == "b\na\nc\n"
    records = cli.audit()
    assert verify(cli.state / "runs" / records[0]["run_id"] / "audit.jsonl").ok


def test_validate_exit_codes(cli, tmp_path):
    good = cli.runbook("name: ok\nsteps: [{id: a, title: A, run: 'true'}]\n", "good.yaml")
    bad = cli.runbook(
        "name: bad\nsteps: [{id: a, title: A, run: 'true', colour: red}]\n", "bad.yaml"
    )
    assert cli("validate", str(good)).returncode == 0
    out = cli("validate", str(bad))
    assert (
        out.returncode == 2 and f"{bad}:2:" in out.stderr and "unknown key 'colour'" in out.stderr
    )


def test_audit_records_guards_log_reference_and_exit(cli, tmp_path):
    rb = cli.runbook(f"""\
        name: auditrefs
        steps:
          - id: out
            title: Write an artifact
            run: printf 'abc' > {tmp_path}/artifact; echo done
            artifacts: [{tmp_path}/artifact]
            preconditions:
              - {{check: disk_free, path: {tmp_path}, min: 1MiB}}
    """)
    cli("run", str(rb), "--auto", check=0)
    final = [r for r in cli.audit() if r["event"] == "step.state" and r["status"] == "succeeded"][0]
    assert final["exit_code"] == 0 and final["where"]["transport"] == "local"
    assert final["guards"][0]["ok"] and final["guards"][0]["observed"]["free_bytes"] > 2**20
    import hashlib

    assert (
        final["log"]["sha256"] == hashlib.sha256(b"done\n").hexdigest() and final["log"]["end"] == 5
    )
    assert final["artifacts"][0]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    md = cli("audit", "export", "--format", "md", check=0).stdout
    assert "## Succeeded steps" in md and "| out | ran | 0 |" in md
    assert hashlib.sha256(b"abc").hexdigest() in md.split("## Artifacts", 1)[1]
