"""`eagle3 patch` on copies of the real file (§6.8 items 2-4): round trip, idempotence, refusals
that leave the file untouched, py_compile, the helper install, and the runbook guard."""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import shutil
import subprocess
import sys

import pytest
from patch_fixtures import PATCHED_SHA256, PRISTINE_SHA256, RELEASES, make_site, wheel_file

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.patching import hashes
from remote_agent.eagle3.patching.blocks import PatchError, apply_blocks, load_spec
from remote_agent.wire.atomic_write import TEMP_MARK


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def patch(capsys, *args) -> tuple[int, dict]:
    code = main(["patch", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture
def target(sglang_wheel, tmp_path):
    return make_site(sglang_wheel, tmp_path / "site")


@pytest.fixture
def release_target(sglang_release, tmp_path):
    version, wheel = sglang_release
    return version, make_site(wheel, tmp_path / "site", version=version)


def test_round_trip_idempotent_and_byte_identical(release_target, capsys):
    version, target = release_target
    PRISTINE_SHA256, _, PATCHED_SHA256 = RELEASES[version]  # noqa: N806 (per-release pins)
    pristine = target.read_bytes()
    site = target.parents[3]
    code, rep = patch(capsys, "status", "--target", target)
    assert (
        code == 0 and rep["state"] == "pristine" and rep["check"]["version_source"] == "dist-info"
    )
    assert rep["check"]["record_sha256"] == PRISTINE_SHA256 and rep["check"]["version"] == version

    code, rep = patch(capsys, "apply", "--target", target)
    assert code == 0 and rep["action"] == "applied" and sha(target) == PATCHED_SHA256
    backup = target.with_name("deepseek_v2.py.eagle3-dump.orig")
    assert rep["backup"] == str(backup) and backup.read_bytes() == pristine
    assert not any(
        p.suffix == ".py" and p.name != "deepseek_v2.py" for p in target.parent.iterdir()
    )
    assert not list(target.parent.glob(f"*{TEMP_MARK}*"))
    helper = site / "sglang/srt/eagle3_dump"
    assert rep["helper"]["state"] == "installed"
    assert sorted(p.name for p in helper.iterdir()) == [
        "INSTALLED.json",
        "__init__.py",
        "compat.py",
        "dense.py",
        "hook.py",
        "stream_wire.py",
    ]
    installed = json.loads((helper / "INSTALLED.json").read_text())
    assert installed["patched_sha256"] == PATCHED_SHA256
    py_compile.compile(str(target), cfile=str(target.parent / "x.pyc"), doraise=True)

    code, rep = patch(capsys, "apply", "--target", target)  # idempotent
    assert code == 0 and rep["action"] == "noop" and sha(target) == PATCHED_SHA256

    code, rep = patch(capsys, "revert", "--target", target)
    assert code == 0 and rep["action"] == "reverted"
    assert target.read_bytes() == pristine and not backup.exists() and not helper.exists()
    code, rep = patch(capsys, "revert", "--target", target)
    assert code == 0 and rep["action"] == "noop"


def test_revert_without_backup_strips_the_blocks(target, capsys):
    pristine = target.read_bytes()
    assert patch(capsys, "apply", "--target", target)[0] == 0
    target.with_name("deepseek_v2.py.eagle3-dump.orig").unlink()
    code, rep = patch(capsys, "revert", "--target", target)
    assert code == 0 and target.read_bytes() == pristine


def test_scratch_copy_without_dist_info(sglang_wheel, tmp_path, capsys):
    """The demo's case: a loose copy; the version comes from the hash, the helper goes next to it."""
    target = tmp_path / "scratch" / "deepseek_v2.py"
    target.parent.mkdir()
    target.write_bytes(wheel_file(sglang_wheel, "sglang/srt/models/deepseek_v2.py"))
    code, rep = patch(capsys, "apply", "--target", target)
    assert code == 0 and rep["check"]["version_source"] == "hash" and sha(target) == PATCHED_SHA256
    assert (target.parent / "eagle3_dump" / "hook.py").exists()
    code, rep = patch(capsys, "revert", "--target", target)
    assert code == 0 and sha(target) == PRISTINE_SHA256


def _refused(capsys, target, *args) -> dict:
    before = target.read_bytes()
    code, rep = patch(capsys, *args, "--target", target)
    assert code == 1 and rep["action"] == "refused" and not rep["ok"]
    assert target.read_bytes() == before  # untouched
    assert not list(target.parent.glob(f"*{TEMP_MARK}*"))
    return rep


def test_one_flipped_byte_is_refused_with_both_hashes(target, capsys):
    data = bytearray(target.read_bytes())
    data[5000] ^= 0x01
    target.write_bytes(bytes(data))
    rep = _refused(capsys, target, "apply")
    assert rep["check"]["sha256"] != PRISTINE_SHA256
    assert rep["check"]["pristine_sha256"] == PRISTINE_SHA256
    assert rep["check"]["patched_sha256"] == PATCHED_SHA256
    assert "neither pristine nor patched" in rep["message"]
    assert PRISTINE_SHA256 in rep["message"] and PATCHED_SHA256 in rep["message"]
    _refused(capsys, target, "revert")
    assert not (target.parents[2] / "eagle3_dump").exists()


def test_duplicated_and_missing_anchors_are_refused(target, capsys):
    spec = load_spec(hashes.patches_dir() / "deepseek_v2.eagle3-dump.json")
    text = target.read_text()
    anchor = "logger = logging.getLogger(__name__)\n"
    doubled = text.replace(anchor, anchor + anchor, 1)
    with pytest.raises(PatchError, match="found 2 times"):
        apply_blocks(doubled, spec)
    with pytest.raises(PatchError, match="not found"):
        apply_blocks(
            text.replace(
                "        if self.pp_group.is_last_rank:\n            return self.logits",
                "        if True:\n            return self.logits",
            ),
            spec,
        )
    target.write_text(doubled)  # and the file itself: its hash already says no
    rep = _refused(capsys, target, "apply")
    assert "neither pristine nor patched" in rep["check"]["reason"]


def test_release_file_under_the_other_release_name_is_refused(sglang_release, tmp_path, capsys):
    """0.5.14's file in a site whose dist-info says 0.5.23 (or the reverse) is not patched."""
    version, wheel = sglang_release
    other = next(v for v in RELEASES if v != version)
    target = make_site(wheel, tmp_path / "site", version=version)
    meta = next(target.parents[3].glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace(f"Version: {version}", f"Version: {other}", 1))
    before = target.read_bytes()
    code, rep = patch(capsys, "apply", "--target", target)
    assert code != 0 and rep["check"]["version"] == other
    assert target.read_bytes() == before


def test_unknown_version_is_refused(target, capsys):
    rep = _refused(capsys, target, "apply", "--version", "0.5.99")
    assert "unknown sglang version '0.5.99'" in rep["check"]["reason"]
    meta = next(target.parents[3].glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.5.23", "Version: 0.5.24", 1))
    rep = _refused(capsys, target, "apply")
    assert rep["check"]["version"] == "0.5.24" and "0.5.23" in rep["check"]["reason"]


def test_patched_then_edited_is_refused_both_ways(target, capsys):
    assert patch(capsys, "apply", "--target", target)[0] == 0
    target.write_text(
        target.read_text().replace("_EAGLE3_DUMP = bool(", "_EAGLE3_DUMP = True or bool(", 1)
    )
    rep = _refused(capsys, target, "apply")
    assert "edited after patching" in rep["check"]["reason"]
    _refused(capsys, target, "revert")
    code, rep = patch(capsys, "status", "--target", target)
    assert code == 1 and rep["state"] == "modified"


def test_record_disagreeing_with_the_table_is_refused(target, capsys):
    record = next(target.parents[3].glob("sglang-*.dist-info")) / "RECORD"
    record.write_text(
        record.read_text().replace("9h-TAZvx52gPRaH-InJEQz4bIgIcuVXlPSW5z5AEc_k", "A" * 43)
    )
    rep = _refused(capsys, target, "apply")
    assert "RECORD" in rep["check"]["reason"]


def test_spec_change_without_table_update_is_refused(target, capsys, tmp_path, monkeypatch):
    patches = tmp_path / "repo" / "patches"
    shutil.copytree(hashes.patches_dir(), patches)
    shutil.copytree(hashes.repo_root() / "remote_agent", tmp_path / "repo" / "remote_agent")
    spec = json.loads((patches / "deepseek_v2.eagle3-dump.json").read_text())
    spec["blocks"][0]["lines"].insert(1, "# an unreviewed extra line")
    (patches / "deepseek_v2.eagle3-dump.json").write_text(json.dumps(spec))
    monkeypatch.setenv("EAGLE3_PATCHES_DIR", str(patches))
    rep = _refused(capsys, target, "apply")
    assert "without a reviewed table update" in rep["check"]["reason"]
    # and a helper source edited after review
    spec["blocks"][0]["lines"].pop(1)
    (patches / "deepseek_v2.eagle3-dump.json").write_text(json.dumps(spec))
    hook = patches / "eagle3_dump" / "hook.py"
    hook.write_text(hook.read_text() + "\n# unreviewed\n")
    rep = _refused(capsys, target, "apply")
    assert "not the reviewed" in rep["check"]["reason"]


def test_missing_target_is_bad_input(tmp_path, capsys):
    assert main(["patch", "status", "--target", str(tmp_path / "nope.py")]) == 2


def test_runbook_guard_module(target):
    """The stdlib guard the runbook runs on the box: exit 0 pristine/patched, 1 otherwise."""
    env = {**os.environ, "PYTHONPATH": str(hashes.repo_root())}
    cmd = [
        sys.executable,
        "-m",
        "remote_agent.eagle3.patching.hashes",
        "check",
        str(target),
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "pristine"
    target.write_bytes(target.read_bytes() + b"\n")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and json.loads(proc.stdout)["state"] == "modified"


def test_fetch_pristine_checks_record_and_table(sglang_wheel, tmp_path, capsys):
    out = tmp_path / "cache" / "deepseek_v2.py"
    assert main(["patch", "fetch-pristine", "--out", str(out), "--wheel", str(sglang_wheel)]) == 0
    assert sha(out) == PRISTINE_SHA256


HELPER_SCRIPT = r"""
import sys, types, torch
sys.modules["remote_agent"] = None  # as inside SGLang: the helper must not need the project
sys.path.insert(0, sys.argv[1])
from sglang.srt.eagle3_dump import dump, reset

class Mode:
    def is_extend(self): return True
    def is_target_verify(self): return False
    def is_mixed(self): return False
    def is_idle(self): return False

model = types.SimpleNamespace(
    capture_aux_hidden_states=True,
    config=types.SimpleNamespace(hidden_size=4, num_hidden_layers=8, _name_or_path="stub"),
    model=types.SimpleNamespace(layers_to_capture=[2, 4, 5]),
    pp_group=types.SimpleNamespace(is_last_rank=True),
)
fb = types.SimpleNamespace(
    forward_mode=Mode(), rids=["dump-a", "warmup"], input_ids=torch.arange(7),
    extend_seq_lens_cpu=[3, 2], extend_prefix_lens_cpu=[0, 0],
)
dump(model, fb, torch.ones(7, 4), torch.ones(7, 12))
reset()
"""


def test_installed_helper_imports_as_sglang_srt_eagle3_dump(target, tmp_path, capsys):
    """The helper exactly as `apply` installs it, imported under its real name next to a stub
    sglang package (the stub: empty packages + get_parallel; the helper code is the real one)."""
    pytest.importorskip("torch")
    assert patch(capsys, "apply", "--target", target)[0] == 0
    site = target.parents[3]
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "runtime_context.py").write_text(
        "import types\n"
        "def get_parallel():\n"
        "    return types.SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, attn_dp_rank=0,"
        " attn_dp_size=1, dp_rank=None)\n"
        "def get_server_args():\n"
        "    return types.SimpleNamespace(dp_size=1, enable_dp_attention=False)\n"
    )
    dump_dir = tmp_path / "dump"
    env = {**os.environ, "EAGLE3_DUMP_DIR": str(dump_dir), "EAGLE3_DUMP_SYNC": "1",
           "EAGLE3_DUMP_MIN_FREE_MB": "0"}  # fmt: skip
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", HELPER_SCRIPT, str(site)],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from remote_agent.eagle3.dense import DumpReader

    reader = DumpReader(dump_dir)
    assert reader.ids() == ["a"] and reader.get("a")["input_ids"].tolist() == [0, 1, 2]
    assert reader.meta.extra["patched_sha256_expected"] == PATCHED_SHA256
    # the flag block: set (non-empty) EAGLE3_DUMP_DIR enables, unset or empty disables
    spec = load_spec(hashes.patches_dir() / "deepseek_v2.eagle3-dump.json")
    flag_code = "\n".join(spec.blocks[0].lines)
    for value, expected in (("/x", True), ("", False), (None, False)):
        env_backup = os.environ.pop("EAGLE3_DUMP_DIR", None)
        try:
            if value is not None:
                os.environ["EAGLE3_DUMP_DIR"] = value
            scope: dict = {}
            exec(flag_code, scope)
            assert scope["_EAGLE3_DUMP"] is expected
        finally:
            os.environ.pop("EAGLE3_DUMP_DIR", None)
            if env_backup is not None:
                os.environ["EAGLE3_DUMP_DIR"] = env_backup
