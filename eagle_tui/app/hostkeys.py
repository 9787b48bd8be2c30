"""Hook for the SSH transport's host-key refusals (issue 3, runbook/transports/hostkeys.py).

The SSH transport refuses an unknown host with a permanent TransportError (`HostKeyUnknown`,
with a `fingerprint` attribute; its message names the key and the `--trust-host` flag). The TUI
asks the operator instead; on "trust" it adds the fingerprint to the CLI options the transport
factory reads (`args.trust_host`, as if `--trust-host` had been given), drops the refused
session and connects again; the transport then records the key in known_hosts. A *changed*
key (`HostKeyChanged`) is never offered for trust: the error is shown with both fingerprints.

Only the message reaches the app through ConnectionChanged events, so both forms are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")
_UNKNOWN_HINTS = ("unknown host key", "not in known_hosts", "--trust-host")
_CHANGED_HINTS = ("changed", "mismatch", "does not match", "man-in-the-middle")


@dataclass(frozen=True)
class UnknownHostKey:
    fingerprint: str
    message: str


def unknown_host_key(refusal: BaseException | str) -> UnknownHostKey | None:
    """The fingerprint to offer for trust, when `refusal` is an unknown-host refusal."""
    message = str(refusal)
    if isinstance(refusal, BaseException):
        fp = getattr(refusal, "fingerprint", None)
        if isinstance(fp, str) and type(refusal).__name__ == "HostKeyUnknown":
            return UnknownHostKey(fp, message)
    low = message.lower()
    if any(h in low for h in _CHANGED_HINTS):
        return None
    found = sorted(set(FINGERPRINT_RE.findall(message)))
    if len(found) != 1 or not any(h in low for h in _UNKNOWN_HINTS):
        return None
    return UnknownHostKey(found[0], message)
