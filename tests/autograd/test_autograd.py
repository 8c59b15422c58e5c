"""Autograd across the core, in every layout: leaves, construction, leaving and changing storage,
masked x plain products, the gradient mask rules of backward, gradcheck, and no reference cycles.

Each gradient is checked three ways: its type and layout, its mask (hand-derived: which
positions may receive a gradient), and its values against plain autograd on the dense data.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    dense_of,
    layout_params,
    make_masked,
)

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

SHAPE = (4, 5)
F64 = torch.float64
TO = {torch.strided: "to_dense", torch.sparse_coo: "to_sparse_coo",
      torch.sparse_csr: "to_sparse_csr"}


def leaf(layout, seed=0, shape=SHAPE, **kw):
    """A MaskedTensor leaf requiring grad (built by masked_tensor(requires_grad=True))."""
    mt, data, mask = make_masked(shape, layout, F64, seed=seed, **kw)
    x = ms.masked_tensor(mt.get_data(), mt.get_mask(), requires_grad=True)
    return x, data, mask


def dense(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of any layout as a strided one (differentiably)."""
    return t if t.layout == torch.strided else t.to_dense()


def weights(shape=SHAPE) -> torch.Tensor:
    return torch.arange(1, 1 + torch.Size(shape).numel(), dtype=F64).reshape(shape) / 7


def assert_grad(x, ref, mask, layout):
    """``x.grad`` is a MaskedTensor of ``layout`` over x's storage with ``mask``."""
    g = x.grad if isinstance(x, torch.Tensor) and x.grad is not None else x
    assert isinstance(g, ms.MaskedTensor), type(g)
    assert g.layout == layout
    check_invariants(g, layout)
    assert_masked_equal(g, ref, mask)


# -- leaves --------------------------------------------------------------------------------
@layout_params()
def test_leaf_grad_has_same_mask_layout_and_index(layout):
    x, dx, mx = leaf(layout)
    assert x.is_leaf and x.requires_grad and x.grad_fn is None
    w = weights()
    (dense((x * x).to_tensor(0)) * w).sum().backward()
    assert_grad(x, 2 * dx * w, mx, layout)
    assert all(p is q for p, q in zip(x.grad._storage.index, x._storage.index))
    # A second backward accumulates into .grad, keeping the mask.
    (dense(x.exp().to_tensor(0))).sum().backward()
    assert_grad(x, 2 * dx * w + dx.exp(), mx, layout)


@layout_params()
def test_fully_masked_leaf_gets_fully_masked_grad(layout):
    x, dx, mx = leaf(layout, density=0.0)
    dense(x.sin().to_tensor(0)).sum().backward()
    assert_grad(x, torch.zeros(SHAPE, dtype=F64), torch.zeros(SHAPE, dtype=torch.bool), layout)


def test_transposed_leaf_grad_obeys_the_layout_contract():
    data = torch.randn(5, 4, dtype=F64).t()
    mask = (torch.rand(5, 4) > 0.3).t()
    x = ms.masked_tensor(data, mask, requires_grad=True)
    x.get_data().sum().backward()  # expanded gradient: AccumulateGrad restrides it
    assert_grad(x, torch.ones(4, 5, dtype=F64), mask, torch.strided)
    assert x.grad.stride() == x.stride()


# -- as_masked_tensor / get_data / to_tensor -----------------------------------------------
def test_as_masked_tensor_dense_data():
    x = torch.tensor([1.0, 2.0, 3.0], dtype=F64, requires_grad=True)
    mask = torch.tensor([True, False, True])
    mt = ms.as_masked_tensor(x * x, mask)
    assert mt.requires_grad and not mt.is_leaf
    dense(mt.to_tensor(0)).sum().backward()
    assert_grad(x, 2 * x.detach(), mask, torch.strided)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_as_masked_tensor_sparse_leaf_data(layout):
    mt, dx, mx = make_masked(SHAPE, layout, F64, seed=1)
    data = mt.get_data().detach().requires_grad_()
    x = ms.as_masked_tensor(data, mt.get_mask())
    (dense((x * 3).to_tensor(0)) * weights()).sum().backward()
    # Note [Plain gradients for plain leaves]: the sparse leaf's gradient is a plain tensor
    # of its own layout over its own index, 0 at stored-but-unspecified entries.
    g = data.grad
    assert not isinstance(g, ms.MaskedTensor) and g.layout == layout
    if layout == torch.sparse_coo:
        assert torch.equal(g._indices(), data.indices())
    else:
        assert torch.equal(g.col_indices(), data.col_indices())
    torch.testing.assert_close(g.to_dense(), torch.where(mx, 3 * weights(), 0.0))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_as_masked_tensor_sparse_data_with_history(layout):
    # Data built from a values tensor: the masked gradient is handed to torch's sparse
    # backward as a plain gradient, 0 at stored-but-masked entries.
    mt, dx, mx = make_masked(SHAPE, layout, F64, seed=2)
    d, m = mt.get_data(), mt.get_mask()
    v = d.values().detach().requires_grad_()
    data = (torch.sparse_coo_tensor(d.indices(), v, SHAPE, is_coalesced=True)
            if layout == torch.sparse_coo else
            torch.sparse_csr_tensor(d.crow_indices(), d.col_indices(), v, SHAPE))
    dense((ms.as_masked_tensor(data, m) * 3).to_tensor(0)).sum().backward()
    assert not isinstance(v.grad, ms.MaskedTensor)
    torch.testing.assert_close(v.grad, torch.where(m.values(), 3.0, 0.0).to(F64))


