"""Reductions on every layout x op x dim x keepdim x dtype, against independent references:
a brute-force per-group loop with torch's own op, numpy.ma, and dense ``torch.where``.

Every float input has NaN under its mask and at least one fully masked slice (empty groups).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import check_invariants, make_masked
from hypothesis import given
from hypothesis import strategies as st
from reduction_refs import (
    check_result,
    expected_layout,
    hybrid_coo,
    norm_dims,
    out_shape,
    ref_groups,
    ref_numpy_ma,
)

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

CASES = ["strided", "coo", "csr", "hybrid"]
TORCH_LAYOUT = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
                "hybrid": torch.sparse_coo}
DIMS = {2: [None, 0, 1, -1, (0, 1)], 3: [None, 0, -1, (0, 2), (1, 2), (0, 1, 2)]}
ONE_DIMS = [None, 0, -1]


def make(case, dtype=torch.float32, seed=0, shape=None):
    """A MaskedTensor with an all-masked first slice and NaN (floats) under the mask."""
    if shape is None:
        shape = (5, 6) if case == "csr" else (3, 4, 5)
    mt, data, mask = make_masked(shape, torch.strided, dtype, seed=seed, density=0.5)
    mask = mask.clone()
    if mask.numel():
        mask[0] = False
    data = data.clone()
    if dtype.is_floating_point:
        data[~mask] = float("nan")
    if case == "hybrid":
        return hybrid_coo(data, mask, seed), data, mask
    mt = make_masked(shape, TORCH_LAYOUT[case], dtype, seed=seed, data=data, mask=mask)[0]
    return mt, data, mask


def result_layout(case, shape, dims, keepdim):
    if case == "hybrid" and not keepdim and set(range(len(shape) - 1)) <= set(dims):
        return torch.strided  # no sparse dim left: dense, as torch.sparse.sum returns
    return expected_layout(TORCH_LAYOUT[case], shape, dims, keepdim)


def check(case, out, values, mask, shape, dim, keepdim, **tol):
    dims = norm_dims(dim, len(shape))
    assert isinstance(out, ms.MaskedTensor)
    check_invariants(out, result_layout(case, shape, dims, keepdim))
    assert tuple(out.shape) == out_shape(shape, dims, keepdim)
    check_result(out, values, mask, **tol)


def _call(fn, mt, dim, keepdim):
    return fn(mt) if dim is None and not keepdim else fn(mt, dim=dim, keepdim=keepdim)


# name -> (masked op(mt, dim, keepdim), reference on the selected 1-D values, min count)
SIMPLE = {
    "sum": (lambda mt, d, k: torch.sum(mt, dim=d, keepdim=k), lambda s, p: s.sum(), 1),
    "mean": (lambda mt, d, k: mt.mean(dim=d, keepdim=k), lambda s, p: s.mean(), 1),
    "prod": (lambda mt, d, k: torch.prod(mt) if d is None else torch.prod(mt, d, keepdim=k),
             lambda s, p: s.prod(), 1),
    "amax": (lambda mt, d, k: torch.amax(mt, dim=() if d is None else d, keepdim=k),
             lambda s, p: s.amax(), 1),
    "amin": (lambda mt, d, k: mt.amin(dim=() if d is None else d, keepdim=k),
             lambda s, p: s.amin(), 1),
    "all": (lambda mt, d, k: torch.all(mt, dim=d, keepdim=k), lambda s, p: s.all(), 1),
    "any": (lambda mt, d, k: mt.any(dim=d, keepdim=k), lambda s, p: s.any(), 1),
    "logsumexp": (lambda mt, d, k: torch.logsumexp(mt, dim=() if d is None else d, keepdim=k),
                  lambda s, p: torch.logsumexp(s, 0), 1),
    "var": (lambda mt, d, k: torch.var(mt, dim=d, keepdim=k), lambda s, p: s.var(), 2),
    "var_c0": (lambda mt, d, k: mt.var(dim=d, keepdim=k, correction=0),
               lambda s, p: s.var(correction=0), 1),
    "std": (lambda mt, d, k: torch.std(mt, dim=d, keepdim=k), lambda s, p: s.std(), 2),
    "std_unbiased_false": (lambda mt, d, k: mt.std(d, False, k), lambda s, p: s.std(False), 1),
    "norm2": (lambda mt, d, k: torch.linalg.vector_norm(mt, dim=d, keepdim=k),
              lambda s, p: torch.linalg.vector_norm(s), 1),
    "norm1": (lambda mt, d, k: torch.linalg.vector_norm(mt, 1, d, k),
              lambda s, p: torch.linalg.vector_norm(s, 1), 1),
    "norm_inf": (lambda mt, d, k: mt.norm(math.inf, d, k),
                 lambda s, p: torch.linalg.vector_norm(s, math.inf), 1),
    "norm_ninf": (lambda mt, d, k: torch.norm(mt, -math.inf, d, k),
                  lambda s, p: torch.linalg.vector_norm(s, -math.inf), 1),
    "norm0": (lambda mt, d, k: torch.linalg.vector_norm(mt, 0, d, k),
              lambda s, p: torch.linalg.vector_norm(s, 0), 1),
    "norm3": (lambda mt, d, k: torch.norm(mt, 3, d, k),
              lambda s, p: torch.linalg.vector_norm(s, 3), 1),
    "norm_fro": (lambda mt, d, k: mt.norm(dim=d, keepdim=k),
                 lambda s, p: torch.linalg.vector_norm(s), 1),
    "count_nonzero": (lambda mt, d, k: torch.count_nonzero(mt, dim=d),
                      lambda s, p: torch.count_nonzero(s), 1),
}
INT_OPS = ["sum", "prod", "amax", "amin", "all", "any", "count_nonzero"]


def _params():
    out = []
    for case in CASES:
        ndim = 2 if case == "csr" else 3
        for dim in DIMS[ndim]:
            for keepdim in (False, True):
                out.append(pytest.param(case, dim, keepdim, id=f"{case}-{dim}-{keepdim}"))
    return out


@pytest.mark.parametrize("name", sorted(SIMPLE))
@pytest.mark.parametrize("case, dim, keepdim", _params())
def test_float_reductions(name, case, dim, keepdim):
    fn, ref, min_count = SIMPLE[name]
    if not _expressible(name, dim, keepdim):
        pytest.skip("torch's argument parser rejects this combination before dispatch")
    mt, data, mask = make(case, torch.float64, seed=len(name))
    if name == "count_nonzero":
        data = torch.where(torch.rand(data.shape) < 0.3, 0.0, data)
        mt = _rebuild(case, mt, data, mask)
    out = fn(mt, dim, keepdim)
    values, spec = ref_groups(ref, data, mask, dim, keepdim, min_count)
    check(case, out, values, spec, data.shape, dim, keepdim)


def _expressible(name, dim, keepdim):
    if name == "count_nonzero":
        return not keepdim
    if name == "prod":  # one int dim, or none (then no keepdim)
        return isinstance(dim, int) or (dim is None and not keepdim)
    return True


def _rebuild(case, mt, data, mask):
    if case == "hybrid":
        return hybrid_coo(data, mask)
    return make_masked(tuple(data.shape), TORCH_LAYOUT[case], data.dtype, data=data,
                       mask=mask)[0]


@pytest.mark.parametrize("name", INT_OPS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("case", CASES)
def test_int_and_bool_reductions(name, dtype, case):
    if dtype == torch.bool and name in ("prod", "amax", "amin"):
        pytest.skip("covered by all/any")
    fn, ref, _ = SIMPLE[name]
    mt, data, mask = make(case, dtype, seed=3)
    for dim in DIMS[data.dim()]:
        keepdim = name != "count_nonzero" and dim == 0
        if not _expressible(name, dim, keepdim):
            continue
        out = fn(mt, dim, keepdim)
        values, spec = ref_groups(ref, data, mask, dim, keepdim)
        check(case, out, values, spec, data.shape, dim, keepdim)


@pytest.mark.parametrize("name, np_name, kwargs", [
    ("sum", "sum", {}), ("mean", "mean", {}), ("prod", "prod", {}), ("amax", "max", {}),
    ("amin", "min", {}), ("var", "var", {"ddof": 1}), ("std", "std", {"ddof": 1}),
    ("var_c0", "var", {"ddof": 0})])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_against_numpy_ma(name, np_name, kwargs, dtype, case):
    fn = SIMPLE[name][0]
    mt, data, mask = make(case, dtype, seed=11)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    for dim in DIMS[data.dim()]:
        for keepdim in (False, True):
            if not _expressible(name, dim, keepdim):
                continue
            out = fn(mt, dim, keepdim)
            values, spec = ref_numpy_ma(np_name, data, mask, dim, keepdim, **kwargs)
            check(case, out, values.to(dtype), spec, data.shape, dim, keepdim, **tol)


@pytest.mark.parametrize("case", CASES)
def test_against_dense_where(case):
    mt, data, mask = make(case, torch.float64, seed=12)
    for dim in DIMS[data.dim()]:
        dims = tuple(norm_dims(dim, data.dim()))
        count = mask.sum(dims, keepdim=True)
        total = torch.where(mask, data, 0.0).sum(dims, keepdim=True)
        top = torch.where(mask, data, -math.inf).amax(dims, keepdim=True)
        spec = count > 0
        for out, ref in [(torch.sum(mt, dims, keepdim=True), total),
                         (torch.mean(mt, dims, keepdim=True), total / count),
                         (torch.amax(mt, dims, keepdim=True), top)]:
            check(case, out, ref, spec, data.shape, dims, True)


# -- argmin / argmax / min / max / median: one dim or all --------------------------------
def _first_arg(kind):
    def ref(s, p):
        return p[torch.argmax(s) if kind == "max" else torch.argmin(s)]
    return ref


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
@pytest.mark.parametrize("case", CASES)
def test_argminmax(kind, dtype, case):
    mt, data, mask = make(case, dtype, seed=5)
    if dtype == torch.int64:  # ties: the first position wins, as in torch
        data = data % 3
        mt = _rebuild(case, mt, data, mask)
    arg = torch.argmax if kind == "max" else torch.argmin
    for dim in ONE_DIMS:
        for keepdim in (False, True):
            out = arg(mt, dim=dim, keepdim=keepdim)
            idx, spec = ref_groups(_first_arg(kind), data, mask, dim, keepdim)
            check(case, out, idx, spec, data.shape, dim, keepdim)
            if dim is None:
                continue
            values, indices = getattr(mt, kind)(dim, keepdim)
            ref_v, _ = ref_groups(lambda s, p: getattr(s, "a" + kind)(), data, mask, dim,
                                  keepdim)
            check(case, values, ref_v, spec, data.shape, dim, keepdim)
            check(case, indices, idx, spec, data.shape, dim, keepdim)
    full = getattr(torch, kind)(mt)
    ref_full, spec_full = ref_groups(lambda s, p: getattr(s, "a" + kind)(), data, mask, None,
                                     False)
    check(case, full, ref_full, spec_full, data.shape, None, False)


def test_argmax_nan_and_flat_index():
    data = torch.tensor([[1.0, float("nan"), 5.0], [7.0, 2.0, float("nan")]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    mt = ms.masked_tensor(data, mask)
    # specified NaN propagates (torch's rule); masked NaN is ignored
    assert torch.equal(torch.argmax(mt, 1).get_data(), torch.tensor([1, 0]))
    assert torch.argmax(mt).item() == 1
    assert torch.argmin(mt.to_sparse_coo(), 1).to_dense().get_data().tolist() == [1, 1]
    # indices are in the full uncompressed shape, not positions in the stored values
    coo = ms.masked_tensor(torch.tensor([[0.0, 0.0, 0.0, 9.0]]),
                           torch.tensor([[False, False, False, True]])).to_sparse_coo()
    assert torch.argmax(coo).item() == 3 and torch.argmax(coo, 1).to_dense().get_data() == 3


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_median(nan, case):
    mt, data, mask = make(case, torch.float64, seed=6)
    if nan:  # a specified NaN: median propagates it, nanmedian ignores it
        data = data.clone()
        data[1, 0] = float("nan")
        mask = mask.clone()
        mask[1, 0] = True
        mt = _rebuild(case, mt, data, mask)
    for name in ("median", "nanmedian"):
        op = getattr(torch, name)

        def ref(s, p, op=op):
            return op(s)

        def ref_idx(s, p, op=op):
            return p[op(s, 0).indices]

        full = op(mt)
        v, m = ref_groups(ref, data, mask, None, False, min_count=1)
        if name == "nanmedian":
            v, m = ref_groups(ref, data, mask & ~data.isnan(), None, False)
        check(case, full, v, m, data.shape, None, False)
        for dim in (0, -1):
            for keepdim in (False, True):
                values, indices = op(mt, dim, keepdim)
                eff = mask & ~data.isnan() if name == "nanmedian" else mask
                v, m = ref_groups(ref, data, eff, dim, keepdim)
                i, _ = ref_groups(ref_idx, data, eff, dim, keepdim)
                check(case, values, v, m, data.shape, dim, keepdim)
                check(case, indices, i, m, data.shape, dim, keepdim)


@pytest.mark.parametrize("case", CASES)
def test_nansum_nanmean_ignore_specified_nan(case):
    mt, data, mask = make(case, torch.float64, seed=7)
    data = torch.where(torch.rand(data.shape) < 0.3, float("nan"), data)
    mt = _rebuild(case, mt, data, mask)
    eff = mask & ~data.isnan()
    for dim in DIMS[data.dim()][:3]:
        v, m = ref_groups(lambda s, p: s.sum(), data, eff, dim, False)
        check(case, torch.nansum(mt, dim), v, m, data.shape, dim, False)
        v, m = ref_groups(lambda s, p: s.mean(), data, eff, dim, False)
        check(case, mt.nanmean(dim), v, m, data.shape, dim, False)
        # while plain sum propagates a specified NaN
        v, m = ref_groups(lambda s, p: s.sum(), data, mask, dim, False)
        check(case, mt.sum(dim), v, m, data.shape, dim, False)


@pytest.mark.parametrize("case", CASES)
def test_var_mean_std_mean_and_correction(case):
    mt, data, mask = make(case, torch.float64, seed=8)
    for correction in (0, 1, 2):
        var, mean = torch.var_mean(mt, 0, correction=correction)
        v, m = ref_groups(lambda s, p, c=correction: s.var(correction=c), data, mask, 0, False,
                          min_count=correction + 1)
        check(case, var, v, m, data.shape, 0, False)
        v, m = ref_groups(lambda s, p: s.mean(), data, mask, 0, False)
        check(case, mean, v, m, data.shape, 0, False)
    std, _ = torch.std_mean(mt, unbiased=False)
    v, m = ref_groups(lambda s, p: s.std(correction=0), data, mask, None, False)
    check(case, std, v, m, data.shape, None, False)
    v, m = ref_groups(lambda s, p: s.var(), data, mask, None, False, min_count=2)
    check(case, torch.var(mt, True), v, m, data.shape, None, False)


# -- edge cases ---------------------------------------------------------------------------
ALL_NAMES = sorted(SIMPLE)


@pytest.mark.parametrize("case", CASES)
def test_fully_masked_input(case):
    shape = (5, 6) if case == "csr" else (3, 4, 5)
    mt, data, mask = make(case, torch.float64, seed=9)
    mask = torch.zeros(shape, dtype=torch.bool)
    mt = _rebuild(case, mt, data.nan_to_num(), mask)
    for name in ALL_NAMES + ["median", "argmax", "max"]:
        fn = SIMPLE[name][0] if name in SIMPLE else getattr(torch, name)
        for dim in (None, 1):
            out = fn(mt, dim, False) if name in SIMPLE else (
                fn(mt) if dim is None else fn(mt, dim)[0])
            s = out._storage
            assert not bool(s.mask.any()), name
            assert bool(torch.isfinite(s.values).all()), (name, s.values)
    assert not torch.sum(mt).get_mask()


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)])
@pytest.mark.parametrize("case", ["strided", "coo", "csr"])
def test_zero_size_dims(shape, case):
    mt, data, mask = make(case, torch.float32, seed=1, shape=shape)
    for name in ["sum", "mean", "prod", "amax", "var", "logsumexp", "norm2", "count_nonzero"]:
        fn, ref, min_count = SIMPLE[name]
        for dim in (None, 0, 1):
            if not _expressible(name, dim, False):
                continue
            out = fn(mt, dim, False)
            values, spec = ref_groups(ref, data, mask, dim, False, min_count)
            check(case, out, values, spec, shape, dim, False)
    for dim in (0, 1):
        values, spec = ref_groups(_first_arg("max"), data, mask, dim, False)
        check(case, torch.argmax(mt, dim), values, spec, shape, dim, False)


def test_zero_dim_input():
    mt = ms.masked_tensor(torch.tensor(2.0), torch.tensor(True))
    assert mt.sum().item() == 2.0 and mt.sum(0).item() == 2.0 and mt.mean(-1).item() == 2.0
    assert mt.amax(0, keepdim=True).shape == () and torch.argmax(mt).item() == 0
    masked = ms.masked_tensor(torch.tensor(2.0), torch.tensor(False))
    assert not masked.sum().get_mask() and not masked.softmax(0).get_mask()


@pytest.mark.parametrize("case", CASES)
def test_dtype_argument(case):
    mt, data, mask = make(case, torch.int32, seed=4)
    for op in [torch.sum, torch.mean, torch.prod, torch.nansum]:
        out = op(mt, 1, dtype=torch.float64)
        values, spec = ref_groups(lambda s, p, op=op: op(s, dtype=torch.float64), data, mask, 1,
                                  False)
        check(case, out, values, spec, data.shape, 1, False)
    assert torch.sum(mt).dtype == torch.int64  # torch's integer promotion
    with pytest.raises(RuntimeError, match="mean"):
        torch.mean(mt)  # torch's own error for an int mean without dtype=


def test_argument_forms():
    mt, data, mask = make("strided", torch.float64, seed=2)
    ref = torch.sum(mt, dim=(0, 2), keepdim=True)
    for out in [mt.sum((0, 2), True), mt.sum([0, -1], keepdim=True), torch.sum(mt, (-3, -1), True),
                mt.sum(axis=(0, 2), keepdims=True), torch.sum(input=mt, dim=(2, 0), keepdim=True)]:
        assert torch.equal(out.to_tensor(0), ref.to_tensor(0))
        assert torch.equal(out.get_mask(), ref.get_mask())
    assert torch.equal(mt.sum(dim=()).to_tensor(0), mt.sum().to_tensor(0))
    with pytest.raises(IndexError):
        mt.sum(3)
    with pytest.raises(RuntimeError, match="multiple"):
        mt.sum((0, -3))
    with pytest.raises(TypeError, match="out="):
        torch.sum(mt, 0, out=torch.empty(4, 5))
    with pytest.raises(TypeError):
        mt.sum(dim="x")
    with pytest.raises(NotImplementedError, match="to_dense"):
        mt.norm(p="nuc")
    with pytest.raises(TypeError, match="complex"):
        torch.amax(ms.masked_tensor(torch.ones(2, dtype=torch.complex64), torch.ones(2).bool()))
    # torch.max(mt, other) is the binary maximum
    assert torch.equal(torch.max(mt, mt).to_tensor(0), torch.maximum(mt, mt).to_tensor(0))


def _dense(mt):
    return mt.to_tensor(0).to_dense(), mt.get_mask().to_dense()


@pytest.mark.parametrize("case", CASES)
def test_aten_overloads(case):
    aten = torch.ops.aten
    mt, data, mask = make(case, torch.float64, seed=10)
    pairs = [
        (aten.sum.dim_IntList(mt, [1], True), torch.sum(mt, 1, keepdim=True)),
        (aten.sum.default(mt), torch.sum(mt)),
        (aten.amax.default(mt, [0]), torch.amax(mt, 0)),
        (aten.mean.dim(mt, [0, 1]), torch.mean(mt, (0, 1))),
        (aten.max.dim(mt, 1)[1], torch.argmax(mt, 1)),
        (aten.var.correction(mt, [1], correction=0), mt.var(1, correction=0)),
        (aten.linalg_vector_norm.default(mt, 2, [0]), torch.linalg.vector_norm(mt, dim=0)),
        (aten.logsumexp.default(mt, [1]), mt.logsumexp(1)),
        (aten._softmax.default(mt, 1, False), mt.softmax(1)),
        (aten._log_softmax.default(mt, 0, False), mt.log_softmax(0)),
    ]
    for got, ref in pairs:
        assert got.layout == ref.layout and got.shape == ref.shape
        (gv, gm), (rv, rm) = _dense(got), _dense(ref)
        assert torch.equal(gm, rm)
        torch.testing.assert_close(gv, rv)


def test_sum_to_from_broadcast_gradient():
    # The engine reduces a broadcast plain operand's gradient with aten.sum.dim_IntList.
    a = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("nan"), 6.0]])
    b = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    mt = ms.masked_tensor(a, ~a.isnan())
    (grad,) = torch.autograd.grad(torch.sum(mt * b), b)
    dense = grad.to_tensor(0) if isinstance(grad, ms.MaskedTensor) else grad
    torch.testing.assert_close(dense, torch.tensor([5.0, 2.0, 6.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(300, 250), (20, 70, 60)])
def test_large_strided_sum_and_mean(dtype, shape):
    # Large enough for the fused block path (Note [Fused masked sum]); NaN and inf under
    # the mask must not leak, -0.0 and specified values must come through bit for bit.
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(shape, generator=g) * 100).to(dtype)
    mask = torch.rand(shape, generator=g) < 0.5
    mask[:, 0] = False
    if dtype.is_floating_point:
        data[~mask] = torch.tensor([float("nan"), float("inf"), -float("inf")]).repeat(
            int((~mask).sum()) // 3 + 1)[: int((~mask).sum())].to(dtype)
    mt = ms.masked_tensor(data, mask)
    for dim in [0, 1, -1, (0, 1), None]:
        dims = tuple(norm_dims(dim, len(shape)))
        for keepdim in (False, True):
            count = mask.sum(dims, keepdim=keepdim)
            total = torch.where(mask, data, torch.zeros((), dtype=dtype)).sum(dims, keepdim)
            check("strided", torch.sum(mt, dim=dim, keepdim=keepdim), total, count > 0, shape,
                  dim, keepdim)
            if dtype.is_floating_point:
                check("strided", mt.mean(dim=dim, keepdim=keepdim), total / count, count > 0,
                      shape, dim, keepdim)


def test_hybrid_dense_dim_reduction_keeps_the_index_tensor():
    mt, data, mask = make("hybrid", torch.float64, seed=14)
    for out in (mt.sum(-1), torch.amax(mt, 2, keepdim=True), mt.mean(-1)):
        assert out.layout == torch.sparse_coo
        assert out._storage.index[0] is mt._storage.index[0]
    assert torch.sum(mt, (0, 1)).layout == torch.strided  # no sparse dim left: dense


# -- huge sparse inputs: never densified ----------------------------------------------------
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_huge_sparse_reductions(layout):
    n, nnz = 100_000, 1000
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, n * n, (2 * nnz,), generator=g).unique()[:nnz]
    idx = torch.stack([keys // n, keys % n])
    vals = torch.rand(nnz, generator=g, dtype=torch.float64)
    mvals = torch.rand(nnz, generator=g) < 0.8
    data = torch.sparse_coo_tensor(idx, vals, (n, n)).coalesce()
    mask = torch.sparse_coo_tensor(idx, mvals, (n, n)).coalesce()
    if layout == torch.sparse_csr:
        data, mask = data.to_sparse_csr(), mask.to_sparse_csr()
    mt = ms.masked_tensor(data, mask)
    ci, cv, cm = data.to_sparse_coo().coalesce().indices(), data.to_sparse_coo().coalesce(
    ).values(), mask.to_sparse_coo().coalesce().values()
    torch.testing.assert_close(torch.sum(mt).item(), cv[cm].sum().item())
    assert torch.amax(mt).item() == cv[cm].max().item()
    assert torch.argmax(mt).item() == (ci[0] * n + ci[1])[cm][cv[cm].argmax()].item()
    for dim in (0, 1):
        out = torch.sum(mt, dim)
        assert out.layout == torch.sparse_coo and out.shape == (n,)
        ref = torch.sparse.sum(torch.sparse_coo_tensor(ci[:, cm], cv[cm], (n, n)), dim)
        ref = ref.coalesce()
        got = out._storage
        keep = got.mask
        assert torch.equal(got.index[0][:, keep], ref.indices())
        torch.testing.assert_close(got.values[keep], ref.values())
        kept = torch.mean(mt, dim, keepdim=True)
        assert kept.layout == layout
        assert mt.softmax(dim)._storage.index[0] is mt._storage.index[0]
        assert torch.argmax(mt, dim).layout == torch.sparse_coo


# -- a layout without a reduction kernel: reduced through its COO form ---------------------
def test_fallback_through_coo():
    import layouts

    coo = layouts.get_layout(torch.sparse_coo)
    plain = layouts.Layout(
        name="coo_without_kernels", torch_layout=None, index_names=("indices",),
        from_torch=coo.from_torch, from_strided=coo.from_strided, densify=coo.densify,
        to_torch=coo.to_torch, gather=coo.gather,
        to_coo=lambda s: coo.build(s.index, s.values, s.mask, s.shape),
        from_coo=lambda s: plain.build(s.index, s.values, s.mask, s.shape),
        validate=coo.validate)
    mt, data, mask = make("coo", torch.float64, seed=13)
    s = mt._storage
    from masked_sparse._tensor import _wrap

    odd = _wrap(plain.build(s.index, s.values, s.mask, s.shape))
    for dim in (None, 0, (1, 2)):
        out = torch.sum(odd, dim)
        values, spec = ref_groups(lambda x, p: x.sum(), data, mask, dim, False)
        check("coo", out, values, spec, data.shape, dim, False)
    sm = odd.softmax(1)
    assert sm._storage.layout is plain
    ref = torch.softmax(torch.where(mask, data, -math.inf), 1)
    check_result(sm, torch.where(mask, ref, 0.0), mask)


# -- random shapes ---------------------------------------------------------------------
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       case=st.sampled_from(["strided", "coo", "csr"]),
       name=st.sampled_from(["sum", "mean", "amax", "prod", "var_c0", "logsumexp", "norm2"]),
       keepdim=st.booleans(), data=st.data(), seed=st.integers(0, 1000))
def test_hypothesis_random_shapes(shape, case, name, keepdim, data, seed):
    if case == "csr" and len(shape) != 2:
        case = "coo"
    ndim = len(shape)
    dims = data.draw(st.lists(st.integers(-ndim, ndim - 1), unique_by=lambda d: d % ndim,
                              max_size=ndim))
    mt, x, mask = make(case, torch.float64, seed=seed, shape=tuple(shape))
    dim = tuple(dims) if dims else None
    if name == "prod":  # one int dim or none
        dim = dims[0] if dims else None
        keepdim = keepdim and dim is not None
    fn, ref, min_count = SIMPLE[name]
    out = fn(mt, dim, keepdim)
    values, spec = ref_groups(ref, x, mask, dim, keepdim, min_count)
    check(case, out, values, spec, tuple(shape), dim, keepdim)


@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3),
       case=st.sampled_from(["strided", "coo", "csr"]), log=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data(),
       seed=st.integers(0, 1000))
def test_hypothesis_softmax_random_shapes(shape, case, log, dtype, data, seed):
    """softmax / log_softmax along any dim of random shapes and masks (one native call
    along or across the stored lines, the composed route where it does not apply): the
    float64 reference of the specified elements, the others -inf."""
    if case == "csr" and len(shape) != 2:
        case = "coo"
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    mt, x, mask = make(case, dtype, seed=seed, shape=tuple(shape))
    out = (torch.log_softmax if log else torch.softmax)(mt, dim)
    want = (torch.log_softmax if log else torch.softmax)(
        torch.where(mask, x.double(), -math.inf), dim)
    check_result(out, torch.where(mask, want, 0.0).to(dtype), mask)

