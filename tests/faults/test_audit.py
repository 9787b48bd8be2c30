"""Attacks on "the audit is the record": tamper with a run's files, then resume it.

Real CLI, real local agent (its spool is "the box"). A base run is made once (step `a`
succeeds, `b` fails: the run stays unfinished and resumable); each trial copies it, attacks the
copy, and resumes. Held = refused with one message naming the fault (exit 2, `a` not re-run,
no traceback), or, for a torn last line, repaired with an audited record and resumed.
Every trial runs (the tally counts them all); a test fails at its end if any broke.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from runbook.audit import canonical, record_hash
from tests.faults.tally import trials
from tests.runbook.conftest import Cli
from tests.ssh.conftest import box, ssh_keys  # noqa: F401 - fixtures of the real sshd
from tests.ssh.helpers import SshCli, write_ssh_config
from tests.ssh.sshd import kill_tagged

RUNBOOK = """\
    name: sealed
    steps:
      - id: a
        title: Counts its runs
        run: echo a >> {work}/a.count
      - id: b
        title: Fails until the file ok exists
        run: test -f {work}/ok && echo b >> {work}/b.count
      - id: c
        title: Needs b
        preconditions:
          - {{check: step_succeeded, step: b}}
        run: echo c >> {work}/c.count
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit-base")
    cli = Cli(root)
    rb = cli.runbook(RUNBOOK.format(work=root / "work"))
    (root / "work").mkdir()
    cli("run", "--auto", str(rb), check=1)
    return root


def trial_copy(base: Path, dest: Path) -> tuple[Cli, Path, Path]:
    """A copy of the base run (state, spool = the box, work dir) at `dest`, runbook re-pointed."""
    shutil.copytree(base, dest)
    cli = Cli(dest)
    rb = cli.runbook(RUNBOOK.format(work=dest / "work"))
    run_dir = next((dest / "state" / "runs").iterdir())
    return cli, rb, run_dir


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def refused(out: subprocess.CompletedProcess, cli: Cli, what: str) -> bool:
    err = out.stderr.strip()
    return (
        out.returncode == 2
        and "refusing to resume" in err
        and what in err
        and "--accept-audit-break" in err
        and "Traceback" not in out.stderr + out.stdout
        and len(err.splitlines()) == 1
        and count(cli.tmp / "work" / "a.count") == 1  # nothing re-ran
        and count(cli.tmp / "work" / "c.count") == 0
    )


def forge(prev: dict, event: str, **fields) -> bytes:
    rec = {**prev, "seq": prev["seq"] + 1, "event": event, "prev": prev["hash"], **fields}
    rec.pop("hash")
    rec["hash"] = record_hash(rec)
    return canonical(rec) + b"\n"


