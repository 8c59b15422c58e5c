"""The code examples of the guides in ``docs/`` run (as ``tests/docs/test_readme.py`` runs the
README's): every ```` ```python ```` block of a page, in order, in one namespace per page that
starts with ``import torch`` and ``import masked_sparse as ms``. A block written as a
doctest (``>>>`` lines) is run as one and must print what it shows. Blocks fenced ```` ```py ````
or ```` ```text ```` are shown only (a script for ``torchrun``, a shell session)."""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


def test_the_guides_have_examples():
    """The pages with code are found (a changed fence would silently skip them)."""
    assert len(PAGES) >= 15
    assert sum(bool(blocks(p)) for p in PAGES) >= 10


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page):
    namespace: dict = {"__name__": f"docs/{page}"}
    exec("import torch\nimport masked_sparse as ms\n", namespace)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for number, code in enumerate(blocks(page), 1):
        name = f"docs/{page}, python block {number}"
        if ">>>" in code:
            test = doctest.DocTestParser().get_doctest(code, namespace, name, name, 0)
            result = runner.run(test, clear_globs=False)
            assert result.failed == 0, f"{name}: {result.failed} failed examples"
        else:
            exec(compile(code, name, "exec"), namespace)


def test_the_compile_table_names_tests_that_exist():
    """Every test that ``docs/compile.md``'s layout table names is defined in ``tests/``."""
    page = (DOCS / "compile.md").read_text()
    table = page.split("## What each layout compiles", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(test_\w+)`", table))
    assert named, "the table names no test"
    defined = set()
    for path in (DOCS.parent / "tests").rglob("test_*.py"):
        defined.update(re.findall(r"^def (test_\w+)\(", path.read_text(), re.MULTILINE))
    assert named <= defined, sorted(named - defined)