@layout_params()
def test_get_data_is_differentiable(layout):
    x, dx, mx = leaf(layout, seed=3)
    data = x.get_data()
    assert not isinstance(data, ms.MaskedTensor) and data.layout == layout
    (dense(data) * weights()).sum().backward()
    # Only specified entries receive a gradient: the data under the mask is not a value.
    assert_grad(x, weights(), mx, layout)


@pytest.mark.parametrize("value", [0, -2.0])
@layout_params()
def test_to_tensor_backpropagates_to_specified_entries_only(value, layout):
    x, dx, mx = leaf(layout, seed=4)
    out = x.to_tensor(value)
    assert out.layout == (layout if value == 0 else torch.strided)
    ref = dx.clone().requires_grad_()
    (torch.where(mx, ref, value) * weights()).sum().backward()
    (dense(out) * weights()).sum().backward()
    assert_grad(x, ref.grad, mx, layout)


# -- MaskedTensor with plain Tensor --------------------------------------------------------
@layout_params()
def test_plain_tensor_gets_a_plain_gradient(layout):
    # Note [Plain operands get plain gradients]: 0 where y met only unspecified elements.
    x, dx, mx = leaf(layout, seed=5)
    y = (torch.rand(SHAPE, dtype=F64) + 1).requires_grad_()
    (dense((x * y).to_tensor(0)) * weights()).sum().backward()
    assert_grad(x, y.detach() * weights(), mx, layout)
    assert type(y.grad) is torch.Tensor
    torch.testing.assert_close(y.grad, torch.where(mx, dx * weights(), 0))


@layout_params()
def test_broadcast_plain_tensor_gets_a_reduced_plain_gradient(layout):
    x, dx, mx = leaf(layout, seed=6)
    y = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=F64, requires_grad=True)
    dense((x * y).to_tensor(0)).sum().backward()
    assert type(y.grad) is torch.Tensor and y.grad.shape == y.shape
    torch.testing.assert_close(y.grad, torch.where(mx, dx, 0).sum(0))


@layout_params()
def test_plain_and_masked_gradients_sum_to_a_plain_one(layout):
    # y reaches the loss through a masked path and a plain path: both gradients are plain.
    x, dx, mx = leaf(layout, seed=7)
    y = torch.rand(SHAPE, dtype=F64).requires_grad_()
    (dense((x * y).to_tensor(0)).sum() + (y * 2).sum()).backward()
    assert not isinstance(y.grad, ms.MaskedTensor)
    torch.testing.assert_close(y.grad, 2 + torch.where(mx, dx, 0))


@layout_params()
def test_plain_gradients_accumulate_into_a_plain_grad(layout):
    x, dx, mx = leaf(layout, seed=8)
    y = torch.rand(SHAPE, dtype=F64).requires_grad_()
    dense((x * y).to_tensor(0)).sum().backward()
    (y * 3).sum().backward()
    assert type(y.grad) is torch.Tensor
    torch.testing.assert_close(y.grad, 3 + torch.where(mx, dx, 0))


def test_masked_gradient_through_plain_history():
    # as_masked_tensor(model(x), mask): ops without a masked kernel (addmm) in the plain
    # history receive the gradient as a plain tensor, 0 where there is no gradient.
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4).double()
    inp = torch.randn(6, 3, dtype=F64)
    mask = torch.rand(6, 4) > 0.4
    ms.as_masked_tensor(lin(inp), mask).exp().to_tensor(0).sum().backward()
    got = lin.weight.grad.clone()
    lin.zero_grad()
    torch.where(mask, lin(inp).exp(), 0).sum().backward()
    torch.testing.assert_close(got, lin.weight.grad)


