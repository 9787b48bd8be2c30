"""The patched file compared with the pristine one by AST and by diff (§6.8 item 5): exactly one
hook call, in DeepseekV2ForCausalLM.forward after the aux unpack and before the last-rank branch,
guarded by the module flag that follows the logger; every other top-level node unchanged."""

from __future__ import annotations

import ast
import difflib

import pytest
from patch_fixtures import TARGET, wheel_file

from remote_agent.eagle3.patching import hashes
from remote_agent.eagle3.patching.blocks import apply_blocks, load_spec


@pytest.fixture(scope="module")
def sources(sglang_wheel):
    pristine = wheel_file(sglang_wheel, TARGET).decode()
    spec = load_spec(hashes.patches_dir() / "deepseek_v2.eagle3-dump.json")
    return pristine, apply_blocks(pristine, spec), spec


def _forward(tree):
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2ForCausalLM"
    )
    return cls, next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")


def _is_hook_call(node) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "_eagle3_dump"
    )


def test_exactly_one_guarded_hook_call_in_the_right_place(sources):
    _, patched, _ = sources
    tree = ast.parse(patched)
    calls = [n for n in ast.walk(tree) if _is_hook_call(n)]
    assert len(calls) == 1
    cls, forward = _forward(tree)
    assert calls[0] in list(ast.walk(forward))
    body = forward.body
    guard = next(
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.If) and ast.unparse(s.test) == "_EAGLE3_DUMP"
    )
    unpack = next(
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.If)
        and "hidden_states, aux_hidden_states = hidden_states" in ast.unparse(s)
    )
    last_rank = next(
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.If) and ast.unparse(s.test) == "self.pp_group.is_last_rank"
    )
    assert unpack < guard < last_rank and guard == unpack + 1 and last_rank == guard + 1
    call = calls[0]
    assert [ast.unparse(a) for a in call.args] == [
        "self",
        "forward_batch",
        "hidden_states",
        "aux_hidden_states",
    ]
    assert calls[0] in list(ast.walk(body[guard]))  # only reachable when the flag is set


def test_flag_follows_the_logger(sources):
    _, patched, _ = sources
    body = ast.parse(patched).body
    i = next(
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "logger"
    )
    assert ast.unparse(body[i + 1]) == "import os as _eagle3_os"
    assert (
        ast.unparse(body[i + 2]) == "_EAGLE3_DUMP = bool(_eagle3_os.environ.get('EAGLE3_DUMP_DIR'))"
    )
    assigned = [
        s
        for s in ast.walk(ast.parse(patched))
        if isinstance(s, ast.Assign) and "_EAGLE3_DUMP" in ast.unparse(s.targets[0])
    ]
    assert len(assigned) == 1  # read once, at import


def test_every_other_top_level_node_is_unchanged(sources):
    pristine, patched, _ = sources
    old, new = ast.parse(pristine).body, ast.parse(patched).body
    added = {
        "import os as _eagle3_os",
        "_EAGLE3_DUMP = bool(_eagle3_os.environ.get('EAGLE3_DUMP_DIR'))",
    }
    new_wo = [n for n in new if ast.unparse(n) not in added]
    assert len(new_wo) == len(old) == len(new) - 2
    changed = [
        i for i, (a, b) in enumerate(zip(old, new_wo, strict=True)) if ast.dump(a) != ast.dump(b)
    ]
    assert len(changed) == 1 and getattr(old[changed[0]], "name", "") == "DeepseekV2ForCausalLM"
    # inside the class only forward differs, and only by the inserted If
    old_cls, old_fwd = _forward(ast.parse(pristine))
    new_cls, new_fwd = _forward(ast.parse(patched))
    for a, b in zip(old_cls.body, new_cls.body, strict=True):
        if getattr(a, "name", None) != "forward":
            assert ast.dump(a) == ast.dump(b)
    kept = [
        s
        for s in new_fwd.body
        if not (isinstance(s, ast.If) and ast.unparse(s.test) == "_EAGLE3_DUMP")
    ]
    assert [ast.dump(s) for s in kept] == [ast.dump(s) for s in old_fwd.body]
    assert len(new_fwd.body) == len(old_fwd.body) + 1


def test_diff_adds_lines_only_between_markers(sources):
    pristine, patched, spec = sources
    diff = list(difflib.ndiff(pristine.splitlines(), patched.splitlines()))
    assert not [d for d in diff if d.startswith("- ")]
    added = [d[2:] for d in diff if d.startswith("+ ")]
    inside, blocks = False, 0
    for line in added:
        s = line.strip()
        if s.startswith(spec.marker_begin):
            inside, blocks = True, blocks + 1
        elif s.startswith(spec.marker_end):
            inside = False
        else:
            assert inside, f"added line outside the markers: {line!r}"
    assert blocks == 2 and not inside
    assert len(added) == sum(len(b.lines) for b in spec.blocks)


def test_no_new_undefined_names(sources):
    """Names the blocks read are defined by the blocks or the function (a pyflakes-lite check)."""
    _, patched, _ = sources
    tree = ast.parse(patched)
    _, forward = _forward(tree)
    guard = next(
        s for s in forward.body if isinstance(s, ast.If) and ast.unparse(s.test) == "_EAGLE3_DUMP"
    )
    loaded = {
        n.id for n in ast.walk(guard) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    params = {a.arg for a in forward.args.args}
    assert loaded <= params | {"_EAGLE3_DUMP", "_eagle3_dump", "hidden_states", "aux_hidden_states"}
