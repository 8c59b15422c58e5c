"""Masking by a data condition: ``ms.masked_invalid`` and ``ms.masked_where`` against
``numpy.ma.masked_invalid`` / ``numpy.ma.masked_where`` in every layout (the storage and
its index kept), their gradients and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    make_masked,
    make_masked_in,
    where0,
)

import masked_sparse as ms


def _np_ma(data, mask):
    return np.ma.array(data.double().numpy(), mask=~mask.numpy())


def _assert_ma_equal(got, ref: np.ma.MaskedArray):
    """``got`` specifies exactly ``ref``'s unmasked elements and agrees with it there."""
    want_mask = torch.from_numpy(~np.ma.getmaskarray(ref))
    want = torch.from_numpy(ref.filled(0.0))
    assert_masked_equal(got, want.to(got.dtype), want_mask)


def _invalid_data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g)
    r = torch.rand(shape, generator=g)
    data[r < 0.15] = float("nan")
    data[(r >= 0.15) & (r < 0.25)] = float("inf")
    data[(r >= 0.25) & (r < 0.3)] = -float("inf")
    return data


def _kept_storage(out, mt):
    assert out.layout == mt.layout
    assert len(out._storage.index) == len(mt._storage.index)
    assert all(a is b for a, b in zip(out._storage.index, mt._storage.index))


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_masked_invalid_matches_numpy_ma(layout):
    data = _invalid_data((5, 6), 0)
    mt, data, mask = make_masked_in((5, 6), layout, data=data)
    out = ms.masked_invalid(mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, np.ma.masked_invalid(_np_ma(data, mask)))


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_masked_invalid_of_a_plain_tensor(layout):
    data = _invalid_data((4, 6), 1)
    plain = data if layout == torch.strided else (
        data.to_sparse_bsr((1, 1)) if layout == torch.sparse_bsr else data.to_sparse(layout=layout))
    out = ms.masked_invalid(plain)
    assert out.layout == layout
    _assert_ma_equal(out, np.ma.masked_invalid(data.double().numpy()))
    assert ms.masked_invalid(torch.arange(3)).get_mask().all()  # integers: nothing invalid


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
@pytest.mark.parametrize("cond_kind", ["plain", "plain_row", "plain_sparse", "masked"])
def test_masked_where_matches_numpy_ma(layout, cond_kind):
    mt, data, mask = make_masked_in((5, 6), layout, seed=2)
    g = torch.Generator().manual_seed(3)
    if cond_kind == "plain":
        cond = torch.rand(5, 6, generator=g) < 0.4
        ref = np.ma.masked_where(cond.numpy(), _np_ma(data, mask))
    elif cond_kind == "plain_row":  # broadcast over rows
        cond = torch.rand(6, generator=g) < 0.4
        ref = np.ma.masked_where(np.broadcast_to(cond.numpy(), (5, 6)), _np_ma(data, mask))
    elif cond_kind == "plain_sparse":
        dense_cond = torch.rand(5, 6, generator=g) < 0.4
        cond = dense_cond.to_sparse_coo()
        ref = np.ma.masked_where(dense_cond.numpy(), _np_ma(data, mask))
    else:  # mt > 0.5: where the condition is unspecified, the element is unspecified
        cm = torch.rand(5, 6, generator=g) < 0.8
        cond_mt = ms.masked_tensor(where0(data, mask) > 0.5, cm)
        cond = cond_mt if layout == torch.strided else ms.to_layout(cond_mt, "sparse_coo")
        c = np.ma.array((data > 0.5).numpy(), mask=~cm.numpy())
        ref = np.ma.masked_where(c.filled(True), _np_ma(data, mask))
    out = ms.masked_where(cond, mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, ref)


def test_masked_where_with_its_own_comparison_keeps_sparse():
    mt, data, mask = make_masked((6, 7), torch.sparse_csr, seed=4)
    out = ms.masked_where(mt > 0.5, mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, np.ma.masked_where((data > 0.5).numpy(), _np_ma(data, mask)))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_masked_where_and_invalid_are_differentiable(layout):
    data = _invalid_data((4, 5), 5)
    mt, data, mask = make_masked((4, 5), layout, data=data)
    mt.requires_grad_()
    out = ms.masked_where(mt > 1.0, ms.masked_invalid(mt))
    (out * out).sum().backward()
    keep = mask & torch.isfinite(data) & ~(data > 1.0)
    assert_masked_equal(mt.grad, torch.where(keep, 2 * data, 0.0), mask)


def test_masked_where_errors_name_the_op():
    x = torch.ones(2, 3)
    with pytest.raises(TypeError, match="masked_where: condition must have dtype torch.bool"):
        ms.masked_where(torch.ones(2, 3), x)
    with pytest.raises(ValueError, match="masked_where: condition of shape"):
        ms.masked_where(torch.ones(4, 3, dtype=torch.bool), x)
    assert {"masked_invalid", "masked_where"} <= set(ms.__all__)