# -- layout conversions --------------------------------------------------------------------
@pytest.mark.parametrize("target", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("source", LAYOUTS, ids=LAYOUT_IDS)
def test_conversions_are_differentiable(source, target):
    x, dx, mx = leaf(source, seed=9)
    y = getattr(x, TO[target])()
    assert y.layout == target and y.requires_grad
    assert_masked_equal(y, dx, mx)
    (dense(y.exp().to_tensor(0)) * weights()).sum().backward()
    # The gradient comes back in the source layout, over the source's storage.
    assert_grad(x, dx.exp() * weights(), mx, source)
    assert all(p is q for p, q in zip(x.grad._storage.index, x._storage.index))


# -- gradcheck on the specified entries ----------------------------------------------------
class _PlainGrad(torch.autograd.Function):
    """Identity; hands a masked gradient to gradcheck as a plain tensor (0 = no gradient).

    The masks themselves are asserted by the tests above.
    """

    @staticmethod
    def forward(ctx, v):
        return v.view_as(v)

    @staticmethod
    def backward(ctx, g):
        return dense(g.to_tensor(0)) if isinstance(g, ms.MaskedTensor) else g


class Case:
    """Inputs for gradcheck: the stored values of a masked tensor, and how to rebuild it."""

    def __init__(self, layout, seed=0, shape=SHAPE, **kw):
        mt, self.data, self.mask = make_masked(shape, layout, F64, seed=seed, **kw)
        self.layout, self.shape = layout, torch.Size(shape)
        self.d, self.m = mt.get_data(), mt.get_mask()
        self.values = self.sparse_values(self.d).detach().clone().requires_grad_()

    def sparse_values(self, t):
        return t if self.layout == torch.strided else t.values()

    def plain(self, v):
        """A plain tensor of the case's layout and positions holding ``v``."""
        if self.layout == torch.strided:
            return v
        if self.layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(self.d.indices(), v, self.shape, is_coalesced=True)
        return torch.sparse_csr_tensor(self.d.crow_indices(), self.d.col_indices(), v,
                                       self.shape)

    def read(self, full):
        """A dense tensor read at the stored positions (as a values tensor)."""
        if self.layout == torch.strided:
            return full
        if self.layout == torch.sparse_coo:
            return full[tuple(self.d.indices())]
        crow = self.d.crow_indices()
        rows = torch.repeat_interleave(torch.arange(self.shape[0]), crow.diff())
        return full[rows, self.d.col_indices()]

    def build(self, v, mask=None):
        mask = self.m if mask is None else self.plain(self.read(mask))
        return ms.as_masked_tensor(self.plain(_PlainGrad.apply(v)), mask)


def out(mt):
    """A MaskedTensor result as a dense plain tensor, 0 where unspecified."""
    return dense(mt.to_tensor(0))


def gradcheck(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5)


@layout_params()
def test_gradcheck_unary_and_binary(layout):
    c = Case(layout, seed=10)
    gradcheck(lambda v: out(torch.sin(c.build(v)) * c.build(v).exp()), c.values)
    other = (c.values.detach() * 0.5 + 3).requires_grad_()
    gradcheck(lambda v, w: out(c.build(v) / c.build(w)), c.values, other)
    plain = torch.rand(SHAPE, dtype=F64, requires_grad=True)
    gradcheck(lambda v, t: out(torch.atan2(c.build(v), _PlainGrad.apply(t))), c.values, plain)


@layout_params()
def test_gradcheck_where(layout):
    c = Case(layout, seed=11, stored_masked=0.4)
    g = torch.Generator().manual_seed(3)
    other_mask = torch.rand(SHAPE, generator=g) < 0.6
    cond = torch.rand(SHAPE, generator=g) < 0.5
    w = (c.values.detach() + 5).requires_grad_()
    gradcheck(lambda v, u: out(torch.where(cond, c.build(v).exp(), c.build(u, other_mask) * 2)),
              c.values, w)
    plain = torch.rand(SHAPE, dtype=F64, requires_grad=True)
    gradcheck(lambda v, t: out(torch.where(cond, _PlainGrad.apply(t), c.build(v) ** 2)),
              c.values, plain)


@layout_params()
def test_gradcheck_get_data_and_to_tensor(layout):
    c = Case(layout, seed=12)
    gradcheck(lambda v: dense(c.build(v).get_data())[c.mask], c.values)
    gradcheck(lambda v: out(c.build(v) * 2), c.values)
    gradcheck(lambda v: dense(c.build(v).to_tensor(-1.5)), c.values)


@pytest.mark.parametrize("target", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("source", LAYOUTS, ids=LAYOUT_IDS)
def test_gradcheck_conversions(source, target):
    c = Case(source, seed=13)
    gradcheck(lambda v: out(getattr(c.build(v), TO[target])().cos()), c.values)


# -- no reference cycles -------------------------------------------------------------------
def test_graph_is_freed_without_gc():
    x, _, _ = leaf(torch.strided, seed=14)
    y = torch.rand(SHAPE, dtype=F64)
    z = torch.where(y > 0.5, (x * y).exp(), x.to_sparse_coo().to_dense())  # on_values inside
    refs = [weakref.ref(z), weakref.ref(z.grad_fn)]
    z.get_data().sum().backward()
    del z
    assert all(r() is None for r in refs)  # freed by refcounting: no cycle holds them


def test_repeated_forward_backward_keeps_memory_flat():
    x, _, _ = leaf(torch.strided, seed=15, shape=(3, 3))
    cond = torch.rand(3, 3) > 0.5

    def step():
        torch.where(cond, x, 0.0).to_tensor(0).sum().backward()

    for _ in range(100):  # warm-up: caches, lazily registered kernels
        step()
    gc.collect()
    gc.disable()
    try:
        objects = len(gc.get_objects())
        for _ in range(8_500):
            step()
        # With the cycle collector off, anything kept alive by a cycle would pile up here.
        assert len(gc.get_objects()) - objects < 100
        tracemalloc.start()
        for _ in range(500):
            step()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1_000):  # 10_000 iterations in all
            step()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert gc.collect() == 0, "objects were only freed by the cycle collector"
    finally:
        tracemalloc.stop()
        gc.enable()
    # Keeping one iteration's output alive costs ~1.8 KB of Python memory; tracemalloc also
    # shows a decaying one-off growth (tens of KB) while torch's internal pools turn over.
    assert grown < 256 * 1024, f"Python memory grew by {grown} bytes over 1000 iterations"
    assert torch.equal(dense_of(x.grad)[1], x.get_mask() & cond)


REDUCTIONS = {
    "sum_all": lambda mt: torch.sum(mt),
    "sum_dim": lambda mt: mt.sum(1),
    "sum_keepdim": lambda mt: torch.sum(mt, 0, keepdim=True),
    "mean": lambda mt: torch.mean(mt, 0),
    "amax": lambda mt: torch.amax(mt, 1),
    "prod": lambda mt: torch.prod(mt, 1),
    "softmax": lambda mt: torch.softmax(mt, 1),
    "log_softmax": lambda mt: torch.nn.functional.log_softmax(mt, 0),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@layout_params()
def test_gradcheck_reductions_and_softmax(name, layout):
    # Row 2 and column 4 are fully masked: their results are unspecified.
    mask = torch.rand(SHAPE, generator=torch.Generator().manual_seed(16)) < 0.7
    mask[2] = mask[:, 4] = False
    c = Case(layout, seed=16, mask=mask)
    gradcheck(lambda v: out(REDUCTIONS[name](c.build(v))), c.values)


@pytest.mark.parametrize(("layout", "through"), [
    (torch.sparse_coo, torch.strided), (torch.sparse_coo, torch.sparse_csr),
    (torch.sparse_csr, torch.strided), (torch.sparse_csr, torch.sparse_coo)],
    ids=["coo-to_dense", "coo-to_csr", "csr-to_dense", "csr-to_coo"])
def test_gradient_given_with_another_pattern(layout, through):
    # backward(gradient) with a gradient stored differently from the output: it is read at
    # the output's positions (unspecified or absent entries give no gradient). (Into a
    # pointwise op directly, such a gradient is refused: torch's own formula runs on it.)
    data = torch.tensor([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]])
    mask = data != 0
    x = ms.to_layout(ms.masked_tensor(data, mask), layout).detach().requires_grad_()
    y = ms.to_layout(x.exp(), through)
    grad_mask = torch.tensor([[True, False, True], [False, True, True]])
    grad = ms.masked_tensor(torch.full((2, 3), 5.0), grad_mask).to_sparse_coo()
    y.backward(grad)
    assert x.grad.layout == layout
    got, got_mask = dense_of(x.grad)
    assert torch.equal(got_mask, mask)
    expected = torch.where(mask & grad_mask, 5.0 * data.exp(), 0.0)
    torch.testing.assert_close(torch.where(mask, got, 0), expected)
