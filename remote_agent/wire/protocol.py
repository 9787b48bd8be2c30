"""Wire format, protocol version 1: one JSON object per line in each direction.

Requests `{"id", "op", "args"}`; responses `{"id", "ok": true, "result"}` or
`{"id", "ok": false, "error": {"type", "message"}}`; unsolicited events `{"event": name, ...}`.
Log bytes travel as text decoded with surrogateescape and JSON-encoded with ensure_ascii, so the
client recovers the exact bytes with `text.encode("utf-8", "surrogateescape")`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

PROTOCOL_VERSION = 1
MAX_LINE = 16 * 1024 * 1024  # a request line longer than this is refused, not buffered


class AgentError(Exception):
    """An error answered to the client as `{"type", "message"}`; never a traceback. The client
    raises the same class from an error answer (runbook/agent_client.py)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message}


def bad(message: str) -> AgentError:
    return AgentError("bad_request", message)


@dataclass(frozen=True)
class Request:
    id: int
    op: str
    args: dict[str, Any]


class RequestError(Exception):
    """A line that cannot be served; `id` is the request's id when it could be read."""

    def __init__(self, id_: int | None, error: AgentError) -> None:
        super().__init__(error.message)
        self.id = id_
        self.error = error


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_request(line: bytes) -> Request:
    """Parse one request line; raise RequestError (never anything else) when it is malformed."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            None, bad(f"request is not UTF-8: {e.reason} at byte {e.start}")
        ) from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        # RecursionError: deeply nested arrays; ValueError covers JSONDecodeError and huge ints.
        raise RequestError(None, bad(f"request is not JSON: {str(e)[:200]}")) from None
    if not isinstance(obj, dict):
        raise RequestError(None, bad(f"request must be a JSON object, got {type(obj).__name__}"))
    rid = obj.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise RequestError(None, bad("request needs an integer 'id'"))
    op = obj.get("op")
    if not isinstance(op, str) or not op:
        raise RequestError(rid, bad("request needs a string 'op'"))
    args = obj.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RequestError(rid, bad("'args' must be a JSON object"))
    extra = set(obj) - {"id", "op", "args"}
    if extra:
        raise RequestError(rid, bad(f"unknown request keys: {sorted(extra)}"))
    return Request(rid, op, args)


def _clean(obj: Any) -> Any:
    """Replace non-finite floats by None: NaN/Infinity are not JSON for strict clients."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def encode(obj: dict[str, Any]) -> bytes:
    """One protocol line (ASCII only, so surrogate-escaped bytes survive any transport)."""
    try:
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_clean(obj), ensure_ascii=True, separators=(",", ":"))
    return text.encode("ascii") + b"\n"


def ok_response(rid: int, result: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "ok": True, "result": result}


def error_response(rid: int | None, error: AgentError) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": error.to_json()}


def bytes_to_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def text_to_bytes(text: str) -> bytes:
    """The client's inverse of bytes_to_text: the exact log bytes back."""
    return text.encode("utf-8", "surrogateescape")


# --- argument readers: each raises bad_request naming the argument ---------------------------

_MISSING: Any = object()


def _given(args: dict[str, Any], key: str, default: Any) -> Any:
    """args[key], else `default`; a required argument (no default) that is absent is refused."""
    v = args.get(key, default)
    if v is _MISSING:
        raise bad(f"args.{key} is required")
    return v


def arg_str(
    args: dict[str, Any], key: str, default: Any = _MISSING, *, nullable: bool = False
) -> Any:
    v = _given(args, key, default)
    if v is None and (nullable or default is None):
        return None
    if not isinstance(v, str):
        raise bad(f"args.{key} must be a string")
    if "\x00" in v:
        raise bad(f"args.{key} must not contain NUL")
    return v


def arg_int(
    args: dict[str, Any], key: str, default: Any = _MISSING, *, minimum: int | None = 0
) -> Any:
    v = _given(args, key, default)
    if v is None and default is None:
        return None
    if not _is_int(v):
        raise bad(f"args.{key} must be an integer")
    if minimum is not None and v < minimum:
        raise bad(f"args.{key} must be >= {minimum}")
    return v


def arg_float(
    args: dict[str, Any], key: str, default: Any = _MISSING, *, positive: bool = True
) -> Any:
    v = _given(args, key, default)
    if v is None and default is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise bad(f"args.{key} must be a number")
    if positive and v <= 0:
        raise bad(f"args.{key} must be > 0")
    if v < 0:
        raise bad(f"args.{key} must be >= 0")
    return float(v)


def arg_bool(args: dict[str, Any], key: str, default: bool) -> bool:
    v = args.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"args.{key} must be true or false")
    return v


def arg_str_list(args: dict[str, Any], key: str, *, nullable: bool = False) -> Any:
    v = args.get(key)
    if v is None:
        if nullable:
            return None
        raise bad(f"args.{key} is required")
    if not isinstance(v, list) or not all(isinstance(x, str) and "\x00" not in x for x in v):
        raise bad(f"args.{key} must be a list of strings without NUL")
    return v


def arg_env(args: dict[str, Any], key: str) -> dict[str, str]:
    v = args.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad(f"args.{key} must be an object of strings")
    for k, val in v.items():
        if not k or "=" in k or "\x00" in k:
            raise bad(f"args.{key}: invalid variable name {k!r}")
        if not isinstance(val, str) or "\x00" in val:
            # The message names the variable only: values of secret_env must never be echoed.
            raise bad(f"args.{key}.{k} must be a string without NUL")
    return dict(v)
