"""Gradients of reductions on every layout, against the gradient of a brute-force reference
(torch's own op on each group's specified elements), and the "no NaN, input's mask" rules.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_masked
from reduction_refs import hybrid_coo, ref_groups

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

CASES = ["strided", "coo", "csr", "hybrid"]
TORCH_LAYOUT = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
                "hybrid": torch.sparse_coo}

# name -> (masked op(mt, dim), reference on 1-D selected values, min count)
GRAD_OPS = {
    "sum": (lambda mt, d: mt.sum(d), lambda s: s.sum(), 1),
    "mean": (lambda mt, d: torch.mean(mt, d), lambda s: s.mean(), 1),
    "prod": (lambda mt, d: mt.prod() if d is None else mt.prod(d), lambda s: s.prod(), 1),
    "amax": (lambda mt, d: torch.amax(mt, () if d is None else d), lambda s: s.amax(), 1),
    "amin": (lambda mt, d: mt.amin(() if d is None else d), lambda s: s.amin(), 1),
    "norm2": (lambda mt, d: torch.linalg.vector_norm(mt, dim=d),
              lambda s: torch.linalg.vector_norm(s), 1),
    "norm1": (lambda mt, d: mt.norm(1, d), lambda s: torch.linalg.vector_norm(s, 1), 1),
    "norm_inf": (lambda mt, d: mt.norm(math.inf, d),
                 lambda s: torch.linalg.vector_norm(s, math.inf), 1),
    "norm3": (lambda mt, d: torch.norm(mt, 3, d), lambda s: torch.linalg.vector_norm(s, 3), 1),
    "var": (lambda mt, d: torch.var(mt, d), lambda s: s.var(), 2),
    "std": (lambda mt, d: mt.std(d), lambda s: s.std(), 2),
    "logsumexp": (lambda mt, d: torch.logsumexp(mt, () if d is None else d),
                  lambda s: torch.logsumexp(s, 0), 1),
    "median": (lambda mt, d: torch.median(mt) if d is None else torch.median(mt, d).values,
               lambda s: torch.median(s), 1),
    "max_dim": (lambda mt, d: mt.max() if d is None else mt.max(d).values, lambda s: s.max(), 1),
}


def make(case, seed, shape=None, nan_under_mask=True):
    shape = shape or ((5, 6) if case == "csr" else (3, 4, 5))
    _, data, mask = make_masked(shape, torch.strided, torch.float64, seed=seed, density=0.5)
    data, mask = data.clone(), mask.clone()
    mask[0] = False  # a fully masked slice: empty groups
    if nan_under_mask:
        data[~mask] = float("nan")
    if case == "hybrid":
        mt = hybrid_coo(data, mask, seed)
    else:
        mt = make_masked(shape, TORCH_LAYOUT[case], torch.float64, data=data, mask=mask)[0]
    return mt.requires_grad_(), data, mask


def masked_grad(mt):
    """Dense (values, mask) of a MaskedTensor gradient, checking layout and finiteness."""
    g = mt.grad
    assert isinstance(g, ms.MaskedTensor), type(g)
    assert g.layout == mt.layout
    s = g._storage
    assert bool(torch.isfinite(s.values).all()), s.values  # never NaN, even under the mask
    return s.densify(s.values, 0), s.densify(s.mask, False)


def reference_grad(fn, data, mask, dim, weights, min_count):
    x = data.nan_to_num().requires_grad_()
    values, spec = ref_groups(lambda s, p: fn(s), x, mask, dim, False, min_count)
    (values * weights * spec).sum().backward()
    return x.grad


@pytest.mark.parametrize("name", sorted(GRAD_OPS))
@pytest.mark.parametrize("dim", [None, 0, -1])
@pytest.mark.parametrize("case", CASES)
def test_reduction_gradient(name, dim, case):
    fn, ref, min_count = GRAD_OPS[name]
    mt, data, mask = make(case, seed=len(name) + (dim or 0))
    out = fn(mt, dim)
    g = torch.Generator().manual_seed(1)
    weights = torch.rand(out.shape, generator=g, dtype=torch.float64) + 0.5
    (out * weights).sum().backward()
    got, got_mask = masked_grad(mt)
    assert torch.equal(got_mask, mask)  # the gradient carries the input's mask
    expected = reference_grad(ref, data, mask, dim, weights, min_count)
    torch.testing.assert_close(torch.where(mask, got, 0.0), torch.where(mask, expected, 0.0))


@pytest.mark.parametrize("name", sorted(GRAD_OPS))
@pytest.mark.parametrize("case", CASES)
def test_fully_masked_gradient_is_not_nan(name, case):
    fn = GRAD_OPS[name][0]
    mt, data, mask = make(case, seed=3)
    s = mt._storage
    empty = ms.masked_tensor(s.layout.to_torch(s, s.values.detach()),
                             s.layout.to_torch(s, torch.zeros_like(s.mask)),
                             requires_grad=True)
    for dim in (None, 1):
        empty.grad = None
        out = fn(empty, dim)
        assert not bool(out._storage.mask.any())
        out.sum().backward()
        got, got_mask = masked_grad(empty)
        assert not bool(got_mask.any())


@pytest.mark.parametrize("case", CASES)
def test_zero_norm_and_constant_std_have_zero_gradient(case):
    # sqrt at 0: torch.linalg.vector_norm's subgradient is 0; ours too (no NaN)
    shape = (5, 6) if case == "csr" else (3, 4, 5)
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[1] = True
    data = torch.zeros(shape, dtype=torch.float64)
    data[2] = float("nan")
    mt = hybrid_coo(data, mask) if case == "hybrid" else make_masked(
        shape, TORCH_LAYOUT[case], torch.float64, data=data, mask=mask)[0]
    for fn in (lambda t: torch.linalg.vector_norm(t, dim=-1), lambda t: t.std(-1),
               lambda t: torch.linalg.vector_norm(t)):
        x = mt.detach().requires_grad_()
        fn(x).sum().backward()
        got, got_mask = masked_grad(x)
        assert torch.equal(got_mask, mask) and not bool(got.any())


def test_seed_tutorial_sum_gradients():
    torch.manual_seed(22)
    data = torch.randn(2, 2, 3).mul(5).float()
    mask = torch.randint(2, (2, 2, 3), dtype=torch.bool)
    m = ms.masked_tensor(data, mask, requires_grad=True)
    s = torch.sum(m)
    torch.testing.assert_close(s.get_data(), data[mask].sum())
    s.backward()
    assert torch.equal(m.grad.get_mask(), mask)
    assert torch.equal(m.grad.to_tensor(0), mask.float())
    m = ms.masked_tensor(data, torch.zeros_like(mask), requires_grad=True)
    s = torch.sum(m)
    assert not s.get_mask()
    s.backward()
    assert not m.grad.get_mask().any()
