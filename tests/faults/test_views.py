"""Attacks on "the views tell the truth" (issue 15 items 7-9): a dry run neither cries wolf on a
guard an earlier step satisfies nor hides a real block; a skip condition that does not hold is
never shown as a failure; the Markdown audit's headings list only what they say. Real engine and
real local agent for the dry run; each trial counted in the tally."""

from __future__ import annotations

import asyncio
import json
import os
import random
import stat
from pathlib import Path

from eagle_tui.present import guards as guard_view
from eagle_tui.present.audit_md import SECTIONS, export_markdown
from runbook.engine import Engine
from runbook.loader import load_runbook
from runbook.transports.factory import make_transport_factory

STEP_MAKES = {  # how an earlier step declares the file it writes: each one the dry run must see
    "artifact": 'artifacts: ["{f}"]',
    "postcondition": 'postconditions: [{{check: path_exists, path: "{f}"}}]',
    "skip_if": 'skip_if: {{check: path_exists, path: "{f}"}}',
}
GUARDS = {  # a later guard that reads that file (or the dir holding it)
    "path_exists": '{{check: path_exists, path: "{f}"}}',
    "dir_size": '{{check: dir_size, path: "{d}", min: 1}}',
    "sha256": '{{check: sha256, path: "{f}", any_of: ["' + "0" * 64 + '"]}}',
    "command": '{{check: command, run: [cat, "{f}"]}}',
}


def dry_run(root: Path, text: str) -> tuple[int, dict[str, tuple[str, str]]]:
    root.mkdir(parents=True, exist_ok=True)
    rb = root / "rb.yaml"
    rb.write_text(text)
    state = root / "state"
    os.environ["EAGLE_TUI_SPOOL"] = str(root / "spool")
    loaded = load_runbook(rb, state_dir=state)

    async def main() -> tuple[int, dict]:
        engine = Engine(loaded, state, make_transport_factory(state), None)
        await engine.open_readonly()
        try:
            return await engine.dry_run(), engine.dry_report
        finally:
            await engine.close()

    return asyncio.run(main())


def test_dry_run_is_pending_on_what_earlier_steps_make_and_blocks_on_the_rest(tmp_path, tally):
    rng = random.Random(15)
    for i in range(12):
        root = tmp_path / f"t{i}"
        data = root / "work" / "data"
        made, guard = rng.choice(list(STEP_MAKES)), rng.choice(list(GUARDS))
        produced = rng.random() < 0.6  # else the earlier step writes some other file
        f = data / "x.bin"
        writes = f if produced else root / "elsewhere" / "y.bin"
        text = (
            "name: dry\nsteps:\n"
            f"  - id: make\n    title: Make\n    run: mkdir -p {writes.parent} && echo x > {writes}\n"
            f"    {STEP_MAKES[made].format(f=json.dumps(str(writes))[1:-1])}\n"
            f"  - id: use\n    title: Use\n    run: 'true'\n"
            f"    preconditions: [{GUARDS[guard].format(f=f, d=data)}]\n"
        )
        code, report = dry_run(root, text)
        state, why = report["use"]
        held = (
            (code, state, why) == (0, "pending", "pending on step make")
            if produced
            else (code == 3 and state == "blocked" and why)
        )
        assert tally.trial("dry run: pending vs really blocked", bool(held)), (made, guard, report)
        assert not data.exists() and not writes.exists()  # a dry run runs nothing


def test_a_skip_condition_that_does_not_hold_is_never_a_failure(tally):
    rng = random.Random(7)
    for _ in range(40):
        results = [
            {
                "phase": rng.choice(guard_view.PHASES),
                "check": "path_exists",
                "ok": rng.random() < 0.5,
            }
            for _ in range(rng.randint(1, 6))
        ]
        shown = guard_view.views(results)
        failures = sum(1 for r in results if r["phase"] != "skip_if" and not r["ok"])
        cell = str(guard_view.summary(results))
        held = all(
            g.mark != "✗" for g, r in zip(shown, results, strict=True) if r["phase"] == "skip_if"
        ) and (cell.startswith(f"✗{failures}/") if failures else "✗" not in cell)
        assert tally.trial("guard view: skip_if miss shown as failure", held), (results, cell)


def test_audit_headings_list_only_what_they_say(tally):
    rng = random.Random(9)
    statuses = [s for _, group in SECTIONS for s in group]
    for t in range(20):
        records = [{"run_id": "r", "seq": 0, "event": "run.started", "runbook": {}, "who": {}}]
        final = {}
        for i in range(rng.randint(1, 8)):
            for status in rng.sample(statuses, rng.randint(1, 3)):  # the last one stands
                records.append(
                    {"event": "step.state", "step": f"step{i}x", "status": status, "who": {}}
                )
                final[f"step{i}x"] = status
        md = export_markdown(records)
        held = True
        for heading, group in SECTIONS:
            body = md.split(f"## {heading}\n", 1)[1].split("\n## ")[0] if heading in md else ""
            listed = {sid for sid in final if f"| {sid} |" in body}
            held &= listed == {sid for sid, st in final.items() if st in group}
        assert tally.trial("audit markdown: a heading lists another status", held), (t, md)


def _bytes_on_disk(root: Path) -> int:
    """Apparent bytes of every regular file under root, each inode once (links not followed)."""
    seen, total = set(), 0
    for d, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def test_the_delete_evidence_is_what_the_delete_frees(tmp_path, tally):
    """The size a delete target shows is what the agent's delete then frees: a directory's
    contents (not its 4096-byte entry), a link as the link itself, a link written with `/`
    refused (nothing freed), hard links inside once; measured by the bytes that really went."""
    from remote_agent.agent.deletion import SPEC, run_job
    from remote_agent.agent.probes import run_probe

    rng = random.Random(21)
    for i in range(16):
        work = tmp_path / f"w{i}" / "work"
        old = work / "old"
        (old / "sub").mkdir(parents=True)
        (work / "keep").mkdir()
        (work / "keep" / "k.bin").write_bytes(os.urandom(rng.randint(1, 5000)))
        for j in range(rng.randint(0, 5)):
            (old / ("sub" if j % 2 else "") / f"f{j}.bin").write_bytes(b"x" * rng.randint(0, 70000))
        if rng.random() < 0.5 and any(old.glob("*.bin")):
            first = next(old.glob("*.bin"))
            os.link(first, old / "sub" / "hard.bin")  # one inode, counted once
        (work / "lnk").symlink_to(old)
        raw = rng.choice([str(old), f"{work}/lnk/", f"{work}/lnk", f"{old}/"])
        res = run_probe({"check": "delete_target", "path": raw, "root": str(work)})
        before = _bytes_on_disk(work)
        if res["ok"]:
            jd = tmp_path / f"w{i}" / "job"
            jd.mkdir()
            target = {"path": raw, "root": str(work), "expect": res["observed"]}
            (jd / SPEC).write_text(json.dumps({"targets": [target], "protected": []}))
            run_job(str(jd))
        freed = before - _bytes_on_disk(work)
        if raw == f"{work}/lnk/":  # `rm -rf lnk/` would empty old: refused, nothing freed
            held = not res["ok"] and freed == 0 and "trailing" in res["message"]
        else:
            shown = (res.get("observed") or {}).get("bytes")
            held = bool(res["ok"]) and shown == freed
        assert tally.trial("delete evidence: size shown vs bytes the delete freed", held), (
            raw,
            res,
            freed,
        )
