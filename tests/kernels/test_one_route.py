"""One kernel route (Note [Kernel families as ops], ``layouts/kernels/``): the same value in
every mode.

- The forward value of every reduction and softmax is bitwise the same with and without
  ``requires_grad`` on strided, COO, CSR and CSC (the kernel family picks its
  implementation by device, never by autograd).
- Without the native kernels (``MASKED_SPARSE_NATIVE=0``: the torch-op implementation
  every other device takes) the values are within float tolerance of a float64 dense
  ``torch.where`` reference.
- Gradients, both ways, equal the gradient of the dense ``torch.where`` reference.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import _to_layout, dense_of

import layouts
import layouts._native as native
import masked_sparse as ms
from masked_sparse.ops import softmax as softmax_ops

F32, F64 = torch.float32, torch.float64
NEG_INF = -math.inf
LAYOUT_IDS = ["strided", "coo", "csr", "csc"]


def _operand(layout: str, dtype: torch.dtype, seed: int = 0, shape=(7, 9), step: float = 0):
    """A MaskedTensor of ``layout`` with a fully masked row, a fully masked stored column,
    an empty row (sparse), stored entries that are unspecified (holding NaN / inf), and its
    dense data (float64) and mask; with ``step``, the data are multiples of it (ties)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g, dtype=F64) * 2
    if step:
        data = (data / step).round() * step
    mask = torch.rand(shape, generator=g) < 0.6
    mask[2] = False
    mask[:, 4] = False
    stored = mask | (torch.rand(shape, generator=g) < 0.4)
    stored[:, 4] = True
    stored[5] = False
    mask &= stored
    junk = torch.where(torch.rand(shape, generator=g) < 0.5, math.inf, math.nan)
    held = torch.where(mask, data, junk).to(dtype)  # garbage under the mask
    if layout == "strided":
        return ms.masked_tensor(held, mask), data, mask
    coo = ms.masked_tensor(_to_layout(held, stored, torch.sparse_coo),
                           _to_layout(mask, stored, torch.sparse_coo))
    return {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout], \
        data, mask


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.layout == torch.strided else t.to_dense()


def _var_ref(x, m, dim, correction=1):
    count = m.sum(dim)
    mean = torch.where(m, x, 0).sum(dim) / count.clamp(min=1)
    dev = torch.where(m, x - mean.unsqueeze(dim), 0)
    dof = count - correction
    return (dev * dev).sum(dim) / torch.where(dof > 0, dof, 1), dof > 0


def _ref(op: str, x: torch.Tensor, m: torch.Tensor, dim: int):
    """``(values, specified)`` of the dense float64 ``torch.where`` reference."""
    any_ = m.any(dim)
    if op == "sum":
        return torch.where(m, x, 0).sum(dim), any_
    if op == "mean":
        return torch.where(m, x, 0).sum(dim) / m.sum(dim).clamp(min=1), any_
    if op in ("amax", "max"):
        return torch.where(m, x, NEG_INF).amax(dim), any_
    if op == "amin":
        return torch.where(m, x, math.inf).amin(dim), any_
    if op == "prod":
        return torch.where(m, x, 1).prod(dim), any_
    if op == "var":
        return _var_ref(x, m, dim)
    if op == "std":
        var, spec = _var_ref(x, m, dim)
        return torch.where(spec, var, 1).sqrt(), spec
    if op == "logsumexp":
        return torch.where(m, x, NEG_INF).logsumexp(dim), any_
    if op == "norm":
        return torch.where(m, x, 0).norm(dim=dim), any_
    if op == "argmax":
        return torch.where(m, x, NEG_INF).argmax(dim), any_
    if op in ("softmax", "log_softmax"):
        out = getattr(torch.where(m, x, NEG_INF), op)(dim)
        return torch.where(m, out, 0), m
    raise AssertionError(op)


def _call(op: str, mt, dim: int):
    if op == "max":
        return mt.max(dim).values
    if op == "norm":
        return torch.linalg.vector_norm(mt, dim=dim)
    return getattr(torch, op)(mt, dim)


