"""Training curves as data: the series the plots draw, fed by MetricsUpdate events, and rebuilt
after a reattach by scanning the mirror log for `@@eagle3 {"kind":"metrics",...}` lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.logsplit import parse_record

MAX_POINTS = 2000  # per series; older points are thinned (every other one) beyond this


class Series:
    def __init__(self) -> None:
        self.x: list[float] = []
        self.y: list[float] = []

    def add(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > MAX_POINTS:  # keep the shape of a long run at bounded cost
            self.x[:] = self.x[::2]
            self.y[:] = self.y[::2]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if v == v else None  # NaN is skipped, not plotted


class Metrics:
    """loss, per-position accuracy (acc_k list, or a scalar acc) and simulated acceptance length."""

    def __init__(self) -> None:
        self.loss = Series()
        self.accept = Series()
        self.acc: dict[int, Series] = {}
        self.count = 0
        self.last: dict[str, Any] = {}
        self.skipped = 0  # steps the trainer skipped for a NaN/inf gradient, summed over the run

    def add(self, record: dict[str, Any]) -> None:
        x = _num(record.get("step"))
        x = float(self.count) if x is None else x
        self.count += 1
        self.last = record
        if (n := _num(record.get("skipped_nonfinite"))) is not None:
            self.skipped += int(n)
        if (v := _num(record.get("loss"))) is not None:
            self.loss.add(x, v)
        if (v := _num(record.get("sim_accept_len"))) is not None:
            self.accept.add(x, v)
        accs = record.get("acc_k", record.get("acc"))
        if not isinstance(accs, list):
            accs = [accs]
        for k, a in enumerate(accs):
            if (v := _num(a)) is not None:
                self.acc.setdefault(k, Series()).add(x, v)


_MARK = b"@@eagle3 "  # cheap pre-filter; parse_record decides


def scan_metrics(path: Path | str, end: int, block: int = 1 << 20) -> list[dict[str, Any]]:
    """Metrics records on complete lines of the file's first `end` bytes. A line still open at
    `end` is left out: the engine emits it as a MetricsUpdate once its newline arrives."""
    out: list[dict[str, Any]] = []
    try:
        f = open(path, "rb")
    except OSError:
        return out
    with f:
        remaining, partial = end, b""
        while remaining > 0:
            data = f.read(min(block, remaining))
            if not data:
                break
            remaining -= len(data)
            buf = partial + data
            cut = buf.rfind(b"\n") + 1
            partial = buf[cut:]
            if _MARK not in buf:  # the common case: plain log text, no need to split it
                continue
            for line in buf[:cut].split(b"\n"):
                if (
                    _MARK in line
                    and (rec := parse_record(line)) is not None
                    and rec["kind"] == "metrics"
                ):
                    out.append(rec)
    return out


class StepMetrics:
    """One attempt's curves: records scanned from the mirror's first `scan_end` bytes, then live
    MetricsUpdate events from beyond that point (earlier ones are in the scan already)."""

    def __init__(self, source: str | None, scan_end: int) -> None:
        self.source = source
        self.scan_end = scan_end
        self.metrics = Metrics()
        self.ready = scan_end == 0  # nothing to scan
        self._pending: list[dict[str, Any]] = []

    def add_live(self, record: dict[str, Any], mirror_end: int) -> bool:
        if mirror_end <= self.scan_end:
            return False
        if self.ready:
            self.metrics.add(record)
        else:
            self._pending.append(record)
        return True

    def scanned(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.metrics.add(r)
        for r in self._pending:
            self.metrics.add(r)
        self._pending.clear()
        self.ready = True
