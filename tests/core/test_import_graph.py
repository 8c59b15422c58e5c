"""The packages import each other in layers: no module imports one that imports it back.

The import graph is read from the source (``ast``: nothing is imported), module-level and
deferred imports (inside functions) alike: ``import a.b``, ``from a.b import c`` and
relative ``from . import x`` / ``from .x import y``, where a name that is a submodule counts
as an import of that submodule (imports under ``if TYPE_CHECKING:`` count too; a module
loaded by ``importlib`` is not seen). Every strongly connected component of more than one
module is a circle; the failure message names its modules and the imports that tie them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("masked_sparse", "layouts", "benchmarks")


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> file (a package is its
    ``__init__.py``)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(module: str, is_package: bool, tree: ast.AST,
             files: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of ``files``, line) of every import in ``tree``, anywhere in the file.

    ``import a.b`` imports ``a.b``; ``from a import b`` imports ``a.b`` where that is a
    module, else the name ``b`` of ``a`` (an import of ``a``). Relative imports are resolved
    against ``module``'s package; modules outside ``files`` are left out.
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name in files]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target not in files:
                    target = base  # a name defined in ``base`` (or ``*``)
                if target in files:
                    found.append((target, node.lineno))
    return found


def import_graph(files: dict[str, Path]) -> dict[str, dict[str, list[int]]]:
    """module -> {module it imports: [lines of those imports]}, for every module of
    ``files`` (a module importing itself is left out)."""
    graph: dict[str, dict[str, list[int]]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, list[int]] = {}
        for target, line in _imports(module, path.name == "__init__.py", tree, files):
            if target != module:
                at = edges.setdefault(target, [])
                if line not in at:
                    at.append(line)
        graph[module] = edges
    return graph


def find_circles(graph: dict[str, set[str] | dict]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, kept
    iterative), each sorted, sorted by their first node. A node's edge to itself is no
    circle; edges to nodes outside ``graph`` are ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return sorted(circles)


def describe(circle: list[str], graph: dict[str, dict[str, list[int]]],
             files: dict[str, Path], root: Path = ROOT) -> str:
    """The modules of ``circle`` and every import between two of them (file:line)."""
    members = set(circle)
    lines = [f"circle of {len(circle)} modules: {', '.join(circle)}"]
    for module in circle:
        for target, at in sorted(graph[module].items()):
            if target in members:
                where = ", ".join(f"{files[module].relative_to(root).as_posix()}:{n}" for n in at)
                lines.append(f"  {module} -> {target}  ({where})")
    return "\n".join(lines)


# -- the cycle finder itself ----------------------------------------------------------------


def test_find_circles_finds_a_circle_and_passes_a_dag():
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert find_circles({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a"}}) == []
    assert find_circles({"a": {"a"}}) == []  # a self-import is no circle
    # two separate circles, joined by an edge that is part of neither
    two = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"e", "a"}}
    assert find_circles(two) == [["a", "b"], ["c", "d"]]
    # a long chain (no recursion limit) closed into one circle at its end
    chain = {str(i): {str(i + 1)} for i in range(5000)}
    chain["5000"] = set()
    assert find_circles(chain) == []
    chain["5000"] = {"0"}
    assert find_circles(chain) == [sorted(chain)]


def test_import_graph_reads_every_form_of_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("import pkg.b\n")
    (package / "b.py").write_text("def f():\n    from .sub import c\n    from . import d\n")
    (package / "d.py").write_text("from .sub.c import name\n")
    (package / "sub" / "__init__.py").write_text("X = 1\n")
    (package / "sub" / "c.py").write_text("from .. import a\nfrom . import X\nimport os\n")
    files = module_files(tmp_path, ("pkg",))
    graph = import_graph(files)
    assert {m: sorted(e) for m, e in graph.items()} == {
        "pkg": ["pkg.a"],
        "pkg.a": ["pkg.b"],
        "pkg.b": ["pkg.d", "pkg.sub.c"],  # deferred imports count; ``.sub`` gives only c
        "pkg.d": ["pkg.sub.c"],
        "pkg.sub": [],
        "pkg.sub.c": ["pkg.a", "pkg.sub"],  # ``from .. import a``: the submodule a
    }
    assert find_circles(graph) == [["pkg.a", "pkg.b", "pkg.d", "pkg.sub.c"]]
    message = describe(find_circles(graph)[0], graph, files, tmp_path)
    assert "pkg.sub.c -> pkg.a  (pkg/sub/c.py:1)" in message


# -- the packages ---------------------------------------------------------------------------

_FILES = module_files()
_GRAPH = import_graph(_FILES)


@pytest.mark.parametrize("package", ["masked_sparse", "layouts", "benchmarks"])
def test_no_import_circle(package):
    inside = {m: {t for t in e if t == package or t.startswith(package + ".")}
              for m, e in _GRAPH.items() if m == package or m.startswith(package + ".")}
    circles = find_circles(inside)
    assert not circles, "\n".join(describe(c, _GRAPH, _FILES) for c in circles)


def test_layouts_imports_nothing_from_masked_sparse():
    wrong = [f"{_FILES[m].relative_to(ROOT)}:{line} imports {t}"
             for m, edges in _GRAPH.items() if m.split(".")[0] == "layouts"
             for t, at in edges.items() if t.split(".")[0] == "masked_sparse" for line in at]
    assert not wrong, "layouts must not know masked_sparse:\n" + "\n".join(wrong)
