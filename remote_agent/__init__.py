"""The eagle-tui remote agent: runs on the GPU box, standard library only (Python >= 3.10).

`python -m remote_agent serve` speaks JSON lines on stdin/stdout (see PROTOCOL.md): detached
jobs supervised by a per-job `jobwrap` process, byte-offset log cursors, probes, disk/GPU stats.
Nothing here may import a third-party package: the package ships to the box as one zipapp.
"""

__version__ = "0.1.0"
