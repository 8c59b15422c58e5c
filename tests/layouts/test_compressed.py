"""The compressed family (``layouts/_compressed.py``): CSC's native reductions, softmax and
shape ops against the strided reference and against CSR on the transposed matrix, on
matrices with empty rows and columns, stored-but-masked rows, +-inf and NaN."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, dense_of, make_masked

import layouts
import masked_sparse as ms
from layouts._reduce_sparse import CompressedGrouping


def _awkward(dtype=torch.float64):
    """``(data, mask, stored)`` 6 x 5: row 2 and column 3 empty, row 4 stored but masked,
    +-inf and NaN among the specified values."""
    g = torch.Generator().manual_seed(0)
    data = torch.randn(6, 5, generator=g, dtype=dtype)
    stored = torch.rand(6, 5, generator=g) < 0.8
    stored[2], stored[:, 3], stored[4] = False, False, True
    mask = stored & (torch.rand(6, 5, generator=g) < 0.8)
    mask[4] = False
    mask[0, 0] = mask[1, 1] = mask[5, 4] = mask[0, 2] = True
    data[0, 0], data[1, 1], data[5, 4], data[0, 2] = math.inf, -math.inf, math.nan, -math.inf
    return data, mask, stored | mask


def _pair(layout):
    """The awkward matrix in ``layout`` and as strided (the reference)."""
    data, mask, stored = _awkward()
    idx = stored.nonzero().t()
    coo = ms.masked_tensor(torch.sparse_coo_tensor(idx, data[stored], data.shape).coalesce(),
                           torch.sparse_coo_tensor(idx, mask[stored], data.shape).coalesce())
    return ms.to_layout(coo, layout), ms.masked_tensor(data, mask)


def _same(got, ref):
    check_invariants(got)
    assert_masked_equal(got, *dense_of(ref))


REDUCTIONS = {
    "sum": lambda t, d, k: torch.sum(t, d, keepdim=k),
    "mean": lambda t, d, k: torch.mean(t, d, keepdim=k),
    "amax": lambda t, d, k: torch.amax(t, d, keepdim=k),
    "amin": lambda t, d, k: torch.amin(t, d, keepdim=k),
    "prod": lambda t, d, k: torch.prod(t, d, keepdim=k),
    "argmax": lambda t, d, k: torch.argmax(t, d, keepdim=k),
    "var": lambda t, d, k: torch.var(t, d, keepdim=k),
    "any": lambda t, d, k: torch.any(t > 0, d, keepdim=k),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_csc_reductions_match_strided_and_csr(name, dim, keepdim):
    fn = REDUCTIONS[name]
    csc, ref = _pair(torch.sparse_csc)
    csr, _ = _pair(torch.sparse_csr)
    got = fn(csc, dim, keepdim)
    _same(got, fn(ref, dim, keepdim))
    if keepdim and name not in ("argmax",):
        assert got.layout == torch.sparse_csc
    # CSR of the transposed matrix along the swapped dim: the same numbers
    swapped = fn(csr.t(), 1 - dim, keepdim)
    assert_masked_equal(got, *dense_of(swapped.t() if keepdim else swapped))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("log", [False, True])
def test_csc_softmax_matches_strided(dim, log):
    csc, ref = _pair(torch.sparse_csc)
    fn = torch.log_softmax if log else torch.softmax
    got = fn(csc, dim)
    assert got.layout == torch.sparse_csc
    assert got._storage.index[0] is csc._storage.index[0]  # the pattern is kept
    _same(got, fn(ref, dim))


def test_csc_full_reductions():
    csc, ref = _pair(torch.sparse_csc)
    for fn in (torch.sum, torch.amax, torch.argmax, torch.mean):
        _same(fn(csc), fn(ref))


def test_csc_groupings_are_native():
    csc, _ = _pair(torch.sparse_csc)
    for dims in ((0,), (1,), (0, 1)):
        g = layouts.group_by(csc._storage, dims, False)
        assert isinstance(g, CompressedGrouping)  # never through the COO form
        assert g.source is csc._storage
    assert layouts.group_by(csc._storage, (0,), False).by_lines


@pytest.mark.parametrize("op", [
    lambda t: t[:, 1:4], lambda t: t[:, ::2], lambda t: t[1:5], lambda t: t[:, 2],
    lambda t: t[3], lambda t: t.index_select(1, torch.tensor([4, 0, 0])),
    lambda t: t.index_select(0, torch.tensor([5, 2])), lambda t: t.t(),
    lambda t: t.transpose(0, 1).t(), lambda t: t.narrow(1, 1, 2)])
def test_csc_shape_ops_match_strided(op):
    csc, ref = _pair(torch.sparse_csc)
    got = op(csc)
    _same(got, op(ref))
    if got.dim() == 2:
        assert got.layout == torch.sparse_csc


def test_csc_empty_matrix():
    mt = ms.to_layout(ms.masked_tensor(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool)),
                      torch.sparse_csc)
    check_invariants(mt, torch.sparse_csc)
    for dim in (0, 1):
        out = torch.sum(mt, dim)
        assert out.shape == (3,) if dim == 0 else (0,)
        assert not dense_of(out)[1].any()
    assert mt.softmax(0).shape == (0, 3)


@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr", "sparse_csc",
                                  "sparse_bsr"])
def test_a_copy_of_each_layout_is_a_working_layout(name):
    import dataclasses

    original = layouts.get_layout(name)
    copy = layouts.register_layout(dataclasses.replace(original, name=f"{name}_copy",
                                                       torch_layout=None))
    try:
        options = {"blocksize": (2, 1)} if name == "sparse_bsr" else {}
        mt, data, mask = make_masked((4, 6), torch.sparse_coo, seed=3)
        got = ms.to_layout(mt, copy.name, **options)
        assert got._storage.layout is copy
        check_invariants(got)
        assert_masked_equal(got, data, mask)
        outs = [got * 2, got + got, torch.softmax(got, 1), got.exp()]
        if name != "sparse_bsr":  # BSR has no shape kernels
            outs.append(got.t().t())
        for out in outs:
            assert out._storage.layout is copy
            check_invariants(out)
        assert_masked_equal(got * 2 + got, data * 3, mask)
        assert_masked_equal(ms.to_layout(got, original, **options), data, mask)
        back = ms.to_layout(ms.to_layout(got, "sparse_coo"), copy, **options)
        assert back._storage.layout is copy
        assert_masked_equal(torch.sum(got, 1), *dense_of(torch.sum(mt, 1)))
    finally:
        layouts.unregister_layout(copy)


# -- reduction paths: every grouping strategy against the strided reference --------------
def _wide(shape, seed):
    """A sparse COO masked tensor with ±inf, NaN, empty and all-masked rows."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g, dtype=torch.float64)
    stored = torch.rand(shape, generator=g) < 0.3
    mask = stored & (torch.rand(shape, generator=g) < 0.7)
    stored[1] = False
    mask[1] = mask[2] = False
    flat = data.view(-1)
    flat[:3] = torch.tensor([math.inf, -math.inf, math.nan])
    stored.view(-1)[:3] = mask.view(-1)[:3] = True
    idx = stored.nonzero().t()
    mt = ms.masked_tensor(torch.sparse_coo_tensor(idx, data[stored], shape).coalesce(),
                          torch.sparse_coo_tensor(idx, mask[stored], shape).coalesce())
    return mt, ms.masked_tensor(data, mask)


