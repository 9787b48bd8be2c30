"""Attacks on "guards are fresh" and "destructive targets": files changed while the operator
confirms, symlinked targets, forbidden delete targets. Real engine, real local agent (a
subprocess over pipes), real `rm -rf`; each trial counted in the tally."""

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
from runbook.loader import load_runbook
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
    run: {run}
    destructive: true
    confirm: Delete ${{old}}?
    removes: ["${{old}}"]
    removes_within: "${{work}}"
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
    root: Path, work: Path, old: str, run: str, during_confirm=None, remote=None
) -> tuple:
    """One run of the `wipe` step; `during_confirm` mutates the box while the "modal" is open.

    `remote`: (host, options) to drive the box over SSH (the test sshd on loopback, so the
    box's files are this machine's) instead of the local agent."""
    rb_path = root / "rb.yaml"
    text = RUNBOOK.format(work=json.dumps(str(work)), old=json.dumps(old), run=run)
    rb_path.write_text(text if remote is None else f"host: {remote[0]}\n{text}")
    state = root / "state"
    os.environ["EAGLE_TUI_SPOOL"] = str(root / "spool")
    loaded = load_runbook(rb_path, state_dir=state)
    shown: list = []

    async def confirmer(req):
        shown.append(req.evidence)
        if during_confirm is not None:
            await during_confirm()
        return Confirmation("typed", req.step_id)

    async def main():
        options = remote[1] if remote is not None else None
        engine = Engine(loaded, state, make_transport_factory(state, options), confirmer)
        # one id per trial: over SSH every trial shares the box's spool (and its audit heads)
        await engine.open("r-" + hashlib.sha256(str(root).encode()).hexdigest()[:12])
        try:
            await engine.run_step("wipe")
        finally:
            await engine.close()
        return engine

    engine = asyncio.run(main())
    rec = engine.state.steps["wipe"]
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

        target = f"{old}/" if attack == "swap to link" else str(old)
        rec, audit, shown = run_engine(
            root, work, target, json.dumps(["rm", "-rf", target]), mutate, remote
        )
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
    rec, audit, _ = run_engine(root, work, str(old), json.dumps(["rm", "-rf", str(old)]))
    assert rec.status == "succeeded" and not old.exists()
    launch = [r for r in audit if r["event"] == "step.launch_guards"]
    assert len(launch) == 1 and all(g["ok"] for g in launch[0]["guards"])


def test_symlink_target_evidence_is_what_rm_deletes(tmp_path, tally):
    symlink_trials(tmp_path, tally, random.Random(1302), 20, "symlink target")


def symlink_trials(tmp_path, tally, rng, n: int, attack_class: str, remote=None) -> None:
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
        target = f"{link}/"  # `rm -rf link/` deletes the link target's contents
        rec, _audit, shown = run_engine(
            root, work, target, json.dumps(["rm", "-rf", target]), remote=remote
        )
        sizes = (
            [g["observed"]["bytes"] for g in shown[0] if g["check"] == "dir_size"] if shown else []
        )
        if inside:
            held = sizes == [size] and rec.status == "succeeded"
        else:
            held = rec.status == "blocked" and (real / "data.bin").exists() and not shown
        tally.trial(attack_class, held)
        assert held, (inside, sizes, size, rec.status, rec.message)


def test_forbidden_delete_targets_refused_before_anything_runs(tmp_path, tally):
    rng = random.Random(1303)
    kinds = ["/", "home", "work root", "parent of work", "holds merged", "link out of root"]
    for i in range(trials(24)):
        root = _fresh(tmp_path, i)
        work, _old = make_work(root, rng)
        kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        marker = root / "ran"
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
        # the command only marks that it ran: never a real delete of / or $HOME, even on old code
        run = json.dumps(["touch", str(marker)])
        rec, _audit, _shown = run_engine(root, work, target, run)
        refused = [g for g in rec.guards or [] if g["check"] == "removal_target" and not g["ok"]]
        held = rec.status == "blocked" and not marker.exists() and len(refused) == 1
        tally.trial("forbidden delete target", held)
        assert held, (kind, target, rec.status, rec.message)


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
