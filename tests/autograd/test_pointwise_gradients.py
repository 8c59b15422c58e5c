"""Every differentiable elementwise op has a masked gradient in every layout.

The op list comes from torch: every unary op of torch's ``op_db`` that supports autograd and
is elementwise (checked by running it: it commutes with a permutation of its input), with the
arguments of its own sample inputs -- so ``torch.nn.functional``'s activations come with
their negative slopes, alphas, betas / thresholds, bounds and ``approximate`` modes, and a
new pointwise op of torch's is tested here without an edit. The gradient of a MaskedTensor
leaf must be a MaskedTensor of the leaf's layout and mask, equal to the gradient of plain
autograd on the dense data at the specified positions (Note [Elementwise backward ops] in
masked_sparse/ops/pointwise.py).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked_in, where0

import masked_sparse as ms
from masked_sparse.ops.pointwise import _is_pointwise, is_elementwise_backward

LAYOUTS = ["strided", "sparse_coo", "sparse_csr", "sparse_csc"]
TORCH_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo,
                 "sparse_csr": torch.sparse_csr, "sparse_csc": torch.sparse_csc,
                 "sparse_bsr": torch.sparse_bsr}
DTYPES = [torch.float32, torch.float64]
SHAPE = (3, 4)


def _inputs(n: int) -> list[torch.Tensor]:
    """Data of SHAPE for ``n`` operands in most ops' domain: inside (-1, 1) without 0 for
    one operand, positive for two (``pow``, ``atan2``, ...)."""
    base = torch.linspace(-0.9, 0.9, 12, dtype=torch.float64)
    if n == 1:
        return [base.reshape(SHAPE)]
    return [(base.roll(5 * i) * 0.4 + 0.5 + 0.2 * i).reshape(SHAPE) for i in range(n)]


def _differentiable(op, n: int) -> bool:
    """``op`` on ``n`` float64 tensors of SHAPE is deterministic, gives a float64 tensor of
    SHAPE and has a derivative (plain autograd runs its backward)."""
    xs = [x.requires_grad_() for x in _inputs(n)]
    try:
        out, again = op(*xs), op(*xs)
        if not (isinstance(out, torch.Tensor) and out.shape == SHAPE
                and out.dtype == torch.float64 and out.requires_grad
                and torch.equal(out, again)):
            return False
        out.sum().backward()
    except Exception:
        return False
    return True


@functools.cache
def torch_pointwise_ops() -> list[tuple[str, object, int]]:
    """(name, aten overload, number of tensor operands) for every functional aten overload
    torch tags ``pointwise`` that takes one or two tensors (its other arguments have
    defaults) and has a derivative: a new pointwise op of torch's is tested here unedited."""
    cases = []
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        ns, _, rest = full.partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(torch.ops.aten, name, None) if ns == "aten" else None
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None or torch.Tag.pointwise not in op.tags or op._schema.is_mutable:
            continue
        args = op._schema.arguments
        n = 0
        while n < len(args) and str(args[n].type) == "Tensor" and not args[n].kwarg_only:
            n += 1
        if n not in (1, 2) or any(not a.has_default_value() for a in args[n:]):
            continue
        if len(op._schema.returns) == 1 and _differentiable(op, n):
            # torch's own function (the user's route: torch.sgn, ...) where there is one
            fn = getattr(torch, name, None) if not name.startswith("_") else None
            cases.append((str(op).removeprefix("aten."), fn or op, n))
    return cases


# The activations a user reaches for, through torch.nn.functional with their arguments
# (those without arguments run above as aten ops too).
ACTIVATIONS = {
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "elu": lambda x: F.elu(x, alpha=0.5),
    "selu": F.selu, "celu": lambda x: F.celu(x, alpha=0.7),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=1.0), "mish": F.mish,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.7), "relu6": F.relu6,
    "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish, "logsigmoid": F.logsigmoid,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "softsign": F.softsign,
    "tanhshrink": F.tanhshrink, "hardshrink": lambda x: F.hardshrink(x, 0.3),
    "softshrink": lambda x: F.softshrink(x, 0.3), "threshold": lambda x: F.threshold(x, 0.1, 2.),
    "rrelu_eval": lambda x: F.rrelu(x, training=False),
}


def masked_leaf(data: torch.Tensor, mask: torch.Tensor, layout: str,
                dtype: torch.dtype) -> ms.MaskedTensor:
    """A MaskedTensor leaf over ``data`` and ``mask`` in ``layout`` (sparse ones store
    some masked-out elements too)."""
    mt, _, _ = make_masked_in(SHAPE, TORCH_LAYOUTS[layout], dtype=dtype, data=data.to(dtype),
                              mask=mask, seed=3)
    return mt.detach().requires_grad_()


