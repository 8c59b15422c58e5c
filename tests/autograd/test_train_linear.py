"""Training an MLP with masked weights against the dense workaround ``F.linear(x, W * M, b)``.

The workaround is the reference (what ``torch.nn.utils.prune`` computes): on every row of a
weight that keeps at least one entry the two forward passes are the same sums, so losses,
the gradients at the kept entries, the biases' gradients and the parameters after several
optimizer steps (``ms.optim.Adam`` against ``torch.optim.Adam`` on the dense weights, whose
masked-out entries get a zero gradient and so never move) agree to 1e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked_in

import layouts
import masked_sparse as ms
from benchmarks.bench_training import forward as _forward  # the benchmarked MLP

SIZES = (20, 16, 12, 5)
LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr}
TOL = dict(rtol=1e-5, atol=1e-5)


def _dense(t: torch.Tensor) -> torch.Tensor:
    if ms.is_masked_tensor(t):
        t = t.to_tensor(0)
    return t.to_dense() if t.layout != torch.strided else t


def _model(seed: int):
    g = torch.Generator().manual_seed(seed)
    weights, masks, biases = [], [], []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        weights.append(torch.randn(n_out, n_in, generator=g) / n_in ** 0.5)
        masks.append(torch.rand(n_out, n_in, generator=g) < 0.5)
        biases.append(torch.randn(n_out, generator=g) * 0.1)
    assert all(m.any(1).all() for m in masks)  # no fully pruned neuron: outputs agree
    return weights, masks, biases


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mlp_training_matches_dense_workaround(layout):
    weights, masks, biases = _model(0)
    mine_w = [torch.nn.Parameter(ms.to_layout(ms.masked_tensor(w.clone(), m), LAYOUTS[layout]))
              for w, m in zip(weights, masks)]
    mine_b = [torch.nn.Parameter(b.clone()) for b in biases]
    ref_w = [torch.nn.Parameter(w.clone()) for w in weights]
    ref_b = [torch.nn.Parameter(b.clone()) for b in biases]
    opt = ms.optim.Adam(mine_w + mine_b, lr=0.01)
    ref_opt = torch.optim.Adam(ref_w + ref_b, lr=0.01, foreach=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(32, SIZES[0], generator=g), torch.randint(SIZES[-1], (32,), generator=g)
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = F.cross_entropy(_forward(x, mine_w, mine_b), y)
        ref_loss = F.cross_entropy(_forward(x, ref_w, ref_b, masks), y)
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, **TOL)
        for w, rw, m in zip(mine_w, ref_w, masks):
            assert ms.is_masked_tensor(w.grad) and w.grad.layout == LAYOUTS[layout]
            torch.testing.assert_close(_dense(w.grad)[m], rw.grad[m], **TOL)
        for b, rb in zip(mine_b, ref_b):
            assert not ms.is_masked_tensor(b.grad)  # a plain parameter, a plain gradient
            torch.testing.assert_close(b.grad, rb.grad, **TOL)
        opt.step()
        ref_opt.step()
    for w, rw, m, w0 in zip(mine_w, ref_w, masks, weights):
        got = _dense(w.detach())
        torch.testing.assert_close(got[m], rw.detach()[m], **TOL)
        assert not torch.equal(got[m], w0[m])
        assert torch.equal(rw.detach()[~m], w0[~m])  # the reference's pruned entries held
    for b, rb in zip(mine_b, ref_b):
        torch.testing.assert_close(b.detach(), rb.detach(), **TOL)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("transpose", [False, True], ids=["x@W.T", "x@W"])
def test_sparse_weight_product_gradients_in_float64(layout, transpose):
    """Both gradients of ``x @ W.T`` and ``x @ W`` (the transposed pattern of Note
    [Transposed pattern]) against the dense product, float64."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(7, 9, generator=g, dtype=torch.float64)
    m = torch.rand(7, 9, generator=g) < 0.4
    m[:, 0] = True
    m[0, :] = True  # every row and column has an entry
    x = torch.randn(5, 7 if transpose else 9, generator=g, dtype=torch.float64)
    grad_out = torch.randn(5, 9 if transpose else 7, generator=g, dtype=torch.float64)
    mt = ms.to_layout(ms.masked_tensor(w.clone(), m), LAYOUTS[layout]).requires_grad_()
    xm = x.clone().requires_grad_()
    out = (xm @ mt) if transpose else F.linear(xm, mt)
    out.to_tensor(0).backward(grad_out)
    wd = w.clone().requires_grad_()
    xd = x.clone().requires_grad_()
    ref = (xd @ (wd * m)) if transpose else F.linear(xd, wd * m)
    ref.backward(grad_out)
    torch.testing.assert_close(out.to_tensor(0), ref.detach())
    torch.testing.assert_close(xm.grad, xd.grad)
    torch.testing.assert_close(_dense(mt.grad)[m], wd.grad[m])


