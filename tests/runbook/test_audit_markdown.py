"""Issue 15 item 9: the Markdown audit is the record of the run, built from a real (fast) run
that blocks on a declined confirmation, is resumed with a changed variable, deletes, skips and
fails: every heading is true of what it lists."""

from __future__ import annotations

import hashlib
import re

RUNBOOK = """\
name: record
vars:
  work: {work}
  tag: one
steps:
  - id: make
    title: Make the data and its old copy
    run: mkdir -p ${{work}}/old && head -c 65536 /dev/zero > ${{work}}/old/blob && echo made > ${{work}}/data.txt
    artifacts: ["${{work}}/data.txt"]
    postconditions:
      - {{check: path_exists, path: "${{work}}/data.txt", title: data written}}
  - id: gate
    title: Wait for the go file
    preconditions:
      - {{check: path_exists, path: "${{work}}/go", title: go file}}
  - id: wipe
    title: Delete the old copy
    destructive: true
    confirm: delete ${{work}}/old?
    delete: ["${{work}}/old"]
    delete_within: "${{work}}"
    preconditions:
      - {{check: step_succeeded, step: make, title: data made in this run}}
    postconditions:
      - {{check: path_absent, path: "${{work}}/old", title: old copy gone}}
  - id: already
    title: Nothing to do when the data is there
    run: "false"
    skip_if: {{check: path_exists, path: "${{work}}/data.txt"}}
  - id: flaky
    title: Fails unless tag is three
    run: test ${{tag}} = three
"""

HEADINGS = [
    "# Audit log of run",
    "## Outcome",
    "## What happened, in order",
    "## Succeeded steps",
    "## Failed, lost or cancelled steps",
    "## Blocked earlier",
    "## Confirmations given",
    "## Confirmations declined or not given",
    "## Guards and proofs",
    "## Artifacts",
    "## Resumes that changed something",
]


def section(md: str, heading: str) -> str:
    return md.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def test_the_markdown_audit_is_the_record_of_a_real_run(cli, tmp_path):
    work = tmp_path / "work"
    rb = cli.runbook(RUNBOOK.format(work=work))
    cli("run", str(rb), "--auto", check=3)  # gate: no go file yet
    (work / "go").touch()
    cli("run", str(rb), "--auto", check=3)  # wipe: no --yes, so its confirmation is not given
    assert (work / "old" / "blob").exists()
    cli("run", str(rb), "--auto", "--yes", "wipe", "--set", "tag=two", check=1)  # flaky fails
    assert not (work / "old").exists()
    md = cli("audit", "export", "--format", "md", check=0).stdout

    headings = [
        line for line in md.splitlines() if line.startswith("#") and not line.startswith("###")
    ]
    assert [h for h in headings if any(h.startswith(x) for x in HEADINGS)] == headings
    assert [next(x for x in HEADINGS if h.startswith(x)) for h in headings] == HEADINGS

    assert "- exit 1: a step failed or was lost" in section(md, "## Outcome")
    ok = section(md, "## Succeeded steps")
    assert re.search(r"^\| make \| ran \| 0 \|", ok, re.M) and "| wipe | ran | 0 |" in ok
    assert "| already | skip condition held |" in ok
    assert "flaky" not in ok  # a heading that is true: no failure under "Succeeded"
    bad = section(md, "## Failed, lost or cancelled steps")
    assert "| flaky | failed | exit_code · exited with code 1 | 1 |" in bad
    earlier = section(md, "## Blocked earlier")
    assert re.search(
        r"^\| gate \| [^|]+ \| precondition_failed · path_exists: .*/go does not exist \| succeeded \|$",
        earlier,
        re.M,
    )
    assert "| wipe |" not in earlier  # its declined confirmation has its own table
    assert "| gate | guards_passed |" in ok
    assert "| wipe | yes_flag |" in section(md, "## Confirmations given")
    declined = section(md, "## Confirmations declined or not given")
    assert "| wipe |" in declined and "--yes wipe" in declined

    proofs = section(md, "## Guards and proofs")
    wipe = proofs.split("### `wipe` (succeeded)", 1)[1].split("###", 1)[0]
    assert "✓ guard data made in this run: passed" in wipe
    assert "removes 64.0 KiB in 1 file" in wipe  # exactly what the agent took, not a dir entry
    assert "✓ proof old copy gone: proven" in wipe
    assert "ended_at=20" in wipe and "e+09" not in wipe  # local ISO time, not a float
    already = proofs.split("### `already` (succeeded)", 1)[1].split("###", 1)[0]
    assert "↷ skip if path_exists: holds" in already and "✗" not in already

    digest = hashlib.sha256((work / "data.txt").read_bytes()).hexdigest()
    assert f"| make | {work / 'data.txt'} | {digest} | 5 B |" in section(md, "## Artifacts")
    assert 'tag: "one" -> "two"' in section(md, "## Resumes that changed something")

    # issue 28 item 4: the story in order; the verification in verify's words
    assert "- audit verify: ok: " in md and "checked against the head on local" in md
    story = section(md, "## What happened, in order")
    events = [
        "driver started the run",
        "`make` succeeded",
        "`gate` blocked: precondition_failed",
        "driver stopped: exit 3",
        "driver resumed the run (",
        "`gate` succeeded",
        "`wipe` blocked: confirmation_required",
        'tag: "one" -> "two"',
        "confirmation given for `wipe`",
        "`wipe` succeeded",
        "`already` succeeded (skip condition held)",
        "`flaky` failed: exit_code",
        "driver stopped: exit 1",
    ]
    at = [story.find(e) for e in events]
    assert -1 not in at and at == sorted(at), list(zip(events, at, strict=True))
    assert "nothing changed" not in md  # a resume that changed nothing is one line of the story
    order = [row.split("|")[1].strip() for row in ok.splitlines() if row.startswith("| ")][1:]
    assert order == ["make", "gate", "wipe", "already"]  # the succeeded table in run order


