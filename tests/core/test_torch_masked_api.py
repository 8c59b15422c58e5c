"""torch.masked's API on masked_sparse: ``masked_sparse.functional`` against torch.masked's
own functions and dense references, ``is_sparse_coo()`` / ``is_sparse_csr()``, the
requires-grad warning, and the plain exits (``tolist``, ``numpy``, ``np.asarray``, format).
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.masked
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    make_masked,
    make_masked_in,
)

import masked_sparse as ms
import masked_sparse.functional as MF

SPARSE = [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc]
# name -> positional arguments after the input (torch.masked's signatures)
ARGS = {"norm": (2.0, 1), "normalize": (2.0, 1), "median": (1,), "softmax": (1,),
        "log_softmax": (1,), "softmin": (1,), "cumsum": (1,), "cumprod": (1,)}
FUNCS = sorted(MF.__all__)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 5, generator=g) < 0.5
    mask[0] = False       # a fully masked row: unspecified in every reduction along dim 1
    mask[1, :3] = True    # at least two specified elements for var/std
    return x, mask


def _close_where_specified(out, ref):
    got = out.to_dense()
    spec = got.get_mask()
    torch.testing.assert_close(got.to_tensor(0), torch.where(spec, ref.to(got.dtype), 0),
                               equal_nan=True)
    return spec


@pytest.mark.parametrize("name", FUNCS)
def test_functional_matches_torch_masked(name):
    x, mask = _inputs()
    args = ARGS.get(name, (1,))
    out = getattr(MF, name)(x, *args, mask=mask)
    ref = getattr(torch.masked, name)(x, *args, mask=mask)
    assert isinstance(out, ms.MaskedTensor)
    spec = _close_where_specified(out, ref)
    if name in ("softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod"):
        assert torch.equal(spec, mask)  # elementwise in shape: the input's mask
    elif name in ("var", "std"):
        assert torch.equal(spec, mask.sum(1) > 1)
    else:
        assert torch.equal(spec, mask.any(1))


@pytest.mark.parametrize("name", ["sum", "prod", "amax", "amin", "mean", "logsumexp", "norm",
                                  "var", "std", "argmax", "argmin"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_functional_full_and_keepdim_against_dense(name, keepdim):
    x, mask = _inputs(1)
    fn = getattr(MF, name)
    sel = x[mask]
    full = fn(x, mask=mask) if name != "norm" else fn(x, 2.0, mask=mask)
    ref = {"sum": sel.sum(), "prod": sel.prod(), "amax": sel.amax(), "amin": sel.amin(),
           "mean": sel.mean(), "logsumexp": sel.logsumexp(0), "norm": sel.norm(),
           "var": sel.var(), "std": sel.std(),
           "argmax": torch.where(mask, x, -math.inf).argmax(),
           "argmin": torch.where(mask, x, math.inf).argmin()}[name]
    assert full.dim() == 0 and bool(full.get_mask())
    torch.testing.assert_close(full.to_tensor(0).to(ref.dtype), ref)
    if name in ("argmax", "argmin", "prod"):
        return
    along = fn(x, 0, keepdim=keepdim, mask=mask) if name != "norm" else fn(
        x, 2.0, 0, keepdim=keepdim, mask=mask)
    assert along.shape == ((1, 5) if keepdim else (5,))


@pytest.mark.parametrize("layout", SPARSE, ids=["coo", "csr", "csc"])
@pytest.mark.parametrize("name", FUNCS)
def test_functional_sparse_input_agrees_with_strided(name, layout):
    x, mask = _inputs(2)
    args = ARGS.get(name, (1,))
    dense = getattr(MF, name)(x, *args, mask=mask)
    sparse_x = x.to_sparse(layout=layout)
    masks = (mask, mask.to_sparse(layout=layout), mask.to_sparse_coo())
    for m in masks:  # strided, same-layout or COO mask
        try:
            out = getattr(MF, name)(sparse_x, *args, mask=m)
        except NotImplementedError:
            if name not in ("cumsum", "cumprod"):
                raise
            pytest.skip("sparse scans need the core's scan kernels")
        assert out.layout != torch.strided or out.dim() == 0 or name in ("argmax", "argmin")
        got = out.to_dense()
        assert torch.equal(got.get_mask(), dense.get_mask())
        torch.testing.assert_close(got.to_tensor(0), dense.to_tensor(0), equal_nan=True)


def test_functional_mask_none_and_masked_input():
    x = torch.tensor([[1.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    assert float(MF.mean(x).to_tensor(0)) == pytest.approx(4 / 6)
    # sparse input: the stored elements (explicit zeros too) are the specified ones
    coo = torch.sparse_coo_tensor([[0, 0, 1], [0, 1, 2]], [1.0, 0.0, 5.0], (2, 3))
    assert float(MF.mean(coo).to_tensor(0)) == pytest.approx(2.0)
    assert torch.equal(MF.amax(coo, 1).to_dense().to_tensor(-1), torch.tensor([1.0, 5.0]))
    mt = ms.masked_tensor(x, x != 0)
    assert float(MF.sum(mt).to_tensor(0)) == 4.0
    with pytest.raises(TypeError, match="carries its own mask"):
        MF.sum(mt, mask=x != 0)


# -- mask=None on a strided input: torch's own op (Note [Strided input without a mask]) ------
OVER_ALL = {"norm": (2.0,)}  # the call over all dims, where the function has one
ELEMENTWISE = ("softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod")


def _calls(name):
    """(args, kwargs) of each call of ``name`` checked: along dim 1, keepdim, all dims."""
    calls = [(ARGS.get(name, (1,)), {})]
    if name not in ELEMENTWISE:
        calls.append((ARGS.get(name, (1,)), {"keepdim": True}))
    if name not in ARGS or name in OVER_ALL:
        calls += [(OVER_ALL.get(name, ()), {}), (OVER_ALL.get(name, ()), {"keepdim": True})]
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", FUNCS)
def test_functional_without_mask_is_torch_masked_exactly(name, dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 4, generator=g, dtype=dtype)
    for args, kwargs in _calls(name):
        out = getattr(MF, name)(x, *args, **kwargs)
        ref = getattr(torch.masked, name)(x, *args, **kwargs)
        assert isinstance(out, ms.MaskedTensor)
        # torch.masked.argmax / argmin give the indices in the input's dtype
        assert out.dtype == (torch.long if name in ("argmax", "argmin") else ref.dtype)
        assert out.shape == ref.shape and bool(out.get_mask().all()), (args, kwargs)
        # torch.masked.prod over all dims multiplies one dim at a time (pytorch#56586)
        exact = name != "prod" or args
        torch.testing.assert_close(out.to_tensor(0), ref.to(out.dtype),
                                   **({"rtol": 0, "atol": 0} if exact else {}))


def _with_specials(x):
    if x.is_floating_point():  # NaN, +-inf and a tie in the rows
        x[0, 1], x[1, 2], x[2, 3], x[0, 4] = math.nan, math.inf, -math.inf, x[0, 0]
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64,
                                   torch.bool, torch.complex64],
                         ids=["f32", "f64", "f16", "i64", "bool", "c64"])
@pytest.mark.parametrize("name", FUNCS)
def test_functional_without_mask_equals_an_all_true_mask(name, dtype):
    # whichever route mask=None takes, the result is the masked op's on an all-True mask:
    # values, mask, dtype, or the same error; empty inputs leave every group unspecified
    for x in (_with_specials(make_masked((3, 7), dtype=dtype, seed=6)[1]),
              torch.zeros(0, 7, dtype=dtype), torch.zeros(3, 0, dtype=dtype)):
        everywhere = torch.ones(x.shape, dtype=torch.bool)
        calls = _calls(name)
        if name in ("sum", "mean", "softmax", "cumsum") and dtype != torch.complex64:
            calls.append(((1,), {"dtype": torch.float64}))
        for args, kwargs in calls:
            fn = getattr(MF, name)
            try:
                ref = fn(x, *args, mask=everywhere, **kwargs)
            except Exception as e:  # noqa: BLE001
                with pytest.raises(type(e)):
                    fn(x, *args, **kwargs)
                continue
            out = fn(x, *args, **kwargs)
            assert out.dtype == ref.dtype and torch.equal(out.get_mask(), ref.get_mask())
            # mask=None runs torch's own norm and product: equal up to the last bits
            exact = name not in ("norm", "normalize", "prod")
            torch.testing.assert_close(out.to_tensor(0), ref.to_tensor(0), equal_nan=True,
                                       **({"rtol": 0, "atol": 0} if exact else {}))


@pytest.mark.parametrize("name", [n for n in FUNCS if n not in ("argmax", "argmin")])
def test_functional_without_mask_gradients(name):
    x0 = torch.randn(4, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    args = ARGS.get(name, (1,))
    grads = []
    for mask in (None, torch.ones(x0.shape, dtype=torch.bool)):
        x = x0.clone().requires_grad_(True)
        out = getattr(MF, name)(x, *args, mask=mask).to_tensor(0)
        (out * torch.arange(1.0, out.numel() + 1, dtype=x.dtype).view(out.shape)).sum().backward()
        grads.append(x.grad)
    assert type(grads[0]) is torch.Tensor
    torch.testing.assert_close(grads[0], grads[1])
    jac = torch.func.jacrev(lambda t: getattr(MF, name)(t, *args).to_tensor(0))(x0)
    torch.testing.assert_close(jac, torch.func.jacrev(
        lambda t: getattr(MF, name)(t, *args, mask=torch.ones(t.shape, dtype=torch.bool))
        .to_tensor(0))(x0))


def test_functional_is_differentiable_and_reexported():
    x, mask = _inputs(3)
    x.requires_grad_(True)
    ms.softmax(x, 1, mask=mask).to_tensor(0).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name in MF.__all__:
        assert getattr(ms, name) is getattr(MF, name)


def test_functional_dtype_argument():
    x = torch.tensor([[1, 2], [3, 4]])
    mask = torch.tensor([[True, False], [True, True]])
    assert MF.sum(x, 1, dtype=torch.float64, mask=mask).dtype == torch.float64
    assert MF.amax(x, 1, dtype=torch.float32, mask=mask).dtype == torch.float32
    assert MF.softmax(x.double(), 1, dtype=torch.float32, mask=mask).dtype == torch.float32


# -- MaskedTensor's torch.masked methods --------------------------------------------------
@pytest.mark.parametrize("layout", [torch.strided, torch.sparse_coo, torch.sparse_csr])
@pytest.mark.filterwarnings("ignore:The PyTorch API of MaskedTensors")
def test_is_sparse_coo_and_csr(layout):
    mt = make_masked((3, 4), layout)[0]
    ref = torch.masked.masked_tensor(torch.zeros(1), torch.ones(1, dtype=torch.bool))
    assert mt.is_sparse_coo() == (layout == torch.sparse_coo)
    assert mt.is_sparse_csr() == (layout == torch.sparse_csr)
    assert bool(mt.is_sparse_csr) == (layout == torch.sparse_csr)  # torch's property form
    assert ref.is_sparse_coo() is False  # the methods mirror torch.masked's
    assert mt.is_sparse == (layout != torch.strided)  # as torch.masked's is_sparse


def test_requires_grad_warning_like_torch_masked():
    data = torch.ones(2, requires_grad=True)
    mask = torch.tensor([True, False])
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        torch.masked.masked_tensor(data, mask)
    expected = {str(w.message) for w in theirs if "requires_grad" in str(w.message)}
    assert expected
    for build in (ms.masked_tensor, ms.MaskedTensor):
        with pytest.warns(UserWarning) as ours:
            build(data, mask)
        assert {str(w.message) for w in ours} == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ms.as_masked_tensor(data, mask)  # the differentiable view does not warn
        ms.masked_tensor(data.detach(), mask)


# -- plain exits ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", [torch.strided, torch.sparse_coo])
def test_plain_exits_name_the_way_out(layout):
    mt = make_masked((2, 3), layout)[0]
    for call, hint in ((mt.tolist, "to_tensor"), (mt.numpy, "to_tensor"),
                       (lambda: np.asarray(mt), "to_tensor")):
        with pytest.raises(TypeError, match="ms.to_numpy") as info:
            call()
        assert hint in str(info.value)


def test_format_of_0d():
    x = ms.masked_tensor(torch.tensor([1.23456, 2.0]), torch.tensor([True, False]))
    assert f"{x[0]:.3f}" == "1.235"
    assert f"{x[1]:.3f}" == "--"
    assert f"{x[1]:>6.2f}" == "    --"
    assert f"{x.sum():+.1e}" == "+1.2e+00"
    assert format(x) == str(x)
    with pytest.raises(TypeError, match="0-d"):
        f"{x:.3f}"


def test_torch_load_without_import_readme_fix(tmp_path):
    path = tmp_path / "ckpt.pt"
    mt = make_masked((3, 4), torch.sparse_csr)[0]
    torch.save({"w": mt}, path)
    # In a process that never imported masked_sparse the load fails; docs/interop.md's one line
    # (import masked_sparse before torch.load) fixes it.
    base = "import torch\n"
    load = f"sd = torch.load({str(path)!r}, weights_only=True)\n"
    fails = subprocess.run([sys.executable, "-c", base + load], capture_output=True,
                           text=True, cwd=str(tmp_path))
    assert fails.returncode != 0
    fix = "import masked_sparse  # noqa: F401\n"
    check = "print(sd['w'].layout, float(sd['w'].sum().to_tensor(0)))\n"
    ok = subprocess.run([sys.executable, "-c", base + fix + load + check], capture_output=True,
                        text=True, cwd=str(tmp_path),
                        env={**__import__("os").environ,
                             "PYTHONPATH": str(__import__("pathlib").Path(ms.__file__)
                                               .parent.parent)})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[0] == "torch.sparse_csr"
    assert float(ok.stdout.split()[1]) == pytest.approx(float(mt.sum().to_tensor(0)))


# -- torch.masked's sample inputs (broadcast sparse masks, 0-d inputs), parity and decisions


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



@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_is_sparse_is_true_for_every_sparse_layout_as_torch_masked(layout):
    mt, data, mask = make_masked_in((3, 4), layout)
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
