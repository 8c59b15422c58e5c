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


GRADGRAD_OPS = {  # second derivatives that are not zero: squares after linear reductions
    "sin": lambda m: ms.to_tensor(torch.sin(m) * m, 0),
    "sum1": lambda m: ms.to_tensor(m.sum(1) ** 2, 0),
    "mean1": lambda m: ms.to_tensor(m.mean(1) ** 2, 0),
    "amax0": lambda m: ms.to_tensor(m.amax(0) ** 2, 0),
    "var1": lambda m: ms.to_tensor(m.var(1), 0),
    "softmax1": lambda m: ms.to_tensor(m.softmax(1), 0),
    "log_softmax0": lambda m: ms.to_tensor(m.log_softmax(0), 0),
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


def _strided_case(seed, shape=(2, 4)):  # small: gradgradcheck perturbs every element
    _, x, m = make_masked(shape, torch.strided, F64, seed=seed)
    m = m.clone()
    m[:, :2] = True  # var: two specified elements per row; amax0: no fully masked column
    return x, m


@pytest.mark.parametrize("op", GRADGRAD_OPS, ids=list(GRADGRAD_OPS))
def test_gradcheck_and_gradgradcheck_of_a_masked_tensor_input(op):
    # Note [Masked values into plain tensors]: torch's checker fills its plain Jacobian
    # from the masked gradient; it perturbs the MaskedTensor's data in place (masked-out
    # entries too: their column must be 0 both ways).
    x, m = _strided_case(seed=9)
    fn = GRADGRAD_OPS[op]
    mt = ms.masked_tensor(x, m, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (mt,))
    assert torch.autograd.gradgradcheck(fn, (mt,))
    assert torch.autograd.gradcheck(fn, (mt,), fast_mode=True)


@pytest.mark.parametrize("op", GRADGRAD_OPS, ids=list(GRADGRAD_OPS))
def test_gradgradcheck_plain_leaf_through_as_masked_tensor(op):
    # Note [Double backward] (_autograd.py): the backward is differentiable again.
    x, m = _strided_case(seed=10)
    fn = GRADGRAD_OPS[op]
    leaf = x.clone().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda d: fn(ms.as_masked_tensor(d, m)), (leaf,))
    assert torch.autograd.gradgradcheck(lambda d: fn(ms.as_masked_tensor(d, m)), (leaf,),
                                        fast_mode=True)


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


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_plain_leaf_takes_no_value_the_masked_gradient_leaves_unspecified(layout):
    data, mask, dx, mx = leaf_of(layout, seed=7)
    g = torch.arange(15, dtype=F64).reshape(SHAPE) + 100
    gmask = mx & (torch.arange(15).reshape(SHAPE) % 2 == 0)  # half of the specified ones
    mt = ms.as_masked_tensor(data, mask)
    mt.backward(ms.to_layout(ms.masked_tensor(g, gmask), ms.layout_of(mt)))
    torch.testing.assert_close(dense(data.grad), torch.where(gmask, g, 0))


def test_vjp_through_as_masked_tensor_pointwise():
    data, mask, dx, mx = leaf_of(torch.strided, seed=6)
    w = torch.arange(15, dtype=F64).reshape(SHAPE)
    out, pullback = torch.func.vjp(
        lambda x: ms.to_tensor(torch.sin(ms.as_masked_tensor(x, mask)) * 2, 0), data.detach())
    (grad,) = pullback(w)
    torch.testing.assert_close(out, torch.where(mx, dx.sin() * 2, 0))
    torch.testing.assert_close(grad, torch.where(mx, 2 * dx.cos() * w, 0))


# -- torch.func: Note [MaskedTensors in torch.func] -----------------------------------------
# Each op: (masked function of a MaskedTensor -> plain strided tensor, the same computation
# on dense data ``x`` with a bool mask ``m`` written with torch.where, 0 where unspecified).
NEG_INF = float("-inf")


def _where_softmax(x, m, dim):
    p = torch.where(m, x, NEG_INF).softmax(dim)
    return torch.where(m, p, 0)


