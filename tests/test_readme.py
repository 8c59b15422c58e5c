"""The README's Python snippets run, and it gives the two commands a newcomer needs."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


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
