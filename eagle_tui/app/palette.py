"""Colours with >= 4.5:1 contrast (WCAG AA) on the cockpit's dark backgrounds.

Rich styles name ANSI colours ("red", "green"); Textual turns them into RGB with an ANSI theme.
Its default (Monokai) red is #F4005F: 3.6:1 on a zebra row. This theme keeps Monokai and only
lightens the colours that fall short. tests/tui/test_contrast.py measures every drawn cell."""

from __future__ import annotations

from rich.terminal_theme import TerminalTheme

_RED, _BLUE, _MAGENTA = (255, 123, 114), (121, 192, 255), (210, 168, 255)

READABLE_DARK = TerminalTheme(
    (12, 12, 12),
    (217, 217, 217),
    [
        (26, 26, 26),
        _RED,
        (152, 224, 36),
        (253, 151, 31),
        _BLUE,
        _MAGENTA,
        (88, 209, 235),
        (196, 197, 181),
    ],
    [
        (98, 94, 76),
        _RED,
        (152, 224, 36),
        (224, 213, 97),
        _BLUE,
        _MAGENTA,
        (88, 209, 235),
        (246, 246, 239),
    ],
)