def test_dropped_tail_is_refused(base, tmp_path, tally):
    breaks: list = []
    rng = random.Random(41)
    for i in range(trials(6)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        audit = run / "audit.jsonl"
        recs = lines(audit)
        keep = rng.randrange(1, len(recs))
        audit.write_bytes(b"".join(recs[:keep]))
        if rng.random() < 0.5:  # the thorough attacker also rewinds state.json's head
            st = json.loads((run / "state.json").read_text())
            last = json.loads(recs[keep - 1])
            st["audit_seq"], st["audit_head"] = last["seq"], last["hash"]
            (run / "state.json").write_text(json.dumps(st))
        out = cli("run", "--auto", str(rb))
        ok = refused(out, cli, "seq")
        tally.trial("audit tail dropped, resume", ok)
        if not ok:
            breaks.append(out.stderr)
    assert not breaks, breaks[:2]


def test_forged_chained_record_is_refused(base, tmp_path, tally):
    breaks: list = []
    for i in range(trials(6)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        audit = run / "audit.jsonl"
        last = json.loads(lines(audit)[-1])
        forged = forge(last, "step.state", step="b", status="succeeded", reason=None)
        with open(audit, "ab") as f:
            f.write(forged)
        st = json.loads((run / "state.json").read_text())  # and a state to match it
        st["steps"]["b"]["status"] = "succeeded"
        rec = json.loads(forged)
        st["audit_seq"], st["audit_head"] = rec["seq"], rec["hash"]
        (run / "state.json").write_text(json.dumps(st))
        verify = cli("audit", "verify")
        out = cli("run", "--auto", str(rb))
        ok = refused(out, cli, "added outside eagle-tui")
        tally.trial("audit forged chained record, resume", ok)
        if not ok:
            breaks.append((verify.stdout, out.stderr))
    assert not breaks, breaks[:2]


def test_torn_last_line_is_repaired_and_audited(base, tmp_path, tally):
    breaks: list = []
    rng = random.Random(7)
    for i in range(trials(8)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        audit = run / "audit.jsonl"
        last = json.loads(lines(audit)[-1])
        whole = forge(last, "step.state", step="b", status="running")
        cut = rng.randrange(1, len(whole) - 1)  # a crash mid-append: never the newline
        with open(audit, "ab") as f:
            f.write(whole[:cut])
        (cli.tmp / "work" / "ok").write_text("")
        out = cli("run", "--auto", str(rb))
        verify = cli("audit", "verify")
        events = [r["event"] for r in cli.audit()]
        ok = (
            out.returncode == 0
            and "Traceback" not in out.stderr
            and "audit.repaired" in events
            and verify.returncode == 0
            and count(cli.tmp / "work" / "a.count") == 1
            and count(cli.tmp / "work" / "b.count") == 1
        )
        tally.trial("audit torn last line, resume", ok)
        if not ok:
            breaks.append((out.stdout[-2000:], out.stderr, verify.stderr))
    assert not breaks, breaks[:2]


@pytest.mark.parametrize("attack", ["emptied", "truncated", "edited"])
def test_state_json_tampering_is_refused(base, tmp_path, tally, attack):
    breaks: list = []
    rng = random.Random(attack)
    expect = {
        "emptied": "state.json is empty",
        "truncated": "state.json is truncated",
        "edited": "state.json was edited",
    }[attack]
    for i in range(trials(4)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        state = run / "state.json"
        text = state.read_text()
        if attack == "emptied":
            state.write_text("")
        elif attack == "truncated":
            state.write_text(text[: rng.randrange(1, len(text) - 2)])
        else:
            st = json.loads(text)
            st["steps"]["b"]["status"] = "succeeded"
            state.write_text(json.dumps(st))
        out = cli("run", "--auto", str(rb))
        ok = refused(out, cli, expect)
        tally.trial(f"state.json {attack}, resume", ok)
        if not ok:
            breaks.append(out.stderr)
    assert not breaks, breaks[:2]


def test_override_is_audited_and_state_rederived(base, tmp_path, tally):
    breaks: list = []
    for i, attack in enumerate(["edited", "emptied"]):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        state = run / "state.json"
        if attack == "edited":
            st = json.loads(state.read_text())
            st["steps"]["b"]["status"] = "succeeded"
            state.write_text(json.dumps(st))
        else:
            state.write_text("")
        out = cli("run", "--auto", "--accept-audit-break", str(rb))
        recs = cli.audit()
        accepted = [r for r in recs if r["event"] == "audit.break_accepted"]
        ok = (
            out.returncode == 1  # b really failed: it runs again (the audit's word), and c not
            and len(accepted) == 1
            and "state.json" in accepted[0]["problem"]
            and count(cli.tmp / "work" / "a.count") == 1
            and count(cli.tmp / "work" / "c.count") == 0
        )
        tally.trial("audit override flag, audited", ok)
        if not ok:
            breaks.append((out.stdout[-2000:], out.stderr))
    assert not breaks, breaks[:2]


def test_enospc_on_state_dir(tmp_path, tally):
    """A tiny tmpfs as the state dir, filled to a random level: one line, exit 2, files whole."""
    breaks: list = []
    if shutil.which("mount") is None:
        pytest.skip("mount(8) missing")
    rng = random.Random(3)
    for i in range(trials(20)):
        root = tmp_path / f"t{i}"
        cli = Cli(root)
        (root / "work").mkdir(parents=True)
        rb = cli.runbook(RUNBOOK.format(work=root / "work"))
        cli.state.mkdir()
        mnt = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(cli.state)])
        if mnt.returncode != 0:
            pytest.skip("cannot mount a tmpfs (needs root)")
        try:
            # leave 0-20 KiB free: the run dies at a different write each trial
            free = rng.randrange(0, 20) * 1024
            filler = cli.state / "filler"
            with open(filler, "wb") as f:
                try:
                    f.write(b"x" * (64 * 1024 - free))
                except OSError:
                    pass
            out = cli("run", "--auto", str(rb))
            run_dirs = list((cli.state / "runs").glob("*")) if (cli.state / "runs").exists() else []
            whole = True
            for d in run_dirs:
                if (d / "audit.jsonl").exists():
                    data = (d / "audit.jsonl").read_bytes()
                    whole &= not data or data.endswith(b"\n")
                    whole &= all(json.loads(x) for x in data.splitlines())
                if (d / "state.json").exists():
                    json.loads((d / "state.json").read_text())
            err = out.stderr.strip().splitlines()
            ok = (
                "Traceback" not in out.stderr + out.stdout
                and whole
                and (
                    out.returncode == 1  # enough room after all: b fails as it should
                    or (
                        out.returncode == 2
                        and len(err) == 1
                        and "No space left on device" in err[0]
                    )
                )
            )
            tally.trial("ENOSPC on the state dir", ok)
            if not ok:
                breaks.append((free, out.returncode, out.stdout[-1500:], out.stderr))
        finally:
            subprocess.run(["umount", "-l", str(cli.state)])
    assert not breaks, breaks[:2]


def test_edited_earlier_run_does_not_open_a_within_guard(base, tmp_path, tally):
    """`step_succeeded` with `within:` looks at earlier runs: their audit decides, not state.json."""
    breaks: list = []
    for i in range(trials(3)):
        cli, _, run = trial_copy(base, tmp_path / f"t{i}")
        rb = cli.runbook(
            RUNBOOK.format(work=cli.tmp / "work").replace("step: b}", "step: b, within: 3600}")
        )
        st = json.loads((run / "state.json").read_text())
        st["steps"]["b"]["status"] = "succeeded"
        st["steps"]["b"]["ended_at"] = st["updated_at"]
        (run / "state.json").write_text(json.dumps(st))
        out = cli("run", "--auto", "--new-run", "--only", "c", str(rb))
        ok = out.returncode == 3 and count(cli.tmp / "work" / "c.count") == 0
        tally.trial("state.json edited in an earlier run, within guard", ok)
        if not ok:
            breaks.append((out.stdout[-1500:], out.stderr))
    assert not breaks, breaks[:2]


# --- `audit verify` consults the head kept on the box ------------------------------------------


def _tamper(run: Path, how: str, rng: random.Random) -> None:
    """Rewrite the local files consistently (chain and state.json agree): only the box knows."""
    audit = run / "audit.jsonl"
    recs = lines(audit)
    st = json.loads((run / "state.json").read_text())
    if how == "tail dropped":
        keep = rng.randrange(1, len(recs))
        audit.write_bytes(b"".join(recs[:keep]))
        last = json.loads(recs[keep - 1])
    else:  # a correctly chained forged record after the clean close
        last = json.loads(recs[-1])
        forged = forge(last, "step.state", step="b", status="succeeded", reason=None)
        audit.write_bytes(b"".join(recs) + forged)
        last = json.loads(forged)
        st["steps"]["b"]["status"] = "succeeded"
    st["audit_seq"], st["audit_head"] = last["seq"], last["hash"]
    (run / "state.json").write_text(json.dumps(st))


def _verify_trials(cli, run: Path, host: str, extra: list[str], rng, attack: str, tally, n: int):
    breaks = []
    pristine = {p.name: p.read_bytes() for p in (run / "audit.jsonl", run / "state.json")}
    for i in range(trials(n)):
        for name, data in pristine.items():
            (run / name).write_bytes(data)
        how = ("untouched", "tail dropped", "forged record")[i % 3]
        if how != "untouched":
            _tamper(run, how, rng)
        out = cli("audit", "verify", *extra, **({"ssh": False} if extra else {}))
        off = cli("audit", "verify", "--offline", *extra, **({"ssh": False} if extra else {}))
        said = f"checked against the head on {host}"
        if how == "untouched":
            ok = out.returncode == 0 and said in out.stdout
        else:
            ok = (
                out.returncode == 1
                and "NOT OK" in out.stderr
                and said in out.stderr
                and len(out.stderr.strip().splitlines()) == 1
            )
        # offline, the local files alone agree: ok, and it says the box was not asked
        ok = ok and off.returncode == 0 and "box head not checked (--offline)" in off.stdout
        ok = ok and "Traceback" not in out.stderr + off.stderr
        tally.trial(attack, ok)
        if not ok:
            breaks.append((how, out.stdout, out.stderr, off.stdout))
        # the exports' headers say what verify says, word for word, box head included
        said_verify = (out.stdout or out.stderr).strip().split(": ", 1)[1]
        exported = []
        for fmt, flags in (("md", []), ("csv", []), ("md", ["--offline"])):
            e = cli(
                "audit",
                "export",
                "--format",
                fmt,
                *flags,
                *extra,
                **({"ssh": False} if extra else {}),
            )
            exported.append((fmt, flags, e))
        held = True
        for _fmt, flags, e in exported:
            head = e.stdout.split("\n", 6)
            words = said_verify if not flags else off.stdout.strip().split(": ", 1)[1]
            line = next((x for x in head if "audit verify: " in x), "")
            held = held and line.split("audit verify: ", 1)[-1] == words
            held = held and e.returncode == (0 if how == "untouched" or flags else 1)
            held = held and "verified" not in e.stdout.split("\n## ", 1)[0]
            if not flags and how != "untouched":
                held = held and line.split("audit verify: ", 1)[-1].startswith("NOT OK")
            if flags:
                held = held and "local chain only" in line
        tally.trial(attack.replace("audit verify", "export header"), held)
        if not held:
            breaks.append((how, "export", [(f, fl, e.stdout[:600]) for f, fl, e in exported]))
    assert not breaks, breaks[:2]


def test_audit_verify_consults_the_box_head_local(base, tmp_path, tally):
    cli, _, run = trial_copy(base, tmp_path / "v")
    rng = random.Random(8)
    _verify_trials(cli, run, "local", [], rng, "audit verify vs box head (local)", tally, 9)


@pytest.mark.sshd
def test_audit_verify_consults_the_box_head_over_ssh(tmp_path, box, ssh_keys, tally):  # noqa: F811
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box)
    cli = SshCli(tmp_path, known, config)
    work = tmp_path / "work"
    work.mkdir()
    rb = cli.runbook("    host: box\n" + RUNBOOK.format(work=work))
    try:
        cli("run", "--auto", str(rb), check=1)
        run = next((cli.state / "runs").iterdir())
        extra = ["--ssh-config", str(config), "--known-hosts", str(known)]
        rng = random.Random(9)
        _verify_trials(cli, run, "box", extra, rng, "audit verify vs box head (ssh)", tally, 9)
        # the box unreachable: said, and the local chain alone is checked
        bad = tmp_path / "bad_config"
        bad.write_text(config.read_text().replace(f"Port {box.port}", "Port 1"))
        out = cli(
            "audit", "verify", "--ssh-config", str(bad), "--known-hosts", str(known), ssh=False
        )
        ok = out.returncode == 0 and "box head not checked: box not reachable" in out.stdout
        tally.trial("audit verify vs box head (ssh)", ok)
        assert ok, out.stdout + out.stderr
    finally:
        cli.cleanup()
        kill_tagged(box.tag)


def test_killed_before_the_first_state_save_resumes(base, tmp_path, tally):
    """`kill -9` between the run's first audit records and its first state.json save (the box
    holds only the head pushed before them, the empty chain): nothing ran, so the state is rebuilt from the audit (noted) and
    the run resumes, instead of "state.json is missing" forever. Half the trials land before
    the `run.started` record (right after the head push): the run starts as new."""
    breaks: list = []
    for i in range(trials(4)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        recs = lines(run / "audit.jsonl")
        first = next(k for k, r in enumerate(recs) if json.loads(r)["event"] == "run.started")
        before_record = i % 2 == 1  # killed after the head push, before `run.started`
        (run / "audit.jsonl").write_bytes(b"".join(recs[: 0 if before_record else first + 1]))
        (run / "state.json").unlink()
        # the box as it was then: the head pushed before the run's first record (the empty
        # chain, so that `run.started` may name this spool), no job launched
        empty = {"run_id": run.name, "seq": -1, "hash": "0" * 64, "clean": False, "ts": 0}
        (cli.tmp / "spool" / "audit-heads" / f"{run.name}.json").write_text(json.dumps(empty))
        shutil.rmtree(cli.tmp / "spool" / "jobs", ignore_errors=True)
        (cli.tmp / "work" / "a.count").unlink()
        out = cli("run", "--auto", str(rb))
        events = [r["event"] for r in cli.audit()]
        ok = (
            out.returncode == 1  # b still fails, as in the base run
            and "Traceback" not in out.stderr
            and ("state.rederived" in events) != before_record  # nothing to rederive
            and count(cli.tmp / "work" / "a.count") == 1
            and cli("audit", "verify").returncode == 0
        )
        tally.trial("driver killed before its first state save", ok)
        if not ok:
            breaks.append((out.returncode, out.stderr, events))
    assert not breaks, breaks[:2]


def test_box_head_deleted_is_refused(base, tmp_path, tally):
    """The box's head file for the run is deleted (a cleanup of `audit-heads/`, or to hide a
    local rewrite), alone or with the local tail dropped (state rewound to match) or a chained
    forged record: the spool is the same one (its id unchanged), so a missing head means it
    was deleted; the resume is refused, nothing re-runs. A wiped spool (new id) is the known
    limit: it is still resumed on the local chain, noted."""
    breaks: list = []
    rng = random.Random(61)
    for i in range(trials(9)):
        cli, rb, run = trial_copy(base, tmp_path / f"t{i}")
        (cli.tmp / "spool" / "audit-heads" / f"{run.name}.json").unlink()
        audit, st_path = run / "audit.jsonl", run / "state.json"
        recs = lines(audit)
        st = json.loads(st_path.read_text())
        if i % 3 == 1:  # drop the tail after the opening, rewind state.json to match
            first = next(k for k, r in enumerate(recs) if json.loads(r)["event"] == "run.started")
            keep = rng.randrange(first + 1, len(recs))
            audit.write_bytes(b"".join(recs[:keep]))
            last = json.loads(recs[keep - 1])
            st["audit_seq"], st["audit_head"] = last["seq"], last["hash"]
            st["steps"]["a"]["status"] = "pending"
        elif i % 3 == 2:  # a forged, correctly chained "b succeeded", state to match
            last = json.loads(recs[-1])
            with open(audit, "ab") as f:
                f.write(forge(last, "step.state", step="b", status="succeeded", reason=None))
            new = json.loads(lines(audit)[-1])
            st["audit_seq"], st["audit_head"] = new["seq"], new["hash"]
            st["steps"]["b"]["status"] = "succeeded"
        st_path.write_text(json.dumps(st))
        out = cli("run", "--auto", str(rb))
        verify = cli("audit", "verify")
        ok = refused(out, cli, "the head was deleted") and verify.returncode == 1
        ok = ok and "the head was deleted" in verify.stderr
        tally.trial("box head deleted (alone, tail dropped, forged), resume", ok)
        if not ok:
            breaks.append((i, out.returncode, out.stderr, verify.stderr))
    # control: the spool itself wiped (a tmpfs reboot): no head and a new spool id
    cli, rb, run = trial_copy(base, tmp_path / "wiped")
    shutil.rmtree(cli.tmp / "spool")
    (cli.tmp / "work" / "ok").write_text("")
    out = cli("run", "--auto", str(rb))
    assert out.returncode == 0, out.stderr
    assert "audit.no_box_head" in [r["event"] for r in cli.audit()]
    assert not breaks, breaks[:2]
