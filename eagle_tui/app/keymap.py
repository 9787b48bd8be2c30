"""User keymaps: override any action's keys by its binding id.

The file is `$EAGLE_TUI_KEYMAP`, else `$XDG_CONFIG_HOME/eagle-tui/keymap.toml` (or `.json`;
`~/.config` when XDG_CONFIG_HOME is unset). Either form maps binding ids to comma-separated keys:

    # keymap.toml                      // keymap.json
    run-selected = "enter,r"           {"run-selected": "enter,r", "quit": "ctrl+q"}
    quit = "ctrl+q"

A `[keymap]` table (TOML) or `{"keymap": {...}}` (JSON) is accepted too. Key names are Textual's
(`textual keys` shows what your terminal sends). Unknown ids are reported, not fatal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

try:
    import tomllib  # pyright: ignore[reportMissingImports] (3.11+; 3.10 is checked)
except ImportError:  # Python 3.10: JSON keymaps only
    tomllib = None  # type: ignore[assignment]


class KeymapError(Exception):
    pass


def default_keymap_paths() -> list[Path]:
    env = os.environ.get("EAGLE_TUI_KEYMAP")
    if env:
        return [Path(env)]
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "eagle-tui"
    return [base / "keymap.toml", base / "keymap.json"]


def parse_keymap(text: str, suffix: str) -> dict[str, str]:
    if suffix == ".json":
        data = json.loads(text)
    else:
        if tomllib is None:
            raise KeymapError("TOML keymaps need Python 3.11+; use keymap.json")
        data = tomllib.loads(text)
    if isinstance(data, dict) and isinstance(data.get("keymap"), dict):
        data = data["keymap"]
    if not isinstance(data, dict):
        raise KeymapError("a keymap maps binding ids to keys")
    out = {}
    for k, v in data.items():
        if isinstance(v, list):
            v = ",".join(str(x) for x in v)
        if not isinstance(v, str) or not v.strip():
            raise KeymapError(f'{k}: keys must be a string like "ctrl+r,r"')
        out[str(k)] = v.replace(" ", "")
    return out


def load_keymap(
    known_ids: set[str], paths: list[Path] | None = None
) -> tuple[dict[str, str], list[str]]:
    """(keymap, problems) from the first keymap file that exists; no file is no keymap."""
    for path in paths if paths is not None else default_keymap_paths():
        if not path.is_file():
            continue
        try:
            keymap = parse_keymap(path.read_text(), path.suffix.lower())
        except (OSError, ValueError, KeymapError) as exc:
            return {}, [f"{path}: {exc}"]
        unknown = sorted(set(keymap) - known_ids)
        problems = [
            f"{path}: unknown binding id {u!r} (known: {', '.join(sorted(known_ids))})"
            for u in unknown
        ]
        return {k: v for k, v in keymap.items() if k in known_ids}, problems
    return {}, []
