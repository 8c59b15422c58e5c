"""The README's Python snippets run, and it gives the two commands a newcomer needs."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_snippets_run(capsys):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    namespace: dict = {}
    exec(compile("import torch\nimport masked_sparse as ms\n" + "\n".join(blocks), "README",
                 "exec"), namespace)
    out = namespace["out"]
    assert out.layout == namespace["torch"].sparse_coo


def test_readme_gives_the_two_commands():
    text = README.read_text()
    assert "python -m masked_sparse" in text
    assert "python -m pytest" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pytest" in ci and "torch==2.13.0" in ci


def test_readme_is_a_front_page():
    """At most 12 KB (the guides live in docs/), the generated performance summary between
    its markers, and every relative link pointing at a file of the repository."""
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024
    # the markers of benchmarks/readme.py (BEGIN, END)
    section = text[text.index("<!-- performance: begin"):text.index("<!-- performance: end -->")]
    assert len([line for line in section.splitlines() if line.startswith("- ")]) == 5
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert "docs/design.md" in links and "benchmarks/RESULTS.md" in links
    missing = [link for link in links if not (README.parent / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