FUNC_OPS = {
    "sin_mul": (lambda mt: (mt.sin() * mt).to_tensor(0),
                lambda x, m: torch.where(m, x.sin() * x, 0)),
    "sum": (lambda mt: mt.sum().to_tensor(0), lambda x, m: torch.where(m, x, 0).sum()),
    "mean1": (lambda mt: mt.mean(1).to_tensor(0),
              lambda x, m: torch.where(m, x, 0).sum(1) / m.sum(1).clamp(min=1)),
    "amax0": (lambda mt: mt.amax(0).to_tensor(0),
              lambda x, m: torch.where(m.any(0), torch.where(m, x, NEG_INF).amax(0), 0)),
    "var1": (lambda mt: mt.var(1).to_tensor(0), None),  # reference: the masked rows alone
    "softmax1": (lambda mt: mt.softmax(1).to_tensor(0), lambda x, m: _where_softmax(x, m, 1)),
    "log_softmax0": (lambda mt: ms.to_tensor(torch.log_softmax(mt, 0), 0),
                     lambda x, m: torch.where(
                         m, torch.where(m, x, NEG_INF).log_softmax(0), 0)),
}


def _var1(x, m):  # per row over the specified elements (rows here have >= 2 of them)
    n = m.sum(1)
    mu = torch.where(m, x, 0).sum(1) / n
    return torch.where(m, (x - mu[:, None]) ** 2, 0).sum(1) / (n - 1)


def _func_case(seed=5):
    _, x, m = make_masked(SHAPE, torch.strided, F64, seed=seed)
    m = m.clone()
    m[:, :2] = True  # every row and column has specified elements (var: >= 2 per row)
    m[0, 2:] = False
    return x, m


def _reference(op):
    fn, ref = FUNC_OPS[op]
    return fn, (ref if ref is not None else _var1)


@pytest.mark.parametrize("op", FUNC_OPS, ids=list(FUNC_OPS))
def test_func_grad_vjp_jacrev_through_as_masked_tensor(op):
    fn, ref = _reference(op)
    x, m = _func_case()
    w = torch.rand(fn(ms.masked_tensor(x, m)).shape, dtype=F64)

    def loss(masked):  # a scalar from the masked function and from the dense reference
        return lambda d: (masked(d) * w).sum()

    got = torch.func.grad(loss(lambda d: fn(ms.as_masked_tensor(d, m))))(x)
    want = torch.func.grad(loss(lambda d: ref(d, m)))(x)
    torch.testing.assert_close(got, torch.where(m, want, 0))

    out, pullback = torch.func.vjp(lambda d: fn(ms.as_masked_tensor(d, m)), x)
    torch.testing.assert_close(out, ref(x, m))
    torch.testing.assert_close(pullback(w)[0], got)

    jac = torch.func.jacrev(lambda d: fn(ms.as_masked_tensor(d, m)))(x)
    jac_ref = torch.func.jacrev(lambda d: ref(d, m))(x)
    torch.testing.assert_close(jac, torch.where(m, jac_ref, 0))


@pytest.mark.parametrize("op", ["mean1", "softmax1", "var1"])
def test_func_vmap_and_hessian_through_as_masked_tensor(op):
    fn, ref = _reference(op)
    x, m = _func_case()
    batch = torch.stack([x, x.flip(1), 2 * x])
    got = torch.func.vmap(lambda d: fn(ms.as_masked_tensor(d, m)))(batch)
    torch.testing.assert_close(got, torch.stack([ref(b, m) for b in batch]))

    per_example = torch.func.vmap(torch.func.grad(
        lambda d: fn(ms.as_masked_tensor(d, m)).pow(2).sum()))(batch)
    want = torch.func.vmap(torch.func.grad(lambda d: ref(d, m).pow(2).sum()))(batch)
    torch.testing.assert_close(per_example, torch.where(m, want, 0))

    hess = torch.func.hessian(lambda d: fn(ms.as_masked_tensor(d, m)).pow(2).sum())(x)
    hess_ref = torch.func.hessian(lambda d: ref(d, m).pow(2).sum())(x)
    keep = m.reshape(-1, 1) & m.reshape(1, -1)
    torch.testing.assert_close(hess.reshape(keep.shape),
                               torch.where(keep, hess_ref.reshape(keep.shape), 0))


