"""Issue 28 (the operator's second night), the smaller items, each as the operator meets it:

- in a real terminal (tmux, 160x50): the footer shows q, ? and l; the help modal fits (every
  row ends inside its border); Ctrl+C says how to quit in plain text (no `[b]` markup); the
  resources say `no GPU (…)` once; quitting with a detached job running prints a reattach
  command that works when pasted (it carries `--state-dir`, `--host` and the `--set` values);
- headless: a resumed run says which states are from an earlier session (no stale "blocked"
  line), a blocking guard's reason is printed once, durations of earlier sessions are shown,
  and `--only` ends with "selected steps done; N pending", not "all steps done";
- the cockpit's "run finished" toast says what the exit code means.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from eagle_tui.app.launch import reattach_command
from eagle_tui.cli import build_parser
from eagle_tui.cli import main as cli_main

from .helpers import SIZE, opened, status, type_confirmation, wait_for
from .tmux_driver import TmuxDriver, cockpit_argv, gate_line, terminal_env

COCKPIT = __import__("tests.tui.helpers", fromlist=["RUNBOOKS"]).RUNBOOKS / "cockpit.yaml"
RUNBOOKS_DIR = __import__("tests.support.paths", fromlist=["REPO"]).REPO / "runbooks"


@pytest.mark.skipif(not TmuxDriver.available(), reason="tmux is not installed")
def test_terminal_footer_help_ctrl_c_and_the_reattach_command(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "spool"))
    (tmp_path / "work").mkdir()
    argv = cockpit_argv(COCKPIT, tmp_path, "--set", "gate_at=3", "--set", "lines=6")
    tm = TmuxDriver("night", cwd=tmp_path, env=terminal_env(tmp_path), size=(160, 50))
    tm.start()
    try:
        tm.run(argv)
        tm.wait_for(r"● connected", timeout=60)
        footer = tm.screen().rstrip("\n").splitlines()[-1]
        for key in ("q Quit", "? Help", "l Full log"):
            assert key in footer, footer
        tm.wait_for(r"no GPU \(")  # this machine has none: the agent's reason, said once
        assert "no GPU (no GPU" not in tm.screen()
        tm.keys("?")
        tm.wait_for(r"Keys \(Esc, \? or F1 closes\)")
        rows = [x for x in tm.screen().splitlines() if re.search(r"█\s+\S+\s+(quit|help)\s", x)]
        assert len(rows) == 2 and all(x.rstrip().endswith("█") for x in rows), rows
        tm.keys("Escape")
        tm.wait_until(lambda: "Keys (Esc" not in tm.screen(), "the help to close")
        tm.keys("C-c")
        tm.wait_for(r"Press q \(or ctrl\+q\) to quit")
        assert "[b]" not in tm.screen()
        tm.keys("a")  # run-all to the detached train, which waits at its gate; then quit
        tm.wait_for(r"Destructive step: wipe")
        tm.send_text("wipe")
        tm.keys("Enter")
        tm.wait_for(gate_line(tmp_path / "work"), timeout=60)
        tm.keys("q")
        tm.wait_for(r"EXIT=0", timeout=60)
        joined = tm.tmux("capture-pane", "-p", "-J", "-t", tm.session)  # wrapped lines joined
        line = re.search(r"reattach with: (eagle-tui run [^\n]+)", joined).group(1).strip()
    finally:
        tm.stop()
    pasted = shlex.split(line)
    assert "--state-dir" in pasted and str(tmp_path / "state") in pasted, line
    assert f"work={tmp_path / 'work'}" in pasted and "gate_at=3" in pasted, line
    # pasted, it opens the same run (no new one, no "resuming with changes") and finishes it
    (tmp_path / "work" / "release").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "eagle_tui.cli", *pasted[1:], "--auto", "--yes", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        input="",
        env={**terminal_env(tmp_path), "PYTHONPATH": ":".join(sys.path)},
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    run_id = pasted[pasted.index("--run") + 1]
    assert f"run {run_id} (resumed)" in text and "with changes" not in text, text
    assert out.returncode == 0 and "exit 0: all steps done" in text, text


def test_reattach_command_is_only_as_long_as_needed(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_TUI_STATE_DIR", str(tmp_path / "default"))
    args = build_parser().parse_args(["run", "rb.yaml"])
    assert reattach_command(args, tmp_path / "default", "R1") == "eagle-tui run rb.yaml --run R1"
    args = build_parser().parse_args(["run", "rb.yaml", "--set", "a=b c"])
    cmd = reattach_command(args, tmp_path / "other", "R1")
    assert shlex.split(cmd)[-4:] == ["--state-dir", str(tmp_path / "other"), "--set", "a=b c"]


def _headless(env, *extra: str) -> list[str]:
    return env.argv("--auto", "--quiet", *extra)


def test_headless_earlier_sessions_blocked_once_and_only(cockpit_env, capsys):
    env = cockpit_env
    assert cli_main(_headless(env, "--only", "prepare")) == 0
    out = capsys.readouterr().out
    assert "exit 0: selected steps done; 4 pending (check, wipe, train, report)" in out, out
    assert "all steps done" not in out
    (env.work / "old" / "blob.bin").unlink()
    (env.work / "old").rmdir()
    assert cli_main(_headless(env, "--from", "check")) == 3
    out = capsys.readouterr().out
    assert "✓ prepare succeeded in an earlier session" in out, out
    blocked = [x for x in out.splitlines() if "does not exist" in x and "summary" not in x]
    said = [x for x in blocked if "│" not in x]  # outside the summary table
    assert len(said) == 1 and "✗ guard old data present" in said[0], said
    assert "⏸ check blocked (precondition_failed)" in out
    # the prepare row of the summary has its duration although it ran in an earlier session
    row = next(x for x in out.splitlines() if "│ prepare" in x)
    assert re.search(r"\d+(\.\d+)?(ms|s)\s+│$", row), row
    # --yes after fixing it: the blocked state of the last session is history, not news
    (env.work / "old").mkdir()
    assert cli_main(_headless(env, "--yes")) == 0
    out = capsys.readouterr().out
    stale = [x for x in out.splitlines() if "blocked" in x and "earlier session" not in x]
    assert stale == [], stale
    assert "check blocked in an earlier session (precondition_failed" in out
    assert "exit 0: all steps done" in out


async def test_run_finished_toast_says_what_the_code_means(cockpit_env):
    env = cockpit_env
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("a")
        await type_confirmation(pilot, "wipe")
        await wait_for(pilot, lambda: status(app, "report") == "succeeded", timeout=90)
        note = await wait_for(
            pilot,
            lambda: next(
                (n.message for n in app._notifications if n.message.startswith("run finished")),
                None,
            ),
            what="the run finished toast",
        )
        assert note.startswith("run finished: exit 0 (all steps done) · audit head seq"), note
        await pilot.press("q")
    st = json.loads(app.engine.store.state_path.read_text())
    assert st["finished"] is True


def test_quiet_shows_a_failed_steps_tail_and_log_path(env, capsys):
    """`--quiet` streams no logs, but a failed step's last lines and its log file are shown."""
    assert cli_main(env.argv("--auto", "--quiet")) == 1
    out = capsys.readouterr().out
    assert "✗ flaky failed" in out
    assert "last 1 lines of flaky's log:" in out and "  flaky │ not fixed yet" in out, out
    log = re.search(r"  flaky log: (\S+)", out).group(1)
    assert open(log).read() == "not fixed yet\n"
    assert "  ok │" not in out  # the succeeded step's output stays quiet


