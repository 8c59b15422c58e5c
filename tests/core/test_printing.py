"""Printing: torch's summaries (threshold / edgeitems / precision / sci_mode honoured, ``--``
kept), torch's choice of number format, and sparse summaries with the first stored entries.
Small tensors keep torch.masked's exact text (tests/core/test_core.py checks that)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    make_masked,
    make_masked_in,
)

import masked_sparse as ms

NUMBER = re.compile(r"-?\d+\.\d+(?:e[+-]\d+)?|-?inf|nan")


@pytest.fixture(autouse=True)
def _default_printoptions():
    yield
    torch.set_printoptions(profile="default")
    torch.set_printoptions(sci_mode=None)


def _rows(text: str) -> list[list[str]]:
    """The innermost rows of a printed MaskedTensor, as lists of cells."""
    return [[c.strip() for c in line.strip().rstrip(",")[1:-1].split(",")]
            for line in text.splitlines() if line.strip().startswith("[") and
            line.strip().rstrip(",").endswith("]")]


def _cell(v: float, m: bool, precision: int = 4) -> str:
    return f"{v:.{precision}f}" if m else "--"


@pytest.mark.parametrize("edge", [3, 2])
def test_large_strided_is_summarized_like_torch(edge):
    g = torch.Generator().manual_seed(0)
    data = torch.rand(3000, 3000, generator=g) + 0.5
    mask = torch.rand(3000, 3000, generator=g) > 0.3
    torch.set_printoptions(edgeitems=edge)
    text = repr(ms.masked_tensor(data, mask))
    assert len(text) < 2000  # was 90 MB
    rows = _rows(text)
    keep = list(range(edge)) + list(range(3000 - edge, 3000))
    assert len(rows) == 2 * edge
    for r, row in zip(keep, rows):
        expected = [_cell(float(data[r, c]), bool(mask[r, c])) for c in keep]
        assert row == expected[:edge] + ["..."] + expected[edge:]
    assert "    ...," in text.splitlines()[edge + 2]  # the row of the cut dim


def test_threshold_is_honoured():
    mt, data, mask = make_masked((40, 30), torch.strided, seed=1)
    assert "..." in repr(mt)  # 1200 elements > torch's default threshold of 1000
    torch.set_printoptions(threshold=2000)
    text = repr(mt)
    assert "..." not in text and len(_rows(text)) == 40
    assert _rows(text)[3] == [_cell(float(data[3, c]), bool(mask[3, c])) for c in range(30)]


def test_precision_and_sci_mode_are_honoured():
    mt = ms.masked_tensor(torch.tensor([1.23456, 2.5]), torch.tensor([True, False]))
    torch.set_printoptions(precision=2)
    assert "1.23" in repr(mt) and "1.2346" not in repr(mt)
    torch.set_printoptions(precision=4, sci_mode=True)
    assert "1.2346e+00" in repr(mt) and "--" in repr(mt)


@pytest.mark.parametrize("values", [[1e-8, 2.0], [1.0, 2000.0], [3e9, 1.0], [0.5, 1.5],
                                    [123456.5, 1.0], [-1e-5, 0.0, 7.0], [1.0, float("inf")]])
def test_numbers_are_formatted_as_torch_formats_them(values):
    data = torch.tensor(values + [5.0])
    mask = torch.tensor([True] * len(values) + [False])
    ours = NUMBER.findall(repr(ms.masked_tensor(data, mask)))
    theirs = NUMBER.findall(repr(torch.tensor(values)))
    sci = "e" in "".join(theirs)
    assert ("e" in "".join(ours)) == sci
    if sci:  # torch.masked has no scientific mode: the same digits as torch
        assert ours == theirs


def test_zero_dim_formats():
    x = ms.masked_tensor(torch.tensor([1e-8, 3.0]), torch.tensor([True, False]))
    assert repr(x[0]) == "MaskedTensor(1.0000e-08, True)"
    assert repr(x[1]) == "MaskedTensor(--, False)"
    assert f"{x[0]:.2e}" == "1.00e-08" and f"{x[1]:.3f}" == "--"


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_large_sparse_prints_a_summary_and_the_first_stored_entries(layout):
    mt, data, mask = make_masked((200, 300), layout, density=0.05, seed=3)
    text = repr(mt)
    coo = mt.to_sparse_coo()._storage
    nnz, count = coo.values.shape[0], 6
    head = text.splitlines()[0]
    assert head.startswith(f"MaskedTensor(layout={layout_name(layout)}, shape=(200, 300)")
    assert f"stored={nnz}" in head and f"specified={int(mask.sum())}" in head
    entries = text.splitlines()[1: 1 + count]
    for k, line in enumerate(entries):
        i, j = coo.index[0][:, k].tolist()
        value = _cell(float(data[i, j]), bool(mask[i, j]))
        assert line.split(":")[0].strip() == f"({i}, {j})"
        assert line.split(":")[1].strip() == value
    assert f"... ({nnz - count} more stored)" in text
    assert len(text) < 1000


def layout_name(layout):
    return str(layout).removeprefix("torch.")


def test_small_sparse_prints_as_strided():
    mt, data, mask = make_masked((20, 30), torch.sparse_csr, seed=4)
    assert repr(mt) == repr(ms.masked_tensor(data, mask))


@pytest.mark.parametrize("layout", ALL_LAYOUTS[1:], ids=ALL_LAYOUT_IDS[1:])
def test_sparse_summary_lists_stored_entries_of_every_layout(layout):
    mt, data, mask = make_masked_in((40, 40), layout, density=0.05, stored_masked=0.0)
    text = repr(mt)  # 1600 elements: over the threshold, a summary of the stored entries
    coo = data.where(mask, 0).to_sparse_coo()
    first = tuple(coo.indices()[:, 0].tolist())
    assert f"stored={int(mask.sum())}" in text and f"{first}:" in text
