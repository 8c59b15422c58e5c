"""Issue 31, a third new user's trial: inference_mode, compile of masked weights, half
precision, masking by a condition, torch.masked's samples, meta tensors, clear errors,
torch.masked parity and scipy interop. Every value is checked against a dense
``torch.where`` / ``numpy.ma`` / torch.masked / scipy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import LAYOUT_IDS, LAYOUTS, assert_masked_equal, dense_of, make_masked

import masked_sparse as ms

ALL_LAYOUTS = [*LAYOUTS, torch.sparse_csc, torch.sparse_bsr]
ALL_IDS = [*LAYOUT_IDS, "csc", "bsr"]


def in_layout(shape, layout, seed=0, dtype=torch.float32, **kw):
    """``make_masked`` in any layout (CSC and BSR by conversion from CSR)."""
    if layout in (torch.sparse_csc, torch.sparse_bsr):
        mt, data, mask = make_masked(shape, torch.sparse_csr, seed=seed, dtype=dtype, **kw)
        out = mt.to_sparse_csc() if layout == torch.sparse_csc else mt.to_sparse_bsr((1, 1))
        return out, data, mask
    return make_masked(shape, layout, seed=seed, dtype=dtype, **kw)


def where0(data, mask):
    return torch.where(mask, data, torch.zeros((), dtype=data.dtype))


# ---- 3. inference_mode ------------------------------------------------------------------

def _dense_softmax(data, mask, dim):
    x = torch.where(mask, data.double(), float("-inf"))
    out = torch.softmax(x, dim).nan_to_num(0.0)
    return out.to(data.dtype), mask.any(dim, keepdim=True).expand_as(mask) & mask


INFERENCE_OPS = {
    "softmax": (lambda mt, x, w: torch.softmax(mt, 1),
                lambda d, m, x, w: _dense_softmax(d, m, 1)),
    "matmul": (lambda mt, x, w: (mt @ w).to_tensor(0) if isinstance(mt @ w, ms.MaskedTensor)
               else mt @ w,
               lambda d, m, x, w: where0(d, m) @ w),
    "linear": (lambda mt, x, w: F.linear(x, mt), lambda d, m, x, w: x @ where0(d, m).T),
    "sum": (lambda mt, x, w: mt.sum(1), lambda d, m, x, w: (where0(d, m).sum(1), m.any(1))),
    "mean": (lambda mt, x, w: mt.mean(0),
             lambda d, m, x, w: (where0(d, m).sum(0) / m.sum(0).clamp(min=1), m.any(0))),
    "mul": (lambda mt, x, w: mt * mt, lambda d, m, x, w: (d * d, m)),
    "add_scalar": (lambda mt, x, w: mt + 1, lambda d, m, x, w: (d + 1, m)),
    "exp": (lambda mt, x, w: mt.exp(), lambda d, m, x, w: (d.exp(), m)),
    "amax": (lambda mt, x, w: mt.amax(1),
             lambda d, m, x, w: (torch.where(m, d, -torch.inf).amax(1), m.any(1))),
    "to_tensor": (lambda mt, x, w: mt.to_tensor(0).to_dense(), lambda d, m, x, w: where0(d, m)),
    "transpose": (lambda mt, x, w: mt.t(), lambda d, m, x, w: (d.t(), m.t())),
}


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
@pytest.mark.parametrize("op", list(INFERENCE_OPS))
@pytest.mark.parametrize("built_inside", [True, False], ids=["inference_input", "plain_input"])
def test_every_op_runs_under_inference_mode(layout, op, built_inside):
    if op == "transpose" and layout == torch.sparse_bsr:
        pytest.skip("BSR has no transpose (it says so, with or without inference_mode)")
    fn, ref = INFERENCE_OPS[op]
    x, w = torch.randn(3, 5), torch.randn(5, 2)
    if built_inside:
        with torch.inference_mode():
            mt, data, mask = in_layout((4, 5), layout)
    else:
        mt, data, mask = in_layout((4, 5), layout)
    with torch.inference_mode():
        got = fn(mt, x, w)
        again = fn(mt, x, w)  # second call: any cached fact of an inference tensor
    expected = ref(data, mask, x, w)
    for out in (got, again):
        if isinstance(expected, tuple):
            assert_masked_equal(out, *expected)
        else:
            torch.testing.assert_close(out, expected)


BROAD_INFERENCE_OPS = {
    "var": lambda mt: mt.var(1), "logsumexp": lambda mt: torch.logsumexp(mt, 1),
    "norm": lambda mt: mt.norm(dim=1), "argmax": lambda mt: mt.argmax(1),
    "median": lambda mt: mt.median(1).values, "prod": lambda mt: mt.prod(1),
    "cumsum": lambda mt: mt.cumsum(1), "sort": lambda mt: mt.sort(1).values,
    "where": lambda mt: torch.where(mt > 0, mt, 0.0), "cat": lambda mt: torch.cat([mt, mt]),
    "index": lambda mt: mt[1], "to_coo": lambda mt: mt.to_sparse_coo(),
    "to_dense": lambda mt: mt.to_dense(), "half": lambda mt: mt.half(),
    "to_float16": lambda mt: mt.to(torch.float16), "detach": lambda mt: mt.detach(),
    "log_softmax": lambda mt: F.log_softmax(mt, 1), "ratio": lambda mt: mt / mt.sum(1, True),
    "masked_where": lambda mt: ms.masked_where(mt > 0, mt),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("op", list(BROAD_INFERENCE_OPS))
@pytest.mark.parametrize("built_inside", [True, False], ids=["inference_input", "plain_input"])
def test_more_ops_under_inference_mode_equal_eager(layout, op, built_inside):
    fn = BROAD_INFERENCE_OPS[op]
    mt, data, mask = make_masked((4, 5), layout, seed=1)
    expected = fn(mt)  # eager, outside inference mode (checked against dense elsewhere)
    if built_inside:
        with torch.inference_mode():
            mt = make_masked((4, 5), layout, seed=1)[0]
    with torch.inference_mode():
        got = fn(mt)
    want_data, want_mask = dense_of(expected)
    assert_masked_equal(got.to_dense(), want_data, want_mask)
    assert got.layout == expected.layout and got.dtype == expected.dtype


def test_pruned_model_serves_under_inference_mode():
    w, data, mask = make_masked((6, 5), torch.sparse_csr, seed=3)
    x = torch.randn(2, 5)
    with torch.inference_mode():
        out = torch.softmax(F.relu(F.linear(x, w)), 1).to_tensor(0)
    h = torch.relu(x @ where0(data, mask).T)
    torch.testing.assert_close(out, torch.softmax(h, 1))


# ---- 1, 2. torch.compile of strided masked weights ---------------------------------------

@pytest.fixture
def fresh_dynamo():
    import warnings
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo / AOT cache chatter
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph", "fullgraph"])
def test_inductor_compiles_a_pruned_mlp_of_strided_masked_weights(fresh_dynamo, fullgraph):
    w1, d1, m1 = make_masked((8, 6), seed=1)
    w2, d2, m2 = make_masked((4, 8), seed=2)
    x = torch.randn(3, 6)
    fn = lambda x: F.linear(F.linear(x, w1), w2)  # noqa: E731
    got = torch.compile(fn, fullgraph=fullgraph)(x)  # Inductor (its CPU C++ code)
    eager = fn(x)
    h = x @ where0(d1, m1).T
    ref = h @ where0(d2, m2).T
    assert_masked_equal(got, ref, m2.any(1).expand(3, 4))
    assert_masked_equal(eager, ref, m2.any(1).expand(3, 4))


def test_inductor_fullgraph_with_a_weight_that_requires_grad(fresh_dynamo):
    w, data, mask = make_masked((8, 6), seed=4)
    w.requires_grad_()
    x = torch.randn(3, 6)
    fn = lambda x: F.relu(F.linear(x, w))  # noqa: E731
    got = torch.compile(fn, fullgraph=True)(x)  # forward and backward compiled by Inductor
    got.sum().backward()
    leaf = data.clone().requires_grad_()
    ref = torch.relu(x @ torch.where(mask, leaf, 0.0).T)
    ref.sum().backward()
    assert_masked_equal(got, ref.detach(), mask.any(1).expand(3, 8))
    assert_masked_equal(w.grad, leaf.grad, mask)


# ---- 4. half precision accumulates in float32 --------------------------------------------

HALF = [torch.float16, torch.bfloat16]


def _ref64(name, data, mask, dim):
    """float64 references on the specified elements (torch.where / float64 torch ops)."""
    d = data.double()
    count = mask.sum(dim)
    total = torch.where(mask, d, 0).sum(dim)
    mean = total / count.clamp(min=1)
    if name == "sum":
        return total
    if name == "mean":
        return mean
    if name in ("var", "std"):
        dev = torch.where(mask, d - mean.unsqueeze(dim), 0)
        var = (dev * dev).sum(dim) / (count - 1).clamp(min=1)
        return var if name == "var" else var.sqrt()
    if name == "norm":
        return torch.where(mask, d, 0).pow(2).sum(dim).sqrt()
    if name == "logsumexp":
        return torch.where(mask, d, -torch.inf).logsumexp(dim)
    x = torch.where(mask, d, -torch.inf)
    return torch.softmax(x, dim) if name == "softmax" else torch.log_softmax(x, dim)


HALF_OPS = {
    "sum": lambda mt, dim: mt.sum(dim), "mean": lambda mt, dim: mt.mean(dim),
    "var": lambda mt, dim: mt.var(dim), "std": lambda mt, dim: mt.std(dim),
    "norm": lambda mt, dim: torch.linalg.vector_norm(mt, dim=dim),
    "logsumexp": lambda mt, dim: torch.logsumexp(mt, dim),
    "softmax": lambda mt, dim: torch.softmax(mt, dim),
    "log_softmax": lambda mt, dim: torch.log_softmax(mt, dim),
}


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", list(HALF_OPS))
def test_half_precision_accumulates_in_float32_and_keeps_its_dtype(layout, dtype, op):
    # 200 + noise: a float16 sum of 1000 of them overflows; bfloat16 loses the noise.
    g = torch.Generator().manual_seed(0)
    data = (200 + torch.rand(2, 1000, generator=g)).to(dtype)
    mask = torch.rand(2, 1000, generator=g) < 0.9
    mt, _, _ = in_layout((2, 1000), layout, dtype=dtype, data=data, mask=mask)
    dim = 0 if op == "sum" else 1  # the sum of a column fits float16, of a row does not
    got = HALF_OPS[op](mt, dim)
    assert got.dtype == dtype
    ref = _ref64(op, data, mask, dim)
    out_mask = mask if op.endswith("softmax") else mask.any(dim)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-3, "atol": 1e-3}
    if op in ("var", "std"):  # the deviations are small against 200: compare in float64
        tol = {"rtol": 1e-2, "atol": 1e-3}
    assert_masked_equal(got, ref.to(dtype), out_mask, **tol)


def test_half_precision_mean_of_200s_is_200_and_var_is_0():
    x = torch.full((2, 1000), 200.0, dtype=torch.float16)
    mt = ms.masked_tensor(x, torch.ones(2, 1000, dtype=torch.bool))
    assert_masked_equal(mt.mean(1), x.mean(1), torch.ones(2, dtype=torch.bool))
    assert_masked_equal(mt.var(1), x.var(1), torch.ones(2, dtype=torch.bool))
    assert x.mean(1).tolist() == [200.0, 200.0] and x.var(1).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
def test_bfloat16_full_mean_is_as_accurate_as_torch(layout):
    g = torch.Generator().manual_seed(1)
    data = torch.rand(200, 500, generator=g).bfloat16()
    mask = torch.rand(200, 500, generator=g) < 0.7
    mt, _, _ = in_layout((200, 500), layout, dtype=torch.bfloat16, data=data, mask=mask)
    exact = data.double()[mask].mean()
    ours = (mt.mean().to_tensor(0).double() - exact).abs() / exact
    theirs = (data[mask].mean().double() - exact).abs() / exact
    assert ours <= theirs + 2 ** -9  # within half a bfloat16 ulp of torch's own rounding


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("op", ["mean", "var", "softmax"])
def test_half_precision_gradient_flows_through_the_casts(layout, op):
    data = (200 + torch.rand(3, 700, generator=torch.Generator().manual_seed(2))).half()
    mask = torch.rand(3, 700, generator=torch.Generator().manual_seed(3)) < 0.8
    mt, _, _ = make_masked((3, 700), layout, dtype=torch.float16, data=data, mask=mask)
    mt.requires_grad_()
    w = torch.linspace(0, 1, 700 if op == "softmax" else 3, dtype=torch.float64)
    out = HALF_OPS[op](mt, 1)
    (out.to_tensor(0).to_dense().double() * w).sum().backward()
    leaf = data.double().requires_grad_()
    ref = _ref64(op, torch.where(mask, leaf, 0), mask, 1)
    (ref.nan_to_num(0) * w).sum().backward()
    assert mt.grad.dtype == torch.float16
    assert_masked_equal(mt.grad, leaf.grad.half(), mask, rtol=1e-2, atol=1e-3)


# ---- 5. masking by a data condition: ms.masked_invalid, ms.masked_where -------------------

def _np_ma(data, mask):
    return np.ma.array(data.double().numpy(), mask=~mask.numpy())


def _assert_ma_equal(got, ref: np.ma.MaskedArray):
    """``got`` specifies exactly ``ref``'s unmasked elements and agrees with it there."""
    want_mask = torch.from_numpy(~np.ma.getmaskarray(ref))
    want = torch.from_numpy(ref.filled(0.0))
    assert_masked_equal(got, want.to(got.dtype), want_mask)