STORY = """\
name: story
steps:
  - id: evaluate
    title: Evaluate the drafter
    run: [python3, -c, "print('@@eagle3 ' + '{\\"kind\\": \\"result\\", \\"command\\": \\"eval\\", \\"accept_length\\": 3.21, \\"lossless\\": true}')"]
  - id: optional
    title: An optional step
    run: "true"
  - id: slow
    title: Sleeps until killed
    run: [sleep, "60"]
"""


def test_the_markdown_audit_tells_the_story(cli, tmp_path):
    """Issue 28 item 4: the pipeline's figure first, the operator's skip and unskip with their
    reasons, a driver killed mid-run (a session without a close), in order."""
    import asyncio
    import os
    import signal
    import time

    from runbook.engine import Engine
    from runbook.loader import load_runbook
    from runbook.transports.factory import make_transport_factory

    rb = cli.runbook(STORY)
    os.environ["EAGLE_TUI_SPOOL"] = cli.env["EAGLE_TUI_SPOOL"]

    async def operator() -> None:  # the cockpit's actions, through the engine itself
        loaded = load_runbook(rb, state_dir=cli.state)
        engine = Engine(loaded, cli.state, make_transport_factory(cli.state), None)
        await engine.open("story-run")
        try:
            await engine.skip("optional", "not needed tonight")
            engine.unskip("optional", "needed after all")
            await engine.skip("optional", "really not needed")
        finally:
            await engine.close()

    asyncio.run(operator())
    proc = cli.popen("run", str(rb), "--auto", "--run", "story-run")
    deadline = time.time() + 60
    while (
        time.time() < deadline
        and '"slow"' not in (cli.state / "runs" / "story-run" / "audit.jsonl").read_text()
    ):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # the driver dies mid-step: no close, no finish
    proc.wait()
    # the local agent dies with its driver, and its bound job with it: lost, said in order
    cli("run", str(rb), "--auto", "--run", "story-run", check=1)
    md = cli("audit", "export", "--format", "md", check=0).stdout

    outcome = section(md, "## Outcome")
    assert "- `evaluate` (succeeded): accept length 3.21 · lossless yes" in outcome
    assert "1 ended without closing (interrupted or killed)" in outcome
    story = section(md, "## What happened, in order")
    events = [
        "operator skipped `optional`: not needed tonight",
        "operator unskipped `optional`: needed after all",
        "operator skipped `optional`: really not needed",
        "driver closed (jobs keep running)",
        "driver resumed the run",
        "`evaluate` succeeded (ran, exit 0",
        "`slow` started",
        "driver ended without closing the run (interrupted or killed)",
        "driver resumed the run",
        "`slow` lost: agent_lost",
        "driver stopped: exit 1",
    ]
    pos, at = 0, []
    for e in events:  # each after the one before it
        pos = story.find(e, pos)
        at.append(pos)
        pos = max(pos, 0) + 1
    assert -1 not in at, (list(zip(events, at, strict=True)), story)
    assert "nothing changed" not in md
