"""`eagle3 patch` on the installs seen in practice: an editable/source checkout (found through
the import system), a read-only site-packages (a clean refusal), a file owned by another user
(mode and owner kept). All on the real deepseek_v2.py from the 0.5.23 wheel."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
from patch_fixtures import PATCHED_SHA256, make_site

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.patching import hashes


def test_an_editable_source_checkout_is_found_through_the_import_system(
    sglang_wheel, tmp_path, monkeypatch
):
    # SGLang's own images: `pip install -e python/` -> the package lives in the checkout, the
    # dist-info elsewhere points at it; the import system is what knows where
    src = tmp_path / "sglang-checkout" / "python"
    target = make_site(sglang_wheel, src)
    (src / "sglang" / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    site = tmp_path / "site-packages"  # where pip put the (editable) dist-info
    site.mkdir()
    for info in src.glob("sglang-*.dist-info"):
        info.rename(site / info.name)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(src))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    assert hashes.default_target() == target
    assert "sglang" not in sys.modules  # located, not imported (no CUDA init)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a read-only bind mount")
def test_a_read_only_site_packages_is_a_clean_refusal(sglang_wheel, tmp_path):
    site = tmp_path / "site"
    target = make_site(sglang_wheel, site)
    before = target.read_bytes()
    subprocess.run(["mount", "--bind", str(site), str(site)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(site)], check=True)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "remote_agent.eagle3",
                "patch",
                "apply",
                "--target",
                str(target),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        subprocess.run(["umount", str(site)], check=True)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "cannot apply the patch" in out.stderr
    assert "Read-only file system" in out.stderr
    assert target.read_bytes() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_the_patched_file_keeps_mode_and_owner(sglang_wheel, tmp_path, capsys):
    target = make_site(sglang_wheel, tmp_path / "site")
    os.chown(target, 4242, 4343)
    os.chmod(target, 0o640)
    assert main(["patch", "apply", "--target", str(target), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["action"] == "applied"
    st = target.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4242, 4343, 0o640)
    import hashlib

    assert hashlib.sha256(target.read_bytes()).hexdigest() == PATCHED_SHA256
    assert main(["patch", "revert", "--target", str(target), "--json"]) == 0
    st = target.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4242, 4343, 0o640)