def _invalid_data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g)
    r = torch.rand(shape, generator=g)
    data[r < 0.15] = float("nan")
    data[(r >= 0.15) & (r < 0.25)] = float("inf")
    data[(r >= 0.25) & (r < 0.3)] = -float("inf")
    return data


def _kept_storage(out, mt):
    assert out.layout == mt.layout
    assert len(out._storage.index) == len(mt._storage.index)
    assert all(a is b for a, b in zip(out._storage.index, mt._storage.index))


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
def test_masked_invalid_matches_numpy_ma(layout):
    data = _invalid_data((5, 6), 0)
    mt, data, mask = in_layout((5, 6), layout, data=data)
    out = ms.masked_invalid(mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, np.ma.masked_invalid(_np_ma(data, mask)))


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
def test_masked_invalid_of_a_plain_tensor(layout):
    data = _invalid_data((4, 6), 1)
    plain = data if layout == torch.strided else (
        data.to_sparse_bsr((1, 1)) if layout == torch.sparse_bsr else data.to_sparse(layout=layout))
    out = ms.masked_invalid(plain)
    assert out.layout == layout
    _assert_ma_equal(out, np.ma.masked_invalid(data.double().numpy()))
    assert ms.masked_invalid(torch.arange(3)).get_mask().all()  # integers: nothing invalid


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
@pytest.mark.parametrize("cond_kind", ["plain", "plain_row", "plain_sparse", "masked"])
def test_masked_where_matches_numpy_ma(layout, cond_kind):
    mt, data, mask = in_layout((5, 6), layout, seed=2)
    g = torch.Generator().manual_seed(3)
    if cond_kind == "plain":
        cond = torch.rand(5, 6, generator=g) < 0.4
        ref = np.ma.masked_where(cond.numpy(), _np_ma(data, mask))
    elif cond_kind == "plain_row":  # broadcast over rows
        cond = torch.rand(6, generator=g) < 0.4
        ref = np.ma.masked_where(np.broadcast_to(cond.numpy(), (5, 6)), _np_ma(data, mask))
    elif cond_kind == "plain_sparse":
        dense_cond = torch.rand(5, 6, generator=g) < 0.4
        cond = dense_cond.to_sparse_coo()
        ref = np.ma.masked_where(dense_cond.numpy(), _np_ma(data, mask))
    else:  # mt > 0.5: where the condition is unspecified, the element is unspecified
        cm = torch.rand(5, 6, generator=g) < 0.8
        cond_mt = ms.masked_tensor(where0(data, mask) > 0.5, cm)
        cond = cond_mt if layout == torch.strided else ms.to_layout(cond_mt, "sparse_coo")
        c = np.ma.array((data > 0.5).numpy(), mask=~cm.numpy())
        ref = np.ma.masked_where(c.filled(True), _np_ma(data, mask))
    out = ms.masked_where(cond, mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, ref)