@pytest.mark.parametrize("op", FUNC_OPS, ids=list(FUNC_OPS))
def test_func_grad_of_a_masked_tensor_argument(op):
    fn, ref = _reference(op)
    x, m = _func_case(seed=6)
    mt = ms.masked_tensor(x, m)
    grad = torch.func.grad(lambda a: fn(ms.lift(a)).sum())(mt)
    want = torch.func.grad(lambda d: ref(d, m).sum())(x)
    assert isinstance(grad, ms.MaskedTensor)
    assert torch.equal(grad.get_mask(), m)  # the argument's mask: "no gradient" stays so
    torch.testing.assert_close(grad.to_tensor(0), torch.where(m, want, 0))
    # per example: a batch of MaskedTensors, each row a MaskedTensor inside the function
    rows = torch.func.vmap(lambda a: ms.lift(a).softmax(0).to_tensor(0))(mt)
    torch.testing.assert_close(rows, _where_softmax(x, m, 1))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_func_unlifted_reduction_under_grad_says_lift(layout):
    mt, _, _ = make_masked(SHAPE, layout, F64, seed=14)
    with pytest.raises(NotImplementedError, match=r"ms\.lift"):
        torch.func.grad(lambda a: ms.to_tensor(a.mean(1), -1.0).sum())(mt)
    # vmap alone batches the masked kernels: a reduction per row, as in eager
    rows = torch.func.vmap(lambda a: ms.to_tensor(a.sum(0), -1.0))(mt)
    torch.testing.assert_close(rows, ms.to_tensor(mt.sum(1), -1.0))


def test_func_jacobians_of_a_masked_tensor_argument_say_use_the_data():
    x, m = _func_case(seed=15)
    mt = ms.masked_tensor(x, m)
    with pytest.raises(NotImplementedError, match="with respect to the data"):
        torch.func.jacrev(lambda a: ms.lift(a).softmax(1).to_tensor(0))(mt)
    with pytest.raises(NotImplementedError, match="with respect to the data"):
        torch.func.vmap(torch.func.grad(lambda a: ms.lift(a).mean().to_tensor(0)))(mt)


def test_func_functional_api_lifts_its_argument():
    x, m = _func_case(seed=7)
    grad = torch.func.grad(lambda a: ms.mean(a, 1).sum().to_tensor(0))(ms.masked_tensor(x, m))
    want = torch.func.grad(lambda d: FUNC_OPS["mean1"][1](d, m).sum())(x)
    torch.testing.assert_close(grad.to_tensor(0), torch.where(m, want, 0))


# -- torch.func on sparse layouts: the transform tracks strided data, the function converts --
# The MaskedTensor over the tracked data converts to a sparse layout (its values gathered at
# the mask: plain ops), and every masked op after it is the layout's kernel on those values.
# Results are taken strided (``to_dense``): torch.func cannot build a compressed result.
TO_SPARSE = {
    "coo": lambda mt: mt.to_sparse_coo(),
    "csr": lambda mt: mt.to_sparse_csr(),
    "csc": lambda mt: mt.to_sparse_csc(),
    "bsr": lambda mt: mt.to_sparse_bsr((1, 1)),
}


def _strided_out(mt):
    return mt.to_dense().to_tensor(0)


SPARSE_FUNC_OPS = {  # name -> masked function of a sparse MaskedTensor (strided result)
    "sin_mul": lambda mt: _strided_out(mt.sin() * mt),
    "sum": lambda mt: _strided_out(mt.sum()),
    "mean1": lambda mt: _strided_out(mt.mean(1)),
    "amax0": lambda mt: _strided_out(mt.amax(0)),
    "var1": lambda mt: _strided_out(mt.var(1)),
    "softmax1": lambda mt: _strided_out(mt.softmax(1)),
    "log_softmax0": lambda mt: _strided_out(torch.log_softmax(mt, 0)),
}


def _sparse_case(layout, op, seed=5):
    x, m = _func_case(seed)
    to_sparse, fn = TO_SPARSE[layout], SPARSE_FUNC_OPS[op]
    ref = FUNC_OPS[op][1] or _var1
    assert ms.layout_of(to_sparse(ms.masked_tensor(x, m))).name.endswith(layout)
    return x, m, (lambda d: fn(to_sparse(ms.as_masked_tensor(d, m)))), ref


@pytest.mark.parametrize("op", SPARSE_FUNC_OPS, ids=list(SPARSE_FUNC_OPS))
@pytest.mark.parametrize("layout", TO_SPARSE, ids=list(TO_SPARSE))
def test_func_grad_vjp_jacrev_on_sparse_layouts(layout, op):
    x, m, masked, ref = _sparse_case(layout, op)
    w = torch.rand(ref(x, m).shape, dtype=F64)
    got = torch.func.grad(lambda d: (masked(d) * w).sum())(x)
    want = torch.func.grad(lambda d: (ref(d, m) * w).sum())(x)
    torch.testing.assert_close(got, torch.where(m, want, 0))

    out, pullback = torch.func.vjp(masked, x)
    torch.testing.assert_close(out, ref(x, m))
    torch.testing.assert_close(pullback(w)[0], got)

    jac = torch.func.jacrev(masked)(x)
    torch.testing.assert_close(jac, torch.where(m, torch.func.jacrev(lambda d: ref(d, m))(x), 0))