DELETE_RUNBOOK = """\
name: delete-says-what
vars: {work: /nonexistent}
steps:
  - id: stage
    title: Make something to delete
    run: mkdir -p ${work}/old && head -c 5000 /dev/zero > ${work}/old/a.bin
  - id: wipe
    title: Delete it
    delete: ["${work}/old"]
    delete_within: "${work}"
    destructive: true
    confirm: Delete ${work}/old?
"""


def test_headless_delete_says_what_it_removed(env, capsys):
    """The engine's delete evidence (the resolved target, its bytes and files), once it ran."""
    rb = env.root / "delete.yaml"
    rb.write_text(DELETE_RUNBOOK)
    argv = ["run", str(rb), "--state-dir", str(env.state), "--host", "local", "--auto"]
    argv += ["--quiet", "--set", f"work={env.work}", "--yes", "wipe"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"  wipe removed 4.9 KiB in 1 file: {env.work / 'old'}" in out, out
    assert not (env.work / "old").exists()


async def test_skipping_a_step_says_what_it_leaves_behind(env):
    """A step's `skipping_leaves` (the shipped runbooks' revert-patch has one) is said in the
    skip dialog and as a warning once skipped, and kept in the audit."""
    from eagle_tui.app.screens.dialogs import ReasonScreen
    from runbook.loader import load_runbook

    for name in ("demo", "kimi-k25-eagle3", "kimi-k25-eagle3-2box", "gpu-sglang-check"):
        rb = load_runbook(RUNBOOKS_DIR / f"{name}.yaml", {}).runbook
        assert "still patched" in (rb.step("revert-patch").skipping_leaves or ""), name
    (env.root / "leaves.yaml").write_text(LEAVES_RUNBOOK)
    env.runbook = env.root / "leaves.yaml"
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("revert")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ReasonScreen), what="the dialog")
        assert "Skipping it leaves the file patched." in app.screen.body
        await pilot.press(*"no time", "enter")
        await wait_for(pilot, lambda: status(app, "revert") == "skipped", what="the skip")
        await wait_for(
            pilot,
            lambda: any(
                n.message == "revert skipped: this leaves the file patched"
                for n in app._notifications
            ),
            what="the warning",
        )
        records = [json.loads(x) for x in app.engine.store.audit_path.read_text().splitlines()]
        skip = [r for r in records if r.get("reason") == "operator_skip"]
        assert skip and skip[-1]["leaves"] == "the file patched"
        await pilot.press("q")


