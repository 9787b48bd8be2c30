"""Hook for the SSH transport's host-key refusals (issue 3).

The SSH transport refuses an unknown host with a TransportError whose message carries the key's
fingerprint and the flag that trusts it (`--trust-host SHA256:...`). The TUI asks the operator
instead; on "trust" it adds the fingerprint to the CLI options the transport factory reads
(`args.trust_host`, as if `--trust-host` had been given), drops the refused session and connects
again. A *changed* key is never offered for trust: both fingerprints are shown as an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")
_UNKNOWN_HINTS = (
    "unknown host",
    "not in known_hosts",
    "not known",
    "--trust-host",
    "unknown key",
    "host key is not trusted",
)
_CHANGED_HINTS = ("changed", "mismatch", "does not match", "man-in-the-middle")


@dataclass(frozen=True)
class UnknownHostKey:
    fingerprint: str
    message: str


def unknown_host_key(message: str) -> UnknownHostKey | None:
    """The fingerprint to offer for trust, when `message` is an unknown-host refusal."""
    low = message.lower()
    if any(h in low for h in _CHANGED_HINTS):
        return None
    found = FINGERPRINT_RE.findall(message)
    if len(found) != 1 or not any(h in low for h in _UNKNOWN_HINTS):
        return None
    return UnknownHostKey(found[0], message)
