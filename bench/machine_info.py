"""The machine a benchmark ran on, recorded next to its figures, and how a result is saved
(stdlib only: the GPU box runs these scripts without the project's dependencies)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def _first(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def describe(**extra: Any) -> dict[str, Any]:
    """CPU model and count, RAM, load at the start, Python and OS, plus what the caller adds."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cpus": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory": _first("/proc/meminfo", "MemTotal"),
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    info.update(extra)
    return info


def disk_write_gbps(root: Path, nbytes: int = 1 << 30) -> float:
    """Sequential write + fsync of `nbytes` into `root`, GB/s: the disk a dump lands on."""
    import time

    path = Path(root) / "disk-write-probe.bin"
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    try:
        with open(path, "wb") as f:
            for _ in range(max(1, nbytes >> 20)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)
    return max(1, nbytes >> 20) * (1 << 20) / seconds / 1e9


def portable(value: Any) -> Any:
    """Paths under the checkout become repo-relative and the home directory `~`, also inside
    messages (a child's traceback), so a result or log names no particular machine's layout."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, str):
        repo = str(Path(__file__).resolve().parents[1])
        if value == repo:
            return "."
        return value.replace(repo + "/", "").replace(str(Path.home()) + "/", "~/")
    return value


def save_result(path: Path, result: dict[str, Any]) -> None:
    """Every benchmark's JSON result, written the same way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(result), indent=1, default=str) + "\n")
