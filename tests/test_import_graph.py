"""No new import circle between product files (docs/ARCHITECTURE.md "Import rules").

The graph: one node per file of runbook/, eagle_tui/, remote_agent/ (the ML payload included),
one edge per import of another product file, lazy (in-function) imports included, imports under
`if TYPE_CHECKING:` left out (they never run). `from pkg import name` is an edge to pkg/name.py
when that file exists, else to pkg itself. A circle is a strongly connected component of more
than one file. The circles found must be exactly KNOWN: a new one fails, and so does a fixed
one still listed (remove it here and in docs/ARCHITECTURE.md "Known circles").

Screens and widgets sit below the cockpit app: they reach it through its port
(`eagle_tui/app/port.py`), never by importing the app, its launcher or the CLI, not even under
`if TYPE_CHECKING:` (that graph counts typing imports too).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.support.paths import REPO

PACKAGES = ("runbook", "eagle_tui", "remote_agent")

# each a set of repo-relative files; the reason for each is in docs/ARCHITECTURE.md (none left)
KNOWN: list[frozenset[str]] = []


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every product module."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = p.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _type_checking_only(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, typing_too: bool = False) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not typing_too and isinstance(child, ast.If) and _type_checking_only(child.test):
                for sub in child.orelse:
                    walk(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


@functools.cache
def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    """Repo-relative file -> the product files it imports (`typing_too`: also those imported
    under `if TYPE_CHECKING:`)."""
    files = module_files()
    rel = {m: str(p.relative_to(REPO)) for m, p in files.items()}
    graph: dict[str, set[str]] = {f: set() for f in rel.values()}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        me = rel[mod]
        for node in _imports(ast.parse(path.read_text(), str(path)), typing_too):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in rel else base for a in node.names
                ]
            for t in targets:
                while t and t not in rel:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and rel[t] != me:
                    graph[me].add(rel[t])
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every file `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for t in graph[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _show(cs: list[frozenset[str]]) -> str:
    return "\n".join("  " + ", ".join(sorted(c)) for c in sorted(cs, key=sorted))


def test_the_graph_sees_the_product() -> None:
    graph = import_graph()
    assert len(graph) > 150
    # spot checks that resolution works: absolute, `from pkg import module`, relative
    assert "runbook/schema.py" in graph["runbook/loader.py"]
    assert "remote_agent/wire/check_vocabulary.py" in graph["runbook/schema.py"]
    assert any(t.startswith("runbook/") for t in graph["eagle_tui/cli.py"])
    # the tenants' and eagle3's sub-packages are in it
    assert "remote_agent/wire/protocol.py" in graph["remote_agent/agent/server.py"]
    assert "remote_agent/eagle3/tiny/kimi.py" in graph["remote_agent/eagle3/tiny/cache.py"]
    assert (
        "remote_agent/eagle3/drafter/model/merge.py"
        in graph["remote_agent/eagle3/drafter/model/ttt_attention.py"]
    )


def test_the_circle_finder_finds_circles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(g) == [frozenset({"a", "b", "c"})]


def test_no_import_circle_but_the_known_ones() -> None:
    found = circles(import_graph())
    new = [c for c in found if c not in KNOWN]
    gone = [c for c in KNOWN if c not in found]
    assert not new, f"new import circle(s): break them, or list them in KNOWN:\n{_show(new)}"
    assert not gone, f"fixed circle(s) still listed in KNOWN (remove them):\n{_show(gone)}"


def test_no_import_runs_back_up_the_stack() -> None:
    """eagle_tui -> runbook -> remote_agent: nothing imports a room above its own."""
    above = {"remote_agent": ("runbook/", "eagle_tui/"), "runbook": ("eagle_tui/",)}
    up = [
        f"{a} -> {t}"
        for a, targets in import_graph().items()
        for t in sorted(targets)
        if t.startswith(above.get(a.split("/")[0], ()))
    ]
    assert not up, "imports running back up the stack:\n" + "\n".join(up)


TENANTS = ("remote_agent/agent/", "remote_agent/wire/", "remote_agent/eagle3/")


def test_the_tenants_import_as_the_layout_says() -> None:
    """remote_agent's three tenants: the wire contracts import neither the agent core nor the
    payload, the core and the payload never each other, and runbook/ and eagle_tui/ take from
    remote_agent the wire contracts only (lazy and typing imports included)."""
    graph = import_graph(typing_too=True)
    assert {t for t in TENANTS if any(f.startswith(t) for f in graph)} == set(TENANTS)
    may = {
        "remote_agent/wire/": ("remote_agent/wire/",),
        "remote_agent/agent/": ("remote_agent/agent/", "remote_agent/wire/"),
        "remote_agent/eagle3/": ("remote_agent/eagle3/", "remote_agent/wire/"),
        "runbook/": ("remote_agent/wire/",),
        "eagle_tui/": ("remote_agent/wire/",),
    }
    bad = [
        f"{f} -> {t}"
        for f in sorted(graph)
        for room, allowed in may.items()
        if f.startswith(room)
        for t in sorted(graph[f])
        if t.startswith(TENANTS) and not t.startswith(allowed)
    ]
    assert not bad, "imports across the tenants (docs/ARCHITECTURE.md):\n" + "\n".join(bad)


BELOW_THE_APP = ("eagle_tui/app/screens/", "eagle_tui/app/widgets/")
THE_APP = {"eagle_tui/app/app.py", "eagle_tui/app/launch.py", "eagle_tui/cli.py"}
# what a file could name the app by without an import statement: a quoted annotation, the
# class, importlib.import_module's argument
APP_NAMES = {"CockpitApp", "eagle_tui.app.app", "eagle_tui.app.launch", "eagle_tui.cli"}


def _names_the_app(tree: ast.AST) -> bool:
    for n in ast.walk(tree):
        if (isinstance(n, ast.Name) and n.id in APP_NAMES) or (
            isinstance(n, ast.Attribute) and n.attr in APP_NAMES
        ):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in APP_NAMES:
            return True
    return False


def test_the_reach_finder_follows_imports() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": {"a"}}
    assert reached(g, "a") == {"b", "c"}
    assert reached(g, "d") == {"a", "b", "c"}
    assert _names_the_app(ast.parse("x: 'CockpitApp'"))
    assert _names_the_app(ast.parse("importlib.import_module('eagle_tui.cli')"))
    assert not _names_the_app(ast.parse('"""The app (CockpitApp) hands us its port."""'))


def test_screens_and_widgets_import_neither_the_app_nor_the_cli() -> None:
    """Screens get the app's port (eagle_tui/app/port.py), widgets post messages up: none of them
    imports the app, its launcher or the CLI, through another file, lazily or for typing."""
    graph = import_graph(typing_too=True)
    below = sorted(f for f in graph if f.startswith(BELOW_THE_APP))
    assert "eagle_tui/app/screens/main.py" in below
    assert "eagle_tui/app/widgets/steps/todo_list.py" in below
    bad = [
        f"{f} -> {', '.join(sorted(reached(graph, f) & THE_APP))}"
        for f in below
        if reached(graph, f) & THE_APP
    ]
    assert not bad, "screens/widgets reaching the app or the CLI (use the port):\n" + "\n".join(bad)
    named = [f for f in below if _names_the_app(ast.parse((REPO / f).read_text(), f))]
    assert not named, f"screens/widgets naming the app or the CLI (use the port): {named}"


DRAFTER = "remote_agent/eagle3/drafter/"
# the drafter's sub-packages, each importing only those before it (torchtitan-style components:
# the model knows nothing of training, training nothing of export or evaluation)
DRAFTER_LAYERS = ("model", "parallel", "train", "export", "eval")


def test_drafter_packages_import_only_the_ones_below() -> None:
    """model <- parallel <- train <- export <- eval, lazy imports included (typing ones too)."""
    graph = import_graph(typing_too=True)
    rank = {name: i for i, name in enumerate(DRAFTER_LAYERS)}

    def layer(f: str) -> str:
        return f[len(DRAFTER) :].partition("/")[0]

    files = [f for f in graph if f.startswith(DRAFTER)]
    assert {layer(f) for f in files if "/" in f[len(DRAFTER) :]} == set(DRAFTER_LAYERS)
    up = [
        f"{f} -> {t}"
        for f in sorted(files)
        if layer(f) in rank
        for t in sorted(graph[f])
        if t.startswith(DRAFTER) and rank.get(layer(t), -1) > rank[layer(f)]
    ]
    assert not up, "drafter imports running up its packages:\n" + "\n".join(up)
