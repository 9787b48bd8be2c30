"""GPU facts from nvidia-smi (present wherever the NVIDIA driver is); a clear error otherwise."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

NO_GPU = "no GPU: nvidia-smi not found"
QUERY_TIMEOUT_S = 10.0


class GpuError(Exception):
    pass


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _query(args: list[str], timeout_s: float) -> list[list[str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise GpuError(NO_GPU)
    try:
        p = subprocess.run(
            [exe, *args, "--format=csv,noheader,nounits"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GpuError(f"nvidia-smi timed out after {timeout_s:g}s") from None
    except OSError as e:
        raise GpuError(f"nvidia-smi failed to run: {e}") from None
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
        raise GpuError(f"nvidia-smi exited {p.returncode}: {msg[-1] if msg else ''}".strip())
    rows = []
    for line in p.stdout.decode(errors="replace").splitlines():
        if line.strip():
            rows.append([c.strip() for c in line.split(",")])
    return rows


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def gpus(timeout_s: float = QUERY_TIMEOUT_S) -> list[dict[str, Any]]:
    """One dict per GPU: index, uuid, name, util (%), mem_used_mib, mem_total_mib."""
    rows = _query(
        ["--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total"], timeout_s
    )
    out = []
    for r in rows:
        if len(r) < 6:
            raise GpuError(f"unexpected nvidia-smi output: {','.join(r)!r}")
        # The name may contain commas: it is everything between uuid and the last three fields.
        name = ",".join(r[2:-3])
        out.append(
            {
                "index": _int(_num(r[0])),
                "uuid": r[1],
                "name": name,
                "util": _num(r[-3]),
                "mem_used_mib": _num(r[-2]),
                "mem_total_mib": _num(r[-1]),
            }
        )
    return out


def compute_apps(timeout_s: float = QUERY_TIMEOUT_S) -> list[dict[str, Any]]:
    """Processes holding a CUDA context: pid, gpu_uuid, used_memory_mib, process name."""
    rows = _query(["--query-compute-apps=pid,gpu_uuid,used_memory,process_name"], timeout_s)
    out = []
    for r in rows:
        if len(r) < 3:
            continue
        out.append(
            {
                "pid": _int(_num(r[0])),
                "gpu_uuid": r[1],
                "used_memory_mib": _num(r[2]),
                "process_name": ",".join(r[3:]) if len(r) > 3 else None,
            }
        )
    return out
