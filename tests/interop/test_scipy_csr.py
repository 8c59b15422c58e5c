"""``ms.to_scipy`` of a CSR MaskedTensor builds scipy's CSR directly (no COO form): equal to
scipy's CSR of the specified entries, for every dtype, array and matrix forms, nothing
specified and empty matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    assert_masked_equal,
    dense_of,
    make_masked,
    where0,
)

import masked_sparse as ms


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("matrix", [False, True])
def test_to_scipy_csr_equals_scipy_of_the_specified_entries(dtype, matrix):
    import scipy.sparse as sp

    mask = torch.rand(7, 9, generator=torch.Generator().manual_seed(8)) < 0.5
    mask[2] = False  # a row with stored (stored_masked) but no specified entries
    mt, data, mask = make_masked((7, 9), torch.sparse_csr, dtype=dtype, seed=7, mask=mask)
    got = ms.to_scipy(mt, "csr", matrix=matrix)
    assert got.format == "csr" and isinstance(got, sp.csr_matrix if matrix else sp.csr_array)
    d, m = dense_of(mt)
    rows, cols = m.nonzero(as_tuple=True)
    ref = sp.csr_array((d[m].numpy(), (rows.numpy(), cols.numpy())), shape=(7, 9))
    assert got.nnz == int(m.sum())  # specified zeros stored, masked-out entries dropped
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.data, ref.data)
    got.check_format(full_check=True)
    back = ms.from_scipy(got)
    assert_masked_equal(back.to_dense(), torch.where(m, d, torch.zeros((), dtype=dtype)), m)


def test_to_scipy_csr_of_nothing_specified_and_of_an_empty_matrix():
    for shape, density in (((4, 5), 0.0), ((0, 3), 0.5), ((3, 0), 0.5)):
        mt, _, _ = make_masked(shape, torch.sparse_csr, density=density, stored_masked=0.5)
        got = ms.to_scipy(mt)
        assert got.shape == shape and got.nnz == 0
        np.testing.assert_array_equal(got.indptr, np.zeros(shape[0] + 1))


def test_to_scipy_csr_takes_no_coo_form(monkeypatch):
    import masked_sparse.interop.scipy as scipy_interop

    def refuse(*_):
        raise AssertionError("to_scipy(csr) of a CSR tensor went through its COO form")

    mt, data, mask = make_masked((6, 8), torch.sparse_csr, dtype=torch.float64, seed=9)
    monkeypatch.setattr(scipy_interop, "_specified_coo", refuse)
    got = ms.to_scipy(mt)
    np.testing.assert_array_equal(got.toarray(), where0(data, mask).numpy())
    assert got.nnz == int(mask.sum())
