"""Marked blocks: the patch is a list of line blocks, each inserted at a unique anchor and
wrapped in begin/end marker comments, so applying is pure insertion and reverting is stripping
the marked lines. Pure text functions; the hash table decides whether they may run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class PatchError(Exception):
    """The text does not have the shape the patch expects (anchor missing or ambiguous)."""


@dataclass(frozen=True)
class Block:
    name: str
    anchor: tuple[str, ...]  # consecutive lines (without line endings) that must occur once
    insert_after: int  # index into anchor after which the lines go
    lines: tuple[str, ...]


@dataclass(frozen=True)
class PatchSpec:
    name: str
    patch_version: int
    path: str
    marker_begin: str
    marker_end: str
    blocks: tuple[Block, ...]


def load_spec(path: Path) -> PatchSpec:
    data = json.loads(Path(path).read_text())
    if data.get("format") != "eagle3-marked-blocks":
        raise ValueError(f"{path}: not an eagle3 marked-blocks patch")
    blocks = tuple(
        Block(b["name"], tuple(b["anchor"]), int(b["insert_after"]), tuple(b["lines"]))
        for b in data["blocks"]
    )
    for b in blocks:
        if not (b.lines[0].strip().startswith(data["marker_begin"])):
            raise ValueError(f"{path}: block {b.name} does not start with the begin marker")
        if not (b.lines[-1].strip().startswith(data["marker_end"])):
            raise ValueError(f"{path}: block {b.name} does not end with the end marker")
    return PatchSpec(
        data["name"],
        int(data["patch_version"]),
        data["path"],
        data["marker_begin"],
        data["marker_end"],
        blocks,
    )


def _split(text: str) -> tuple[list[str], str]:
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    return lines, eol


def _bare(line: str) -> str:
    return line.rstrip("\r\n")


def anchor_positions(text: str, anchor: tuple[str, ...]) -> list[int]:
    """0-based line indexes where the anchor's consecutive lines start."""
    bare = [_bare(line) for line in text.splitlines()]
    n = len(anchor)
    return [i for i in range(len(bare) - n + 1) if tuple(bare[i : i + n]) == anchor]


def has_markers(text: str, spec: PatchSpec) -> bool:
    return any(
        line.strip().startswith((spec.marker_begin, spec.marker_end)) for line in text.splitlines()
    )


def apply_blocks(text: str, spec: PatchSpec) -> str:
    """Insert every block; each anchor must occur exactly once and no marker may be present."""
    if has_markers(text, spec):
        raise PatchError(f"{spec.name} markers already present")
    lines, eol = _split(text)
    inserts: list[tuple[int, Block]] = []
    for block in spec.blocks:
        found = anchor_positions(text, block.anchor)
        if len(found) != 1:
            what = "not found" if not found else f"found {len(found)} times (lines {found})"
            raise PatchError(f"anchor of block {block.name!r} {what}: {block.anchor[0]!r}")
        inserts.append((found[0] + block.insert_after + 1, block))
    for at, block in sorted(inserts, key=lambda x: x[0], reverse=True):
        lines[at:at] = [line + eol for line in block.lines]
    return "".join(lines)


def strip_blocks(text: str, spec: PatchSpec) -> str:
    """Remove every marked block (marker lines included); markers must pair up."""
    lines, _ = _split(text)
    out: list[str] = []
    inside = False
    for line in lines:
        s = line.strip()
        if s.startswith(spec.marker_begin):
            if inside:
                raise PatchError("nested begin marker")
            inside = True
            continue
        if s.startswith(spec.marker_end):
            if not inside:
                raise PatchError("end marker without a begin marker")
            inside = False
            continue
        if not inside:
            out.append(line)
    if inside:
        raise PatchError("begin marker without an end marker")
    return "".join(out)
