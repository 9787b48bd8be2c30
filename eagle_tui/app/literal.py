"""Markup whose user-supplied parts are shown literally.

Every value also goes through runbook/escape.terminal (the one terminal sanitizer): values quote
job output and the box, and a control sequence or bidi character in one must not reach the screen.

Escaping (rich's or Textual's) does not round-trip every string through Textual 8's markup parser
(`\\[b]`, `[$x]`), and a string that fails to parse crashes the widget. Values passed here are
substituted as Textual markup variables (`$name`), which are never parsed."""

from __future__ import annotations

from textual.content import Content

from runbook.escape import terminal

NL = Content("\n")


def markup(template: str, **values: object) -> Content:
    """`template` is trusted markup (ours); every `$name` in it is replaced by str(value), literally.
    A literal dollar sign in the template is written `$$`."""
    return Content.from_markup(template, **{k: _shown(str(v)) for k, v in values.items()})


def _shown(text: str) -> str:
    """Escaped for the screen; a newline stays a line break (a multi-line command reads as
    one), every other control is shown as its escape."""
    return "\n".join(terminal(line) for line in text.split("\n"))


def lines(parts: list[Content]) -> Content:
    return NL.join(parts)
