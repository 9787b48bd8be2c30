"""Attacks on "a delete removes exactly what was measured" (docs/SAFETY.md "Deletes").

Patterns next to look-alikes, shell deletions in `run:`, a target swapped for a link between
the measurement and the deletion (and during the walk), paths that leave their root, mount
points inside a target, kill -9 of the driver or of the delete job midway (then resumed), a
full disk, two drivers at once. Real engine and CLI, real local agent, the agent's own delete
job, real tmpfs/bind mounts where root may mount (skipped otherwise); every trial is counted.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from remote_agent.agent.deletion import SPEC, measure, run_job
from remote_agent.agent.probes import run_probe
from remote_agent.agent.spool import Spool
from runbook.loader import RunbookError, load_text
from tests.faults.test_guards import make_work, run_engine
from tests.runbook.conftest import Cli
from tests.support.waiting import wait_for

DELETE_RB = """\
name: wipe
vars:
  work: {work}
  old: {old}
steps:
  - id: wipe
    title: Delete the old states
    delete: ["${{old}}"]
    delete_within: "${{work}}"
    destructive: true
    confirm: Delete ${{old}}?
    skip_if: {{check: path_absent, path: "${{old}}"}}
    postconditions:
      - {{check: path_absent, path: "${{old}}"}}
"""


def _tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under `path` (a link as its target text), to compare before and after."""
    out: dict[str, bytes | None] = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = (
            os.readlink(p).encode() if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
        )
    return out


def _precious(root: Path, rng: random.Random) -> Path:
    keep = root / "precious"
    (keep / "sub").mkdir(parents=True)
    for i in range(rng.randint(1, 3)):
        (keep / "sub" / f"k{i}").write_bytes(os.urandom(rng.randint(1, 999)))
    return keep


# ---------------------------------------------------------------- patterns, shell deletes

PATTERNS = ["old*", "o*", "ol?*", "ol[d]*", "*important", "[o]lder*", "{old,older-important}"]


def test_glob_brace_bracket_paths_refused_next_to_lookalikes(tmp_path, tally):
    """`old*` beside `older-important/`: refused with a located message (loader, and the agent
    for a client that skips the loader); nothing is deleted, the look-alike intact."""
    rng = random.Random(2501)
    for i in range(28):
        root = tmp_path / f"t{i}"
        work = root / "work"
        (work / "old").mkdir(parents=True)
        (work / "old" / "x").write_bytes(b"1")
        (work / "older-important").mkdir()
        (work / "older-important" / "keep").write_bytes(os.urandom(64))
        before = _tree(work)
        pattern = PATTERNS[i % len(PATTERNS)]
        route = rng.choice(["literal", "--set", "agent"])
        old = f"{work}/{pattern}"
        if route == "agent":  # a client that does not validate: the box refuses it too
            res = run_probe({"check": "delete_target", "path": old, "root": str(work)})
            held = not res["ok"] and "pattern" in res["message"]
        else:
            text = DELETE_RB.format(work=json.dumps(str(work)), old=json.dumps(old))
            over = {"old": old} if route == "--set" else None
            if over:
                text = text.replace(json.dumps(old), json.dumps(f"{work}/old"), 1)
            try:
                load_text(text, "rb.yaml", overrides=over)
                held = False
            except RunbookError as exc:
                msg = str(exc)
                # a literal pattern is refused where the delete names it; through --set the
                # path type refuses the glob characters before any step sees the value
                held = ("rb.yaml:" in msg and "pattern" in msg and "delete" in msg) or (
                    route == "--set" and msg.startswith("--set old=") and "old is a path" in msg
                )
        held = held and _tree(work) == before
        tally.trial("glob/brace/bracket delete path", held)
        assert held, (pattern, route)


