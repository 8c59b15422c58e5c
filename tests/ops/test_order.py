"""sort, argsort, msort, topk and kthvalue on every layout, against a reference that sorts
each line's specified elements alone (a Python loop over lines with torch.sort)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import check_invariants, dense_of, make_masked
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ALL = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
DTYPES = [torch.float32, torch.float64, torch.int64]


def masked(shape, layout, dtype=torch.float64, seed=0, **kw):
    base = torch.sparse_coo if layout != "strided" else torch.strided
    mt, data, mask = make_masked(shape, base, dtype=dtype, seed=seed, **kw)
    return ms.to_layout(mt, layout), data, mask


def reference(data, mask, dim, descending, k=None):
    """Per line: the specified values sorted (stable), their input positions, then nothing."""
    d, m = data.movedim(dim, -1), mask.movedim(dim, -1)
    width = d.shape[-1] if k is None else k
    values = torch.zeros(d.shape[:-1] + (width,), dtype=d.dtype)
    specified = torch.zeros(values.shape, dtype=torch.bool)
    positions = torch.zeros(values.shape, dtype=torch.long)
    for line in itertools.product(*map(range, d.shape[:-1])):
        where = m[line].nonzero().squeeze(1)
        sv, si = torch.sort(d[line][where], descending=descending, stable=True)
        n = min(width, where.numel())
        values[line][:n], specified[line][:n], positions[line][:n] = sv[:n], True, where[si][:n]
    return values.movedim(-1, dim), specified.movedim(-1, dim), positions.movedim(-1, dim)


def assert_matches(out, values, specified):
    got, got_mask = dense_of(out)
    assert torch.equal(got_mask, specified)
    zero = torch.zeros((), dtype=values.dtype)
    torch.testing.assert_close(torch.where(got_mask, got, zero),
                               torch.where(specified, values, zero), equal_nan=True)


def check_sort(mt, data, mask, dim, descending, k=None):
    if k is None:
        out = torch.sort(mt, dim, descending=descending)
    else:
        out = torch.topk(mt, k, dim, largest=descending)
    values, idx = out
    check_invariants(values)
    check_invariants(idx)
    assert values.layout == idx.layout
    assert idx._storage.mask is values._storage.mask
    ref_v, ref_m, ref_i = reference(data, mask, dim, descending, k)
    assert_matches(values, ref_v, ref_m)
    assert_matches(idx, ref_i, ref_m)
    return values


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_sort_and_topk(layout, dtype, descending, dim):
    mt, data, mask = masked((5, 6), layout, dtype, seed=1)
    out = check_sort(mt, data, mask, dim, descending)
    if layout != "strided":  # Note [Sorted layout]: same layout, same number stored
        assert out.layout == mt.layout
        assert out._storage.mask.numel() == mt._storage.mask.numel()
    for k in (0, 1, 3, mt.shape[dim]):
        check_sort(mt, data, mask, dim, descending, k)


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_nan_inf_and_fully_masked_lines(layout, descending, dtype):
    data = torch.tensor([[1., math.inf, 2., 2., -math.inf, math.nan],
                         [math.nan, 1., 3., 1., 3., 1.],
                         [-math.inf, math.nan, 5., -math.inf, 1., 1.],
                         [-0.0, 0.0, 7., 0.0, -0.0, 7.]], dtype=dtype)
    mask = torch.tensor([[True, False, True, True, True, True],
                         [True, True, False, True, True, False],
                         [True, False, True, True, False, True],
                         [True] * 6])
    mt, _, _ = masked(data.shape, layout, dtype, data=data, mask=mask)
    for dim in (0, 1):
        check_sort(mt, data, mask, dim, descending)
        for k in (1, 2, 3):
            check_sort(mt, data, mask, dim, descending, k)
    mt, _, _ = masked(data.shape, layout, dtype, data=data, mask=mask & False)
    check_sort(mt, data, mask & False, 1, descending, 2)  # every line fully masked


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue(layout, dtype, keepdim):
    mt, data, mask = masked((5, 6), layout, dtype, seed=2)
    for dim in (0, 1):
        ref_v, ref_m, ref_i = reference(data, mask, dim, False)
        for k in range(1, mt.shape[dim] + 1):
            values, idx = torch.kthvalue(mt, k, dim, keepdim=keepdim)
            check_invariants(values)
            pick = [slice(None)] * 2
            pick[dim] = slice(k - 1, k) if keepdim else k - 1
            assert_matches(values, ref_v[tuple(pick)], ref_m[tuple(pick)])
            assert_matches(idx, ref_i[tuple(pick)], ref_m[tuple(pick)])


@pytest.mark.parametrize("layout", ALL)
def test_argsort_msort_and_methods(layout):
    mt, data, mask = masked((4, 5), layout, seed=3)
    ref_v, ref_m, ref_i = reference(data, mask, 0, False)
    assert_matches(torch.msort(mt), ref_v, ref_m)
    assert_matches(mt.argsort(0), ref_i, ref_m)
    ref_v, ref_m, ref_i = reference(data, mask, 1, True)
    assert_matches(torch.argsort(mt, dim=-1, descending=True, stable=True), ref_i, ref_m)
    assert_matches(mt.sort(stable=True, descending=True).values, ref_v, ref_m)
    assert_matches(mt.topk(2).indices, ref_i[:, :2], ref_m[:, :2])


def test_sort_of_3d_coo_along_a_middle_dim_stays_coalesced():
    mt, data, mask = masked((3, 4, 5), "sparse_coo", seed=4)
    for dim in range(3):
        for descending in (False, True):
            check_sort(mt, data, mask, dim, descending)
            check_sort(mt, data, mask, dim, descending, 2)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo", "sparse_csr"])
def test_gradient_flows_to_the_sorted_elements(layout):
    mt, data, mask = masked((4, 5), layout, seed=5)
    mt.requires_grad_()
    w = torch.rand(4, 3, dtype=torch.float64)
    values = torch.topk(mt, 3, 1).values
    (values.to_dense().to_tensor(0) * w).sum().backward()
    ref_v, ref_m, ref_i = reference(data, mask, 1, True, 3)
    expected = torch.zeros_like(data).scatter_add(1, ref_i, torch.where(ref_m, w, 0))
    got, got_mask = dense_of(mt.grad)
    assert torch.equal(got_mask, mask)
    torch.testing.assert_close(torch.where(mask, got, 0), expected)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo"])
def test_bad_arguments(layout):
    mt, _, _ = masked((3, 4), layout)
    with pytest.raises(ValueError, match=r"topk\(\): k=5 is out of range"):
        torch.topk(mt, 5, 1)
    with pytest.raises(ValueError, match=r"kthvalue\(\): k=0 is out of range"):
        torch.kthvalue(mt, 0, 1)
    with pytest.raises(IndexError):
        torch.sort(mt, 2)
    with pytest.raises(TypeError, match="out= is not supported"):
        torch.sort(mt, out=(torch.empty(3, 4), torch.empty(3, 4, dtype=torch.long)))


def test_hybrid_sort_along_a_sparse_dim_is_refused():
    data = torch.rand(3, 4, 2)
    mask = torch.rand(3, 4, 2) > 0.3
    idx = torch.tensor([[0, 2], [1, 3]])
    mt = ms.masked_tensor(torch.sparse_coo_tensor(idx, data[idx[0], idx[1]], (3, 4, 2)),
                          torch.sparse_coo_tensor(idx, mask[idx[0], idx[1]], (3, 4, 2)))
    with pytest.raises(NotImplementedError, match="sort along sparse dim 0 of a hybrid"):
        torch.sort(mt, 0)
    torch.sort(mt, 2)  # along the dense dim: fine


@st.composite
def cases(draw):
    layout = draw(st.sampled_from(ALL))
    ndim = 2 if layout in ("sparse_csr", "sparse_csc", "sparse_bsr") else draw(
        st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    dim = draw(st.integers(0, ndim - 1))
    return (layout, shape, dim, draw(st.integers(0, shape[dim])), draw(st.booleans()),
            draw(st.floats(0, 1)), draw(st.integers(0, 2**16)))


@given(cases(), st.sampled_from([torch.float32, torch.int64]))
def test_random_shapes_and_masks(case, dtype):
    layout, shape, dim, k, descending, density, seed = case
    mt, data, mask = masked(shape, layout, dtype, seed=seed, density=density)
    check_sort(mt, data, mask, dim, descending)
    check_sort(mt, data, mask, dim, descending, k)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_lines_of_very_different_lengths(layout):
    # one long line and many short ones: the padded blocks are bucketed by length
    mask = torch.zeros(60, 1200, dtype=torch.bool)
    g = torch.Generator().manual_seed(7)
    mask[0] = torch.rand(1200, generator=g) < 0.9
    mask[1:, :6] = torch.rand(59, 6, generator=g) < 0.6
    mt, data, mask = masked(mask.shape, layout, torch.float32, seed=7, mask=mask,
                            stored_masked=0.001)
    for descending in (False, True):
        check_sort(mt, data, mask, 1, descending)
        check_sort(mt, data, mask, 1, descending, 4)