def test_masked_where_with_its_own_comparison_keeps_sparse():
    mt, data, mask = make_masked((6, 7), torch.sparse_csr, seed=4)
    out = ms.masked_where(mt > 0.5, mt)
    _kept_storage(out, mt)
    _assert_ma_equal(out, np.ma.masked_where((data > 0.5).numpy(), _np_ma(data, mask)))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_masked_where_and_invalid_are_differentiable(layout):
    data = _invalid_data((4, 5), 5)
    mt, data, mask = make_masked((4, 5), layout, data=data)
    mt.requires_grad_()
    out = ms.masked_where(mt > 1.0, ms.masked_invalid(mt))
    (out * out).sum().backward()
    keep = mask & torch.isfinite(data) & ~(data > 1.0)
    assert_masked_equal(mt.grad, torch.where(keep, 2 * data, 0.0), mask)


def test_masked_where_errors_name_the_op():
    x = torch.ones(2, 3)
    with pytest.raises(TypeError, match="masked_where: condition must have dtype torch.bool"):
        ms.masked_where(torch.ones(2, 3), x)
    with pytest.raises(ValueError, match="masked_where: condition of shape"):
        ms.masked_where(torch.ones(4, 3, dtype=torch.bool), x)
    assert {"masked_invalid", "masked_where"} <= set(ms.__all__)