SHELL_DELETES = [
    "rm -rf {p}",
    "rm {p}",
    "/bin/rm -r -- {p}",
    "rmdir {p}",
    "unlink {p}",
    "shred -u {p}",
    "truncate -s 0 {p}",
    "wipefs -a {p}",
    "find {p} -delete",
    "find {p} -name '*.bin' -exec rm {{}} +",
    "find {p} -type f -execdir rm -f {{}} ;",
    "rsync -a --delete empty/ {p}",
    "rsync -a --delete-after empty/ {p}",
    "rsync -a --remove-source-files {p} elsewhere/",
    "dd if=/dev/zero of={p} bs=1M count=1",
    "mv new {p}",
    "git -C {p} clean -fdx",
    "git rm -r {p}",
    "sudo rm -rf {p}",
    "env X=1 timeout 5 nice -n 3 rm -rf {p}",
    "ls {p} | xargs rm",
    "echo start && rm -rf {p}",
    "x=$(rm -rf {p})",
    "sh -c 'rm -rf {p}'",
    "bash -lc 'cd /tmp; shred {p}'",
    "if test -d {p}; then rm -r {p}; fi",
    "busybox rm -rf {p}",
]
STILL_ALLOWED = [
    "mkdir -p {p} && head -c 8 /dev/urandom > {p}/x",
    "echo rm -rf {p}",
    "mv -n new {p}",
    "rsync -a --delay-updates src/ {p}",
    "python -m remote_agent.eagle3 verify {p}",
    "git -C {p} status",
]


def _rb_with_run(run: object, guard: bool = False) -> str:
    body = {"id": "s", "title": "t", "run": "true" if guard else run}
    if guard:
        body["preconditions"] = [{"check": "command", "run": run}]
    return json.dumps({"name": "x", "steps": [body]}, indent=1)


def test_every_shell_delete_form_refused_at_validate(tmp_path, tally):
    """Each form, as a shell string and as an argv list (where it is one command), in `run:` and
    in a `command` guard: refused with `file:line:` and a pointer to the delete action."""
    rng = random.Random(2502)
    for form in SHELL_DELETES:
        p = f"/data/{rng.choice(['old', 'states', 'x y'])}-{rng.randint(0, 99)}"
        shell = form.format(p=json.dumps(p) if " " in p else p)
        runs: list[object] = [shell]
        if not any(c in form for c in "|&$'") and "; " not in form:  # one command: argv too
            runs.append(shlex.split(shell))
        for run in runs:
            guard = rng.random() < 0.3
            try:
                load_text(_rb_with_run(run, guard), str(tmp_path / "rb.yaml"))
                held = False
            except RunbookError as exc:
                msg = str(exc)
                held = f"{tmp_path / 'rb.yaml'}:" in msg and "delete:" in msg
            tally.trial("shell delete refused at validate", held)
            assert held, (run, guard)
    for form in STILL_ALLOWED:  # not every command that names a path deletes it
        load_text(_rb_with_run(form.format(p="/data/old")), "rb.yaml")


# ---------------------------------------------------------------- swaps (TOCTOU)


def _job_dir(root: Path, targets: list[dict]) -> Path:
    jd = root / "job"
    jd.mkdir()
    (jd / SPEC).write_text(json.dumps({"targets": targets, "protected": []}))
    return jd


def test_target_swapped_for_a_link_after_measuring_deletes_nothing(tmp_path, tally):
    """The measured directory is replaced by a link to a precious directory (or another
    directory) after the launch guards measured it and before the job deletes: refused
    (exit 3), nothing deleted; swapped inside the target during a paced walk: the link is
    removed as a link, never followed."""
    rng = random.Random(2503)
    for i in range(20):
        root = tmp_path / f"t{i}"
        work, old = make_work(root, rng)
        (old / "deep" / "er").mkdir(parents=True)
        (old / "deep" / "er" / "f").write_bytes(b"f" * 10)
        keep = _precious(root, rng)
        before = _tree(keep)
        expect = measure(str(old), str(work), [], None)
        target = {"path": str(old), "root": str(work), "expect": expect}
        mid_walk = i % 2 == 1
        if not mid_walk:
            how = rng.choice(["link", "other dir"])
            shutil.rmtree(old)
            if how == "link":
                old.symlink_to(keep, target_is_directory=True)
            else:
                old.mkdir()
                (old / "new").write_bytes(b"n")
            rc = run_job(str(_job_dir(root, [target])))
            held = rc == 3 and _tree(keep) == before and os.path.lexists(old)
        else:  # swap `deep` for a link to the precious dir while the walk runs
            os.environ["EAGLE_TUI_DELETE_PACE_S"] = "0.01"
            swapped = threading.Event()

            def swap(old=old, keep=keep, swapped=swapped):
                time.sleep(rng.uniform(0.0, 0.03))
                try:
                    shutil.rmtree(old / "deep")
                    (old / "deep").symlink_to(keep, target_is_directory=True)
                    swapped.set()
                except OSError:  # the walk already removed it
                    pass

            t = threading.Thread(target=swap)
            t.start()
            try:
                rc = run_job(str(_job_dir(root, [target])))
            finally:
                t.join()
                os.environ.pop("EAGLE_TUI_DELETE_PACE_S", None)
            # 3: the swap landed before the job's identity check (refused, nothing deleted)
            held = rc in (0, 1, 3) and _tree(keep) == before
            held = held and (rc != 3 or (old / "deep").is_symlink())
        tally.trial("target swapped for a link before/while deleting", held)
        assert held, (i, rc)


