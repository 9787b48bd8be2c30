"""A cockpit in a fixed, seeded state for snapshots: fixed run id, fixed clock, fixed paths,
a log mirror with known content, and host stats/connection events made up by the test. The app
neither connects nor reattaches, so nothing depends on timing or on this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle_tui.app.app import CockpitApp
from eagle_tui.app.launch import build_app
from eagle_tui.cli import build_parser
from runbook.audit import AuditLog
from runbook.events import ConnectionChanged, HostStats
from runbook.loader import load_runbook, parse_overrides
from runbook.state import RunState, RunStore, StepRecord

from .helpers import RUNBOOKS, quiet

RUN_ID = "20260101T000000Z-cockpit-test-snap"
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NOW = T0 + 420.0
SETS = ["work=/srv/eagle/work", "python=python3", "job=/opt/eagle/train_job.py", "lines=400"]


def train_log(lines: int = 400, upto: int = 240) -> bytes:
    out = []
    for i in range(1, upto + 1):
        out.append(f"train line {i:05d} of {lines}")
        if i % 5 == 0:
            out.append(
                "@@eagle3 "
                + json.dumps(
                    {
                        "kind": "metrics",
                        "step": i,
                        "loss": round(4.0 / (1 + i / 10), 4),
                        "acc_k": [round(min(0.95, 0.3 + i / (100 + 20 * k)), 4) for k in range(3)],
                        "sim_accept_len": round(1.0 + min(2.0, i / 25), 3),
                    },
                    separators=(",", ":"),
                )
            )
    return ("\n".join(out) + "\n").encode()


def _guards() -> dict[str, list[dict[str, Any]]]:
    return {
        "check": [
            {
                "check": "disk_free",
                "title": None,
                "ok": True,
                "observed": {
                    "path": "/srv/eagle/work",
                    "total": 2 << 40,
                    "free": 812 << 30,
                    "used": (2 << 40) - (812 << 30),
                },
                "message": "/srv/eagle/work: 812.0 GiB free >= 200.0 GiB required",
            },
            {
                "check": "path_exists",
                "title": "old data present",
                "ok": True,
                "observed": {"exists": True, "type": "dir", "size": 4096},
                "message": "/srv/eagle/work/old exists (a directory)",
            },
        ],
        "wipe": [
            {
                "check": "delete_target",
                "title": "delete target /srv/eagle/work/old",
                "phase": "pre",
                "ok": True,
                "observed": {
                    "path": "/srv/eagle/work/old",
                    "target": "/srv/eagle/work/old",
                    "kind": "dir",
                    "bytes": 924 << 30,
                    "files": 37_312,
                },
                "message": "'/srv/eagle/work/old' deletes /srv/eagle/work/old: 924.0 GiB in 37,312 files",
            },
            {
                "check": "dir_size",
                "title": "old data size",
                "ok": True,
                "observed": {
                    "bytes": 924 << 30,
                    "files": 37_312,
                    "dirs": 12,
                    "errors": 0,
                    "disk_bytes": 925 << 30,
                },
                "message": "/srv/eagle/work/old: 924.0 GiB in 37,312 files, within <= 1.0 TiB",
            },
        ],
    }


def seed(state_dir: Path) -> Path:
    """Write the run's state (prepare/check/wipe done, train running, report pending)."""
    args = build_parser().parse_args(
        [
            "run",
            str(RUNBOOKS / "cockpit.yaml"),
            "--state-dir",
            str(state_dir),
            *sum((["--set", s] for s in SETS), []),
        ]
    )
    loaded = load_runbook(
        args.runbook, parse_overrides(args.set), run_id=RUN_ID, state_dir=state_dir
    )
    store = RunStore(state_dir, RUN_ID)
    store.create_dirs()
    log = store.log_path("train", 1)
    data = train_log()
    log.write_bytes(data)
    os.utime(log, (NOW - 12, NOW - 12))  # the job's last output, 12 s before the fixed clock
    g = _guards()
    steps = {
        "prepare": StepRecord(
            status="succeeded",
            attempt=1,
            job_id=f"{RUN_ID}.prepare.1",
            host="local",
            exit_code=0,
            started_at=T0,
            ended_at=T0 + 2.5,
            command=loaded.runbook.step("prepare").run,
        ),
        "check": StepRecord(
            status="succeeded",
            reason="guards_passed",
            started_at=None,
            ended_at=T0 + 3,
            guards=g["check"],
        ),
        "wipe": StepRecord(
            status="succeeded",
            attempt=1,
            job_id=f"{RUN_ID}.wipe.1",
            host="local",
            exit_code=0,
            started_at=T0 + 4,
            ended_at=T0 + 64,
            guards=g["wipe"],
            command=loaded.runbook.step("wipe").run,
        ),
        "train": StepRecord(
            status="running",
            attempt=1,
            job_id=f"{RUN_ID}.train.1",
            host="local",
            started_at=T0 + 65,
            log_file=str(log),
            log_mirror_size=len(data),
            log_remote_offset=len(data),
            command=loaded.runbook.step("train").run,
            progress={
                "kind": "progress",
                "stage": "train",
                "done": 240,
                "total": 400,
                "unit": "steps",
                "rate": 0.68,
                "eta_s": 235.0,
            },
        ),
        "report": StepRecord(),
    }
    state = RunState(
        run_id=RUN_ID,
        runbook_name=loaded.runbook.name,
        runbook_path=str(loaded.path.resolve()),
        runbook_sha256=loaded.sha256,
        vars=loaded.vars,
        created_at=T0,
        updated_at=T0,
        steps=steps,
    )
    # the audit is the record (docs/SAFETY.md): the seeded state is sealed by a matching audit
    audit = AuditLog(store.audit_path, RUN_ID)
    audit.append(
        "run.started",
        runbook={"name": state.runbook_name, "path": state.runbook_path, "sha256": loaded.sha256},
        vars=loaded.vars,
    )
    for sid, rec in steps.items():
        if rec.status != "pending":
            audit.append(
                "step.state",
                step=sid,
                status=rec.status,
                reason=rec.reason,
                attempt=rec.attempt,
                job_id=rec.job_id,
            )
    state.audit_seq, state.audit_head = audit.head.seq, audit.head.hash
    store.save(state)
    return log