# ---- 6. torch.masked's samples (test_masked.py's test_mask_layout inputs) ----------------

import masked_sparse.functional as MF  # noqa: E402


@pytest.mark.parametrize("shapes", [((3, 2, 1, 2), (3, 2, 1, 1)), ((3, 4), (4,)),
                                    ((2, 3, 4), (3, 1))], ids=["trailing", "row", "middle"])
@pytest.mark.parametrize("op", ["sum", "amax", "mean", "prod", "logsumexp"])
def test_sparse_coo_input_with_a_broadcastable_sparse_coo_mask(shapes, op):
    shape, mshape = shapes
    g = torch.Generator().manual_seed(0)
    data = torch.randn(shape, generator=g, dtype=torch.float64)
    data[torch.rand(shape, generator=g) < 0.3] = 0  # not stored
    mask = torch.rand(mshape, generator=g) < 0.6
    inp, sparse_mask = data.to_sparse_coo(), mask.to_sparse_coo()
    dim = len(shape) - 1
    got = getattr(MF, op)(inp, dim, mask=sparse_mask)
    assert got.layout == torch.sparse_coo
    # torch.masked: the mask's pattern is authoritative, an unstored input element reads 0
    full = mask.expand(shape)
    fill = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -torch.inf, "logsumexp": -torch.inf}
    x = torch.where(full, data, fill[op])
    ref = {"sum": x.sum(dim), "amax": x.amax(dim), "prod": x.prod(dim),
           "logsumexp": x.logsumexp(dim),
           "mean": x.sum(dim) / full.sum(dim).clamp(min=1)}[op]
    specified = full.any(dim)
    assert_masked_equal(got.to_dense(), torch.where(specified, ref, 0.0), specified)
    if op in ("sum", "amax", "prod"):  # torch.masked's sparse COO reductions
        theirs = getattr(torch.masked, op)(inp, dim, mask=sparse_mask).to_dense()
        torch.testing.assert_close(got.to_tensor(0).to_dense(),
                                   torch.where(specified, theirs, 0.0))