@pytest.mark.parametrize("shape, dim", [
    ((5, 7, 3), (0, 2)),     # kept dim 1 not leading, small key space: one scatter into slots
    ((4, 3000, 2), (0, 2)),  # kept key space >> nnz: sorted unique
    ((5, 7, 3), (2,)),       # kept dims lead: ordered storage, no sort
    ((5, 7, 3), (1,)),       # two kept dims, linearized keys
])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "var", "argmax", "any"])
def test_coo_grouping_strategies_match_strided(shape, dim, name):
    mt, ref = _wide(shape, seed=len(shape) + dim[0])
    fn = REDUCTIONS[name]
    d = dim if name != "argmax" else dim[0]
    for keepdim in (False, True):
        _same(fn(mt, d, keepdim), fn(ref, d, keepdim))
    if name in ("sum", "amax"):
        _same(torch.softmax(mt, dim[0]), torch.softmax(ref, dim[0]))


def test_expanded_rows_are_computed_once_per_crow_object():
    from layouts._index import rows_from_crow

    csr, _ = _pair(torch.sparse_csr)
    crow, col = csr._storage.index
    first = rows_from_crow(crow, col.numel())
    assert rows_from_crow(crow, col.numel()) is first
    assert rows_from_crow(crow.clone(), col.numel()) is not first
    with torch.inference_mode():  # inference tensors are never cached
        fresh = torch.tensor([0, 2, 3])
        rows_from_crow(fresh)
    x = torch.ones(3, requires_grad=True)
    (x[rows_from_crow(fresh)] * 2).sum().backward()  # usable with autograd afterwards
    assert x.grad.tolist() == [4.0, 2.0, 0.0]  # rows [0, 0, 1]


