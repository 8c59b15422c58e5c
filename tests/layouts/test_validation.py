"""Malformed torch sparse inputs are refused at construction with a ValueError naming the op,
the index tensor and the bound -- never a wrong result or an interpreter abort.

The bad tensors are built the ways torch allows: ``check_invariants=False`` and torch's
default (invariant checks off unless enabled globally).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import make_masked

import masked_sparse as ms

BUILDERS = {"masked_tensor": ms.masked_tensor, "as_masked_tensor": ms.as_masked_tensor,
            "MaskedTensor": ms.MaskedTensor}


def _coo(indices, shape, check=False, coalesced=False):
    idx = torch.tensor(indices)
    kwargs = {} if check is None else {"check_invariants": check}
    return torch.sparse_coo_tensor(idx, torch.arange(1.0, idx.shape[1] + 1), shape,
                                   is_coalesced=coalesced, **kwargs)


def _compressed(ptr, idx, shape, layout=torch.sparse_csr, ptr_dtype=torch.int64,
                idx_dtype=torch.int64, check=False):
    make = {torch.sparse_csr: torch.sparse_csr_tensor,
            torch.sparse_csc: torch.sparse_csc_tensor}[layout]
    kwargs = {} if check is None else {"check_invariants": check}
    return make(torch.tensor(ptr, dtype=ptr_dtype), torch.tensor(idx, dtype=idx_dtype),
                torch.arange(1.0, len(idx) + 1), shape, **kwargs)


def _mask_of(t):
    if t.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(t._indices(), torch.ones(t._nnz(), dtype=torch.bool),
                                       t.shape, check_invariants=False,
                                       is_coalesced=t.is_coalesced())
    ptr, idx = ((t.crow_indices(), t.col_indices()) if t.layout == torch.sparse_csr
                else (t.ccol_indices(), t.row_indices()))
    make = torch.sparse_csr_tensor if t.layout == torch.sparse_csr else torch.sparse_csc_tensor
    return make(ptr, idx, torch.ones(idx.numel(), dtype=torch.bool), t.shape,
                check_invariants=False)


# name -> (bad tensor factory, words the message must contain)
BAD = {
    "coo_negative": (lambda c: _coo([[0, -1, 2], [0, 1, 1]], (3, 3), c),
                     ["indices[0]", "-1", "[0, 3)"]),
    "coo_too_large": (lambda c: _coo([[0, 1], [0, 4]], (2, 4), c),
                      ["indices[1]", "4", "[0, 4)"]),
    "coo_1d_far": (lambda c: _coo([[0, 10**9]], (5,), c), ["indices[0]", "1000000000"]),
    "coo_flagged_coalesced_unsorted": (lambda c: _coo([[1, 0], [0, 0]], (2, 2), c, True),
                                       ["coalesced", "sorted"]),
    "crow_not_from_0": (lambda c: _compressed([1, 1, 2], [0, 1], (2, 2), check=c),
                        ["crow_indices", "start at 0"]),
    "crow_last_not_nnz": (lambda c: _compressed([0, 1, 3, 2], [0, 1, 2], (3, 3), check=c),
                          ["crow_indices", "nnz = 3"]),
    "crow_decreasing": (lambda c: _compressed([0, 2, 1, 3], [0, 1, 2], (3, 3), check=c),
                        ["crow_indices", "decreases", "non-decreasing"]),
    "crow_wrong_length": (lambda c: _compressed([0, 1, 2], [0, 1], (3, 3), check=c),
                          ["crow_indices", "length 4"]),
    "col_negative": (lambda c: _compressed([0, 1, 2], [0, -3], (2, 2), check=c),
                     ["col_indices", "-3", "[0, 2)", "columns"]),
    "col_too_large": (lambda c: _compressed([0, 1, 2], [0, 7], (2, 3), check=c),
                      ["col_indices", "7", "[0, 3)"]),
    "col_unsorted": (lambda c: _compressed([0, 2, 2], [1, 0], (2, 2), check=c),
                     ["col_indices", "sorted"]),
    "index_dtypes_differ": (lambda c: _compressed([0, 1, 2], [0, 1], (2, 2), check=c,
                                                  ptr_dtype=torch.int32),
                            ["crow_indices", "torch.int32", "torch.int64"]),
    "csc_row_too_large": (lambda c: _compressed([0, 1, 2], [0, 5], (3, 2), torch.sparse_csc,
                                                check=c),
                          ["row_indices", "5", "[0, 3)", "rows"]),
}


@pytest.mark.parametrize("check", [False, None], ids=["check_invariants=False", "default"])
@pytest.mark.parametrize("builder", list(BUILDERS))
@pytest.mark.parametrize("case", list(BAD))
def test_bad_indices_raise_value_error(case, builder, check):
    factory, words = BAD[case]
    try:
        bad = factory(check)
    except RuntimeError:
        pytest.skip("torch itself refuses this tensor at construction")
    good = make_masked(tuple(bad.shape), bad.layout if bad.layout != torch.sparse_csc
                       else torch.sparse_coo)[0]
    for data, mask, what in ((bad, _mask_of(bad), "data"),):
        with pytest.raises(ValueError) as info:
            BUILDERS[builder](data, mask)
        message = str(info.value)
        assert message.startswith(f"{builder}:"), message
        assert what in message
        for word in words:
            assert word in message, (word, message)
    assert good is not None


def test_bad_mask_is_named():
    data = _coo([[0, 1], [0, 1]], (2, 2), True)
    mask = _mask_of(_coo([[0, 2], [0, 1]], (2, 2)))
    with pytest.raises(ValueError, match="mask's indices"):
        ms.masked_tensor(data, mask)


def test_valid_inputs_still_build():
    for layout in (torch.sparse_coo, torch.sparse_csr):
        mt, data, mask = make_masked((4, 5), layout)
        assert torch.equal(mt.to_dense().get_mask(), mask)
    empty = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (2, 2))
    ms.masked_tensor(empty, empty.bool())
    uncoalesced = _coo([[1, 0, 1], [0, 0, 0]], (2, 2), True)
    assert float(ms.masked_tensor(uncoalesced, _mask_of(uncoalesced)).sum().to_tensor(0)) == 6


def test_coo_with_a_negative_index_raises_instead_of_aborting():
    # In a fresh process: an invalid COO index must raise, not end in "double free or
    # corruption".
    code = (
        "import torch, masked_sparse as ms\n"
        "i = torch.tensor([[0, -1], [0, 1]])\n"
        "d = torch.sparse_coo_tensor(i, torch.tensor([1., 2.]), (2, 2), check_invariants=False)\n"
        "m = torch.sparse_coo_tensor(i, torch.tensor([True, True]), (2, 2),"
        " check_invariants=False)\n"
        "try:\n"
        "    mt = ms.masked_tensor(d, m)\n"
        "    mt.sum(1); mt.to_tensor(0).to_dense()\n"
        "except ValueError as e:\n"
        "    print('ValueError', e)\n")
    import os
    import pathlib
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(ms.__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ValueError masked_tensor:")
