"""Markup whose user-supplied parts are shown literally.

Escaping (rich's or Textual's) does not round-trip every string through Textual 8's markup parser
(`\\[b]`, `[$x]`), and a string that fails to parse crashes the widget. Values passed here are
substituted as Textual markup variables (`$name`), which are never parsed."""

from __future__ import annotations

from textual.content import Content

NL = Content("\n")


def markup(template: str, **values: object) -> Content:
    """`template` is trusted markup (ours); every `$name` in it is replaced by str(value), literally.
    A literal dollar sign in the template is written `$$`."""
    return Content.from_markup(template, **{k: str(v) for k, v in values.items()})


def lines(parts: list[Content]) -> Content:
    return NL.join(parts)