OPS = ["sum", "mean", "amax", "amin", "max", "prod", "var", "std", "logsumexp", "norm",
       "argmax", "softmax", "log_softmax"]
DIFFERENTIABLE = [op for op in OPS if op != "argmax"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({F32: torch.int32, F64: torch.int64}[t.dtype]) if t.is_floating_point() \
        else t


def _assert_bitwise(a, b):
    (da, ma), (db, mb) = dense_of(a), dense_of(b)
    assert torch.equal(ma, mb)
    assert torch.equal(_bits(torch.where(ma, da, torch.zeros((), dtype=da.dtype))),
                       _bits(torch.where(mb, db, torch.zeros((), dtype=db.dtype))))


def _assert_ref(out, op, x, m, dim, dtype):
    want, spec = _ref(op, x, m, dim)
    got, got_mask = dense_of(out)
    assert torch.equal(got_mask, spec)
    tol = {} if op == "argmax" else dict(rtol=1e-5, atol=1e-5) if dtype == F32 else \
        dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.where(spec, got, 0).to(want.dtype),
                               torch.where(spec, want, 0), **tol)


@pytest.fixture(params=["native", "torch ops"])
def implementation(request):
    """The native kernels, or the torch-op implementation (``layouts.native_disabled()``,
    as ``MASKED_SPARSE_NATIVE=0``: the path of every other device)."""
    if request.param == "native" and not native.status().startswith("available"):
        pytest.skip(f"native kernels: {native.status()}")
    if request.param == "torch ops":
        with layouts.native_disabled():
            yield request.param
    else:
        yield request.param


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim", [0, 1])
def test_requires_grad_gives_the_no_grad_value_bitwise(implementation, layout, dtype, op,
                                                         dim):
    mt, x, m = _operand(layout, dtype, seed=dim)
    with torch.no_grad():
        plain = _call(op, mt, dim)
    leaf = mt.clone().requires_grad_()
    out = _call(op, leaf, dim)
    assert out.requires_grad == (op != "argmax")
    _assert_bitwise(plain, out.detach())
    _assert_ref(out.detach(), op, x, m, dim, dtype)


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("op", DIFFERENTIABLE)
@pytest.mark.parametrize("dim", [0, 1])
def test_gradients_equal_the_dense_reference(implementation, layout, op, dim):
    mt, x, m = _operand(layout, F64, seed=3 + dim)
    leaf = mt.clone().requires_grad_()
    out = _call(op, leaf, dim)
    w = torch.rand(x.shape if op.endswith("softmax") else out.shape, dtype=F64,
                   generator=torch.Generator().manual_seed(7))
    (_dense(ms.to_tensor(out, 0)) * w).sum().backward()
    xx = x.clone().requires_grad_()
    want, want_spec = _ref(op, xx, m, dim)
    (torch.where(want_spec, want, 0) * w).sum().backward()
    got, got_mask = dense_of(leaf.grad)
    assert torch.equal(got_mask, m)
    torch.testing.assert_close(torch.where(m, got, 0), torch.where(m, xx.grad, 0))


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("op", ["sum0", "sum1", "var1", "mean0"])
def test_large_float32_sums_are_the_same_with_grad(implementation, layout, op):
    """3000 x 400 float32 values near 3000: with and without autograd the same value, bit
    for bit; with the native kernels (sums in double) the float64 reference rounded once,
    with the torch ops (float32 accumulation, as torch's own sums) within the rounding of
    a float32 sum of its length."""
    g = torch.Generator().manual_seed(0)
    x = (3000 + torch.randn(3000, 400, generator=g, dtype=F64)).to(F32)
    m = torch.rand(3000, 400, generator=g) < 0.9
    coo = ms.masked_tensor(x.to_sparse(), m.to_sparse())
    mt = coo if layout == "coo" else coo.to_sparse_csr()
    dim = int(op[-1])
    name = op[:-1]
    with torch.no_grad():
        plain = getattr(torch, name)(mt, dim)
    out = getattr(torch, name)(mt.clone().requires_grad_(), dim)
    _assert_bitwise(plain, out.detach())
    want, spec = _ref(name, x.double(), m, dim)
    got, got_mask = dense_of(out.detach())
    assert torch.equal(got_mask, spec)
    if implementation == "native":
        tol = dict(rtol=2e-7, atol=0) if name in ("sum", "mean") else dict(rtol=1e-6, atol=0)
    else:  # float32 accumulation over up to 3000 values (var: over their deviations)
        tol = dict(rtol=1e-4, atol=0) if name in ("sum", "mean") else dict(rtol=1e-3, atol=0)
    torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_double_backward(implementation, layout, log):
    """A gradient penalty through the softmax family's backward (create_graph=True),
    against the dense torch.where model."""
    mt, x, m = _operand(layout, F64, seed=5)
    w = torch.rand(x.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    leaf = mt.clone().requires_grad_()
    fn = torch.log_softmax if log else torch.softmax
    (g,) = torch.autograd.grad((_dense(ms.to_tensor(fn(leaf, 1), 0)) * w).sum(), leaf,
                               create_graph=True)
    (gg,) = torch.autograd.grad(_dense(ms.to_tensor(g, 0)).pow(2).sum(), leaf)
    xx = x.clone().requires_grad_()
    ref = torch.where(m, getattr(torch.where(m, xx, NEG_INF), fn.__name__)(1), 0)
    (gr,) = torch.autograd.grad((ref * w).sum(), xx, create_graph=True)
    (ggr,) = torch.autograd.grad(torch.where(m, gr, 0).pow(2).sum(), xx)
    got, got_mask = dense_of(gg)
    assert torch.equal(got_mask, m)
    torch.testing.assert_close(torch.where(m, got, 0), torch.where(m, ggr, 0))


@pytest.mark.parametrize("layout", ["strided", "coo", "csr"])
def test_cumsum_along_lines_with_grad(implementation, layout):
    """cumsum along the stored lines: the same value with grad, and the reverse running
    sum as gradient."""
    mt, x, m = _operand(layout, F64, seed=6)
    with torch.no_grad():
        plain = torch.cumsum(mt, 1)
    leaf = mt.clone().requires_grad_()
    out = torch.cumsum(leaf, 1)
    _assert_bitwise(plain, out.detach())
    w = torch.rand(x.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (_dense(ms.to_tensor(out, 0)) * w).sum().backward()
    xx = x.clone().requires_grad_()
    (torch.where(m, torch.where(m, xx, 0).cumsum(1), 0) * w).sum().backward()
    got, _ = dense_of(leaf.grad)
    torch.testing.assert_close(torch.where(m, got, 0), torch.where(m, xx.grad, 0))


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("op", ["var", "std", "norm", "logsumexp"])
def test_double_backward_ignores_what_unspecified_elements_hold(implementation, layout, op):
    """A gradient penalty through the families' backwards (create_graph=True) on stored
    entries holding NaN / inf under the mask: finite, and equal to the dense reference."""
    mt, x, m = _operand(layout, F64, seed=8)
    leaf = mt.clone().requires_grad_()
    w = torch.rand(x.shape[0], dtype=F64, generator=torch.Generator().manual_seed(3))
    (g,) = torch.autograd.grad((_dense(ms.to_tensor(_call(op, leaf, 1), 0)) * w).sum(),
                               leaf, create_graph=True)
    (gg,) = torch.autograd.grad(_dense(ms.to_tensor(g, 0)).pow(2).sum(), leaf)
    xx = x.clone().requires_grad_()
    want, spec = _ref(op, xx, m, 1)
    (gr,) = torch.autograd.grad((torch.where(spec, want, 0) * w).sum(), xx,
                                create_graph=True)
    (ggr,) = torch.autograd.grad(torch.where(m, gr, 0).pow(2).sum(), xx)
    got, got_mask = dense_of(gg)
    assert torch.equal(got_mask, m)
    torch.testing.assert_close(torch.where(m, got, 0), torch.where(m, ggr, 0))


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "var", "logsumexp"])
def test_backward_leaves_the_incoming_gradient_alone(layout, op):
    """The families' backwards fill their own temporaries in place, never the gradient
    they receive (a broadcast of it shares its memory)."""
    x = torch.randn(6, 1, dtype=F64, generator=torch.Generator().manual_seed(9))
    m = torch.tensor([[True], [False], [True], [True], [False], [True]])
    mt = ms.masked_tensor(x, m)
    mt = {"strided": mt, "coo": mt.to_sparse_coo(), "csr": mt.to_sparse_csr(),
          "csc": mt.to_sparse_csc()}[layout]
    leaf = mt.clone().requires_grad_()
    out = getattr(torch, op)(leaf, 1, keepdim=True) if op != "var" else \
        torch.var(leaf, 1, keepdim=True, correction=0)
    grad = torch.full(out.shape, 2.0, dtype=F64)
    out.backward(grad)
    assert torch.equal(grad, torch.full(out.shape, 2.0, dtype=F64))


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "var", "std",
                                "logsumexp", "softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1])