LEAVES_RUNBOOK = """\
name: leaves
vars: {work: /nonexistent, python: python3, job: none}
steps:
  - id: revert
    title: Put the file back
    run: "true"
    skipping_leaves: the file patched
"""


SIZES_RUNBOOK = """\
name: sizes
vars: {work: /nonexistent, python: python3, job: none}
steps:
  - id: check
    title: Room and the manifest
    preconditions:
      - {check: disk_free, path: "${work}", min: 100TB, title: room}
      - {check: manifest, path: "${work}/m.json", title: manifest}
      - {check: dir_size, path: "${work}", max: 2GB, min: 1.5MB, title: size}
    run: "true"
"""


def test_dry_run_reads_sizes_back_as_written_and_leaves_out_empty_fields(env, capsys):
    """Polish: `min: 100TB` reads back as `100 TB` (was `90.9 TiB`), a `dir_size` bound as
    written (`2 GB`, `1.5 MB`), and a manifest guard's observed values leave out the empty
    `fields` (was `fields=[0 items]`)."""
    (env.work / "m.json").write_text('{"file": "m.json", "sha256": "00"}')
    env.runbook = env.root / "sizes.yaml"
    env.runbook.write_text(SIZES_RUNBOOK)
    assert cli_main(env.argv("--dry-run")) == 3  # blocked: not 100 TB free here
    out = capsys.readouterr().out
    assert re.search(r"free < 100 TB required", out), out
    assert "TiB required" not in out
    assert "not within >= 1.5 MB and <= 2 GB" in out, out
    observed = [x for x in out.splitlines() if "observed:" in x and "sha256_expected" in x]
    assert observed and "fields=" not in observed[0], observed


FORWARD_RUNBOOK = """\
name: forward
steps:
  - id: prepare
    title: Prepare
    run: "true"
    requires: [train]
  - id: train
    title: Train
    run: "true"
  - id: report
    title: Report
    run: "true"
    requires: [trian]
"""


def test_validate_suggests_the_step_and_says_a_forward_requires_runs_first(tmp_path, capsys):
    """`validate`: an unknown step in `requires` gets a did-you-mean; a step required before it
    is written is said (it runs first), not silently reordered."""
    rb = tmp_path / "forward.yaml"
    rb.write_text(FORWARD_RUNBOOK)
    assert cli_main(["validate", str(rb)]) == 2
    err = capsys.readouterr().err
    assert f"{rb}:13:16: steps[2].requires[0]: unknown step 'trian'; did you mean 'train'?" in err
    rb.write_text(FORWARD_RUNBOOK.replace("[trian]", "[prepare]"))
    assert cli_main(["validate", str(rb)]) == 0
    captured = capsys.readouterr()
    assert (
        f"{rb}:6:16: steps[0].requires[0]: warning: 'train' comes later in the file but "
        "runs before 'prepare'" in captured.err
    ), captured.err
    assert captured.err.count("warning:") == 1  # `report` requires an earlier step: fine
    assert "ok: runbook 'forward', 3 steps" in captured.out


