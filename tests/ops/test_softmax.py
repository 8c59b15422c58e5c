"""softmax / log_softmax on every layout along every dim, against a brute-force reference
(torch.softmax on each slice's specified elements), with gradients and the safe-softmax
rules: fully masked slices stay masked, no NaN, sparse results share the input's indices.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import check_invariants, make_masked
from reduction_refs import check_result, hybrid_coo

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

CASES = ["strided", "coo", "csr", "hybrid"]
TORCH_LAYOUT = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
                "hybrid": torch.sparse_coo}


def make(case, dtype=torch.float64, seed=0):
    shape = (5, 6) if case == "csr" else (3, 4, 5)
    _, data, mask = make_masked(shape, torch.strided, dtype, seed=seed, density=0.5)
    data, mask = data.clone(), mask.clone()
    mask[1] = False  # fully masked slices along every other dim
    data[~mask] = float("nan")
    if case == "hybrid":
        mt = hybrid_coo(data, mask, seed)
    else:
        mt = make_masked(shape, TORCH_LAYOUT[case], dtype, data=data, mask=mask)[0]
    return mt, data, mask


def ref_softmax(data, mask, dim, log=False):
    """Per-slice torch.softmax of the specified elements; differentiable in ``data``."""
    moved = data.movedim(dim, -1)
    mmoved = mask.movedim(dim, -1)
    flat, fmask = moved.reshape(-1, moved.shape[-1]), mmoved.reshape(-1, moved.shape[-1])
    rows = []
    for row, mrow in zip(flat, fmask):
        out = torch.zeros_like(row)
        if mrow.any():
            fn = torch.log_softmax if log else torch.softmax
            out = out.masked_scatter(mrow, fn(row[mrow], 0))
        rows.append(out)
    return torch.stack(rows).reshape(moved.shape).movedim(-1, dim) if rows else data * 0


FORMS = {
    "torch.softmax": lambda mt, d: torch.softmax(mt, d),
    "Tensor.softmax": lambda mt, d: mt.softmax(d),
    "F.softmax": lambda mt, d: F.softmax(mt, dim=d),
    "special.softmax": lambda mt, d: torch.special.softmax(mt, d),
    "aten._softmax": lambda mt, d: torch.ops.aten._softmax.default(mt, d, False),
    "torch.log_softmax": lambda mt, d: torch.log_softmax(mt, d),
    "Tensor.log_softmax": lambda mt, d: mt.log_softmax(dim=d),
    "F.log_softmax": lambda mt, d: F.log_softmax(mt, d),
    "special.log_softmax": lambda mt, d: torch.special.log_softmax(mt, d),
    "aten._log_softmax": lambda mt, d: torch.ops.aten._log_softmax.default(mt, d, False),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("case", CASES)
def test_softmax_forms_and_layouts(form, dim, case):
    mt, data, mask = make(case, seed=dim + 2)
    out = FORMS[form](mt, dim)
    check_invariants(out, TORCH_LAYOUT[case])
    s, si = out._storage, mt._storage
    assert s.mask is si.mask  # the input's mask, the very same object
    assert all(a is b for a, b in zip(s.index, si.index))
    assert bool(torch.isfinite(s.values).all())
    check_result(out, ref_softmax(data, mask, dim, "log" in form), mask)


@pytest.mark.parametrize("case", CASES)
def test_softmax_dtype_argument(case):
    mt, data, mask = make(case, torch.float32, seed=4)
    out = torch.softmax(mt, 1, dtype=torch.float64)
    check_result(out, ref_softmax(data.double(), mask, 1), mask)
    out = F.log_softmax(mt, 0, dtype=torch.float64)
    check_result(out, ref_softmax(data.double(), mask, 0, log=True), mask)
    with pytest.raises(TypeError, match="floating"):
        torch.softmax(ms.masked_tensor(torch.ones(2, dtype=torch.long), torch.ones(2).bool()), 0)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("case", CASES)
def test_softmax_gradient(log, dim, case):
    mt, data, mask = make(case, seed=7)
    mt.requires_grad_()
    out = mt.log_softmax(dim) if log else mt.softmax(dim)
    weights = torch.rand(out.shape, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    (out * weights).sum().backward()
    g = mt.grad._storage
    assert mt.grad.layout == mt.layout
    assert bool(torch.isfinite(g.values).all())
    got, got_mask = g.densify(g.values, 0), g.densify(g.mask, False)
    assert torch.equal(got_mask, mask)
    x = data.nan_to_num().requires_grad_()
    (ref_softmax(x, mask, dim, log) * weights * mask).sum().backward()
    torch.testing.assert_close(torch.where(mask, got, 0.0), torch.where(mask, x.grad, 0.0))


@pytest.mark.parametrize("case", CASES)
def test_fully_masked_softmax(case):
    mt, data, mask = make(case, seed=1)
    s = mt._storage
    empty = ms.masked_tensor(s.layout.to_torch(s, s.values),
                             s.layout.to_torch(s, torch.zeros_like(s.mask)), requires_grad=True)
    out = empty.log_softmax(0)
    assert not bool(out._storage.mask.any()) and bool(torch.isfinite(out._storage.values).all())
    out.sum().backward()
    assert bool(torch.isfinite(empty.grad._storage.values).all())
    assert not bool(empty.grad._storage.mask.any())


def test_safe_softmax_tutorial():
    # The tutorial's "safe softmax": a fully masked column stays masked, never NaN.
    data = torch.randn(3, 3)
    mask = torch.tensor([[True, False, False], [True, False, True], [False, False, False]])
    x = data.masked_fill(~mask, float("-inf"))
    assert bool(x.softmax(0).isnan().any())  # what plain torch gives
    for layout in (torch.strided, torch.sparse_coo, torch.sparse_csr):
        mt = ms.to_layout(ms.masked_tensor(data, mask), layout)
        out = mt.softmax(0)
        dense = out.to_tensor(0).to_dense()
        assert torch.equal(out.get_mask().to_dense(), mask)
        torch.testing.assert_close(dense, torch.where(mask, x.softmax(0).nan_to_num(), 0.0))


def test_functional_implicit_dim_warns_like_torch():
    mt, data, mask = make("strided", seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = F.softmax(mt)
    assert any("Implicit dimension" in str(w.message) for w in caught)
    check_result(out, ref_softmax(data, mask, 0), mask)  # torch's choice for 3-D: dim 0


def test_softmax_with_infinities_follows_torch():
    # -inf entries get 0; a specified slice that is all -inf gives NaN, as torch does
    data = torch.tensor([[-math.inf, 0.0, 1.0], [-math.inf, -math.inf, 2.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    for layout in (torch.strided, torch.sparse_coo, torch.sparse_csr):
        mt = ms.to_layout(ms.masked_tensor(data, mask), layout)
        for fn in (torch.softmax, torch.log_softmax):
            ref = torch.where(mask, fn(torch.where(mask, data, -math.inf), 1), 0.0)
            check_result(fn(mt, 1), ref, mask)