def test_the_native_backward_is_the_torch_op_backward(monkeypatch, layout, dtype, op, dim):
    """A plain backward takes the native backward kernels (``_native.backward``, along and
    across the stored lines; the softmax along lines: ``_native.softmax_backward``); one
    with ``create_graph=True`` the differentiable torch ops. The two gradients are the same
    bits (the exps of logsumexp and log_softmax: within an ULP of torch's), 0 wherever
    unspecified, whatever the stored entries hold there."""
    if not native.status().startswith("available"):
        pytest.skip(f"native kernels: {native.status()}")
    ran: list[bool] = []

    def spy(kernel):
        def call(*args, **kwargs):
            out = kernel(*args, **kwargs)
            ran.append(out is not None)
            return out
        return call

    monkeypatch.setattr(native, "backward", spy(native.backward))
    monkeypatch.setattr(native, "softmax_backward", spy(native.softmax_backward))
    mt, x, m = _operand(layout, dtype, seed=11 + dim, shape=(23, 17), step=1.0)  # ties
    grads = []
    for create_graph in (False, True):
        leaf = mt.clone().requires_grad_()
        out = _call(op, leaf, dim)
        w = torch.rand(x.shape if op.endswith("softmax") else out.shape, dtype=dtype,
                       generator=torch.Generator().manual_seed(4))
        ran.clear()
        (g,) = torch.autograd.grad((_dense(ms.to_tensor(out, 0)) * w).sum(), leaf,
                                   create_graph=create_graph)
        assert any(ran) != create_graph, ran
        grads.append(dense_of(g))
    (native_grad, native_mask), (torch_grad, torch_mask) = grads
    assert torch.equal(native_mask, m) and torch.equal(torch_mask, m)
    zero = torch.zeros((), dtype=dtype)
    assert torch.equal(_bits(torch.where(m, zero, native_grad)), _bits(zero.expand_as(m)))
    if op in ("logsumexp", "log_softmax"):
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(native_grad, torch_grad, rtol=4 * eps, atol=4 * eps)
    else:
        assert torch.equal(_bits(native_grad), _bits(torch.where(m, torch_grad, zero)))