def test_broadcast_sparse_mask_that_does_not_broadcast_names_the_op():
    with pytest.raises(ValueError, match="functional.sum: mask of shape"):
        MF.sum(torch.ones(3, 4).to_sparse_coo(), 1,
               mask=torch.ones(3, 1, 2, dtype=torch.bool).to_sparse_coo())


@pytest.mark.parametrize("dim", [(0, 2), (), (1,), [0, 1, 2], None])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_functional_prod_takes_a_tuple_of_dims_or_empty(dim, keepdim, layout):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 4, generator=g, dtype=torch.float64) + 0.5
    mask = torch.rand(2, 3, 4, generator=g) < 0.6
    if layout == torch.strided:
        got = MF.prod(x, dim, keepdim=keepdim, mask=mask)
    else:
        got = MF.prod(ms.to_layout(ms.masked_tensor(x, mask), "sparse_coo"), dim,
                      keepdim=keepdim)
    dims = (0, 1, 2) if dim is None or len(dim) == 0 else tuple(dim)
    ref = torch.where(mask, x, 1.0)
    spec = mask
    for d in sorted(dims, reverse=True):
        ref, spec = ref.prod(d, keepdim=keepdim), spec.any(d, keepdim=keepdim)
    if dim is None and not keepdim or dim is not None:
        theirs = torch.masked.prod(x, dim, keepdim=keepdim, mask=mask) if dim is not None \
            else torch.masked.prod(x, mask=mask)
        assert theirs.shape == got.shape
    assert_masked_equal(got.to_dense(), torch.where(spec, ref, 0.0), spec)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS[:2] + ["csr"])
