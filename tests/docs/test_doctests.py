"""The examples in the docstrings of every module of ``layouts`` and ``masked_sparse`` run
and show what they say (a docstring example nobody runs can drift from the code)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import layouts
import masked_sparse

MODULES = sorted(info.name for package in (layouts, masked_sparse)
                 for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
                 if not info.name.endswith(".__main__"))  # the tour runs on import


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name}"
