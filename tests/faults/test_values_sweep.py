"""The injection sweep: 500 forms (interpreters with every option shape, wrappers known and
made up, stdin shells, eval/trap/computed names, bash builtins that take names or arithmetic,
programs that run a command from an argument, dangerous environment names, text through env)
times seeded hostile values (tests/faults/values_sweep.py), through the real loader, and every
accepted trial through the real engine and local agent, under dash and under bash as /bin/sh.

Held, per trial: refused (at `--set` or with a located `file:line:col:` message naming the
variable or the environment name), or run with its canary absent and the value byte-exact where
the form prints it. Text through env (the one way it goes) must be accepted and arrive intact.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from runbook.loader import RunbookError, load_text
from tests.faults import values_measure, values_sweep
from tests.faults.tally import TALLY
from tests.runbook.conftest import Cli

SEED, PER_FORM = 25, 6
_LOCATED = re.compile(r"^[^\n]+:\d+:\d+: ")


def _value(form: values_sweep.Form, tpl: str, d: Path, canary: Path) -> str:
    return values_sweep.PREPARED.get(tpl, tpl).format(c=canary, d=d)


def _refusal_is_located(problems: list[str], file: str, form: values_sweep.Form) -> bool:
    names = ["${x}", "x is a"] + list(form.env)
    for p in problems:
        if p.startswith("--set x="):
            continue
        if not (p.startswith(file + ":") and _LOCATED.match(p) and any(n in p for n in names)):
            return False
    return bool(problems)


def _classify(tmp: Path) -> list[tuple[values_sweep.Form, str, Path, Path]]:
    """Load every trial in-process; count the refused ones; return the accepted ones."""
    accepted = []
    for k, (form, tpl) in enumerate(values_sweep.trials(SEED, PER_FORM)):
        d = tmp / f"t{k}"
        (d / "tmp").mkdir(parents=True)
        canary = d / "canary"
        values_sweep.prepare(str(d), str(canary))
        value = _value(form, tpl, d, canary)
        file = str(d / "sweep.yaml")
        text = values_measure.runbook_text(form).replace("{o}", str(d / "out"))
        try:
            load_text(text, file, {"x": value})
        except RunbookError as exc:
            held = form.kind != "env-data" and _refusal_is_located(exc.problems, file, form)
            TALLY.trial(f"sweep: {form.attack}: refused, located", held)
            assert held, (form, value, exc.problems)
            continue
        accepted.append((form, value, d, canary))
    return accepted


def _batch(accepted: list, tmp: Path, probe: Path) -> tuple[str, list[str]]:
    """One runbook holding every accepted trial as a step (values via --set), and the sets.
    Its first step records which shell /bin/sh is."""
    lines = ["name: sweep-batch", "vars:"]
    steps = [
        {"id": "which-sh", "title": "which /bin/sh",
         "run": f"printf %s \"$${{BASH_VERSION:-dash}}\" > {probe}"},
    ]  # fmt: skip
    sets = []
    for k, (form, value, d, _) in enumerate(accepted):
        lines.append(f"  x{k}: {json.dumps({'type': 'text', 'value': 'v1'})}")
        step = {"id": f"t{k}", "title": f"trial {k}", "run": form.run, "env": form.env}
        text = json.dumps(step).replace("${x}", f"${{x{k}}}").replace("{o}", str(d / "out"))
        steps.append(json.loads(text))
        sets += ["--set", f"x{k}={value}"]
    lines.append("steps:")
    lines += [f"  - {json.dumps(s)}" for s in steps]
    path = tmp / "batch.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path), sets


def _bash_as_sh(cmd: list[str]) -> list[str]:
    """Run cmd in a mount namespace where /bin/sh is bash (as on the RHEL family)."""
    return ["unshare", "--mount", "sh", "-c", 'mount --bind /bin/bash /bin/sh && exec "$@"',
            "_", *cmd]  # fmt: skip


def _can_bind_bash() -> bool:
    if os.geteuid() != 0:
        return False
    probe = _bash_as_sh(["/bin/sh", "-c", 'test -n "$BASH_VERSION"'])
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.parametrize("sh", ["dash", "bash"])
def test_no_value_runs_as_code(tmp_path: Path, sh: str) -> None:
    if sh == "bash" and not _can_bind_bash():
        pytest.skip("bash as /bin/sh needs root (unshare --mount, mount --bind /bin/bash /bin/sh)")
    if sh == "dash" and os.path.realpath("/bin/sh") != "/usr/bin/dash":
        pytest.skip("/bin/sh is not dash here")
    accepted = _classify(tmp_path) if sh == "dash" else _quiet_classify(tmp_path)
    assert accepted, "text through env must be accepted"
    probe = tmp_path / "which-sh"
    path, sets = _batch(accepted, tmp_path, probe)
    cli = Cli(tmp_path)
    cmd = cli.cmd("run", "--auto", *sets, path)
    cmd = _bash_as_sh(cmd) if sh == "bash" else cmd
    out = subprocess.run(cmd, env=cli.env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    shell = probe.read_text()
    assert (shell == "dash") == (sh == "dash"), shell
    for form, value, d, canary in accepted:
        expected = value + "\n" if "<<EOF" in str(form.run) else value
        got = (d / "out").read_bytes() if (d / "out").exists() else None
        held = not canary.exists() and got == expected.encode()
        TALLY.trial(f"sweep: {form.attack}: ran under {sh} as /bin/sh, nothing executed", held)
        assert held, (form, value, got)


def _quiet_classify(tmp: Path) -> list:
    """The bash run re-uses the same accepted trials; the refusals were counted under dash."""
    before = dict(TALLY.trials), dict(TALLY.held)
    try:
        return _classify(tmp)
    finally:
        TALLY.trials.clear()
        TALLY.trials.update(before[0])
        TALLY.held.clear()
        TALLY.held.update(before[1])


def test_sweep_is_at_least_300_forms() -> None:
    forms = values_sweep.forms()
    assert len(forms) >= 300
    assert {f.kind for f in forms} == {"shell", "argv", "env-name", "env-data"}
