"""ARCHITECTURE.md stays true: every file, folder, symbol and Note it names exists.

The map names things in three forms, each checked here against the checkout:

- a path in backticks (``masked_sparse/_tensor.py``, ``layouts/kernels/``): the file or
  folder exists;
- a symbol in backticks, written ``path.py:name`` or ``path.py:Class.attr``: the file
  defines it (a function, class or assignment at top level, or an attribute of the class,
  read with ``ast``: nothing is imported);
- ``Note [Title]``: some source file holds that Note.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "ARCHITECTURE.md"
_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*(?:/|\.(?:py|md|c|sh|toml|json|cfg))$")
_SYMBOL = re.compile(r"^([\w./-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)$")
_NOTE = re.compile(r"Note \[([^\]]+)\]")


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\s]+)`", text)


def named_paths(text: str) -> list[str]:
    """The backticked tokens of ``text`` that are paths (``a/b.py``, ``a/``, ``setup.py``)."""
    return [tok for tok in _backticked(text) if _PATH.match(tok) and not _SYMBOL.match(tok)]


def named_symbols(text: str) -> list[tuple[str, str]]:
    """(file, dotted name) of the backticked ``file.py:name`` tokens of ``text``."""
    return [m.groups() for tok in _backticked(text) if (m := _SYMBOL.match(tok))]


@cache
def definitions(path: Path) -> frozenset[str]:
    """The names ``path`` defines at top level and, as ``Class.attr``, in its classes."""
    names = set()

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return [node.name]
        return []

    for node in ast.parse(path.read_text()).body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{n}" for child in node.body for n in targets(child))
    return frozenset(names)


@cache
def notes() -> frozenset[str]:
    """Every Note title the sources hold (Python and C)."""
    found = set()
    for pattern in ("**/*.py", "**/*.c"):
        for path in ROOT.glob(pattern):
            if not any(part.startswith(".") or part == "build" for part in path.parts):
                found.update(re.findall(r"Note \[([^\]]+)\]\n\s*(?:#\s*)?~~~",
                                        path.read_text(errors="replace")))
    return frozenset(found)


def test_the_check_reads_each_form():
    text = ("`layouts/registry.py` `tests/` `layouts/registry.py:Storage.with_values` "
            "`a + b` Note [X]")
    assert named_paths(text) == ["layouts/registry.py", "tests/"]
    assert named_symbols(text) == [("layouts/registry.py", "Storage.with_values")]
    assert "Storage.with_values" in definitions(ROOT / "layouts/registry.py")
    assert "Storage.no_such_thing" not in definitions(ROOT / "layouts/registry.py")
    assert "Kernel families as ops" in notes() and "No such note" not in notes()


def test_the_map_names_enough():
    text = MAP.read_text()
    assert len(named_paths(text)) > 60 and len(named_symbols(text)) > 15
    assert len(_NOTE.findall(text)) > 5


@pytest.mark.parametrize("path", sorted(set(named_paths(MAP.read_text()))))
def test_every_named_path_exists(path):
    assert (ROOT / path).exists(), f"ARCHITECTURE.md names {path}, which does not exist"
    assert path.endswith("/") == (ROOT / path).is_dir(), f"{path}: a folder ends with /"


@pytest.mark.parametrize("file,name", sorted(set(named_symbols(MAP.read_text()))))
def test_every_named_symbol_is_defined(file, name):
    assert (ROOT / file).is_file(), f"ARCHITECTURE.md names {file}, which does not exist"
    assert name in definitions(ROOT / file), f"ARCHITECTURE.md names {file}:{name}, not there"


def test_every_named_note_exists():
    named = {re.sub(r"\s+", " ", title) for title in _NOTE.findall(MAP.read_text())}
    missing = sorted(named - {"..."} - notes())
    assert not missing, f"ARCHITECTURE.md names Notes no source holds: {missing}"


def test_every_package_module_is_on_the_map():
    """A module added to ``layouts/`` or ``masked_sparse/`` gets a line on the map."""
    named = set(named_paths(MAP.read_text())) | {f for f, _ in named_symbols(MAP.read_text())}
    # A folder the map describes as a whole covers its modules; one whose modules the map
    # lists one by one (ops, kernels) must list them all.
    folders = {f for f in named if f.endswith("/")
               and not any(p.startswith(f) and p.endswith(".py") for p in named)}
    missing = [str(p.relative_to(ROOT)) for pkg in ("layouts", "masked_sparse")
               for p in sorted((ROOT / pkg).rglob("*.py"))
               if str(p.relative_to(ROOT)) not in named and p.name != "__init__.py"
               and f"{p.parent.relative_to(ROOT)}/" not in folders - {f"{pkg}/"}]
    assert not missing, f"modules ARCHITECTURE.md does not name: {missing}"
