"""Sphinx configuration of the masked_sparse docs.

Build (warnings are errors; no network: nothing is fetched at build time)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the checkout, not an installed copy

# torch's beta-state warnings for CSR/CSC/BSR would otherwise print while autodoc imports
warnings.filterwarnings("ignore", message="Sparse .* support is in beta state")

project = "masked_sparse"
author = "the masked_sparse authors"
copyright = "the masked_sparse authors"  # noqa: A001 -- Sphinx's name

extensions = [
    "myst_parser",          # the guides are Markdown (MyST), like the README
    "sphinx.ext.autodoc",   # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # NumPy-style docstrings
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3         # links to a guide's sections: guide.md#a-heading
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"  # signatures stay short; types go into the parameter list
autodoc_mock_imports: list[str] = []
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False

html_theme = "alabaster"  # ships with Sphinx: the build needs nothing else
html_title = "masked_sparse"
html_static_path: list[str] = []
suppress_warnings: list[str] = []
