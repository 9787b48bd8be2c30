"""The one boundary between text the product did not write (job output, guard output, values,
titles, anything from the box) and the places that text is shown or recorded.

- `terminal(text)`: for a terminal or a widget. Every character that can drive a terminal or
  reorder what is read is replaced by its visible escape: C0 controls (but tab), DEL, C1
  controls (U+0080-U+009F, e.g. the 8-bit CSI U+009B), bidi controls, zero-width characters,
  line/paragraph separators and undecodable bytes (lone surrogates from `surrogateescape`).
  ESC becomes the four characters `\\x1b`, so no CSI/OSC/DCS/APC/PM/SOS sequence can start,
  and a sequence split across chunks is harmless: the mapping is per character, stateless.
  Nothing is dropped, so what a job printed can still be read (`\\x1b[2J`).
- `log_line(line)`: one line of job output for display: a carriage return restarts the line
  (progress bars), then `terminal`.
- `md(text)`: inline Markdown that is data: no heading, row, list item, quote, code, link,
  emphasis, HTML or entity can start inside it (CommonMark + GFM tables/autolinks).
- `md_code(text)`: a code span holding any text (a fence longer than its longest backquote run).
- `csv_cell(value)`: a spreadsheet cell that is data: no formula, one physical line.
"""

from __future__ import annotations

import re
from typing import Any

BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u180e"
SEPARATORS = "\u2028\u2029\u0085"
_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\x1b"}


def _visible(ch: str) -> str:
    o = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


_UNSAFE = [chr(c) for c in range(0x20) if c != 0x09] + [chr(c) for c in range(0x7F, 0xA0)]
_UNSAFE += list(BIDI + ZERO_WIDTH + SEPARATORS) + [chr(c) for c in range(0xD800, 0xE000)]
_UNSAFE += ["\ufff9", "\ufffa", "\ufffb"]  # interlinear annotation controls
TERMINAL_TABLE = {ord(ch): _visible(ch) for ch in _UNSAFE}


def terminal(text: str) -> str:
    """`text` with nothing a terminal would act on: see the module docstring."""
    return text.translate(TERMINAL_TABLE)


def terminal_bytes(data: bytes) -> str:
    """Raw bytes from the box (invalid UTF-8 shown as `\\xNN`), safe for a terminal."""
    return terminal(data.decode("utf-8", "surrogateescape"))


def log_line(line: str) -> str:
    """One line of job output as shown: after the last carriage return (terminal semantics for
    progress bars, a lone trailing one ignored), then escaped."""
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return terminal(line)


def has_unsafe(text: str) -> bool:
    return any(ord(ch) in TERMINAL_TABLE for ch in text)


# ------------------------------------------------------------------ Markdown
# always significant inline: escape, code, emphasis, links/images, HTML/autolinks, table cells,
# strikethrough; `_` only where it can open or close emphasis (not inside a word: snake_case
# stays readable); `&` only where it would start an entity
_MD_INLINE = re.compile(r"([\\`*\[\]<|~])|(?<![A-Za-z0-9])(_)|(_)(?![A-Za-z0-9])|(&)(?=#?\w+;)")
# what starts a block at the start of a line: heading, quote, list item (`-`/`+` then a space,
# `1.`/`1)` then a space), thematic break or setext underline (`---`, `===`)
_MD_BLOCK_START = re.compile(r"^([#>]|([-+=])(?=[ \t]|$|\2)|\d{1,9}(?=[.)](?:[ \t]|$)))")
_AUTOLINK = re.compile(r"(?i)(\w)(:)(?=//)|\b(www)(\.)")


def md(value: Any) -> str:
    """`value` as inline Markdown text that renders as itself and starts no block."""
    text = "" if value is None else str(value)
    text = _MD_INLINE.sub(lambda m: "\\" + next(g for g in m.groups() if g), text)
    text = _AUTOLINK.sub(lambda m: f"{m[1] or m[3]}\\{m[2] or m[4]}", text)
    text = terminal(text)  # newlines and controls become visible `\n`, `\x1b`
    m = _MD_BLOCK_START.match(text)
    if m:  # `- x`, `+ x`, `1. x`, `===` (setext): escaped where a line could start
        text = (m[1] + "\\" + text[len(m[1]) :]) if m[1][0].isdigit() else "\\" + text
    stripped = text.lstrip(" ")
    if len(stripped) != len(text):  # leading spaces would indent it into a code block
        text = "&#32;" * (len(text) - len(stripped)) + stripped
    return text


def md_code(value: Any) -> str:
    """`value` as a code span (ids, hashes, paths): backquotes inside cannot close it, `|`
    cannot split a table cell."""
    text = terminal("" if value is None else str(value)).replace("|", "\\|")
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# ------------------------------------------------------------------ CSV
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "|", "%")


def csv_cell(value: Any) -> Any:
    """A CSV cell read as data by spreadsheets (OWASP CSV injection): a text starting like a
    formula is prefixed with `'`; controls (newlines too) are shown escaped. Numbers pass."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    if text.startswith(FORMULA_START):
        text = "'" + text
    return terminal(text)