@pytest.mark.parametrize("specified", [True, False])
@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_median_of_a_0d_masked_input(layout, specified, op):
    x, m = torch.tensor(3.0), torch.tensor(specified)
    mt = ms.masked_tensor(x, m)
    if layout == torch.sparse_coo:
        mt = ms.masked_tensor(x.to_sparse_coo(), m.to_sparse_coo())
    elif layout == torch.sparse_csr:
        pytest.skip("CSR has no 0-d form")
    for out in (getattr(torch, op)(mt), getattr(torch, op)(mt, 0).values,
                getattr(torch, op)(mt, 0, keepdim=True).values):
        assert_masked_equal(out.to_dense(), x, m)
    assert_masked_equal(MF.median(x, 0, mask=m), torch.masked.median(x, 0, mask=m), m)


@pytest.mark.parametrize("specified", [True, False])
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp", "cummax"])
def test_scans_of_a_0d_sparse_coo_input(specified, op):
    x, m = torch.tensor(3.0), torch.tensor(specified)
    mt = ms.masked_tensor(x.to_sparse_coo(), m.to_sparse_coo())
    out = getattr(torch, op)(mt, 0)
    values = out.values if op == "cummax" else out
    assert values.layout == torch.sparse_coo
    assert_masked_equal(values.to_dense(), getattr(torch, op)(x, 0)
                        if op != "cummax" else x, m)
    if op in ("cumsum", "cumprod"):
        got = getattr(MF, op)(x.to_sparse_coo(), 0, mask=m.to_sparse_coo())
        assert_masked_equal(got.to_dense(), x, m)


@pytest.mark.parametrize("masks", ["both", "input_only", "broadcast", "none"])
def test_functional_logaddexp_matches_torch_masked(masks):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ma, mb = torch.rand(3, 4, generator=g) < 0.5, torch.rand(3, 4, generator=g) < 0.5
    kw = {"both": {"input_mask": ma, "other_mask": mb}, "input_only": {"input_mask": ma},
          "broadcast": {"input_mask": ma[0], "other_mask": mb[:, :1]}, "none": {}}[masks]
    got = MF.logaddexp(a, b, **kw)
    theirs = torch.masked.logaddexp(a, b, **kw)
    fa = kw.get("input_mask", torch.ones((), dtype=torch.bool)).expand(3, 4)
    fb = kw.get("other_mask", torch.ones((), dtype=torch.bool)).expand(3, 4)
    ref = torch.logaddexp(torch.where(fa, a, -torch.inf), torch.where(fb, b, -torch.inf))
    assert_masked_equal(got, ref.detach(), fa | fb)
    torch.testing.assert_close(torch.where(fa | fb, theirs, 0.0), got.to_tensor(0))
    got.to_tensor(0).sum().backward()
    ref_grad = torch.where(fa, torch.exp(a - ref), 0.0).detach()
    torch.testing.assert_close(a.grad, torch.where(fa | fb, ref_grad, 0.0))
    with pytest.raises(NotImplementedError, match="logaddexp: strided operands only"):
        MF.logaddexp(a.detach().to_sparse_coo(), b)


# ---- 8. clear errors ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dim", [1, 0, None])
def test_complex_logsumexp_matches_torch(layout, dim):
    mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(4)) < 0.6
    mask[2] = False  # an empty group: unspecified
    mt, data, mask = make_masked((4, 5), layout, dtype=torch.complex128, seed=3, mask=mask)
    mt.requires_grad_()
    dims = (0, 1) if dim is None else dim
    got = torch.logsumexp(mt, dims)
    leaf = data.clone().requires_grad_()
    ref = torch.logsumexp(torch.where(mask, leaf, complex(-torch.inf, 0)), dims)
    specified = mask.any(dims) if dim is not None else mask.any()
    assert got.dtype == torch.complex128
    assert_masked_equal(got.to_dense(), torch.where(specified, ref, 0).detach(), specified)
    got.to_dense().to_tensor(0).abs().sum().backward()
    torch.where(specified, ref, 0).abs().sum().backward()
    assert_masked_equal(mt.grad.to_dense(), leaf.grad, mask)


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
def test_second_backward_through_a_freed_graph_is_torchs_error(layout):
    leaf = torch.randn(3, 4, requires_grad=True)
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) < 0.6
    def build():
        y = ms.as_masked_tensor(leaf, mask)
        return ms.to_layout(y, layout) if layout != torch.sparse_bsr else y.to_sparse_bsr((1, 1))

    total = build().sum()
    total.backward()
    torch.testing.assert_close(leaf.grad, mask.float())
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*"
                                           "retain_graph=True"):
        total.backward()
    kept = build().sum()
    kept.backward(retain_graph=True)
    kept.backward()  # retained: a second backward accumulates
    torch.testing.assert_close(leaf.grad, 3 * mask.float())


