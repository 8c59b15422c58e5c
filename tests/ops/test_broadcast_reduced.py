"""A reduced operand broadcast back onto its full-shape source.

``mt / mt.sum(1, keepdim=True)``, ``mt - mt.mean(0, keepdim=True)``, ... read the reduced
operand by the row or column coordinate the full operand already stores (``layouts.
read_broadcast``, Note [Reading a reduced operand]): no search, no sort. Checked on every
sparse layout, dims 0 and 1, against the dense computation with ``torch.where``, with
gradients, and with fully masked lines (the reduced operand is unspecified there).
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, make_masked

import layouts
import masked_sparse as ms

CONVERT = sys.modules["layouts.convert"]  # ``layouts.convert`` is also a function

SPARSE = ["sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
TORCH_LAYOUT = {"sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr,
                "sparse_csc": torch.sparse_csc, "sparse_bsr": torch.sparse_bsr}


def masked(layout, seed=0, shape=(6, 8), empty=True):
    """A sparse MaskedTensor with one fully masked row and column (``empty``; else every
    line holds a specified element), and its dense form."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < 0.6
    if empty:
        mask[2] = False
        mask[:, 5] = False
    else:
        mask |= torch.eye(*shape, dtype=torch.bool)
        mask[:, shape[0]:] |= torch.eye(shape[0], shape[1] - shape[0], dtype=torch.bool)
    mt, data, mask = make_masked(shape, torch.sparse_coo, torch.float64, seed=seed, mask=mask)
    return ms.to_layout(mt, layout), data, mask


def zeroed(d, m):
    return torch.where(m, d, torch.zeros((), dtype=d.dtype))


# (masked expression, dense reference) for a reduction over ``dim`` read back onto the rows
# or columns: the reference divides by the count of specified elements, as ``mean`` does.
EXPRS = {
    "div_sum": (lambda m, dim: m / m.sum(dim, keepdim=True),
                lambda d, m, dim: d / zeroed(d, m).sum(dim, keepdim=True)),
    "sub_mean": (lambda m, dim: m - m.mean(dim, keepdim=True),
                 lambda d, m, dim: d - zeroed(d, m).sum(dim, keepdim=True)
                 / m.sum(dim, keepdim=True).clamp(min=1)),
    "mul_amax": (lambda m, dim: m * m.amax(dim, keepdim=True),
                 lambda d, m, dim: d * torch.where(m, d, -torch.inf).amax(dim, keepdim=True)),
    "sum_first": (lambda m, dim: m.sum(dim, keepdim=True) - m,
                  lambda d, m, dim: zeroed(d, m).sum(dim, keepdim=True) - d),
}


@pytest.mark.parametrize("layout", SPARSE)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("expr", sorted(EXPRS))
@pytest.mark.parametrize("empty", [True, False], ids=["empty_lines", "no_empty_line"])
def test_matches_the_dense_reference(layout, dim, expr, empty):
    mt, data, mask = masked(layout, seed=dim, empty=empty)
    assert bool((~mask.any(dim)).any()) == empty
    fn, ref = EXPRS[expr]
    out = fn(mt, dim)
    check_invariants(out, TORCH_LAYOUT[layout])
    assert_masked_equal(out, ref(data, mask, dim), mask)
    assert all(a is b for a, b in zip(out._storage.index, mt._storage.index))


@pytest.mark.parametrize("layout", SPARSE)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("expr", ["div_sum", "sub_mean"])
@pytest.mark.parametrize("empty", [True, False], ids=["empty_lines", "no_empty_line"])
def test_gradients_match_the_dense_reference(layout, dim, expr, empty):
    mt, data, mask = masked(layout, seed=3 + dim, empty=empty)
    mt.requires_grad_()
    fn, ref = EXPRS[expr]
    w = torch.rand(mt.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (fn(mt, dim) ** 2 * w).sum().backward()
    x = data.clone().requires_grad_()
    torch.where(mask, ref(x, mask, dim) ** 2 * w, 0).sum().backward()
    assert mt.grad.layout == TORCH_LAYOUT[layout]
    assert_masked_equal(mt.grad, x.grad, mask)


@pytest.mark.parametrize("layout", SPARSE)
@pytest.mark.parametrize("dim", [0, 1])
def test_reads_by_coordinate_without_search_or_sort(layout, dim, monkeypatch):
    mt, data, mask = masked(layout, seed=7)
    reduced = mt.sum(dim, keepdim=True)

    def refuse(*args, **kwargs):
        raise AssertionError("a keyed lookup (search) was used")

    monkeypatch.setattr(CONVERT, "lookup", refuse)
    values, got_mask = layouts.read_broadcast(reduced._storage, mt._storage)
    assert values.shape == mt._storage.values.shape
    out = mt / reduced
    assert_masked_equal(out, data / zeroed(data, mask).sum(dim, keepdim=True), mask)


@pytest.mark.parametrize("layout", SPARSE)
def test_a_larger_sparse_operand_still_takes_the_keyed_lookup(layout):
    # A (1, n) operand of a (4, n) matrix with fewer stored values than its dense size.
    full = torch.zeros(4, 8, dtype=torch.float64)
    full_mask = torch.zeros(4, 8, dtype=torch.bool)
    full_mask[0, 0] = full_mask[2, 4] = True
    full[full_mask] = torch.tensor([2.0, 3.0], dtype=torch.float64)
    big = ms.to_layout(ms.masked_tensor(full.to_sparse_coo(), full_mask.to_sparse_coo()),
                       layout)
    row = torch.arange(1.0, 9.0, dtype=torch.float64)[None]
    small = ms.masked_tensor(row.to_sparse_coo(), torch.ones(1, 8, dtype=torch.bool)
                             .to_sparse_coo())
    assert_masked_equal(big * small, full * row, full_mask)


@pytest.mark.parametrize("layout", ["sparse_csr", "sparse_csc", "sparse_bsr"])
@pytest.mark.parametrize("shape", [(6, 8), (8, 1), (1, 8)])
def test_compressed_densify_equals_torch_to_dense_with_gradient(layout, shape):
    # The densified keepdim reduction read back (Note [Reading a reduced operand]): one
    # scatter by flat position for CSR / CSC, index_put for blocks; torch's to_dense and
    # its gradient are the reference.
    if layout == "sparse_bsr" and shape != (6, 8):
        pytest.skip("2x2 blocks need even sizes")
    g = torch.Generator().manual_seed(7)
    data = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) < 0.6
    mt = ms.to_layout(ms.masked_tensor(data, mask), layout)
    s = mt._storage
    values = s.values.detach().requires_grad_()
    got = s.layout.densify(s.with_values(values), values, -3.0)
    want_mask = s.layout.densify(s, s.mask, False)
    stored = s.layout.to_torch(s, values).to_dense()
    present = s.layout.to_torch(s, torch.ones_like(values)).to_dense().bool()
    torch.testing.assert_close(got, torch.where(present, stored, -3.0))
    assert torch.equal(want_mask, torch.where(present, s.layout.to_torch(s, s.mask.double())
                                              .to_dense().bool(), False))
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((got * w).sum(), values)
    (ref,) = torch.autograd.grad((torch.where(present, stored, 0) * w).sum(), values)
    torch.testing.assert_close(grad, ref)