# -- Note [One Function for a matrix product] ------------------------------------------------
def _nan_masked(shape, seed, dtype=torch.float64, density=0.6):
    """A strided MaskedTensor with NaN under its mask (never read) and its dense reference."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g, dtype=dtype)
    mask = torch.rand(shape, generator=g) < density
    data = torch.where(mask, data, torch.full_like(data, float("nan")))
    return ms.masked_tensor(data, mask), data, mask


def _count_nested_grads(monkeypatch) -> list:
    """A list that grows by one at every ``torch.autograd.grad`` call (a nested run)."""
    nested: list = []
    real_grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad",
                        lambda *a, **k: nested.append(1) or real_grad(*a, **k))
    return nested


PRODUCTS = {  # name: (masked call, dense reference on filled operands)
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: F.linear(x, w, b)),
    "linear_no_bias": (lambda x, w, b: F.linear(x, w), lambda x, w, b: F.linear(x, w)),
    "x@W.T": (lambda x, w, b: x @ w.T, lambda x, w, b: x @ w.T),
    "mm": (lambda x, w, b: torch.mm(x, w.mT), lambda x, w, b: torch.mm(x, w.mT)),
}


@pytest.mark.parametrize("masked_input", [False, True], ids=["plain_x", "masked_x"])
@pytest.mark.parametrize("product", list(PRODUCTS))
def test_strided_products_take_one_node_and_match_the_dense_reference(product, masked_input,
                                                                     monkeypatch):
    """Values, output mask, and the gradients of x, W (a MaskedTensor over W's mask) and b
    equal the dense computation on zero-filled operands, with no nested autograd run."""
    w, wd, wm = _nan_masked((5, 7), seed=0)
    wm[2] = False  # a fully pruned output feature: unspecified in every row
    w = ms.masked_tensor(wd, wm).requires_grad_()
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    if masked_input:
        x, xd, xm = _nan_masked((4, 7), seed=1)
        xm[1] = False  # a fully masked sample
        x = ms.masked_tensor(xd, xm).requires_grad_()
    else:
        xd, xm = torch.randn(4, 7, dtype=torch.float64), torch.ones(4, 7, dtype=torch.bool)
        x = xd.clone().requires_grad_()
    call, ref_call = PRODUCTS[product]
    nested = _count_nested_grads(monkeypatch)
    out = call(x, w, b)
    assert "_MatrixProduct" in type(out.grad_fn).__name__
    g = torch.randn(4, 5, dtype=torch.float64)
    out.to_tensor(0).backward(g)
    # The generic route runs one autograd.grad per product; w.T's own backward runs one.
    assert len(nested) == (0 if product.startswith("linear") else 1)

    xr = torch.where(xm, xd, 0.0).requires_grad_()
    wr = torch.where(wm, wd, 0.0).requires_grad_()
    br = b.detach().clone().requires_grad_()
    ref = ref_call(xr, wr, br)
    out_mask = xm.any(1, keepdim=True) & wm.any(1) if masked_input else wm.any(1).expand(4, 5)
    if masked_input:  # rows with a term: x's and W's masks share one
        out_mask = (xm.double() @ wm.double().T) > 0
    torch.testing.assert_close(out.get_mask(), out_mask.expand(4, 5), rtol=0, atol=0)
    torch.testing.assert_close(out.to_tensor(0), torch.where(out_mask, ref, 0.0).detach())
    (ref * out_mask).backward(g)
    assert ms.is_masked_tensor(w.grad) and w.grad._storage.mask is w._storage.mask
    torch.testing.assert_close(w.grad.to_tensor(0), torch.where(wm, wr.grad, 0.0))
    if product != "linear_no_bias" and product.startswith("linear"):
        torch.testing.assert_close(b.grad, br.grad)
    if masked_input:
        assert ms.is_masked_tensor(x.grad) and torch.equal(x.grad.get_mask(), xm)
        torch.testing.assert_close(x.grad.to_tensor(0), torch.where(xm, xr.grad, 0.0))
    else:
        torch.testing.assert_close(x.grad, xr.grad)


# -- one sparse factor: Note [One Function for a matrix product] -----------------------------
SPARSE = {"coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc}
SPARSE_PRODUCTS = {  # name: (masked call, x's shape, output shape); W is (5, 7)
    "linear": (lambda x, w, b: F.linear(x, w, b), (4, 7), (4, 5)),
    "linear_no_bias": (lambda x, w, b: F.linear(x, w), (4, 7), (4, 5)),
    "x@W": (lambda x, w, b: x @ w, (4, 5), (4, 7)),
    "mm(x, W)": (lambda x, w, b: torch.mm(x, w), (4, 5), (4, 7)),
    "W@x": (lambda x, w, b: w @ x, (7, 3), (5, 3)),
}


def _sparse_reference(product, x, w, b):
    """The product on dense zero-filled operands (the dense workaround)."""
    return {"linear": lambda: F.linear(x, w, b), "linear_no_bias": lambda: F.linear(x, w),
            "x@W": lambda: x @ w, "mm(x, W)": lambda: x @ w, "W@x": lambda: w @ x}[product]()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("route", ["sparse_kernels", "dense_buffer"])
@pytest.mark.parametrize("product", list(SPARSE_PRODUCTS))
@pytest.mark.parametrize("layout", list(SPARSE))
def test_sparse_weight_products_take_one_node_and_match_the_dense_reference(
        layout, product, route, dtype, monkeypatch):
    """A sparse masked weight (stored-but-unspecified entries holding NaN, a fully pruned
    row and column) in ``linear`` / ``x @ W`` / ``W @ x``: one recorded node, no nested
    autograd run, on the layout's sparse kernels below the density threshold and on the
    dense buffer above it; values, output mask and the gradients of x, W (over W's own
    storage: its mask and layout) and b equal the dense computation on zero-filled
    operands."""
    g = torch.Generator().manual_seed(5)
    data = torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=g) < 0.5
    mask[2], mask[:, 4] = False, False  # a pruned output feature and a pruned input
    data = torch.where(mask, data, float("nan")).to(dtype)
    w, wd, wm = make_masked_in((5, 7), SPARSE[layout], dtype=dtype, data=data, mask=mask)
    assert bool((~w._storage.mask).any())  # some stored entries are unspecified
    w.requires_grad_()
    call, x_shape, out_shape = SPARSE_PRODUCTS[product]
    x = torch.randn(x_shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    b = torch.randn(5, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    monkeypatch.setitem(layouts.PRODUCT_DENSITY_THRESHOLDS, "cpu",
                        2.0 if route == "sparse_kernels" else 0.0)
    nested = _count_nested_grads(monkeypatch)
    out = call(x, w, b)
    assert "_MatrixProduct" in type(out.grad_fn).__name__
    grad_out = torch.randn(out_shape, generator=g, dtype=torch.float64).to(dtype)
    out.to_tensor(0).backward(grad_out)
    assert not nested

    wr = torch.where(wm, wd, 0.0).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    br = b.detach().clone().requires_grad_()
    ref = _sparse_reference(product, xr, wr, br)
    out_mask = {"x@W": wm.any(0)[None, :], "mm(x, W)": wm.any(0)[None, :],
                "W@x": wm.any(1)[:, None]}.get(product, wm.any(1)[None, :]).expand(out_shape)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    assert torch.equal(out.get_mask(), out_mask)
    torch.testing.assert_close(out.to_tensor(0), torch.where(out_mask, ref, 0.0).detach(), **tol)
    (ref * out_mask).backward(grad_out)
    assert ms.is_masked_tensor(w.grad) and w.grad.layout == SPARSE[layout]
    assert w.grad._storage.mask is w._storage.mask  # W's own storage, nothing rebuilt
    torch.testing.assert_close(w.grad.to_tensor(0).to_dense(), torch.where(wm, wr.grad, 0.0),
                               **tol)
    torch.testing.assert_close(x.grad, xr.grad, **tol)
    if product == "linear":
        torch.testing.assert_close(b.grad, br.grad, **tol)


@pytest.mark.parametrize("trained", ["x", "W", "b"])
@pytest.mark.parametrize("layout", list(SPARSE))
def test_sparse_weight_product_with_one_operand_trained(layout, trained, monkeypatch):
    """Only the operand that requires grad gets a gradient (the others stay None), equal to
    the dense reference's, on the sparse kernels' route."""
    monkeypatch.setitem(layouts.PRODUCT_DENSITY_THRESHOLDS, "cpu", 2.0)
    g = torch.Generator().manual_seed(6)
    mask = torch.rand(5, 7, generator=g) < 0.5
    data = torch.where(mask, torch.randn(5, 7, generator=g, dtype=torch.float64), float("nan"))
    w, wd, wm = make_masked_in((5, 7), SPARSE[layout], dtype=torch.float64, data=data,
                               mask=mask)
    x = torch.randn(4, 7, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64)
    {"x": x, "W": w, "b": b}[trained].requires_grad_()
    out = F.linear(x, w, b)
    assert "_MatrixProduct" in type(out.grad_fn).__name__
    grad_out = torch.randn(4, 5, generator=g, dtype=torch.float64)
    out.to_tensor(0).backward(grad_out)
    wr, xr, br = (torch.where(wm, wd, 0.0).requires_grad_(), x.detach().clone().requires_grad_(),
                  b.detach().clone().requires_grad_())
    (F.linear(xr, wr, br) * wm.any(1)).backward(grad_out)
    got = {"x": x.grad, "W": w.grad, "b": b.grad}
    assert all(v is None for k, v in got.items() if k != trained)
    if trained == "W":
        assert w.grad.layout == SPARSE[layout]
        torch.testing.assert_close(w.grad.to_tensor(0).to_dense(), torch.where(wm, wr.grad, 0.0))
    else:
        torch.testing.assert_close(got[trained], {"x": xr, "b": br}[trained].grad)


@pytest.mark.parametrize("layout", ["strided", *SPARSE])
def test_linear_double_backward_matches_dense(layout, monkeypatch):
    """A gradient penalty (create_graph=True) through the one-node product, a sparse weight
    on the sparse kernels' route: the generic route's double backward."""
    monkeypatch.setitem(layouts.PRODUCT_DENSITY_THRESHOLDS, "cpu", 2.0)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 6, generator=g) < 0.6
    data = torch.where(mask, torch.randn(4, 6, generator=g, dtype=torch.float64), float("nan"))
    w, wd, wm = make_masked_in((4, 6), {"strided": torch.strided, **SPARSE}[layout],
                               dtype=torch.float64, data=data, mask=mask)
    w.requires_grad_()
    x = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(F.linear(x, w).to_tensor(0).pow(2).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    wr = torch.where(wm, wd, 0.0).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    (gxr,) = torch.autograd.grad(F.linear(xr, wr).pow(2).sum(), xr, create_graph=True)
    gxr.pow(2).sum().backward()
    torch.testing.assert_close(gx, gxr)
    torch.testing.assert_close(_dense(w.grad), torch.where(wm, wr.grad, 0.0))
