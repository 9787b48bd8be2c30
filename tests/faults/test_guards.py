"""Attacks on "guards are fresh" and "destructive targets": files changed while the operator
confirms, symlinked targets, forbidden delete targets. Real engine, real local agent (a
subprocess over pipes), the agent's own delete job; each trial counted in the tally."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest

from runbook.audit import read_records
from runbook.engine import Confirmation, Engine
from runbook.loader import RunbookError, load_runbook
from runbook.transports import TransportOptions
from runbook.transports.factory import make_transport_factory
from tests.faults.tally import trials
from tests.ssh.conftest import box, ssh_keys  # noqa: F401 - fixtures of the real sshd
from tests.ssh.helpers import write_ssh_config
from tests.ssh.sshd import kill_tagged

RUNBOOK = """\
name: guards
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
    preconditions:
      - {{check: manifest, path: "${{work}}/merged.manifest.json", title: merged file}}
      - {{check: dir_size, path: "${{old}}", min: 0, title: bytes freed}}
"""


def make_work(root: Path, rng: random.Random) -> tuple[Path, Path]:
    work = root / "work"
    old = work / "old"
    old.mkdir(parents=True)
    for i in range(rng.randint(1, 4)):
        (old / f"shard-{i}.bin").write_bytes(os.urandom(rng.randint(1, 5000)))
    merged = work / "merged.jsonl"
    merged.write_bytes(b'{"a": 1}\n' * rng.randint(1, 50))
    digest = hashlib.sha256(merged.read_bytes()).hexdigest()
    (work / "merged.manifest.json").write_text(
        json.dumps({"file": "merged.jsonl", "sha256": digest})
    )
    return work, old


def run_engine(
    root: Path, work: Path, old: str, during_confirm=None, remote=None, dry: bool = False
) -> tuple:
    """One run of the `wipe` step; `during_confirm` mutates the box while the "modal" is open.

    `remote`: (host, options) to drive the box over SSH (the test sshd on loopback, so the
    box's files are this machine's) instead of the local agent."""
    rb_path = root / "rb.yaml"
    text = RUNBOOK.format(work=json.dumps(str(work)), old=json.dumps(old))
    rb_path.write_text(text if remote is None else f"host: {remote[0]}\n{text}")
    state = root / "state"
    os.environ["EAGLE_TUI_SPOOL"] = str(root / "spool")
    loaded = load_runbook(rb_path, state_dir=state)
    shown: list = []
    evaluated: list = []  # every guard result, as the engine emitted it

    async def confirmer(req):
        shown.append(req.evidence)
        if during_confirm is not None:
            await during_confirm()
        return Confirmation("typed", req.step_id)

    async def main():
        options = remote[1] if remote is not None else None
        engine = Engine(
            loaded,
            state,
            make_transport_factory(state, options),
            confirmer,
            listeners=[lambda e: evaluated.extend(getattr(e, "results", ()))],
        )
        # one id per trial: over SSH every trial shares the box's spool (and its audit heads)
        await engine.open("r-" + hashlib.sha256(str(root).encode()).hexdigest()[:12])
        try:
            await (engine.dry_run() if dry else engine.run_step("wipe"))
        finally:
            await engine.close()
        return engine

    engine = asyncio.run(main())
    assert engine.state is not None and engine.store is not None
    rec = engine.state.steps["wipe"]
    if dry:
        rec = rec.model_copy(update={"guards": evaluated})
    audit = read_records(engine.store.audit_path)
    return rec, audit, shown


def _fresh(tmp_path: Path, i: int) -> Path:
    root = tmp_path / f"t{i}"
    root.mkdir(parents=True)
    return root


def test_evidence_changed_while_confirming_blocks(tmp_path, tally):
    stale_trials(tmp_path, tally, random.Random(1301), 24, "guard changed while confirming")


def stale_trials(tmp_path, tally, rng, n: int, attack_class: str, remote=None) -> None:
    for i in range(trials(n)):
        root = _fresh(tmp_path, i)
        work, old = make_work(root, rng)
        keep = sorted(p.name for p in old.iterdir())
        attack = rng.choice(["truncate merged", "remove manifest", "grow old", "swap to link"])
        outside = root / "elsewhere"
        outside.mkdir()
        (outside / "precious").write_bytes(b"x" * 100)

        async def mutate(attack=attack, work=work, old=old, outside=outside):
            await asyncio.sleep(rng.uniform(0, 0.05))  # some time while the modal is open
            if attack == "truncate merged":
                (work / "merged.jsonl").write_bytes(b"")
            elif attack == "remove manifest":
                (work / "merged.manifest.json").unlink()
            elif attack == "grow old":
                (old / "late.bin").write_bytes(b"y" * 10)
            else:
                shutil.rmtree(old)
                old.symlink_to(outside, target_is_directory=True)

        target = str(old)
        rec, audit, shown = run_engine(root, work, target, mutate, remote)
        final = [r for r in audit if r["event"] == "step.state"][-1]
        intact = (outside / "precious").exists() and (
            attack == "swap to link" or all((old / n).exists() for n in keep)
        )
        held = (
            rec.status == "blocked"
            and rec.reason == "guards_changed"
            and intact
            and "shown" in (rec.message or "")
            and "guards_at_launch" in final
            and final["guards_at_launch"] != final.get("guards_shown")
        )
        tally.trial(attack_class, held)
        assert held, (attack, rec.status, rec.reason, rec.message)


def test_unchanged_evidence_runs_and_audits_launch_evidence(tmp_path):
    root = _fresh(tmp_path, 0)
    work, old = make_work(root, random.Random(7))
    size = sum(p.stat().st_size for p in old.iterdir())
    rec, audit, _ = run_engine(root, work, str(old))
    assert rec.status == "succeeded" and not old.exists()
    launch = [r for r in audit if r["event"] == "step.launch_guards"]
    assert len(launch) == 1 and all(g["ok"] for g in launch[0]["guards"])
    confirmed = next(r for r in audit if r["event"] == "step.confirmed")
    assert [t["target"] for t in confirmed["targets"]] == [str(old)]
    assert confirmed["targets"][0]["bytes"] == size
    done = [r for r in audit if r["event"] == "step.state"][-1]
    assert done["deleted"]["freed_bytes"] == size
    assert done["deleted"]["targets"][0]["result"] == "deleted"


def test_symlink_target_is_the_link_itself(tmp_path, tally):
    symlink_trials(tmp_path, tally, random.Random(1302), 20, "symlink target")


def symlink_trials(tmp_path, tally, rng, n: int, attack_class: str, remote=None) -> None:
    """A link as the last component is deleted as a link (its target intact); written with a
    trailing `/` (where `rm -rf link/` empties the target) it is refused, nothing removed."""
    for i in range(trials(n)):
        root = _fresh(tmp_path, i)
        work, _old = make_work(root, rng)
        inside = rng.random() < 0.5
        real = (work / "real-states") if inside else (root / "other-disk")
        real.mkdir()
        size = rng.randint(1, 20000)
        (real / "data.bin").write_bytes(b"z" * size)
        link = work / "old-link"
        link.symlink_to(real, target_is_directory=True)
        slash = rng.random() < 0.5
        target = f"{link}/" if slash else str(link)
        rec, _audit, shown = run_engine(root, work, target, remote=remote)
        data_intact = (real / "data.bin").read_bytes() == b"z" * size
        if slash:
            held = rec.status == "blocked" and data_intact and link.is_symlink() and not shown
        else:
            kinds = [g["observed"]["kind"] for g in shown[0] if g["check"] == "delete_target"]
            held = (
                rec.status == "succeeded"
                and kinds == ["symlink"]
                and data_intact
                and not os.path.lexists(link)
            )
        tally.trial(attack_class, held)
        assert held, (inside, slash, rec.status, rec.message)


def test_forbidden_delete_targets_refused_before_anything_runs(tmp_path, tally):
    rng = random.Random(1303)
    kinds = ["/", "home", "work root", "parent of work", "holds merged", "link out of root"]
    for i in range(trials(24)):
        root = _fresh(tmp_path, i)
        work, _old = make_work(root, rng)
        kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        if kind == "/":
            target = "/"
        elif kind == "home":
            target = "~"
        elif kind == "work root":
            target = f"{work}/" if rng.random() < 0.5 else str(work)
        elif kind == "parent of work":
            target = f"{work}/.."
        elif kind == "holds merged":  # the merged file the manifest guard just verified
            data = work / "data"
            data.mkdir()
            (work / "merged.jsonl").rename(data / "merged.jsonl")
            m = json.loads((work / "merged.manifest.json").read_text())
            m["file"] = "data/merged.jsonl"
            (work / "merged.manifest.json").write_text(json.dumps(m))
            target = str(data)
        else:
            out = root / "outside"
            out.mkdir()
            (work / "escape").symlink_to(out, target_is_directory=True)
            target = f"{work}/escape/"
        # / and $HOME only in a dry run (read-only probes): never a real delete of them, even
        # if the refusal were broken; the rest through the real delete job
        before = _tree(root)
        dry = kind in ("/", "home")
        try:
            rec, _audit, _shown = run_engine(root, work, target, dry=dry)
        except RunbookError as exc:  # `..`: refused by the loader, before any box is asked
            held = "`..`" in str(exc) and _tree(root) == before
            tally.trial("forbidden delete target", held)
            assert held, (kind, str(exc))
            continue
        refused = [g for g in rec.guards or [] if g["check"] == "delete_target" and not g["ok"]]
        held = (rec.status == "blocked" or dry) and _tree(root) == before and len(refused) == 1
        tally.trial("forbidden delete target", held)
        assert held, (kind, target, rec.status, rec.message)


def _tree(root: Path) -> list[str]:
    """The box's files of a trial (not the runbook, the run state or the agent's spool)."""
    skip = {"state", "spool", "rb.yaml"}
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not skip & set(p.parts))


@pytest.mark.sshd
def test_stale_guard_and_symlink_target_over_ssh(tmp_path, box, ssh_keys, tally):  # noqa: F811
    """The same attacks with the engine driving the box through the real sshd: the guards are
    re-run by the box's agent in the launching request, and it resolves `link/` itself."""
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box)
    remote = ("box", TransportOptions(ssh_config=str(config), known_hosts=str(known)))
    try:
        stale_trials(
            tmp_path / "stale",
            tally,
            random.Random(1311),
            12,
            "guard changed while confirming (ssh)",
            remote,
        )
        symlink_trials(
            tmp_path / "link", tally, random.Random(1312), 10, "symlink target (ssh)", remote
        )
    finally:
        kill_tagged(box.tag)