def test_counts_are_shared_between_sum_and_its_result_mask():
    csr, ref = _pair(torch.sparse_csr)
    g = layouts.group_by(csr._storage, (1,), False)
    m = csr._storage.mask
    assert g.reduce(m, "sum") is g.reduce(m, "sum")
    assert torch.equal(g.reduce(m, "any"), g.reduce(m, "sum") > 0)
    assert torch.equal(g.reduce(m, "all"), g.reduce(m, "sum") == g.lengths)


# -- reductions along lines: torch's CSR sum, int32 cumsum counts, COO via row pointers ----
LINE_REDUCTIONS = dict(REDUCTIONS, count_nonzero=lambda t, d, k: torch.count_nonzero(t, d))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(LINE_REDUCTIONS))
def test_2d_reductions_along_each_dim_match_strided(layout, dtype, name):
    """Row and column reductions of matrices with an empty row, an all-masked row, ±inf and
    NaN; 2-D COO row reductions run on row pointers like CSR."""
    mt, ref = _wide((6, 9), seed=3)
    if dtype == torch.int64 and name in ("mean", "var"):
        return
    mt, ref = ms.to_layout(mt.to(dtype), layout), ref.to(dtype)
    if dtype == torch.int64:  # ±inf / NaN do not survive the cast; use nonzero integers
        mt, ref = mt * 3 + 1, ref * 3 + 1
    fn = LINE_REDUCTIONS[name]
    for dim in (0, 1):
        for keepdim in (False, True) if name != "count_nonzero" else (False,):
            _same(fn(mt, dim, keepdim), fn(ref, dim, keepdim))
    if layout == torch.sparse_coo:
        g = layouts.group_by(mt._storage, (1,), False)
        assert isinstance(g, CompressedGrouping) and g.by_lines


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc])
def test_line_sums_with_and_without_autograd_agree(layout):
    """A float sum along the lines is torch's CSR sum without autograd and segment_reduce
    with it: the same values, and gradients through the latter."""
    mt, ref = _wide((7, 5), seed=4)
    mt = ms.to_layout(mt, layout)
    inner = 1 if layout != torch.sparse_csc else 0
    with torch.no_grad():
        plain = torch.sum(mt, inner)
    x = mt.detach().requires_grad_()
    tracked = torch.sum(x, inner)
    _same(plain, torch.sum(ref, inner))
    _same(tracked.detach(), torch.sum(ref, inner))
    tracked.sum().backward()  # d(total)/d(value) is 1 wherever specified
    g = x.grad._storage
    mask = g.densify(g.mask, False)
    assert torch.equal(mask, ref.get_mask())
    assert bool((g.densify(g.values, 0)[mask] == 1).all())


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc])
def test_line_reductions_of_empty_matrix(layout):
    empty = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0),
                                    (3, 4)).coalesce()
    mask = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long),
                                   torch.zeros(0, dtype=torch.bool), (3, 4)).coalesce()
    mt = ms.to_layout(ms.masked_tensor(empty, mask), layout)
    ref = ms.masked_tensor(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool))
    for dim in (0, 1):
        for name in ("sum", "mean", "amax", "count_nonzero"):
            _same(LINE_REDUCTIONS[name](mt, dim, False), LINE_REDUCTIONS[name](ref, dim, False))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_key_slots_are_cached_per_index_and_any_agrees_with_counts(layout):
    mt, _ = _wide((6, 9), seed=5)
    s = ms.to_layout(mt, layout)._storage
    first, second = layouts.group_by(s, (0,), False), layouts.group_by(s, (0,), False)
    assert first._present is not None and first._present is second._present
    m = s.mask
    fast = first.reduce(m, "any")  # uint8 amax scatter: nothing counted yet
    assert torch.equal(fast, first.reduce(m, "sum") > 0)
    assert torch.equal(first.reduce(m, "any"), fast)  # now from the shared count


def test_tall_coo_row_reductions_build_no_row_pointers():
    """Row pointers are O(rows): a COO matrix with far more rows than entries groups its
    coordinates instead (and still reduces exactly)."""
    idx = torch.tensor([[3, 3, 900_000], [0, 2, 1]])
    data = torch.sparse_coo_tensor(idx, torch.tensor([1.0, math.inf, 2.0]), (10**6, 3))
    mask = torch.sparse_coo_tensor(idx, torch.tensor([True, False, True]), (10**6, 3))
    mt = ms.masked_tensor(data.coalesce(), mask.coalesce())
    assert not isinstance(layouts.group_by(mt._storage, (1,), False), CompressedGrouping)
    out = torch.sum(mt, 1)._storage
    assert out.index[0].tolist() == [[3, 900_000]]
    assert out.values.tolist() == [1.0, 2.0] and out.mask.tolist() == [True, True]
