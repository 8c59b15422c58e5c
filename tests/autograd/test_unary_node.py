"""A unary pointwise op of a MaskedTensor that requires grad is one recorded node
(Note [A unary op as one node] in masked_sparse/ops/unary_node.py).

The values of every op's gradient are checked against plain autograd on the dense data by
``test_pointwise_gradients.py`` (every differentiable pointwise op of torch's registry, every
layout); here: what the node records, ``.backward()`` and ``torch.autograd.grad`` (torch
runs a node called directly only in the first), the paths that keep the dispatch route,
double backward and a backward inside another, each against the dense reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked_in, where0

import masked_sparse as ms

LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc]
IDS = ["strided", "coo", "csr", "csc"]
SHAPE = (4, 5)
OPS = {  # each one's torch formula saves its input (Note [What the node keeps])
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": lambda x: F.elu(x, alpha=0.7),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.5),
    "square": lambda x: x ** 2,
}


def _leaf(layout: torch.layout, dtype: torch.dtype = torch.float64):
    """A MaskedTensor leaf of SHAPE (sparse layouts also store masked-out elements, NaN
    among them), its dense data and its mask."""
    mt, data, mask = make_masked_in(SHAPE, layout, dtype=dtype, seed=5)
    return mt.detach().requires_grad_(), data, mask


def _node_name(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


def _dense_grad(fn, data, mask, weights, create_graph=False):
    x = data.clone().requires_grad_()
    (grad,) = torch.autograd.grad(torch.where(mask, fn(x) * weights, 0).sum(), x,
                                  create_graph=create_graph)
    return x, grad


@pytest.mark.parametrize("partial", [False, True], ids=["backward", "autograd.grad"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_one_node_with_the_dense_gradient(name, layout, partial):
    leaf, data, mask = _leaf(layout)
    out = OPS[name](leaf)
    assert _node_name(out) == "_UnaryNodeBackward"
    assert out.layout == leaf.layout
    weights = torch.linspace(0.5, 1.5, mask.numel(), dtype=data.dtype).reshape(SHAPE)
    loss = (out * weights).sum()
    if partial:
        (grad,) = torch.autograd.grad(loss, leaf)
    else:
        loss.backward()
        grad = leaf.grad
    _, expected = _dense_grad(OPS[name], data, mask, weights)
    dense = grad.to_dense() if layout != torch.strided else grad
    assert torch.equal(dense.get_mask(), mask)
    torch.testing.assert_close(where0(dense.get_data(), mask), where0(expected, mask))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_double_backward_matches_the_dense_one(layout):
    fn = OPS["softplus"]  # a second derivative that is not zero
    leaf, data, mask = _leaf(layout)
    weights = torch.linspace(0.5, 1.5, mask.numel(), dtype=data.dtype).reshape(SHAPE)
    (grad,) = torch.autograd.grad((fn(leaf) * weights).sum(), leaf, create_graph=True)
    (grad * grad).sum().backward()
    x, dense_grad = _dense_grad(fn, data, mask, weights, create_graph=True)
    torch.where(mask, dense_grad * dense_grad, 0).sum().backward()
    second = leaf.grad.to_dense() if layout != torch.strided else leaf.grad
    torch.testing.assert_close(where0(second.get_data(), mask), where0(x.grad, mask))


class _ActivationInsideBackward(torch.autograd.Function):
    """Identity forward; its backward differentiates ``leaky_relu(mt)`` on its own, so that
    one's backward runs inside a backward that computes only some inputs' gradients."""

    @staticmethod
    def forward(ctx, x, mt):
        ctx.mt = mt
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        with torch.enable_grad():
            inner = F.leaky_relu(ctx.mt, 0.2)
            ctx.kind = _node_name(inner)
            (to_mt,) = torch.autograd.grad(inner.sum(), ctx.mt)
        ctx.inner_grad = to_mt
        return grad, None


@pytest.mark.parametrize("partial", [False, True], ids=["backward", "autograd.grad"])
def test_a_backward_inside_a_backward(partial):
    leaf, data, mask = _leaf(torch.strided)
    x = torch.ones(3, requires_grad=True)
    out = _ActivationInsideBackward.apply(x, leaf)
    if partial:  # torch skips nodes outside its graph there: the recorded graph is differentiated
        torch.autograd.grad(out.sum(), x)
    else:
        out.sum().backward()
    node = out.grad_fn
    assert node.kind == "_UnaryNodeBackward"
    expected = torch.where(data > 0, 1.0, 0.2).to(data.dtype)
    torch.testing.assert_close(where0(node.inner_grad.get_data(), mask), where0(expected, mask))


def test_in_place_complex_and_plain_tensor_calls_keep_the_dispatch_route():
    leaf, data, mask = _leaf(torch.strided)
    h = leaf * 1.0
    assert _node_name(F.leaky_relu(h.clone(), 0.1, inplace=True)) != "_UnaryNodeBackward"
    assert _node_name(F.leaky_relu(h.clone(), 0.1, True)) != "_UnaryNodeBackward"
    assert _node_name(F.elu(h.clone(), 1.0, True)) != "_UnaryNodeBackward"
    z = ms.masked_tensor(torch.randn(2, 3, dtype=torch.complex128), torch.ones(2, 3) > 0,
                         requires_grad=True)
    assert _node_name(z.exp()) != "_UnaryNodeBackward"
    w = torch.randn(SHAPE, dtype=data.dtype, requires_grad=True)  # a plain operand: its route
    assert _node_name(leaf * w) != "_UnaryNodeBackward"


def test_a_comparison_records_nothing():
    leaf, data, mask = _leaf(torch.sparse_csr)
    positive = leaf > 0
    assert isinstance(positive, ms.MaskedTensor) and not positive.requires_grad
    dense = positive.to_dense()
    assert torch.equal(dense.get_mask(), mask)
    assert torch.equal(where0(dense.get_data(), mask), (data > 0) & mask)


def test_a_second_backward_without_retain_graph_raises():
    leaf, _, _ = _leaf(torch.sparse_coo)
    out = OPS["leaky_relu"](leaf)  # (F.relu takes torch's route: Note [What the node keeps])
    assert _node_name(out) == "_UnaryNodeBackward"
    loss = out.sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


@pytest.mark.parametrize("name, node_kind", [("relu", "ReluBackward0"),
                                             ("sigmoid", "SigmoidBackward0"),
                                             ("leaky_relu", "_UnaryNodeBackward")])
def test_the_input_values_are_kept_where_torchs_formula_keeps_them(name, node_kind):
    from torch.multiprocessing.reductions import StorageWeakRef

    fn = {"relu": F.relu, "sigmoid": torch.sigmoid, "leaky_relu": OPS["leaky_relu"]}[name]
    leaf, data, mask = _leaf(torch.strided)
    h = leaf + 1.0  # an intermediate: nothing else holds its values
    out = fn(h)
    assert _node_name(out) == node_kind
    ref = StorageWeakRef(h._storage.values.untyped_storage())
    x = data.clone().requires_grad_() + 1.0  # torch's own route, for comparison
    y = fn(x)
    plain_ref = StorageWeakRef(x.untyped_storage())
    del h, x
    assert ref.expired() == plain_ref.expired()  # relu, sigmoid free it; leaky_relu saves it
    (out.sum() + y.sum()).backward()
    assert leaf.grad is not None


@pytest.mark.parametrize("how", ["checkpoint", "checkpoint (reentrant)", "save_on_cpu"])
def test_saved_tensor_hooks_give_the_gradient_without_them(how):
    from torch.utils.checkpoint import checkpoint

    def block(t):
        return F.gelu(F.leaky_relu(t * 1.5, 0.1) ** 2)

    leaf, data, mask = _leaf(torch.sparse_csr)
    block(leaf).sum().backward()
    expected, leaf.grad = leaf.grad.to_dense(), None
    if how == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu():
            out = block(leaf)
    else:
        out = checkpoint(block, leaf, use_reentrant=how != "checkpoint")
    out.sum().backward()
    got = leaf.grad.to_dense()
    assert torch.equal(got.get_mask(), expected.get_mask())
    torch.testing.assert_close(where0(got.get_data(), mask), where0(expected.get_data(), mask))
