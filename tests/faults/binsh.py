"""Run a command with /bin/sh as dash (this box) or as bash (the RHEL family), for the attacks
of issue 25 that go through a shell: a mount namespace binds /bin/bash over /bin/sh for that
command and its children only (`unshare --mount`, root only)."""

from __future__ import annotations

import os
import subprocess

# what a `run:` string writes to say which shell ran it (`$$` escapes eagle-tui's `${...}`)
WHICH_SH = 'printf %s "$${BASH_VERSION:-dash}"'


def bash_as_sh(cmd: list[str]) -> list[str]:
    return ["unshare", "--mount", "sh", "-c", 'mount --bind /bin/bash /bin/sh && exec "$@"',
            "_", *cmd]  # fmt: skip


def can_bind_bash() -> bool:
    if os.geteuid() != 0:
        return False
    probe = bash_as_sh(["/bin/sh", "-c", 'test -n "$BASH_VERSION"'])
    return subprocess.run(probe, capture_output=True).returncode == 0


def ran_under(sh: str, said: str) -> bool:
    """`said` is what WHICH_SH wrote: dash prints `dash`, bash its version."""
    return (said == "dash") == (sh == "dash") and bool(said)