def _one_node_softmax_off(monkeypatch) -> None:
    """Sparse softmaxes through ``on_values`` (Note [A sparse softmax as one node] off)."""
    monkeypatch.setattr(softmax_ops, "_records_one_node", lambda op, mt: False)


def _recording_node_backward(direct: list[bool]):
    """``layouts.node_backward``, appending to ``direct`` whether it took the direct call."""
    node_backward = layouts.node_backward

    def spy(*args):
        out = node_backward(*args)
        direct.append(out is not None)
        return out

    return spy


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "var", "logsumexp", "softmax", "max"])
@pytest.mark.parametrize("dim", [0, 1])
def test_a_family_backward_without_the_engine_is_the_engines(implementation, monkeypatch,
                                                            layout, op, dim):
    """Note [A family's backward without the engine]: where the inner graph of a masked op
    is one family node, its backward is called directly. The gradients are those of the
    engine's run of the same graph (node_backward switched off), bit for bit, whichever
    outputs are used; a second backward without ``retain_graph`` still raises torch's error,
    and with it gives the same gradient again."""
    mt, x, m = _operand(layout, F64, seed=5 + dim, shape=(11, 13), step=0.5)
    direct: list[bool] = []
    spy = _recording_node_backward(direct)
    _one_node_softmax_off(monkeypatch)  # (the route under test here is on_values')

    def loss_of(leaf):
        out = _call(op, leaf, dim)
        out = out[0] if isinstance(out, tuple) else out
        dense = _dense(ms.to_tensor(out, 0))
        weight = torch.rand(dense.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
        return (dense * weight).sum()

    grads = []
    for engine in (False, True):
        monkeypatch.setattr(layouts, "node_backward",
                            (lambda *a: None) if engine else spy)
        leaf = mt.clone().requires_grad_()
        loss = loss_of(leaf)
        (g,) = torch.autograd.grad(loss, leaf, retain_graph=True)
        (again,) = torch.autograd.grad(loss, leaf)
        _assert_bitwise(g, again)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.grad(loss, leaf)
        grads.append(g)
    # (more than one node: strided softmax; amax, whose fully masked line gets a fill)
    if not (op == "softmax" and layout == "strided") and op != "amax":
        assert direct and all(direct), direct
    _assert_bitwise(*grads)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_heads_as_groups_backward_without_the_engine_is_the_engines(monkeypatch, heads, log):
    """A hybrid COO softmax reads its values flat and views the result back (Note [Heads
    as groups]); node_backward reads through both views: the direct call is taken, and its
    gradient is the engine's, bit for bit, and the dense reference's per head."""
    gen = torch.Generator().manual_seed(heads)
    n = 9
    keep = torch.rand(n, n, generator=gen) < 0.4
    keep[3] = False  # an empty row
    indices = keep.nonzero().t()
    values = torch.randn(indices.shape[1], heads, dtype=F64, generator=gen)
    mask = torch.rand(values.shape, generator=gen) < 0.8
    shape = (n, n, heads)
    mt = ms.masked_tensor(torch.sparse_coo_tensor(indices, values, shape).coalesce(),
                          torch.sparse_coo_tensor(indices, mask, shape).coalesce())
    weight = torch.rand(shape, dtype=F64, generator=gen)
    direct: list[bool] = []
    spy = _recording_node_backward(direct)
    _one_node_softmax_off(monkeypatch)  # (the route under test here is on_values')

    grads = []
    for engine in (False, True):
        monkeypatch.setattr(layouts, "node_backward", (lambda *a: None) if engine else spy)
        leaf = mt.clone().requires_grad_()
        out = (torch.log_softmax if log else torch.softmax)(leaf, 1)
        (g,) = torch.autograd.grad((ms.to_tensor(out, 0).to_dense() * weight).sum(), leaf)
        grads.append(g)
    assert direct == [True]
    _assert_bitwise(*grads)
    dense = torch.zeros(shape, dtype=F64).index_put_(tuple(indices), values).requires_grad_()
    specified = torch.zeros(shape, dtype=torch.bool).index_put_(tuple(indices), mask)
    fn = torch.log_softmax if log else torch.softmax
    ref = fn(dense.masked_fill(~specified, -math.inf), 1)
    (want,) = torch.autograd.grad((torch.where(specified, ref, 0) * weight).sum(), dense)
    got, got_mask = dense_of(grads[0])
    assert torch.equal(got_mask, specified)
    torch.testing.assert_close(torch.where(specified, got, 0), torch.where(specified, want, 0))


@pytest.mark.parametrize("layout", LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("op", ["amax", "amin", "prod", "sumsq"])
@pytest.mark.parametrize("dim", [0, 1, None])
def test_a_reduction_zeroes_its_empty_groups_in_the_kernel_output(layout, dtype, op, dim):
    """``kernels.masked_reduce_zeroed`` (the kernel's output zeroed in place where a group
    holds no specified element) is bit for bit ``where(specified, masked_reduce, 0)``, with
    NaN and inf specified or not, fully masked and empty lines; amax, amin, prod store it,
    the 2-norm its roots."""
    from layouts.kernels import masked_reduce, masked_reduce_zeroed

    mt, x, m = _operand(layout, dtype, step=0.5)
    s = mt._storage
    dims = (0, 1) if dim is None else (dim,)
    g = layouts.group_by(s, dims, False)
    specified = g.reduce(s.mask, "any")
    got = masked_reduce_zeroed(g, s.values, s.mask, op, specified)
    if native.status().startswith("available") and layout != "strided":
        assert got is not None
    if got is None:
        return
    want = torch.where(specified, masked_reduce(g, s.values, s.mask, op),
                       torch.zeros((), dtype=dtype))
    assert torch.equal(_bits(got), _bits(want))
    if op == "sumsq":
        out = torch.linalg.vector_norm(mt, dim=dim)._storage
        want = want.sqrt()
    else:
        out = (getattr(torch, op)(mt) if dim is None else getattr(torch, op)(mt, dim))._storage
    assert torch.equal(_bits(out.values.reshape(-1)), _bits(want.reshape(-1)))


def _hybrid(heads: int, dtype: torch.dtype, seed: int = 0):
    """A hybrid COO MaskedTensor ``(9, 9, heads)`` with an empty row and unspecified
    stored values holding NaN."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(9, 9, generator=gen) < 0.4
    keep[3] = False
    indices = keep.nonzero().t()
    values = torch.randn(indices.shape[1], heads, dtype=dtype, generator=gen)
    mask = torch.rand(values.shape, generator=gen) < 0.8
    values[~mask] = math.nan
    shape = (9, 9, heads)
    return ms.masked_tensor(torch.sparse_coo_tensor(indices, values, shape).coalesce(),
                            torch.sparse_coo_tensor(indices, mask, shape).coalesce())


@pytest.mark.parametrize("create_graph", [False, True], ids=["backward", "create_graph"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", ["coo-0", "coo-1", "csr-0", "csr-1", "csc-0", "csc-1",
                                  "heads-1", "heads-3"])
def test_a_sparse_softmax_as_one_node_is_the_generic_route(monkeypatch, case, log, dtype,
                                                           create_graph):
    """Note [A sparse softmax as one node]: recorded as one node, a sparse softmax gives the
    values and gradients of the on_values route bit for bit (a double backward too, within
    rounding: its graph is on_values' own), in every sparse layout, along either dim and
    per head; the node's saved state goes with a backward without retain_graph."""
    kind, arg = case.split("-")
    if kind == "heads":
        mt, dim = _hybrid(int(arg), dtype), 1
    else:
        mt, dim = _operand(kind, dtype, seed=3, shape=(8, 11))[0], int(arg)
    fn = torch.log_softmax if log else torch.softmax
    weight = torch.rand(mt.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    results = []
    for one_node in (True, False):
        if not one_node:
            _one_node_softmax_off(monkeypatch)
        leaf = mt.clone().requires_grad_()
        out = fn(leaf, dim)
        assert (type(out.grad_fn).__name__ == "_SparseSoftmaxBackward") == one_node
        loss = (_dense(ms.to_tensor(out, 0)) * weight).sum()
        (g,) = torch.autograd.grad(loss, leaf, create_graph=create_graph)
        if create_graph:  # differentiate the gradient again
            (g,) = torch.autograd.grad((_dense(ms.to_tensor(g, 0)) ** 2).sum(), leaf)
        results.append((out.detach(), g))
    (out, g), (want_out, want_g) = results
    _assert_bitwise(out, want_out)
    if create_graph:
        (dg, mg), (dw, mw) = dense_of(g), dense_of(want_g)
        assert torch.equal(mg, mw)
        torch.testing.assert_close(torch.where(mg, dg, 0), torch.where(mw, dw, 0))
    else:
        _assert_bitwise(g, want_g)


def test_a_sparse_softmax_node_frees_its_state_as_torch_does():
    """A second backward through the one-node softmax without retain_graph raises torch's
    error; with retain_graph it gives the same gradient again."""
    mt = _operand("csr", F64, seed=1)[0].requires_grad_()
    loss = ms.to_tensor(torch.softmax(mt, 1) * 2.0, 0).to_dense().pow(2).sum()
    (first,) = torch.autograd.grad(loss, mt, retain_graph=True)
    (again,) = torch.autograd.grad(loss, mt)
    _assert_bitwise(first, again)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(loss, mt)