def check_masked_gradient(fn, data: list[torch.Tensor], layout: str,
                          dtype: torch.dtype) -> None:
    """``fn`` of MaskedTensor leaves over ``data`` (one mask) against plain autograd on the
    dense data: each leaf's gradient is masked, in its layout, equal at the specified
    positions."""
    mask = torch.rand(SHAPE, generator=torch.Generator().manual_seed(3)) < 0.6
    leaves = [masked_leaf(d, mask, layout, dtype) for d in data]
    weights = torch.linspace(0.5, 1.5, mask.numel(), dtype=dtype).reshape(SHAPE)
    (fn(*leaves) * weights).sum().backward()
    xs = [d.to(dtype).clone().requires_grad_() for d in data]
    torch.where(mask, fn(*xs) * weights, 0).sum().backward()
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    for leaf, x in zip(leaves, xs):
        grad = leaf.grad
        assert isinstance(grad, ms.MaskedTensor), type(grad)
        assert grad.layout == leaf.layout
        dense = grad.to_dense() if layout != "strided" else grad
        assert torch.equal(dense.get_mask(), mask)
        torch.testing.assert_close(where0(dense.get_data(), mask), where0(x.grad, mask),
                                   equal_nan=True, **tol)


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", torch_pointwise_ops(), ids=_ids(torch_pointwise_ops()))
def test_pointwise_op_has_masked_gradient(case, layout, dtype):
    _, op, n = case
    check_masked_gradient(op, _inputs(n), layout, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("layout", [*LAYOUTS, "sparse_bsr"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_has_masked_gradient(name, layout, dtype):
    data = torch.linspace(-2.5, 2.5, 12, dtype=torch.float64).reshape(SHAPE)
    check_masked_gradient(ACTIVATIONS[name], [data], layout, dtype)


def test_op_list_is_built_from_torch():
    """The list built from torch's registry has the unary and binary ops one expects."""
    names = {c[0] for c in torch_pointwise_ops()}
    for name in ("leaky_relu.default", "elu.default", "softplus.default", "hardtanh.default",
                 "mish.default", "gelu.default", "exp.default", "sigmoid.default",
                 "mul.Tensor", "div.Tensor", "atan2.default", "pow.Tensor_Tensor"):
        assert name in names


# -- the routing rule against torch's registry --------------------------------------------
def _aten_backward_ops() -> dict[str, object]:
    ops = {}
    for full in torch._C._dispatch_get_all_op_names():
        ns, _, name = full.partition("::")
        if ns == "aten" and name.endswith("_backward") and "." not in name:
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None and "default" in packet.overloads():
                ops[name] = packet.default
    return ops


def test_elementwise_backward_rule_against_torch_registry():
    """The fused backward kernels of torch's activation formulas are routed to the generic
    pointwise kernel; backward kernels of ops that are not elementwise are not."""
    ops = _aten_backward_ops()
    routed = {name for name, op in ops.items() if _is_pointwise(op)}
    expected = {"leaky_relu_backward", "elu_backward", "softplus_backward",
                "hardtanh_backward", "hardsigmoid_backward", "hardswish_backward",
                "log_sigmoid_backward", "threshold_backward", "gelu_backward",
                "silu_backward", "mish_backward", "sigmoid_backward", "tanh_backward",
                "hardshrink_backward", "softshrink_backward", "logit_backward"}
    assert expected <= routed, sorted(expected - routed)
    for name in ("_softmax_backward_data", "mse_loss_backward", "max_pool2d_with_indices_backward",
                 "_prelu_kernel_backward", "embedding_dense_backward", "glu_backward"):
        if name in ops:
            assert not is_elementwise_backward(ops[name]) and name not in routed, name


def test_log_sigmoid_forward_returns_masked_output_and_buffer():
    """The multi-output forward op: both outputs carry the input's mask."""
    mask = torch.rand(SHAPE, generator=torch.Generator().manual_seed(3)) < 0.6
    leaf = masked_leaf(torch.linspace(-2, 2, 12).reshape(SHAPE), mask, "sparse_csr",
                       torch.float32)
    out, buffer = torch.ops.aten.log_sigmoid_forward(leaf.detach())
    for t in (out, buffer):
        assert isinstance(t, ms.MaskedTensor) and t.layout == torch.sparse_csr
    torch.testing.assert_close(where0(out.to_dense().get_data(), mask),
                               where0(F.logsigmoid(torch.linspace(-2, 2, 12).reshape(SHAPE)),
                                      mask))