def seeded_app(state_dir: Path) -> CockpitApp:
    seed(state_dir)
    args = build_parser().parse_args(
        [
            "run",
            str(RUNBOOKS / "cockpit.yaml"),
            "--state-dir",
            str(state_dir),
            *sum((["--set", s] for s in SETS), []),
        ]
    )
    app = build_app(
        args,
        state_dir,
        parse_overrides(args.set),
        {},
        clock=lambda: NOW,
        keymap_paths=[],
        run_id=RUN_ID,
    )
    app.connect = app.reattach = False
    # opening claims the work on the box (a real session); its live host stats would change the
    # snapshot, so only the fixed samples of stats_events() are shown
    app.engine.want_stats = False
    return quiet(app)


def stats_events() -> list[Any]:
    out: list[Any] = [ConnectionChanged("local", "connected", 1, None, None)]
    for i in range(24):
        util = [(37 * i) % 100, (53 * i + 20) % 100]
        out.append(
            HostStats(
                "local",
                {
                    "seq": i + 1,
                    "t": T0 + 2 * i,
                    "disk": [
                        {
                            "path": "/srv/eagle/work",
                            "total": 2 << 40,
                            "free": 812 << 30,
                            "used": (2 << 40) - (812 << 30),
                        }
                    ],
                    "gpus": [
                        {
                            "index": k,
                            "name": "NVIDIA H200",
                            "util": float(util[k]),
                            "mem_used_mib": 101_000.0 + 10 * i,
                            "mem_total_mib": 143_771.0,
                        }
                        for k in range(2)
                    ],
                    "gpu_error": None,
                },
            )
        )
    return out
