"""Issue 15, item 11: grey-on-black text has >= 4.5:1 contrast (WCAG AA). Every cell the
cockpit's main screen draws (the header, the todo list with its cursor row, the detail, the
resources) is measured against its cell's background, as Textual renders it."""

from __future__ import annotations

from textual.color import Color
from textual.geometry import Region

from .helpers import opened, status, wait_for

BOX, BOX_END = 0x2500, 0x259F  # box drawing and blocks: borders and bars, not text


def luminance(c: Color) -> float:
    def ch(v: int) -> float:
        x = v / 255
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4

    return 0.2126 * ch(c.r) + 0.7152 * ch(c.g) + 0.0722 * ch(c.b)


def contrast(a: Color, b: Color) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


async def test_text_contrast_on_the_main_screen(env):
    app = env.app()
    async with app.run_test(size=(160, 50)) as pilot:
        await opened(pilot)
        await wait_for(pilot, lambda: "connected" in str(app.main.query_one("#header").render()))
        for sid, end in (("ok", "succeeded"), ("flaky", "failed")):  # rows in colour
            app.main.select(sid)
            await pilot.press("r")
            await wait_for(pilot, lambda sid=sid, end=end: status(app, sid) == end, what=sid)
        app.main.select("needs-input")  # the cursor on a pending (dim) row
        await pilot.pause(0.2)
        worst: list[tuple[float, str, str]] = []
        checked = 0
        for widget in app.main.query("RunHeader, TodoList, StepDetail, ResourcesPanel"):
            region = Region(0, 0, widget.size.width, widget.size.height)
            for strip in widget.render_lines(region):
                for seg in strip:
                    style = seg.style
                    text = "".join(c for c in seg.text if not BOX <= ord(c) <= BOX_END).strip()
                    if not text or style is None or style.color is None:
                        continue
                    if style.bgcolor is None or style.reverse:
                        continue
                    assert not style.dim, f"dim left to the terminal: {seg.text!r}"
                    fg = Color.from_rich_color(style.color)
                    bg = Color.from_rich_color(style.bgcolor)
                    checked += 1
                    ratio = contrast(fg, bg)
                    if ratio < 4.5:
                        where = type(widget).__name__
                        worst.append((round(ratio, 2), text[:20], where, fg.hex, bg.hex))
        assert checked > 20
        assert not worst, sorted(worst)[:10]