@pytest.mark.parametrize("layout", TO_SPARSE, ids=list(TO_SPARSE))
def test_func_vmap_and_hessian_on_sparse_layouts(layout):
    x, m, masked, ref = _sparse_case(layout, "softmax1")
    batch = torch.stack([x, x.flip(1), 2 * x])
    got = torch.func.vmap(masked)(batch)
    torch.testing.assert_close(got, torch.stack([ref(b, m) for b in batch]))

    per_example = torch.func.vmap(torch.func.grad(lambda d: masked(d).pow(2).sum()))(batch)
    want = torch.func.vmap(torch.func.grad(lambda d: ref(d, m).pow(2).sum()))(batch)
    torch.testing.assert_close(per_example, torch.where(m, want, 0))

    hess = torch.func.hessian(lambda d: masked(d).pow(2).sum())(x)
    hess_ref = torch.func.hessian(lambda d: ref(d, m).pow(2).sum())(x)
    keep = m.reshape(-1, 1) & m.reshape(1, -1)
    torch.testing.assert_close(hess.reshape(keep.shape),
                               torch.where(keep, hess_ref.reshape(keep.shape), 0))


@pytest.mark.parametrize("op", ["sin_mul", "mean1", "amax0", "softmax1"])
@pytest.mark.parametrize("layout", TO_SPARSE, ids=list(TO_SPARSE))
def test_func_grad_of_a_lifted_sparse_argument(layout, op):
    x, m = _func_case(seed=6)
    mt = TO_SPARSE[layout](ms.masked_tensor(x, m))
    ref = FUNC_OPS[op][1]
    grad = torch.func.grad(lambda a: SPARSE_FUNC_OPS[op](ms.lift(a)).sum())(mt)
    want = torch.func.grad(lambda d: ref(d, m).sum())(x)
    assert isinstance(grad, ms.MaskedTensor) and grad.layout == mt.layout
    assert torch.equal(grad.get_mask().to_dense(), m)  # the argument's mask
    torch.testing.assert_close(grad.to_dense().to_tensor(0), torch.where(m, want, 0))
    out, pullback = torch.func.vjp(lambda a: SPARSE_FUNC_OPS["mean1"](ms.lift(a)), mt)
    torch.testing.assert_close(out, FUNC_OPS["mean1"][1](x, m))
    torch.testing.assert_close(pullback(torch.ones(SHAPE[0], dtype=F64))[0].to_dense()
                               .to_tensor(0), (m / m.sum(1, keepdim=True)).to(F64))


def test_func_torch_coo_result_under_grad():
    x, m = _func_case(seed=9)  # a torch sparse_coo result (to_tensor(0)) is one torch wraps
    got = torch.func.grad(lambda d: ms.as_masked_tensor(d, m).to_sparse_coo().sum(1)
                          .to_tensor(0).to_dense().pow(2).sum())(x)
    torch.testing.assert_close(got, torch.where(m, 2 * torch.where(m, x, 0).sum(1, True), 0))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_func_sparse_masked_tensors_say_what_works(layout):
    mt, data, mask = make_masked(SHAPE, layout, F64, seed=8)
    x, m = _func_case(seed=8)
    if layout == torch.sparse_csr:  # torch.func cannot build a compressed sparse result
        with pytest.raises(NotImplementedError, match=r"to_dense\(\)\.to_tensor\(0\)"):
            torch.func.grad(lambda d: ms.as_masked_tensor(d, m).to_sparse_csr().sin()
                            .to_tensor(0).to_dense().sum())(x)
        with pytest.raises(NotImplementedError, match=r"to_dense\(\)\.to_tensor\(0\)"):
            torch.func.vmap(lambda d: ms.as_masked_tensor(d, m).to_sparse_csr().get_data())(
                x[None])
    else:  # nor a sparse input it is given, nor a batch of sparse arguments
        with pytest.raises(NotImplementedError, match=r"as_masked_tensor\(x, mask\)"):
            torch.func.grad(lambda d: ms.as_masked_tensor(d, mt.get_mask()).sum().to_tensor(0))(
                mt.get_data())
        with pytest.raises(NotImplementedError, match="vmap over the strided data"):
            torch.func.vmap(lambda a: ms.lift(a).sum().to_tensor(0))(mt)
    # what works on the argument as it is: pointwise ops, then a dense result (torch.func
    # cannot wrap a compressed sparse result, so not to_tensor(0) / get_data there)
    out, pullback = torch.func.vjp(lambda a: ms.to_tensor(a.sin() * 2, -1.0), mt)
    (grad,) = pullback(torch.ones(SHAPE, dtype=F64))
    assert isinstance(grad, ms.MaskedTensor)
    torch.testing.assert_close(dense(grad.to_tensor(0)),
                               torch.where(dense(mask), 2 * dense(data).cos(), 0.0))


