"""The eagle-tui remote agent: runs on the GPU box, standard library only (Python >= 3.10).

`python -m remote_agent serve` speaks JSON lines on stdin/stdout (see PROTOCOL.md): detached
jobs supervised by a per-job `jobwrap` process, byte-offset log cursors, probes, disk/GPU stats.
Three tenants ship together to the box as one zipapp: the agent core (`agent/`), the wire
contracts the engine imports too (`wire/`), both standard library only, and the ML payload its
jobs run (`eagle3/`, `python -m remote_agent.eagle3 ...`).
"""

import os

__version__ = "0.1.0"


def package_parent() -> str:
    """Where this package was loaded from: its parent directory (a checkout, site-packages) or
    the zipapp archive (`agent.pyz/remote_agent/...`), what a child interpreter needs on its
    path to import it (zipimport serves `-m remote_agent` from either)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
