"""YAML with source positions: every mapping key and value remembers its file:line:col.

PyYAML's composer keeps marks on nodes; we build plain Python values from the node graph and a
side table from path tuples (e.g. ("steps", 2, "run")) to positions, so that any schema error
can be reported as `file:line:col`. Duplicate keys are errors (YAML would silently keep the last).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Pos:
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class SourceDoc:
    file: str
    data: Any
    positions: dict[Path_, Pos] = field(default_factory=dict)
    key_positions: dict[Path_, Pos] = field(default_factory=dict)

    def where(self, path: Path_, key: bool = False) -> Pos:
        """The closest known position for `path` (walks up to a parent when needed)."""
        table = self.key_positions if key else self.positions
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if p in self.positions:
                return self.positions[p]
            p = p[:-1]
        return self.positions.get((), Pos(1, 1))


class YamlError(Exception):
    def __init__(self, file: str, pos: Pos, message: str) -> None:
        super().__init__(f"{file}:{pos.line}:{pos.col}: {message}")
        self.file, self.pos, self.message = file, pos, message


def _pos(node: yaml.Node) -> Pos:
    return Pos(node.start_mark.line + 1, node.start_mark.column + 1)


MAX_NODES = 100_000  # a runbook has hundreds; aliases must not expand one into billions ("laughs")
_STD_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "map", "seq", "merge", "timestamp")
}


class _Builder:
    def __init__(self, doc: SourceDoc) -> None:
        self.doc = doc
        self.constructor = yaml.SafeLoader("")
        self.nodes = 0

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise YamlError(
                self.doc.file,
                _pos(node),
                f"more than {MAX_NODES} values after expanding aliases; "
                "a runbook does not need this many (alias bomb?)",
            )
        if node.tag not in _STD_TAGS:
            raise YamlError(
                self.doc.file,
                _pos(node),
                f"unknown YAML tag {node.tag!r}; runbooks use plain values only",
            )
        self.doc.positions[path] = _pos(node)
        if isinstance(node, yaml.MappingNode):
            self.constructor.flatten_mapping(node)
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise YamlError(
                        self.doc.file, _pos(key_node), "mapping keys must be plain scalars"
                    )
                # keys are taken as written: YAML 1.1 would turn `on:` / `yes:` into booleans
                key = key_node.value
                if key in out:
                    raise YamlError(
                        self.doc.file,
                        _pos(key_node),
                        f"duplicate key {key!r} (YAML would silently keep the last one)",
                    )
                self.doc.key_positions[path + (key,)] = _pos(key_node)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.build_scalar(node)

    def build_scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise YamlError(self.doc.file, _pos(node), "expected a plain value here")
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise YamlError(self.doc.file, _pos(node), f"cannot read value: {exc}") from None


def load_yaml(text: str, file: str) -> SourceDoc:
    """Parse one YAML document; syntax errors become YamlError with the parser's position."""
    doc = SourceDoc(file=file, data=None)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Pos(mark.line + 1, mark.column + 1) if mark else Pos(1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise YamlError(file, pos, f"YAML syntax: {problem}") from None
    except yaml.YAMLError as exc:
        raise YamlError(file, Pos(1, 1), f"YAML syntax: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. NUL bytes, absurd nesting
        raise YamlError(file, Pos(1, 1), f"unreadable YAML: {exc}") from None
    if len(nodes) != 1 or nodes[0] is None:
        raise YamlError(
            file, Pos(1, 1), "expected exactly one YAML document (a mapping with name and steps)"
        )
    try:
        doc.data = _Builder(doc).build(nodes[0], ())
    except RecursionError:
        raise YamlError(file, Pos(1, 1), "YAML nested too deeply") from None
    return doc