@pytest.mark.parametrize("layout", LAYOUTS + [torch.sparse_csc], ids=LAYOUT_IDS + ["csc"])
def test_double_backward_of_a_masked_tensor_leaf(layout):
    # a gradient penalty: d/dx |d(softmax . w)/dx|^2 against the dense torch.where model
    # (COO / CSR softmax along the lines: the softmax family's backward is written in
    # differentiable torch ops, so it has a double backward where torch's segment_reduce
    # had none)
    mt, x, m = make_masked(SHAPE, layout if layout != torch.sparse_csc else torch.sparse_csr,
                           F64, seed=12)
    mt = (mt.to_sparse_csc() if layout == torch.sparse_csc else mt).requires_grad_()
    w = torch.rand(SHAPE, dtype=F64)
    (g,) = torch.autograd.grad((dense(ms.to_tensor(mt.softmax(1), 0)) * w).sum(), mt,
                               create_graph=True)
    (gg,) = torch.autograd.grad(dense(ms.to_tensor(g, 0)).pow(2).sum(), mt)
    xx = x.clone().requires_grad_()
    (gr,) = torch.autograd.grad((_where_softmax(xx, m, 1) * w).sum(), xx, create_graph=True)
    (ggr,) = torch.autograd.grad(torch.where(m, gr, 0).pow(2).sum(), xx)
    assert torch.equal(gg.get_mask() if layout == torch.strided else dense(gg.get_mask()), m)
    torch.testing.assert_close(dense(gg.to_tensor(0)), torch.where(m, ggr, 0))


# -- torch.jit: Note [Aten-level autograd] (_tensor.py) -------------------------------------
class _Reduce(torch.nn.Module):
    def forward(self, x):
        return x.sum(1) * 2


def test_jit_script_runs_forward_and_refuses_masked_autograd():
    mt, _, _ = make_masked(SHAPE, torch.strided, F64, seed=13)
    scripted = torch.jit.script(_Reduce())
    ms_out = scripted(mt)  # the aten-level kernels: the eager result
    assert isinstance(ms_out, ms.MaskedTensor)
    torch.testing.assert_close(ms_out.to_tensor(0), (mt.sum(1) * 2).to_tensor(0))
    # differentiating would run torch's dense formulas: refused (TorchScript re-raises it
    # as a RuntimeError whose text it drops, so the reason comes as a warning too)
    with pytest.warns(UserWarning, match="torch.compile"), pytest.raises(RuntimeError):
        scripted(mt.detach().requires_grad_())
    with pytest.raises(NotImplementedError, match="torch.export"):
        torch.ops.aten.mean.dim(mt.detach().requires_grad_(), [1])


def test_the_library_functions_skip_signature_binding_and_refuse_defaults():
    """``masked_sparse._func.Function.apply`` does not bind the arguments to ``forward``'s
    signature outside transforms (torch's binding only fills in defaults), so a subclass
    whose ``forward`` has a default is refused when it is defined; inside a transform the
    apply is torch's own (``custom_function_call``)."""
    from masked_sparse import _func

    with pytest.raises(TypeError, match="no default arguments"):
        class _Defaulted(_func.Function):  # noqa: F841
            @staticmethod
            def forward(x, scale=2.0):
                return x * scale

    class Twice(_func.Function):
        @staticmethod
        def forward(x):
            return 2 * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, grad):
            return 3 * grad  # not 2: tells this backward from autograd's own formula

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    Twice.apply(x).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    assert torch.func.grad(lambda t: Twice.apply(t).sum())(torch.ones(2)).tolist() == [3.0, 3.0]
