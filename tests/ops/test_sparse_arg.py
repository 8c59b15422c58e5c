"""argmax / argmin / max(dim) / min(dim) along one dim of sparse tensors (COO, CSR, CSC,
a 3-D COO) against the dense reference, on values with many ties, NaN and +-inf, empty and
fully masked rows; and the native arg kernels (Note [Native arg-extremes]) are the path
these take when they apply."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_masked_equal

import layouts._native as native
import masked_sparse as ms

LONG_MAX = torch.iinfo(torch.long).max


def _operand(shape, dtype, layout, seed=0):
    """A masked tensor of ``layout`` with values in {-1, 0, 1, NaN, +-inf} (ties in every
    row), stored-but-masked entries, an empty slice and a stored but fully masked one along
    dim 0; and its dense ``(data, mask)``."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, 7, shape, generator=g)
    data = torch.tensor([-1., 0., 1., 1., math.nan, math.inf, -math.inf], dtype=dtype)[pick]
    stored = torch.rand(shape, generator=g) < 0.7
    mask = stored & (torch.rand(shape, generator=g) < 0.6)
    stored[1], mask[1] = False, False  # an empty slice
    stored[2], mask[2] = True, False  # stored, nothing specified
    idx = stored.nonzero().t()
    coo = ms.masked_tensor(
        torch.sparse_coo_tensor(idx, data[stored], shape).coalesce(),
        torch.sparse_coo_tensor(idx, mask[stored], shape).coalesce())
    return ms.to_layout(coo, layout), data, mask


def _reference(data, mask, dim, kind, keepdim):
    """Per slice along ``dim``: the extreme of the specified elements (NaN wins) and the
    first index reaching it, written densely; which slices have a specified element."""
    fill = -math.inf if kind == "max" else math.inf
    filled = torch.where(mask, data, torch.tensor(fill, dtype=data.dtype))
    top = filled.amax(dim, keepdim=True) if kind == "max" else filled.amin(dim, keepdim=True)
    hit = mask & ((data == top) | (torch.isnan(data) & torch.isnan(top)))
    view = [1] * data.dim()
    view[dim] = data.shape[dim]
    at = torch.where(hit, torch.arange(data.shape[dim]).view(view), LONG_MAX)
    idx, spec = at.amin(dim, keepdim=keepdim), mask.any(dim, keepdim=keepdim)
    # where the extreme is not the fill value, torch's own argmax of the filled tensor agrees
    arg = filled.argmax(dim, keepdim) if kind == "max" else filled.argmin(dim, keepdim)
    top = top if keepdim else top.squeeze(dim)
    plain = spec & (top != fill)
    assert torch.equal(idx[plain], arg[plain])
    return top, idx, spec


CASES = [((6, 9), torch.sparse_coo), ((6, 9), torch.sparse_csr), ((6, 9), torch.sparse_csc),
         ((5, 4, 6), torch.sparse_coo)]


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,layout", CASES, ids=["coo", "csr", "csc", "coo3d"])
def test_arg_extremes_along_each_dim_are_the_dense_reference(shape, layout, dtype, kind):
    mt, data, mask = _operand(shape, dtype, layout)
    arg = torch.argmax if kind == "max" else torch.argmin
    for dim in range(len(shape)):
        for keepdim in (False, True):
            top, idx, spec = _reference(data, mask, dim, kind, keepdim)
            assert_masked_equal(arg(mt, dim, keepdim=keepdim), idx, spec)
            values, indices = getattr(torch, kind)(mt, dim, keepdim=keepdim)
            assert_masked_equal(indices, idx, spec)
            assert_masked_equal(values, top, spec)


@pytest.mark.skipif(not native.available(), reason=f"native kernels: {native.status()}")
@pytest.mark.parametrize("shape,layout", CASES, ids=["coo", "csr", "csc", "coo3d"])
def test_arg_extremes_take_the_native_kernels(shape, layout, monkeypatch):
    """Every dim of every case runs one native arg kernel, with or without autograd (Note
    [Kernel families as ops]), and gives the reference's values and indices both ways."""
    calls = []  # the kernels' results: None where they did not apply

    def counted(kernel):
        return lambda *args: calls.append(kernel(*args)) or calls[-1]

    for name in ("arg_lines", "arg_scatter"):
        monkeypatch.setattr(native, name, counted(getattr(native, name)))
    mt, data, mask = _operand(shape, torch.float32, layout, seed=1)
    for dim in range(len(shape)):
        calls.clear()
        values, indices = torch.max(mt, dim)
        assert len(calls) == 1 and calls[0] is not None
        top, idx, spec = _reference(data, mask, dim, "max", False)
        assert_masked_equal(indices, idx, spec)
        grad = mt.clone().requires_grad_()
        calls.clear()
        composed = torch.max(grad, dim)
        assert len(calls) == 1 and calls[0] is not None  # autograd: the same kernel
        assert composed.values.requires_grad
        assert_masked_equal(composed.indices, idx, spec)
        assert_masked_equal(composed.values.detach(), top, spec)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc])
