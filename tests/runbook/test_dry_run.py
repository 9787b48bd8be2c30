"""Issue 15 item 8: a dry run judges a guard whose input an earlier step produces as pending on
that step, names every blocked step and why, and exits 3 only when something is really blocked."""

from __future__ import annotations

from tests.support.paths import REPO


def test_the_demo_dry_run_on_a_fresh_run_is_pending_not_blocked(cli):
    out = cli("run", str(REPO / "runbooks" / "demo.yaml"), "--dry-run", check=0)
    lines = out.stdout.splitlines()
    assert not [x for x in lines if x.strip().startswith("blocked ")], out.stdout
    pending = {x.split()[1] for x in lines if x.strip().startswith("pending ")}
    # the patch check reads the file fetch-sglang-source writes; the delete waits on the merge
    assert {"check-patch-target", "delete-old-states", "train"} <= pending, out.stdout
    assert "pending on step fetch-sglang-source" in out.stdout
    assert "pending on step verify-merge" in out.stdout
    # stage-old-states creates what delete-old-states' skip_if looks at: not "satisfied" yet
    assert "satisfied delete-old-states" not in out.stdout
    assert lines[-1].startswith("dry run: nothing blocked;") and "pending on earlier" in lines[-1]


def test_a_guard_nothing_earlier_produces_blocks_and_is_named(cli, tmp_path):
    work = tmp_path / "work"
    rb = cli.runbook(f"""\
        name: dry
        steps:
          - id: make
            title: Make the data
            run: mkdir -p {work} && echo x > {work}/data
            artifacts: ["{work}/data"]
          - id: use
            title: Use what make writes
            run: cat {work}/data
            preconditions:
              - {{check: path_exists, path: "{work}/data", title: data made}}
              - {{check: step_succeeded, step: make}}
          - id: needs-input
            title: Needs a file nobody writes
            run: "true"
            preconditions:
              - {{check: path_exists, path: "{tmp_path}/nobody-writes-this", title: input file}}
          - id: after
            title: After the blocked one
            run: "true"
            requires: [needs-input]
          - id: room
            title: Needs more disk than any step makes
            run: "true"
            preconditions:
              - {{check: disk_free, path: "{work}", min: 1000TiB, title: room}}
    """)
    out = cli("run", str(rb), "--dry-run", check=3)
    text = out.stdout
    assert "  pending use on local" in text and "pending on step make" in text
    assert "⋯ guard dry-run data made: pending on step make" in text
    assert "  blocked needs-input on local" in text
    assert "  pending after on local" in text and "pending on step needs-input" in text
    assert "  blocked room on local" in text  # under make's output dir, yet no step makes room
    last = text.splitlines()[-1]
    assert (
        last.startswith("dry run: blocked: needs-input (input file: ") and "does not exist" in last
    )
    assert "; room (room: " in last
    assert "use" not in last.split("blocked:")[1].split(";")[0]
    assert not work.exists() and not (cli.state / "runs").exists()
