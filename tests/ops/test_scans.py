"""Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) on every layout against the
dense reference: the torch op on the data with unspecified elements set to its identity."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, cpu_only, make_masked
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ALL = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
SCANS = ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"]
DIFFERENTIABLE = ["cumsum", "cumprod", "logcumsumexp"]


def masked(shape, layout, dtype=torch.float64, seed=0, **kw):
    base = torch.sparse_coo if layout != "strided" else torch.strided
    mt, data, mask = make_masked(shape, base, dtype=dtype, seed=seed, **kw)
    return ms.to_layout(mt, layout), data, mask


def identity(op, dtype):
    if op == "cumsum":
        return 0
    if op == "cumprod":
        return 1
    low = -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min
    high = math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
    return high if op == "cummin" else low


def reference(op, data, mask, dim):
    """The dense reference: (values, indices or None)."""
    filled = torch.where(mask, data, torch.full((), identity(op, data.dtype), dtype=data.dtype))
    out = getattr(torch, op)(filled, dim)
    return (out.values, out.indices) if op in ("cummax", "cummin") else (out, None)


def check(op, mt, data, mask, dim, layout=None):
    out = getattr(torch, op)(mt, dim)
    values, indices = reference(op, data, mask, dim)
    if indices is not None:
        out, idx = out  # a named tuple, like torch's
        check_invariants(idx, layout)
        assert idx._storage.mask is out._storage.mask
        assert_masked_equal(idx, indices, mask)
    check_invariants(out, layout)
    assert out._storage.mask is mt._storage.mask  # output mask = input mask, shared
    assert all(a is b for a, b in zip(out._storage.index, mt._storage.index)) or layout in (
        torch.sparse_csc, torch.sparse_bsr)
    assert_masked_equal(out, values, mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", SCANS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scan_matches_dense_reference(layout, dtype, op, dim):
    mt, data, mask = masked((5, 6), layout, dtype, seed=1)
    check(op, mt, data, mask, dim, mt.layout)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo"])
@pytest.mark.parametrize("op", ["cumsum", "cummax", "cummin", "cumprod"])
def test_int_scans(layout, op):
    mt, data, mask = masked((4, 3, 5), layout, torch.int64, seed=2)
    for dim in range(3):
        check(op, mt, data, mask, dim)
    if op == "cumsum":  # int32 -> int64, as torch
        assert torch.cumsum(mt.to(torch.int32), 0).dtype == torch.int64


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("op", SCANS)
def test_inf_nan_ties_and_fully_masked_lines(layout, op):
    data = torch.tensor([[1., math.inf, 2., 2., -math.inf, 0.5],
                         [math.nan, 1., 3., 1., 3., 1.],
                         [-math.inf, -math.inf, 5., -math.inf, 1., 1.],
                         [7., 7., 7., 7., 7., 7.]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True, True, True],
                         [True, True, False, True, True, False],
                         [True, False, True, True, False, True],
                         [False] * 6])
    mt, _, _ = masked(data.shape, layout, data=data, mask=mask)
    for dim in (0, 1):
        check(op, mt, data, mask, dim)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("op", ["cumsum", "cummax", "logcumsumexp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lines_of_very_different_lengths(layout, op, dtype):
    # one long line and many short ones: the padded blocks are bucketed by length
    mask = torch.zeros(100, 1500, dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    mask[0] = torch.rand(1500, generator=g) < 0.9
    mask[1:, :6] = torch.rand(99, 6, generator=g) < 0.6
    mt, data, mask = masked(mask.shape, layout, dtype, seed=3, mask=mask, stored_masked=0.0)
    check(op, mt, data, mask, 1)


def test_hybrid_coo_scans_along_sparse_and_dense_dims():
    mt, data, mask = masked((4, 5, 3), "sparse_coo", seed=4)
    hybrid = mt.to_dense().to_sparse_coo()  # fully sparse; build a hybrid by hand
    dense_mask = mask.any(2)
    s = hybrid._storage
    indices = dense_mask.nonzero().t()
    hyb = ms.masked_tensor(torch.sparse_coo_tensor(indices, data[dense_mask], data.shape),
                           torch.sparse_coo_tensor(indices, mask[dense_mask], data.shape))
    assert hyb._storage.values.dim() == 2 and s.values.dim() == 1
    for dim in range(3):
        for op in SCANS:
            check(op, hyb, data, mask, dim)


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("op", DIFFERENTIABLE)
@pytest.mark.parametrize("dim", [0, 1])
def test_gradient_matches_dense_reference(layout, op, dim):
    mt, data, mask = masked((4, 6), layout, seed=5, density=0.6)
    mt.requires_grad_()
    w = torch.rand(4, 6, dtype=torch.float64)
    (getattr(torch, op)(mt, dim) * w).sum().backward()
    x = data.clone().requires_grad_()
    filled = torch.where(mask, x, torch.tensor(identity(op, x.dtype), dtype=x.dtype))
    torch.where(mask, getattr(torch, op)(filled, dim) * w, 0).sum().backward()
    assert mt.grad.layout == mt.layout
    assert_masked_equal(mt.grad, x.grad, mask)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo"])
def test_bad_arguments(layout):
    mt, _, _ = masked((3, 4), layout)
    with pytest.raises(IndexError):
        torch.cumsum(mt, 2)
    with pytest.raises(TypeError, match="cumsum.*dim"):
        torch.cumsum(mt, (0, 1))
    with pytest.raises(TypeError, match="out= is not supported"):
        torch.cumsum(mt, 0, out=torch.empty(3, 4))
    assert torch.cumsum(mt, 0, dtype=torch.float32).dtype == torch.float32


@st.composite
def cases(draw):
    layout = draw(st.sampled_from(ALL))
    ndim = 2 if layout in ("sparse_csr", "sparse_csc", "sparse_bsr") else draw(
        st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    return (layout, shape, draw(st.integers(0, ndim - 1)), draw(st.floats(0, 1)),
            draw(st.integers(0, 2**16)))


@given(cases(), st.sampled_from(SCANS))
def test_random_shapes_and_masks(case, op):
    layout, shape, dim, density, seed = case
    mt, data, mask = masked(shape, layout, seed=seed, density=density)
    check(op, mt, data, mask, dim)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "sparse_csc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("dim", [0, 1])
@cpu_only("the native pass, bit for bit with torch's CPU cumsum")
def test_cumsum_is_torch_cumsum_bit_for_bit(monkeypatch, layout, dtype, dim):
    """A cumsum along the stored lines is one native pass (``_native.cumsum_lines``, where
    the kernels are loaded): each line's running sum in double, rounded at every element,
    as torch's CPU cumsum computes it -- the same bits as ``torch.cumsum`` of the dense
    data with unspecified elements 0, with inf and NaN inside lines (which the restarting
    sum declines), long and short lines."""
    import layouts._native as native

    calls = []
    kernel = native.cumsum_lines
    monkeypatch.setattr(native, "cumsum_lines",
                        lambda *a, **kw: calls.append(kernel(*a, **kw)) or calls[-1])
    g = torch.Generator().manual_seed(11)
    data = (torch.randn(40, 300, generator=g) * 1e3).to(dtype)
    data[3, 5], data[7, 11], data[9, 2] = math.inf, math.nan, -math.inf
    mask = torch.rand(40, 300, generator=g) < 0.7
    mask[5] = False  # a fully masked line
    mt, _, _ = masked(data.shape, layout, dtype, data=data, mask=mask, stored_masked=0.2)
    out = torch.cumsum(mt, dim)
    want = torch.cumsum(torch.where(mask, data, torch.zeros((), dtype=dtype)), dim)
    got = out.to_dense().get_data()
    assert torch.equal(got[mask].isnan(), want[mask].isnan())
    ok = ~want[mask].isnan()
    assert torch.equal(got[mask][ok], want[mask][ok])  # bit for bit, not to a tolerance
    if native.available():
        assert calls and all(c is not None for c in calls)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "sparse_csc"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "inf-nan"])
def test_cumsum_lines_never_read_each_other(monkeypatch, layout, dtype, native, specials):
    """A line of huge values, one holding inf, one NaN, then small lines: every line's
    running sum is its own (exact here), by the kernel and by the torch ops that other
    devices and ``MASKED_SPARSE_NATIVE=0`` run (a running sum over all lines, the previous
    line subtracted, lost the small line after a huge one)."""
    import layouts._native as native_module

    if not native:
        monkeypatch.setattr(native_module, "_library", lambda: None)
    big = torch.finfo(dtype).max / 4
    data = torch.tensor([[big, -big / 2, 0.], [1., 2., 3.], [math.inf, 1., 2.],
                         [math.nan, 2., 1.], [1., 1., 1.]], dtype=dtype)
    if not specials:
        data = data[[0, 1, 4]]
    mask = torch.ones(data.shape, dtype=torch.bool)
    mask[-1, 1] = False
    dim = 1
    if layout == "sparse_csc":  # its stored lines are the columns
        data, mask, dim = data.t().contiguous(), mask.t().contiguous(), 0
    mt, _, _ = masked(data.shape, layout, dtype, data=data, mask=mask, stored_masked=0.0)
    got = torch.cumsum(mt, dim).to_dense().get_data()
    want = torch.cumsum(torch.where(mask, data, torch.zeros((), dtype=dtype)), dim)
    got, want = got[mask], want[mask]
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])