def test_paths_escaping_the_root_are_refused(tmp_path, tally):
    """`..`, a symlinked parent, a path outside the root, a link written with `/`: refused at
    validate or by the agent before anything runs; the precious directory intact."""
    rng = random.Random(2504)
    kinds = ["dotdot", "linked parent", "deep linked parent", "outside", "link slash"]
    for i in range(20):
        root = tmp_path / f"t{i}"
        work, _old = make_work(root, rng)
        keep = _precious(root, rng)
        before = _tree(keep)
        kind = kinds[i % len(kinds)]
        if kind == "dotdot":
            target = f"{work}/a/../../precious/sub"
        elif kind == "linked parent":
            (work / "lnk").symlink_to(keep, target_is_directory=True)
            target = f"{work}/lnk/sub"
        elif kind == "deep linked parent":
            (work / "a").mkdir()
            (work / "a" / "b").symlink_to(root, target_is_directory=True)
            target = f"{work}/a/b/precious"
        elif kind == "outside":
            target = str(keep / "sub")
        else:
            (work / "lnk").symlink_to(keep / "sub", target_is_directory=True)
            target = f"{work}/lnk/"
        try:
            rec, _audit, _shown = run_engine(root, work, target)
        except RunbookError as exc:
            held = "`..`" in str(exc) and _tree(keep) == before
        else:
            refused = [g for g in rec.guards if g["check"] == "delete_target" and not g["ok"]]
            held = rec.status == "blocked" and len(refused) == 1 and _tree(keep) == before
        tally.trial("delete path escapes its root", held)
        assert held, (kind, target)


# ---------------------------------------------------------------- mounts


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_mount_inside_or_at_the_target_is_refused(tmp_path, tally):
    rng = random.Random(2505)
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)):
        pytest.skip("needs root (CAP_SYS_ADMIN) to mount a tmpfs or a bind mount")
    subprocess.run(["umount", str(probe)], check=True)
    for i in range(8):
        root = tmp_path / f"t{i}"
        work, old = make_work(root, rng)
        keep = _precious(root, rng)
        kind = ["tmpfs inside", "bind inside", "target is a mount", "bind deep"][i % 4]
        if kind == "tmpfs inside":
            mnt = old / "mnt"
            mnt.mkdir()
            _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
            (mnt / "on-other-fs").write_bytes(b"t" * 100)
        elif kind == "bind inside":  # the same filesystem: only the mount table tells
            mnt = old / "bound"
            mnt.mkdir()
            _mount("--bind", str(keep), str(mnt))
        elif kind == "target is a mount":
            mnt = old
            _mount("--bind", str(keep), str(mnt))
        else:
            mnt = old / "a" / "b"
            mnt.mkdir(parents=True)
            _mount("--bind", str(keep), str(mnt))
        inside = _tree(mnt)
        try:
            rec, _audit, _shown = run_engine(root, work, str(old))
            refused = [g for g in rec.guards if g["check"] == "delete_target" and not g["ok"]]
            held = (
                rec.status == "blocked"
                and len(refused) == 1
                and "mount point" in refused[0]["message"]
                and _tree(mnt) == inside
            )
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        held = held and (keep / "sub").is_dir()
        tally.trial("mount point inside the delete target", held)
        assert held, (kind, rec.status, rec.message)


