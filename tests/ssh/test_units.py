"""The SSH transport's pieces that need no sshd: the zipapp, targets, quoting, host-key trust."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import asyncssh
import pytest

from runbook.schema import HostConfig
from runbook.transports import HostKeyRefusal, TransportError, TransportOptions
from runbook.transports.bundle import EPOCH, build, build_bytes
from runbook.transports.factory import make_transport_factory
from runbook.transports.hostkeys import (
    HostKeyChanged,
    HostKeyUnknown,
    KnownHosts,
    VerifyingClient,
    fingerprint,
)
from runbook.transports.local import LocalTransport
from runbook.transports.ssh import SshTransport, parse_target, remote_path, sh
from tests.support.paths import REPO


# ---------------------------------------------------------------------- the zipapp
def _copy_sources(dest: Path) -> Path:
    """A frozen copy of what ships (the checkout may be edited while tests run)."""
    shutil.copytree(REPO / "remote_agent", dest / "remote_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(REPO / "patches", dest / "patches")
    return dest


def test_bundle_is_reproducible_and_complete(tmp_path):
    src = _copy_sources(tmp_path / "src")
    a, b = build(tmp_path / "c1", src), build(tmp_path / "c2", src)
    assert a.path.read_bytes() == b.path.read_bytes() and a.digest == b.digest
    assert a.digest == hashlib.sha256(a.path.read_bytes()).hexdigest()[:16]
    with zipfile.ZipFile(a.path) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    assert names[0] == "__main__.py" and names[1:] == sorted(names[1:])
    assert "remote_agent/agent/server.py" in names and "remote_agent/eagle3/progress.py" in names
    assert "patches/sglang-hashes.json" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert {i.date_time for i in infos} == {EPOCH}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}


def test_bundle_hash_follows_content(tmp_path):
    src = _copy_sources(tmp_path / "src")
    before = build_bytes(src)
    (src / "remote_agent" / "eagle3" / "progress.py").write_text("# changed\n", "utf-8")
    changed = build_bytes(src)
    assert changed != before
    (src / "remote_agent" / "eagle3" / "__pycache__").mkdir(exist_ok=True)
    (src / "remote_agent" / "eagle3" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    assert build_bytes(src) == changed  # caches do not ship


def test_bundle_runs_the_agent_and_the_payload(tmp_path):
    pyz = build(tmp_path).path
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing to lean on but the archive
    out = subprocess.run(
        [sys.executable, str(pyz), "--version"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("remote_agent ")
    code = "import remote_agent.eagle3.progress as p; print(p.PREFIX.strip())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(pyz)),
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout.strip() == "@@eagle3"


# ---------------------------------------------------------------------- targets and quoting
@pytest.mark.parametrize(
    "text, want",
    [
        ("box", (None, "box", None)),
        ("root@box", ("root", "box", None)),
        ("me@10.0.0.5:2222", ("me", "10.0.0.5", 2222)),
        ("[::1]:2200", (None, "::1", 2200)),
        ("u@[fe80::1]", ("u", "fe80::1", None)),
        ("a@b@host:22", ("a@b", "host", 22)),
    ],
)
def test_parse_target(text, want):
    assert parse_target(text) == want


@pytest.mark.parametrize("bad", ["", "host:abc", "host:0", "host:70000", "user@"])
def test_parse_target_rejects(bad):
    with pytest.raises(TransportError) as err:
        parse_target(bad)
    assert err.value.permanent


@pytest.mark.parametrize(
    "path",
    ["/usr/bin/python3", "~/venv/bin/python", "~", "/tmp/a b/$(touch x)`y`;'\"\nz", "~/x;y"],
)
def test_remote_path_reaches_the_shell_as_one_word(path, tmp_path):
    home = tmp_path / "home"
    got = subprocess.run(
        ["sh", "-c", sh(f"printf %s {remote_path(path)}")],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    want = str(home) + path[1:] if path.startswith("~") else path
    assert got == want
    assert list(tmp_path.iterdir()) == []  # nothing ran


# ---------------------------------------------------------------------- host keys
def _key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519").convert_to_public()


def test_known_hosts_entries(tmp_path):
    kh = KnownHosts(tmp_path / "dir" / "known_hosts")
    k22, k2222 = _key(), _key()
    assert kh.keys_for("box.example", "10.0.0.1", 22) == []
    kh.add("box.example", 22, k22)
    kh.add("10.0.0.1", 2222, k2222)
    lines = kh.path.read_text().splitlines()
    assert lines[0].startswith("box.example ssh-ed25519 ")
    assert lines[1].startswith("[10.0.0.1]:2222 ssh-ed25519 ")
    assert kh.path.stat().st_mode & 0o777 == 0o600
    assert kh.path.parent.stat().st_mode & 0o777 == 0o700
    assert [fingerprint(k) for k in kh.keys_for("box.example", "", 22)] == [fingerprint(k22)]
    assert [fingerprint(k) for k in kh.keys_for("x", "10.0.0.1", 2222)] == [fingerprint(k2222)]
    kh.path.write_text(kh.path.read_text().rstrip("\n"))  # no final newline: we add one first
    kh.add("third", 22, _key())
    assert len(kh.path.read_text().splitlines()) == 3


def test_verifying_client_decisions(tmp_path):
    kh = KnownHosts(tmp_path / "known_hosts")
    key = _key()
    fp = fingerprint(key)
    trusted: list[str] = []
    client = VerifyingClient("gpu", kh, lambda: trusted)
    assert client.validate_host_public_key("h", "1.2.3.4", 2222, key) is False
    err = client.refusal
    assert isinstance(err, HostKeyUnknown) and err.permanent
    assert (err.host, err.port, err.fingerprint) == ("h", 2222, fp)
    assert f"--trust-host {fp}" in str(err)
    assert err.host_key == HostKeyRefusal("unknown", "[h]:2222", fp, key.get_algorithm())

    trusted.append(fp)
    client = VerifyingClient("gpu", kh, lambda: trusted)
    assert client.validate_host_public_key("h", "1.2.3.4", 2222, key) is True
    assert client.recorded == fp and kh.path.read_text().startswith("[h]:2222 ")

    other = _key()
    trusted.append(fingerprint(other))  # trusting does not override a changed key
    client = VerifyingClient("gpu", kh, lambda: trusted)
    assert client.validate_host_public_key("h", "1.2.3.4", 2222, other) is False
    err = client.refusal
    assert isinstance(err, HostKeyChanged) and err.permanent
    assert fp in str(err) and fingerprint(other) in str(err) and "ssh-keygen -R" in str(err)
    assert err.host_key == HostKeyRefusal(
        "changed", "[h]:2222", fingerprint(other), other.get_algorithm(), (fp,)
    )


# ---------------------------------------------------------------------- the factory
def test_factory_resolves_hosts_config(tmp_path):
    opts = TransportOptions(
        known_hosts=str(tmp_path / "kh"), ssh_config=str(tmp_path / "cfg"), trust_host=("SHA256:x",)
    )
    factory = make_transport_factory(tmp_path, opts)
    assert isinstance(factory("local"), LocalTransport)
    t = factory("gpu", HostConfig(ssh="me@box:2200", python="~/venv/bin/python", spool="/s"))
    assert isinstance(t, SshTransport)
    assert (t.name, t.target, t.python, t.spool) == (
        "gpu",
        "me@box:2200",
        "~/venv/bin/python",
        "/s",
    )
    assert t.endpoint.transport == "ssh" and t.endpoint.host == "gpu"
    assert t.known_hosts.path == tmp_path / "kh" and t.ssh_config == [str(tmp_path / "cfg")]
    raw = factory("root@10.1.2.3")
    assert (raw.target, raw.python, raw.spool) == ("root@10.1.2.3", "python3", None)
    raw.trust("SHA256:z")
    assert raw.trusted() == {"SHA256:x", "SHA256:z"}
    trusting = dataclasses.replace(factory, options=opts.trusting("SHA256:y"))  # a UI's trust
    assert trusting("root@10.1.2.3").trusted() == {"SHA256:x", "SHA256:y"}
    assert opts.trust_host == ("SHA256:x",)  # frozen: the old options are unchanged
