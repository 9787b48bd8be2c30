"""What each supported SGLang release can do, as read from its wheel (tests pin these facts).

0.5.14 (the release pinned to torch 2.11, and by SpecForge 0.2.0) has no capture-only flags:
no `--enable-return-aux-hidden-states`, no `--return-aux-hidden-state-layer-ids`. Its aux hidden
states are captured only when a real EAGLE3 drafter is loaded (layer ids from the drafter's
`eagle_config`). So `sglang-launch extract` (capture without a drafter) needs 0.5.23; serving
(`sglang-launch serve`) uses flags both releases have.
"""

from __future__ import annotations

from importlib import metadata

from remote_agent.eagle3.errors import BadInput

CAPTURE_ONLY_FLAGS = ("--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids")
WITHOUT_CAPTURE_ONLY = frozenset({"0.5.14"})


def installed_version() -> str | None:
    """The installed sglang's version from its dist-info (sglang itself is never imported)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def check_extract_supported(version: str | None) -> None:
    if version in WITHOUT_CAPTURE_ONLY:
        raise BadInput(
            f"sglang {version} has no {' / '.join(CAPTURE_ONLY_FLAGS)}: it cannot capture aux "
            "hidden states without a drafter, so extraction through the server needs sglang "
            "0.5.23 (serving with `sglang-launch serve` works on both)"
        )