def test_interrupting_auto_mid_job_says_what_is_left_running(cockpit_env):
    """Headless Ctrl+C while a detached job runs: `exit 130:` says what is still running on the
    box and how to reattach (it said nothing after `exit 130:`); run again, it finishes."""
    env = cockpit_env
    env.extra_sets = ["gate_at=3", "lines=6"]
    argv = [sys.executable, "-m", "eagle_tui.cli", *env.argv("--auto", "--yes", "--quiet")]
    run_env = {**os.environ, "PYTHONPATH": ":".join(sys.path), "COLUMNS": "200"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env
    )
    try:
        deadline = time.monotonic() + 90
        while not any(
            "waiting for" in p.read_text() for p in env.state.glob("runs/*/logs/train.*.log")
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "never reached the gate"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    last = out.rstrip("\n").splitlines()[-1]
    assert last == (
        "exit 130: interrupted (Ctrl+C or SIGTERM); still running on the box: train "
        "(run the same command again to reattach)"
    ), out
    (env.work / "release").write_text("")
    again = subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=120)
    assert again.returncode == 0 and "exit 0: all steps done" in again.stdout, again.stdout


async def test_a_silent_job_says_how_long_it_has_been_silent(env):
    """Logs: a running step's detail says when its job last wrote (`last output 3s ago`), so a
    job silent at its gate reads as silent, not as a frozen view; progress records are the bar
    above the log, not one log line per update (the full log keeps them)."""
    from eagle_tui.app.widgets.logs.live_log import LiveLog
    from eagle_tui.app.widgets.steps.detail import StepDetail

    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        log = app.main.query_one(LiveLog)
        await wait_for(pilot, lambda: any("waiting for" in x for x in log.lines), what="the gate")

        def silent_for() -> int:
            shown = app.main.query_one(StepDetail).visual.plain
            m = re.search(r"last output (\d+)s ago", shown)
            return int(m.group(1)) if m else -1

        await wait_for(pilot, lambda: silent_for() >= 3, timeout=30, what="the silence counted")
        assert any(x.startswith("▸ metrics · step 5 ") for x in log.lines), list(log.lines)
        assert not any(x.startswith("▸ train · ") for x in log.lines), list(log.lines)
        (env.work / "release").write_text("")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", timeout=60)
        await pilot.pause(0.3)
        assert "last output" not in app.main.query_one(StepDetail).visual.plain
        mirror = open(app.record("long").log_file).read()
        assert '"kind":"progress"' in mirror  # the record is kept, only not a pane line
        assert not any(x.startswith("▸ train · ") for x in log.lines)
        await pilot.press("q")


async def test_a_reopened_run_keeps_its_guards_through_d(cockpit_env):
    """Guard results on reopen come from the audit (they used to read "not evaluated yet", and
    `d` did not bring them back); a dry run (`d`) on the reopened run answers and leaves the
    recorded results of finished steps in place."""
    env = cockpit_env
    env.extra_sets += ["lines=6"]
    env.run_to_the_end()
    from eagle_tui.app.widgets.steps.detail import StepDetail

    app = env.app("--run", "latest")
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("check")
        await pilot.pause(0.2)
        before = app.main.query_one(StepDetail).visual.plain
        assert before.count("✓ guard") == 2 and "not evaluated yet" not in before, before
        await pilot.press("d")
        await wait_for(
            pilot,
            lambda: any(n.message.startswith("dry-run") for n in app._notifications),
            what="the dry run's answer",
        )
        await pilot.pause(0.2)
        after = app.main.query_one(StepDetail).visual.plain
        assert after == before, after
        await pilot.press("q")


async def test_at_100x30_titles_stay_readable_and_the_log_keeps_the_height(env):
    """At 100x30 the title column kept one letter and ~16 rows went unused: now each title
    shows at least 10 characters and the log pane keeps more than half the screen's rows."""
    from eagle_tui.app.widgets.logs.live_log import LiveLog

    from .seed import seeded_app
    from .test_layout import todo_text
    from .test_snapshots import _ready

    app = seeded_app(env.state)
    async with app.run_test(size=(100, 30)) as pilot:
        await _ready(pilot)
        await pilot.pause(0.1)
        rows = todo_text(app)[1:6]
        titles = [re.split(r"\s{2,}", x.strip())[2] for x in rows]  # icon, id, title, ...
        assert all(len(t) >= 10 for t in titles), titles
        assert app.main.query_one(LiveLog).size.height >= 15