def test_a_sparse_arg_extreme_over_every_dim_is_the_first_extreme(layout, dtype, kind):
    """argmax() / argmin() of a 2-D sparse MaskedTensor (the row-major layouts' own
    ``masked_arg``, the others' grouping): the row-major position of the first specified
    extreme (NaN first), as the flattened dense reference gives; values that require grad
    (with autograd on and off) give the same index, with no gradient."""
    mt, data, mask = _operand((6, 9), dtype, layout, seed=3)
    nan = mask & torch.isnan(data)
    if nan.any():
        want = int(nan.flatten().nonzero()[0, 0])
    else:
        fill = -math.inf if kind == "max" else math.inf
        filled = torch.where(mask, data, fill).flatten()
        top = filled.max() if kind == "max" else filled.min()
        want = int((mask.flatten() & (filled == top)).nonzero()[0, 0])
    arg = torch.argmax if kind == "max" else torch.argmin
    leaf = mt.clone().requires_grad_()
    for operand, grad in ((mt, True), (leaf, True), (leaf, False)):
        with torch.set_grad_enabled(grad):
            out = arg(operand)
        assert out.shape == () and out.dtype == torch.long and not out.requires_grad
        assert out.get_mask().item() and out.get_data().item() == want


def test_an_int32_csr_gives_the_int64_results():
    """A CSR with int32 indices (positions widened, the column index read as it is)."""
    mt, data, mask = _operand((6, 9), torch.float64, torch.sparse_csr, seed=2)
    crow, col = (i.int() for i in mt._storage.index)
    narrow = ms.masked_tensor(
        torch.sparse_csr_tensor(crow, col, mt._storage.values, mt.shape),
        torch.sparse_csr_tensor(crow, col, mt._storage.mask, mt.shape))
    assert narrow._storage.index[1].dtype == torch.int32
    for dim in (0, 1):
        top, idx, spec = _reference(data, mask, dim, "min", False)
        values, indices = torch.min(narrow, dim)
        assert_masked_equal(indices, idx, spec)
        assert_masked_equal(values, top, spec)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(6, 9), (5, 4, 6), (7,)])
def test_a_strided_arg_extreme_over_every_dim_is_the_first_extreme(shape, dtype, kind,
                                                                    monkeypatch):
    """argmax() / argmin() of a strided MaskedTensor: the first specified extreme in
    row-major order (NaN first), as the flattened dense reference gives; with the native
    kernels, one masked extreme and one scan of the contiguous values (``_native.first``),
    with or without autograd. A transposed (non-contiguous) operand and one with nothing
    specified take the generic route: the same answer, and 0 unspecified."""
    g = torch.Generator().manual_seed(3)
    pick = torch.randint(0, 7, shape, generator=g)
    data = torch.tensor([-1., 0., 1., 1., math.nan, math.inf, -math.inf], dtype=dtype)[pick]
    mask = torch.rand(shape, generator=g) < 0.5
    calls = []
    first = native.first
    monkeypatch.setattr(native, "first", lambda *args: calls.append(first(*args)) or calls[-1])
    arg = torch.argmax if kind == "max" else torch.argmin
    flipped = (data.transpose(0, -1), mask.transpose(0, -1), False)
    for d, m, grad in ((data, mask, False), (data, mask, True), flipped):
        calls.clear()
        mt = ms.masked_tensor(d, m, requires_grad=grad)
        _, idx, spec = _reference(d.reshape(-1), m.reshape(-1), 0, kind, False)
        assert_masked_equal(arg(mt), idx, spec)
        assert len(calls) == (1 if d.is_contiguous() and native.available() else 0)
    nothing = ms.masked_tensor(data, torch.zeros(shape, dtype=torch.bool))
    assert_masked_equal(arg(nothing), torch.tensor(0), torch.tensor(False))
