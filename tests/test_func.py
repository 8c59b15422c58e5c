"""torch.autograd.gradcheck through ``as_masked_tensor`` with a plain leaf.

Note [Plain gradients for plain leaves] (``_construct.py``): the gradient that reaches a
plain leaf passed straight to ``as_masked_tensor`` is a plain tensor of the leaf's layout,
0 at unspecified positions, so torch's own checkers run unchanged. The reference is
gradcheck's finite differences on the same function, plus a dense ``torch.where`` model.
"""

from __future__ import annotations

import pytest
import torch
from conftest import LAYOUT_IDS, LAYOUTS, make_masked

import masked_sparse as ms

F64 = torch.float64
SHAPE = (3, 5)

OPS = {  # name -> masked function of a MaskedTensor, returning a plain strided tensor
    "sin": lambda m: ms.to_tensor(torch.sin(m) * 2, 0),
    "sum1": lambda m: ms.to_tensor(m.sum(1), 0),
    "sum": lambda m: ms.to_tensor(m.sum(), 0),
    "mean1": lambda m: ms.to_tensor(m.mean(1), 0),
    "amax1": lambda m: ms.to_tensor(m.amax(1), 0),
    "softmax1": lambda m: ms.to_tensor(m.softmax(1), 0),
}


def dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.layout == torch.strided else t.to_dense()


def leaf_of(layout, seed):
    mt, dx, mx = make_masked(SHAPE, layout, F64, seed=seed)
    return mt.get_data().detach().requires_grad_(), mt.get_mask(), dx, mx


@pytest.mark.parametrize("op", OPS, ids=list(OPS))
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_gradcheck_plain_leaf_through_as_masked_tensor(layout, op):
    data, mask, _, _ = leaf_of(layout, seed=3)
    fn = OPS[op]
    if layout == torch.strided:
        assert torch.autograd.gradcheck(lambda x: fn(ms.as_masked_tensor(x, mask)), (data,))
        return
    # gradcheck cannot perturb a sparse leaf itself (torch's checker has no sparse eq.Scalar):
    # the leaf is the values tensor, through torch's own sparse constructor.
    def rebuild(v):
        if layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(data.indices(), v, SHAPE, is_coalesced=True)
        return torch.sparse_csr_tensor(data.crow_indices(), data.col_indices(), v, SHAPE)
    assert torch.autograd.gradcheck(lambda v: dense(fn(ms.as_masked_tensor(rebuild(v), mask))),
                                    (data.values().detach().requires_grad_(),))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_plain_leaf_gradient_matches_dense_where_model(layout):
    data, mask, dx, mx = leaf_of(layout, seed=4)
    y = ms.as_masked_tensor(data, mask).softmax(1)
    w = torch.arange(15, dtype=F64).reshape(SHAPE)
    (dense(ms.to_tensor(y, 0)) * w).sum().backward()
    x = dx.clone().requires_grad_()
    p = torch.where(mx, x, float("-inf")).softmax(1)
    (torch.where(mx, p, 0) * w).sum().backward()
    assert not isinstance(data.grad, ms.MaskedTensor) and data.grad.layout == layout
    torch.testing.assert_close(dense(data.grad), torch.where(mx, x.grad, 0))



def test_vjp_through_as_masked_tensor_pointwise():
    data, mask, dx, mx = leaf_of(torch.strided, seed=6)
    w = torch.arange(15, dtype=F64).reshape(SHAPE)
    out, pullback = torch.func.vjp(
        lambda x: ms.to_tensor(torch.sin(ms.as_masked_tensor(x, mask)) * 2, 0), data.detach())
    (grad,) = pullback(w)
    torch.testing.assert_close(out, torch.where(mx, dx.sin() * 2, 0))
    torch.testing.assert_close(grad, torch.where(mx, 2 * dx.cos() * w, 0))
