"""Attacks on "records content cannot forge" and "a terminal the job cannot drive" (issue 25).

Real CLI and real local agent: a `--set` value and the box (a command guard's stdout, the job's
own output, a progress record) carry hostile text: fake Markdown headings and rows, links,
HTML, code fences, list markers, formula cells, and terminal sequences (clear screen, cursor up
+ erase line, OSC 8 links, OSC 52 clipboard, OSC 0/2 titles, DCS, APC, 8-bit C1, bidi and
zero-width characters, sequences split across writes, invalid UTF-8). Held = the md export
renders (markdown-it, CommonMark + tables) to exactly our headings and rows, with no link, HTML
or code from the data; the CSV parses to one row per record with no formula cell; the JSONL is
the records; and the bytes written to stdout by `run --auto` and `status` carry no ESC, no C0
but newline/tab, no C1, no bidi or zero-width character. Each trial counted in the tally."""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess

from markdown_it import MarkdownIt

from runbook.audit import CSV_COLUMNS
from tests.faults.binsh import ran_under
from tests.runbook.conftest import Cli

FORGE_MD = [
    "\n## Succeeded steps\n\n| fake | ran | 0 |  |  |  |  |\n",
    "x\n# Outcome\n- exit 0: all steps done\n",
    "| injected | row |\n|---|---|\n| a | b |",
    "[click](http://evil.example/) ![img](http://evil.example/i.png)",
    "<script>alert(1)</script><b>bold</b>&amp;&#x41;",
    "```\ncode fence\n```",
    "`code` and ``double``",
    "> quoted\n- item\n1. numbered\n+ plus\n---\n===",
    "- leading dash",
    "1. leading number",
    "# leading hash",
    "    four spaces indent",
    "http://evil.example/ www.evil.example",
    "*emph* _emph_ **strong** ~~strike~~",
    "back\\slash \\| pipe",
    '=HYPERLINK("http://evil")',
    "+1+1",
    "@SUM(A1)",
    "-2+3",
    "\tTAB=1",
]
TERM = [
    "\x1b[2J\x1b[H",  # clear screen, home
    "\x1b[1A\x1b[2K",  # cursor up, erase line
    "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x1b]52;c;ZWNobyBwd25lZA==\x07",  # OSC 52 clipboard write
    "\x1b]0;title\x07\x1b]2;title2\x1b\\",  # window titles
    "\x1bP1$qm\x1b\\",  # DCS
    "\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\",  # APC, PM, SOS
    "\x9b2J\x9d0;c1title\x07",  # 8-bit C1 CSI and OSC
    "\x07\x08\x0b\x0c\x7f",  # BEL, BS, VT, FF, DEL
    "\u202eevil\u202c \u2066iso\u2069 \u200e\u200f\u061c",  # bidi
    "zero\u200bwidth\u200c\u200d\u2060\ufeff",  # zero-width
    "\r\x1b[31mred-after-cr\x1b[0m",
]
FORBIDDEN = [chr(c) for c in range(0x20) if c not in (0x09, 0x0A)] + [
    chr(c) for c in range(0x7F, 0xA0)
]
FORBIDDEN += list("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
FORBIDDEN += list("\u200b\u200c\u200d\u2060\ufeff")

HOSTILE_PY = r"""
import json, os, sys, time
text = open(sys.argv[1], encoding="utf-8").read()
w = lambda b: (os.write(1, b), time.sleep(0.05))
w(text.encode())
w(b"\n\x1b")  # an ESC at the end of one write, its sequence in the next
w(b"[2J split\n")
w(b"bad utf-8: \xff\xfe\xc3 end\n")
w(("@@eagle3 " + json.dumps({"kind": "progress", "stage": text[:200], "done": 1, "total": 2})
   + "\n").encode())
"""

RUNBOOK = """\
name: hostile
vars:
  note: {{type: text, value: plain}}  # free text: refused as an inferred path (typed values)
steps:
  - id: probe
    title: "Probe \u202ereversed\u202c title"
    preconditions:
      - {{check: command, run: [python3, "{work}/hostile.py", "{work}/box.txt"], title: "${{note}}"}}
    run: [python3, "{work}/hostile.py", "{work}/box.txt"]
  - id: after
    title: Another
    preconditions:
      - {{check: command, run: [python3, "-c", "import sys; sys.stdout.write(open('{work}/box.txt').read()); sys.exit(1)"], title: "box says"}}
      - {{check: command, run: 'printf %s "$${{BASH_VERSION:-dash}}" > {work}/sh; cat {work}/box.txt; exit 1', title: "box says, through /bin/sh"}}
    run: "true"
"""


def _hostile(rng: random.Random, pool: list[str], n: int) -> str:
    return "".join(rng.choice(pool) + rng.choice(["", "\n", " "]) for _ in range(n))


def _bad_chars(data: bytes) -> list[str]:
    text = data.decode("utf-8")  # also asserts valid UTF-8: raw bytes never pass through
    return sorted({repr(ch) for ch in text if ch in FORBIDDEN})


MD_HEADINGS = {
    "Outcome",
    "What happened, in order",
    "Succeeded steps",
    "Skipped steps",
    "Failed, lost or cancelled steps",
    "Blocked steps",
    "Blocked earlier",
    "Confirmations given",
    "Confirmations declined or not given",
    "Guards and proofs",
    "Artifacts",
    "Resumes that changed something",
}


def _md_forged(md: str, statuses: dict[str, str]) -> list[str]:
    """What the Markdown renders that the product did not write: headings, rows, links, HTML,
    code blocks, list items beyond ours."""
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    problems = []
    inline = [c for t in tokens if t.children for c in t.children]
    kinds = {t.type for t in tokens} | {c.type for c in inline}
    for bad in ("html_block", "html_inline", "link_open", "image", "fence", "code_block"):
        if bad in kinds:
            problems.append(bad)
    headings = []
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            headings.append((t.tag, tokens[i + 1].content))
    h1 = [c for tag, c in headings if tag == "h1"]
    if len(h1) != 1 or not h1[0].startswith("Audit log of run"):
        problems.append(f"h1 {h1}")
    h2 = [c for tag, c in headings if tag == "h2"]
    if not set(h2) <= MD_HEADINGS or len(h2) != len(set(h2)):
        problems.append(f"h2 {h2}")
    h3 = [c for tag, c in headings if tag == "h3"]
    if any(c.split(" ")[0].strip("`") not in statuses for c in h3):
        problems.append(f"h3 {h3}")
    # every table row of a step table names a real step, and each step is in one row
    for heading in ("Succeeded steps", "Failed, lost or cancelled steps", "Blocked steps"):
        part = md.split(f"## {heading}\n", 1)
        if len(part) < 2:
            continue
        body = part[1].split("\n## ", 1)[0]
        rows = [r for r in body.splitlines() if r.startswith("| ")][1:]
        names = [r.split(" | ")[0][2:] for r in rows]
        if len(names) != len(set(names)) or not set(names) <= set(statuses):
            problems.append(f"rows of {heading}: {names}")
    return problems


def _csv_forged(text: str, n_records: int) -> list[str]:
    lines = text.split("\n")
    body = "\n".join(x for x in lines if not x.startswith("# audit verify: "))
    rows = list(csv.reader(io.StringIO(body)))
    problems = []
    if rows[0] != CSV_COLUMNS or len(rows) != n_records + 1:
        problems.append(f"{len(rows)} rows for {n_records} records")
    for row in rows[1:]:
        if len(row) != len(CSV_COLUMNS):
            problems.append(f"row of {len(row)} cells")
        for v in row:
            numeric = v.lstrip("-").replace(".", "", 1).isdigit()
            if v[:1] in ("=", "+", "-", "@", "\t", "\r") and not numeric:
                problems.append(f"formula cell {v[:20]!r}")
            if "\n" in v or "\r" in v:
                problems.append("cell with a line break")
    return problems


def _run(cli: Cli, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli.cmd(*args), env=cli.env, capture_output=True, timeout=120)


def test_records_and_terminals_cannot_be_forged(tmp_path, tally, bin_sh):
    """Under dash and under bash as /bin/sh (a command guard's shell writes the box's text)."""
    sh, wrap = bin_sh
    rng = random.Random(25)
    breaks = []
    for i in range(6):
        root = tmp_path / f"t{i}"
        work = root / "work"
        work.mkdir(parents=True)
        cli = Cli(root)
        (work / "hostile.py").write_text(HOSTILE_PY)
        box = _hostile(rng, FORGE_MD + TERM, 6)
        (work / "box.txt").write_text(box[:60] if i % 2 else box)  # short: whole in the tail
        value = _hostile(rng, FORGE_MD + TERM, 4)
        rb = cli.runbook(RUNBOOK.format(work=work))
        cmd = wrap(cli.cmd("run", "--auto", str(rb), "--set", f"note={value}"))
        run = subprocess.run(cmd, env=cli.env, capture_output=True, timeout=120)
        status = _run(cli, "status")
        status_json = _run(cli, "status", "--json")
        md = _run(cli, "audit", "export", "--format", "md")
        csv_out = _run(cli, "audit", "export", "--format", "csv")
        jsonl = _run(cli, "audit", "export", "--format", "jsonl")
        audit = next((cli.state / "runs").glob("*/audit.jsonl"))
        records = [json.loads(x) for x in audit.read_text().splitlines()]
        statuses = json.loads(status_json.stdout)["steps"]

        # terminals: nothing a terminal acts on, in any byte the CLI wrote
        term_bad = {
            name: _bad_chars(p.stdout + p.stderr)
            for name, p in (
                ("run --auto", run),
                ("status", status),
                ("status --json", status_json),
                ("audit export md", md),
                ("audit export jsonl", jsonl),
            )
        }
        term_bad = {k: v for k, v in term_bad.items() if v}
        shown = run.stdout.decode()
        visible = "\\x1b[2J" in shown and "\\u202e" in shown  # escaped, not dropped silently
        held = not term_bad and visible and run.returncode == 3  # `after` is blocked
        held = held and ran_under(sh, (work / "sh").read_text())
        tally.trial("terminal: job/box/value text drives the terminal (run --auto, status)", held)
        if not held:
            breaks.append(("terminal", i, term_bad, run.returncode, shown[-800:]))

        forged = _md_forged(md.stdout.decode(), {k: v["status"] for k, v in statuses.items()})
        held = not forged and md.returncode == 0
        tally.trial("record: md export forged by a value or the box", held)
        if not held:
            breaks.append(("md", i, forged, md.stdout.decode()[:3000]))

        forged = _csv_forged(csv_out.stdout.decode(), len(records))
        ok_jsonl = [json.loads(x) for x in jsonl.stdout.decode().splitlines()] == records
        held = not forged and ok_jsonl and jsonl.stdout.isascii()
        tally.trial("record: csv/jsonl export forged by a value or the box", held)
        if not held:
            breaks.append(("csv", i, forged, ok_jsonl))
    assert not breaks, breaks[:2]


def test_escape_corpus_is_stateless_and_complete(tally):
    """The sanitizer itself, over the whole corpus cut at every position: no forbidden
    character survives, and cutting a sequence anywhere changes nothing (per character)."""
    from runbook.escape import md, terminal

    rng = random.Random(52)
    breaks = []
    for _ in range(300):
        text = _hostile(rng, TERM + FORGE_MD, rng.randint(1, 5))
        cut = rng.randint(0, len(text))
        whole = terminal(text)
        held = terminal(text[:cut]) + terminal(text[cut:]) == whole
        held = held and not any(ch in FORBIDDEN or ch == "\n" for ch in whole)
        held = held and not any(ch in FORBIDDEN or ch == "\n" for ch in md(text))
        tally.trial("terminal: sequence split across chunks / corpus", held)
        if not held:
            breaks.append(text)
    assert not breaks, breaks[:3]


def test_cockpit_log_and_full_log_show_sequences_escaped(tmp_path, tally):
    """Real Textual Pilot: the live log pane fed hostile chunks (cut anywhere), and the
    full-log viewer reading the same bytes from a mirror; no widget line holds a control."""
    import asyncio

    from textual.app import App, ComposeResult

    from eagle_tui.app.widgets.logs.line_index import LineIndex
    from eagle_tui.app.widgets.logs.live_log import LiveLog

    rng = random.Random(8)
    texts = [_hostile(rng, TERM + FORGE_MD, 5) + "\n" for _ in range(10)]
    data = "".join(texts)

    class LogApp(App[None]):
        def compose(self) -> ComposeResult:
            yield LiveLog(id="log")

    async def drive() -> list[str]:
        app = LogApp()
        async with app.run_test() as pilot:
            log = app.query_one(LiveLog)
            log.step, log.source = "s", "m"
            pos = 0
            while pos < len(data):
                n = rng.randint(1, 40)
                log.on_chunk("s", data[pos : pos + n], "m", pos + n)
                pos += n
            log.flush()
            await pilot.pause()
            return [str(x) for x in log.lines]

    lines = asyncio.run(drive())
    mirror = tmp_path / "log"
    mirror.write_bytes(data.encode() + b"\xff\xfe tail\n")
    index = LineIndex(mirror)
    index.update()
    full = index.read_lines(0, 1000)
    breaks = []
    for name, got in (("live log", lines), ("full log", full)):
        bad = sorted({repr(ch) for line in got for ch in line if ch in FORBIDDEN})
        held = bool(got) and not bad and any("\\x1b" in x for x in got)
        tally.trial(f"terminal: cockpit {name} shows a control sequence raw", held)
        if not held:
            breaks.append((name, bad, got[:3]))
    assert not breaks, breaks


def test_status_line_of_a_hostile_progress_record(tmp_path, tally):
    """Box text kept in state.json (a progress record's stage) printed by `status`."""
    root = tmp_path
    work = root / "work"
    work.mkdir()
    cli = Cli(root)
    (work / "hostile.py").write_text(HOSTILE_PY)
    (work / "box.txt").write_text("".join(TERM))
    rb = cli.runbook(
        f"""\
        name: prog
        steps:
          - id: p
            title: progress
            run: [python3, "{work}/hostile.py", "{work}/box.txt"]
        """
    )
    _run(cli, "run", "--auto", str(rb))
    out = _run(cli, "status")
    bad = _bad_chars(out.stdout + out.stderr)
    held = not bad and b"\\x1b" in out.stdout
    tally.trial("terminal: status prints box text raw", held)
    assert held, (bad, out.stdout[-500:])


def test_headless_titles_and_bidi(tmp_path, tally):
    """Titles (ours, but free text) with bidi and zero-width characters are shown visibly."""
    cli = Cli(tmp_path)
    rb = cli.runbook(
        """\
        name: titles
        steps:
          - id: t
            title: "pay \u202egnp.exe\u202c \u200b now"
            run: "true"
        """
    )
    out = _run(cli, "run", "--auto", str(rb))
    bad = _bad_chars(out.stdout + out.stderr)
    held = not bad and b"\\u202e" in out.stdout and out.returncode == 0
    tally.trial("terminal: bidi in a title", held)
    assert held, (bad, out.stdout.decode()[-400:])