# ---- 9. torch.masked parity --------------------------------------------------------------

@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_IDS)
def test_is_sparse_is_true_for_every_sparse_layout_as_torch_masked(layout):
    mt, data, mask = in_layout((3, 4), layout)
    assert mt.is_sparse == (layout != torch.strided)
    if layout in (torch.strided, torch.sparse_coo, torch.sparse_csr):  # torch.masked's layouts
        with pytest.warns(UserWarning):
            ref = torch.masked.masked_tensor(mt.get_data(), mt.get_mask())
        assert mt.is_sparse == ref.is_sparse


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_returns_int64_indices_unlike_torch_masked(layout, op):
    # A decision (README, "How it differs from torch.masked"): indices stay int64, as
    # torch.argmax; torch.masked returns them in the input's float dtype.
    mt, data, mask = make_masked((3, 5), layout, dtype=torch.float64, seed=6)
    got = getattr(torch, op)(mt, 1)
    fill = -torch.inf if op == "argmax" else torch.inf
    ref = getattr(torch, op)(torch.where(mask, data, fill), 1)
    assert got.dtype == torch.int64
    assert_masked_equal(got.to_dense(), ref, mask.any(1))
    theirs = getattr(torch.masked, op)(data, 1, mask=mask)
    assert theirs.dtype == torch.float64  # torch.masked's choice, which we do not follow


# ---- 11. the core never names a layout -----------------------------------------------------