# ---------------------------------------------------------------- kill -9, full disk, two drivers


def _cli_work(root: Path, rng: random.Random, files: int) -> tuple[Cli, Path, Path, Path, Path]:
    cli = Cli(root)
    work = root / "work"
    old = work / "old"
    for d in range(max(1, files // 50)):
        (old / f"d{d:03d}").mkdir(parents=True)
        for f in range(50):
            (old / f"d{d:03d}" / f"f{f:02d}").write_bytes(b"s" * rng.randint(1, 300))
    keep = _precious(root, rng)
    (work / "older-important").mkdir()
    (work / "older-important" / "k").write_bytes(b"k")
    rb = cli.runbook(DELETE_RB.format(work=json.dumps(str(work)), old=json.dumps(str(old))))
    return cli, work, old, keep, rb


def _deleted_records(cli: Cli) -> list[dict]:
    """The agent's delete accounts in this operator's audit (none when it never opened a run)."""
    out = cli("audit", "export", "--format", "jsonl")
    if out.returncode == 2 and "no runs" in out.stderr:
        return []
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [r["deleted"] for r in rows if r.get("event") == "step.state" and "deleted" in r]


def _files_left(path: Path) -> int:
    """Files still under `path` while a delete runs (entries vanish under the count)."""
    return sum(len(files) for _d, _s, files in os.walk(path))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_kill9_mid_delete_then_resume(tmp_path, tally):
    """kill -9 of the driver (with its agent) or of the delete job itself while it deletes;
    the next `run` resumes: the target fully gone, nothing outside it touched, the audit says
    the job continued the same target, and `audit verify` passes."""
    rng = random.Random(2506)
    for i in range(6):
        root = tmp_path / f"t{i}"
        cli, work, old, keep, rb = _cli_work(root, rng, 400)
        cli.env["EAGLE_TUI_DELETE_PACE_S"] = "0.004"
        before = (_tree(keep), _tree(work / "older-important"))
        total = _bytes(old)
        victim = "driver" if i % 2 == 0 else "job"
        p = subprocess.Popen(
            cli.cmd("run", str(rb), "--auto", "--quiet", "--yes", "wipe"),
            env=cli.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        left = rng.randint(120, 300)
        wait_for(lambda left=left, old=old: _files_left(old) < left, timeout=60)
        if victim == "driver":
            os.killpg(p.pid, signal.SIGKILL)  # the driver and its agent; the job runs on
        else:
            jobs = Spool(Path(cli.env["EAGLE_TUI_SPOOL"]))
            (jd,) = [jobs.job(j) for j in jobs.job_ids()]
            pg = jd.pgid()
            assert pg is not None
            os.killpg(pg[0], signal.SIGKILL)  # the delete job, mid walk
        p.wait()
        cli.env["EAGLE_TUI_DELETE_PACE_S"] = "0"
        out = cli("run", str(rb), "--auto", "--quiet", "--yes", "wipe", timeout=150)
        verify = cli("audit", "verify")
        deleted = _deleted_records(cli)
        rows = [t for d in deleted for t in d["targets"]]
        held = (
            out.returncode == 0
            and verify.returncode == 0
            and not os.path.lexists(old)
            and (_tree(keep), _tree(work / "older-important")) == before
            and len(deleted) == 1
            and all(r["result"] == "deleted" for r in rows)
            and all(r["target"] == str(old) for r in rows)
        )
        if victim == "job":  # a second job finished it, and says it continued the first
            held = held and rows and rows[0].get("resumed_from", "").endswith(".wipe.1")
            held = held and 0 < rows[0]["freed_bytes"] < total
        else:  # the first job ran to its end; the new driver reattached and recorded it
            held = held and rows and rows[0]["freed_bytes"] == total
        tally.trial(f"kill -9 of the {victim} mid-delete, resumed", bool(held))
        assert held, (victim, out.stdout[-2000:], out.stderr[-2000:], deleted)


def test_delete_on_a_full_disk_frees_it(tmp_path, tally):
    """The work root on a tmpfs filled to the last byte. With the agent's spool elsewhere the
    delete runs (it needs no space) and frees exactly what it measured. With the spool on the
    full disk too, the run is refused with a plain message and nothing is deleted; once some
    space is freed, the same run deletes. The audit verifies either way."""
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)):
        pytest.skip("needs root to mount a tmpfs")
    subprocess.run(["umount", str(probe)], check=True)
    rng = random.Random(2507)
    for i in range(6):
        root = tmp_path / f"t{i}"
        disk = root / "disk"
        disk.mkdir(parents=True)
        assert _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk))
        spool_on_disk = i % 2 == 1
        try:
            cli, work, old, keep, rb = _cli_work(disk, rng, 100)
            cli.env["EAGLE_TUI_STATE_DIR"] = str(root / "state")  # the operator's machine
            cli.state = root / "state"
            if not spool_on_disk:
                cli.env["EAGLE_TUI_SPOOL"] = str(root / "spool")
            (old / "big").write_bytes(os.urandom(rng.randint(1, 3) << 20))
            cli("run", str(rb), "--auto", "--quiet")  # starts the agent; needs a confirmation
            filler = disk / "filler"
            _fill(filler)
            before, old_before = _tree(keep), _tree(old)
            measured = _bytes(old)
            out = cli("run", str(rb), "--auto", "--quiet", "--yes", "wipe", timeout=120)
            first = (out.returncode, out.stderr)
            if spool_on_disk:  # refused, plainly, nothing deleted; then space is made
                refused = (
                    out.returncode != 0
                    and "No space left" in out.stderr
                    and "Traceback" not in out.stdout + out.stderr
                    and _tree(old) == old_before
                )
                filler.unlink()
                out = cli("run", str(rb), "--auto", "--quiet", "--yes", "wipe", timeout=120)
            else:
                refused = True
            verify = cli("audit", "verify")
            deleted = _deleted_records(cli)
            held = (
                refused
                and out.returncode == 0
                and verify.returncode == 0
                and not os.path.lexists(old)
                and _tree(keep) == before
                and len(deleted) == 1
                and deleted[0]["freed_bytes"] == measured
            )
            where = "spool on the full disk" if spool_on_disk else "spool elsewhere"
            tally.trial(f"delete on a full disk ({where})", held)
            assert held, (where, first, out.stdout[-2000:], out.stderr[-2000:], deleted)
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(path: Path) -> None:
    """Write until the filesystem has not one byte left."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (b"\0" * 65536, b"\0"):
            try:
                while True:
                    f.write(chunk)
            except OSError:
                pass


def test_two_drivers_delete_once(tmp_path, tally):
    """Two operators (two state dirs) drive the same delete on one box at once: one deletes,
    the other is refused the box (exit 4) or finds the target already gone; one delete job."""
    rng = random.Random(2508)
    for i in range(6):
        root = tmp_path / f"t{i}"
        a, work, old, keep, rb = _cli_work(root / "alice", rng, 200)
        b = Cli(root / "bob")
        b.tmp.mkdir(parents=True)
        b.env["EAGLE_TUI_SPOOL"] = a.env["EAGLE_TUI_SPOOL"] = str(root / "box-spool")
        rb_b = b.runbook(rb.read_text())
        before = _tree(keep)
        procs = []
        for cli, path in rng.sample([(a, rb), (b, rb_b)], 2):
            procs.append(
                subprocess.Popen(
                    cli.cmd("run", str(path), "--auto", "--quiet", "--yes", "wipe"),
                    env=cli.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            time.sleep(rng.uniform(0, 0.3))
        codes = sorted(p.wait(timeout=120) for p in procs)
        jobs = Spool(root / "box-spool").job_ids()
        deleted = _deleted_records(a) + _deleted_records(b)
        held = (
            codes in ([0, 4], [0, 0])
            and len(jobs) == 1
            and len(deleted) == 1
            and not os.path.lexists(old)
            and _tree(keep) == before
        )
        tally.trial("two drivers, one delete", held)
        assert held, (codes, jobs, deleted, [p.stderr.read() for p in procs if p.stderr])
