"""Human units in runbooks: sizes (`500GiB`, `1.5 TB`, bytes) and durations (`90s`, `1h30m`, seconds)."""

from __future__ import annotations

import re

from pydantic import ByteSize, TypeAdapter, ValidationError

from remote_agent.wire.units import format_size as format_size  # one way, both sides

_BYTES = TypeAdapter(ByteSize)  # "500GiB" binary, "2TB" / "2k" decimal, case-insensitive
# ByteSize alone is lax (any Unicode digit, junk after the unit): the shape is checked first.
_SIZE_RE = re.compile(r"^\s*[0-9]+(?:\.[0-9]+)?\s*[a-zA-Z]*\s*$")
_DUR_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)")
_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(value: object) -> int:
    """Bytes from an int or a string like '500GiB' (binary) or '2TB' (decimal)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '500GiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError("a size cannot be negative")
        return int(value)
    if not isinstance(value, str):
        raise ValueError("a size must be a number of bytes or a string like '500GiB'")
    try:
        if not _SIZE_RE.match(value):
            raise ValueError
        return int(_BYTES.validate_python(value))
    except (ValueError, ValidationError):
        raise ValueError(f"cannot read size {value!r}; write e.g. 500GiB, 2TB or 1048576") from None


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like '90s', '1h30m', '2d'."""
    if isinstance(value, bool):
        raise ValueError("a duration must be seconds or a string like '90s' or '1h30m'")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("a duration must be seconds or a string like '90s' or '1h30m'")
    text = value.strip().replace(" ", "")
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"cannot read duration {value!r}; write e.g. 90s, 10m, 1h30m or 2d")
    return total


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"