def test_the_core_compares_no_layout_name():
    import ast
    import pathlib

    names = {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"}
    root = pathlib.Path(ms.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value in names
                    for c in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


@pytest.mark.parametrize("layout", ALL_LAYOUTS[1:], ids=ALL_IDS[1:])
def test_sparse_summary_lists_stored_entries_of_every_layout(layout):
    mt, data, mask = in_layout((40, 40), layout, density=0.05, stored_masked=0.0)
    text = repr(mt)  # 1600 elements: over the threshold, a summary of the stored entries
    coo = data.where(mask, 0).to_sparse_coo()
    first = tuple(coo.indices()[:, 0].tolist())
    assert f"stored={int(mask.sum())}" in text and f"{first}:" in text


# ---- 10. to_scipy of a CSR tensor builds scipy's CSR directly ------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("matrix", [False, True])
def test_to_scipy_csr_equals_scipy_of_the_specified_entries(dtype, matrix):
    import scipy.sparse as sp

    mask = torch.rand(7, 9, generator=torch.Generator().manual_seed(8)) < 0.5
    mask[2] = False  # a row with stored (stored_masked) but no specified entries
    mt, data, mask = make_masked((7, 9), torch.sparse_csr, dtype=dtype, seed=7, mask=mask)
    got = ms.to_scipy(mt, "csr", matrix=matrix)
    assert got.format == "csr" and isinstance(got, sp.csr_matrix if matrix else sp.csr_array)
    d, m = dense_of(mt)
    rows, cols = m.nonzero(as_tuple=True)
    ref = sp.csr_array((d[m].numpy(), (rows.numpy(), cols.numpy())), shape=(7, 9))
    assert got.nnz == int(m.sum())  # specified zeros stored, masked-out entries dropped
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.data, ref.data)
    got.check_format(full_check=True)
    back = ms.from_scipy(got)
    assert_masked_equal(back.to_dense(), torch.where(m, d, torch.zeros((), dtype=dtype)), m)


def test_to_scipy_csr_of_nothing_specified_and_of_an_empty_matrix():
    for shape, density in (((4, 5), 0.0), ((0, 3), 0.5), ((3, 0), 0.5)):
        mt, _, _ = make_masked(shape, torch.sparse_csr, density=density, stored_masked=0.5)
        got = ms.to_scipy(mt)
        assert got.shape == shape and got.nnz == 0
        np.testing.assert_array_equal(got.indptr, np.zeros(shape[0] + 1))


def test_to_scipy_csr_takes_no_coo_form(monkeypatch):
    import masked_sparse.interop.scipy as scipy_interop

    def refuse(*_):
        raise AssertionError("to_scipy(csr) of a CSR tensor went through its COO form")

    mt, data, mask = make_masked((6, 8), torch.sparse_csr, dtype=torch.float64, seed=9)
    monkeypatch.setattr(scipy_interop, "_specified_coo", refuse)
    got = ms.to_scipy(mt)
    np.testing.assert_array_equal(got.toarray(), where0(data, mask).numpy())
    assert got.nnz == int(mask.sum())


# ---- 7. meta tensors -----------------------------------------------------------------------

META_OPS = {
    "sum": (lambda mt: mt.sum(1), lambda d: d.sum(1)),
    "full_sum": (lambda mt: mt.sum(), lambda d: d.sum()),
    "mean": (lambda mt: mt.mean(0, keepdim=True), lambda d: d.mean(0, keepdim=True)),
    "amax": (lambda mt: mt.amax(1), lambda d: d.amax(1)),
    "var": (lambda mt: mt.var(1), lambda d: d.var(1)),
    "argmax": (lambda mt: mt.argmax(1), lambda d: d.argmax(1)),
    "softmax": (lambda mt: mt.softmax(1), lambda d: d.softmax(1)),
    "logsumexp": (lambda mt: torch.logsumexp(mt, 1), lambda d: torch.logsumexp(d, 1)),
    "exp": (lambda mt: mt.exp(), lambda d: d.exp()),
    "add": (lambda mt: mt + mt, lambda d: d + d),
    "matmul": (lambda mt: mt @ torch.empty(4, 2, device="meta", dtype=mt.dtype),
               lambda d: d @ torch.empty(4, 2, device="meta", dtype=d.dtype)),
    "to_tensor": (lambda mt: mt.to_tensor(0), lambda d: d),
    "transpose": (lambda mt: mt.t(), lambda d: d.t()),
}


@pytest.mark.parametrize("op", list(META_OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_strided_meta_masked_tensor_infers_shapes(op, dtype):
    data = torch.empty(3, 4, device="meta", dtype=dtype)
    mt = ms.masked_tensor(data, torch.empty(3, 4, dtype=torch.bool, device="meta"))
    fn, ref = META_OPS[op]
    got, want = fn(mt), ref(data)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.device.type == "meta"


def test_meta_repr_says_meta_and_prints_no_data():
    mt = ms.masked_tensor(torch.empty(3, 4, device="meta"),
                          torch.empty(3, 4, dtype=torch.bool, device="meta"))
    assert repr(mt) == ("MaskedTensor(..., layout=strided, shape=(3, 4), dtype=torch.float32, "
                        "device='meta')")
    assert repr(mt.sum(0)).startswith("MaskedTensor(..., layout=strided, shape=(4,)")
    real, _, _ = make_masked((3, 4))
    assert "device='meta'" in repr(real.to("meta"))


@pytest.mark.parametrize("layout", ALL_LAYOUTS[1:], ids=ALL_IDS[1:])
def test_sparse_meta_raises_not_implemented_naming_meta(layout):
    mt, _, _ = in_layout((3, 4), layout)
    with pytest.raises(NotImplementedError, match="meta device"):
        mt.to("meta")
    dense_meta = ms.masked_tensor(torch.empty(3, 4, device="meta"),
                                  torch.empty(3, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(NotImplementedError, match=f"meta device to {layout_name(layout)}"):
        ms.to_layout(dense_meta, layout)
    crow = torch.zeros(4, dtype=torch.long, device="meta")
    col = torch.zeros(5, dtype=torch.long, device="meta")
    data = torch.sparse_csr_tensor(crow, col, torch.zeros(5, device="meta"), (3, 4))
    mask = torch.sparse_csr_tensor(crow, col, torch.zeros(5, dtype=torch.bool, device="meta"),
                                   (3, 4))
    with pytest.raises(NotImplementedError, match="masked_tensor: a torch.sparse_csr "
                                                  "MaskedTensor on the meta device"):
        ms.masked_tensor(data, mask)


def layout_name(layout):
    return str(layout).removeprefix("torch.")
