"""The fast paths of the sparse reductions give the results of the dense reference.

The paths under test (the fixture ``fast`` runs each test with the native kernels and with
their torch-op implementation, and lowers the sizes so that small inputs take them):

- ``layouts.fill_unspecified``: the one exact fill (native, else ``torch.where``) must be
  bit-identical to ``torch.where``;
- the 2-norm: the sum of squares fused with the fill, torch's norm over every dim;
- ``argmax`` / ``argmin`` over every dim of COO / CSR through torch's own ``argmax``;
  amax / amin / prod scattered from the identity (``include_self``);
- the native kernels (Note [Native reductions]: sums, amax/amin and counts in one pass),
  and without them the torch-op implementation of each kernel family (Note [Kernel families
  as ops]) -- runs of whole lines
  (CSR rows, CSC columns, rows of a COO matrix: ordered storage) and scatters into slots
  or group ids (COO / CSR columns, a 3-D COO grouped by ``unique``: unordered storage);
- the group counts and result masks cached per index and mask object (Note [Facts of a
  mask]): a mask written in place, or a result mask written in place, is recomputed.

Each case is checked against the strided reduction of the dense data (the reference the
layout-agreement tests use) and against the generic sparse route with the fast paths off,
on inputs with empty rows and columns, fully masked rows and columns, +-inf and NaN, for
float and int dtypes, with and without ``keepdim``.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import _to_layout, assert_masked_equal, check_invariants, dense_of

import layouts
import layouts._fill as layout_fill
import layouts._native as native
import masked_sparse as ms
from masked_sparse._fill import is_zero_filled

INF, NAN = math.inf, math.nan
DTYPES = [torch.float32, torch.float64, torch.int32]
SPARSE = {"coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc,
          "csr32": torch.sparse_csr}


@pytest.fixture(params=["native", "torch ops"])
def fast(request, monkeypatch):
    """Every fast path runs: the native kernels (the exact fill from one element on), or
    without them the torch-op implementation (``MASKED_SPARSE_NATIVE=0``)."""
    if request.param == "native" and not native.available():
        pytest.skip(f"native kernels: {native.status()}")
    if request.param == "torch ops":  # every native entry point asks _library()
        monkeypatch.setattr(native, "_library", lambda: None)
    monkeypatch.setattr(layout_fill, "_FILL_MIN", 1)


def _matrix(dtype, shape=(9, 13), seed=0, specials=True):
    """Dense data, the mask of specified entries and the stored set of a matrix with empty
    rows/columns, fully masked stored rows/columns, +-inf and NaN (specified and not;
    without ``specials`` every value is finite, so that a full reduction is too)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        data = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
        special = torch.tensor([INF, -INF, NAN, -0.0], dtype=dtype)
        pick = torch.randint(0, 12, shape, generator=g)
        if specials:
            data = torch.where(pick < 4, special[pick.clamp(max=3)], data)
    else:
        data = torch.randint(-50, 50, shape, generator=g).to(dtype)
    stored = torch.rand(shape, generator=g) < 0.6
    mask = stored & (torch.rand(shape, generator=g) < 0.6)
    stored[3], mask[3] = True, False     # a stored row, all masked out
    stored[:, 5], mask[:, 5] = True, False
    stored[1] = False                    # an empty row
    stored[:, 2] = False                 # an empty column (after the rows above)
    mask &= stored
    return data, mask, stored


def _sparse(data, mask, stored, layout):
    coo = ms.masked_tensor(_to_layout(data, stored, torch.sparse_coo),
                           _to_layout(mask, stored, torch.sparse_coo))
    if layout == "csr32":  # a CSR whose indices are int32 (torch allows it; kept as is)
        values, flags = (_to_layout(t, stored, torch.sparse_csr) for t in (data, mask))
        crow, col = values.crow_indices().int(), values.col_indices().int()
        mt = ms.masked_tensor(
            torch.sparse_csr_tensor(crow, col, values.values(), data.shape),
            torch.sparse_csr_tensor(crow, col, flags.values(), data.shape))
        assert all(i.dtype == torch.int32 for i in mt._storage.index)  # not widened
        return mt
    return {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout]


def _call(op, mt, dim, keepdim):
    if op == "norm":
        return torch.linalg.vector_norm(mt, dim=dim, keepdim=keepdim)
    if dim is None:
        return getattr(torch, op)(mt)
    return getattr(torch, op)(mt, dim, keepdim=keepdim)


def _same(got, want):
    """Same specified set, dtype and values there (bit for bit up to summation order)."""
    assert_masked_equal(got, *dense_of(want))


OPS = ["sum", "nansum", "mean", "amax", "amin", "prod", "argmax", "argmin", "norm"]


@pytest.mark.parametrize("layout", list(SPARSE))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, False), (1, True), (0, True),
                                         (None, False)])
@pytest.mark.parametrize("specials", [True, False], ids=["inf-nan", "finite"])
def test_fast_paths_match_dense_and_generic(fast, monkeypatch, layout, dtype, op, dim,
                                            keepdim, specials):
    if op in ("mean", "nansum", "norm") and not dtype.is_floating_point:
        pytest.skip("mean / nansum / norm of an integer MaskedTensor: torch's dtype rules")
    if not (specials or dtype.is_floating_point):
        pytest.skip("integers have no inf / NaN: one case is enough")
    data, mask, stored = _matrix(dtype, specials=specials)
    got = _call(op, _sparse(data, mask, stored, layout), dim, keepdim)
    check_invariants(got)
    monkeypatch.setattr(native, "_library", lambda: None)
    monkeypatch.setattr(layout_fill, "_FILL_MIN", 1 << 62)
    # References without the fast paths and without cached counts: dense, and the generic
    # route on a freshly built tensor.
    _same(got, _call(op, ms.masked_tensor(data, mask), dim, keepdim))
    _same(got, _call(op, _sparse(data, mask, stored, layout), dim, keepdim))


@pytest.mark.parametrize("op", ["sum", "amax", "amin", "mean"])
@pytest.mark.parametrize("dim", [1, 2, (0, 1)])
def test_groups_of_a_3d_coo(fast, op, dim):
    """A sparse 3-D COO tensor: reducing the middle dim groups by ``unique`` (the kept key
    space is large: unordered group ids), the last dim by ``unique_consecutive`` (ordered
    group ids), the leading dims into key slots -- each a scatter path."""
    g = torch.Generator().manual_seed(1)
    shape = (6, 7, 5000)
    data = torch.randn(shape, generator=g, dtype=torch.float64)
    data[:, :, ::7] = NAN
    data[:, :, 3::11] = -INF
    stored = torch.rand(shape, generator=g) < 0.01
    mask = stored & (torch.rand(shape, generator=g) < 0.7)
    idx = stored.nonzero().t()
    mt = ms.masked_tensor(torch.sparse_coo_tensor(idx, data[stored], shape).coalesce(),
                          torch.sparse_coo_tensor(idx, mask[stored], shape).coalesce())
    got = getattr(torch, op)(mt, dim)
    _same(got, getattr(torch, op)(ms.masked_tensor(data, mask), dim))
    check_invariants(got)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int8, torch.uint8, torch.int16, torch.int32,
                                   torch.int64], ids=str)
@pytest.mark.parametrize("n", [1, 3, 4, 11, 50, 257])
def test_fill_unspecified_is_where_bit_for_bit(fast, dtype, n):
    g = torch.Generator().manual_seed(n)
    if dtype.is_floating_point:
        values = torch.randn(n, generator=g).to(dtype)
        values[::3] = NAN
        values[1::4] = -INF
        values[2::5] = -0.0
        fills = [0, -0.0, -INF, INF, 1.5, NAN]
    else:
        values = torch.randint(0, 100, (n,), generator=g).to(dtype)
        info = torch.iinfo(dtype)
        fills = [0, info.min, info.max, 7]
    mask = torch.rand(n, generator=g) < 0.5
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    for value in fills:
        got = layouts.fill_unspecified(values, mask, value)
        want = torch.where(mask, values, torch.tensor(value, dtype=dtype))
        assert got.dtype == dtype and got.shape == values.shape
        assert torch.equal(got.view(bits), want.view(bits)), value
    two_d = layouts.fill_unspecified(values.view(1, n), mask.view(1, n), 0)
    assert two_d.shape == (1, n)
    grid = values.repeat(3).view(3, n)  # 2-D, and transposed (not contiguous)
    grid_mask = torch.rand(3, n, generator=g) < 0.5
    for v, m in ((grid, grid_mask), (grid.t(), grid_mask.t()), (grid.t(), grid_mask.t().clone())):
        got = layouts.fill_unspecified(v, m, 0)
        want = torch.where(m, v, torch.tensor(0, dtype=dtype))
        assert got.shape == v.shape and torch.equal(got.contiguous().view(bits),
                                                    want.contiguous().view(bits))


def test_fill_unspecified_keeps_autograd(fast):
    values = torch.tensor([1.0, 2.0, NAN, 4.0], requires_grad=True)
    mask = torch.tensor([True, False, False, True])
    out = layouts.fill_unspecified(values, mask, 0)
    out.sum().backward()
    assert values.grad.tolist() == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("layout", list(SPARSE))
@pytest.mark.parametrize("dim", [0, 1])
def test_cached_counts_follow_in_place_writes(fast, layout, dim):
    """Counts and result masks are cached per mask object: a write into the mask (a new
    version) is seen, and so is a write into a result mask that came from the cache."""
    data, mask, stored = _matrix(torch.float64)
    mt = _sparse(data, mask, stored, layout)
    first = mt.mean(dim)
    _same(first, ms.masked_tensor(data, mask).mean(dim))
    mt._storage.mask.fill_(False)  # every stored entry now unspecified
    assert not mt.sum(dim).get_mask().to_dense().any()
    assert not mt.mean(dim).get_mask().to_dense().any()
    mt._storage.mask.fill_(True)  # every stored entry specified again
    full = ms.masked_tensor(data, stored)
    _same(mt.amax(dim), full.amax(dim))
    out = mt.sum(dim)
    out._storage.mask.fill_(False)  # a result mask written in place
    _same(mt.sum(dim), full.sum(dim))


@pytest.mark.parametrize("layout", list(SPARSE))
def test_gradients_take_the_fast_paths(fast, layout):
    """With autograd the same kernels run (Note [Kernel families as ops]), recorded with their
    backwards; the gradients carry the mask and equal the strided route's."""
    data, mask, stored = _matrix(torch.float64)
    data = torch.where(data.isfinite(), data, 1.0)
    mt = _sparse(data, mask, stored, layout).requires_grad_()
    (torch.amax(mt, 1).to_tensor(0).sum() + mt.sum(0).to_tensor(0).sum()).backward()
    grad = mt.grad
    assert torch.equal(grad.get_mask().to_dense(), mask)
    # the values: the strided route's gradient of the same expression (no sparse kernel)
    ref = ms.masked_tensor(data, mask, requires_grad=True)
    (torch.amax(ref, 1).to_tensor(0).sum() + ref.sum(0).to_tensor(0).sum()).backward()
    torch.testing.assert_close(grad.to_tensor(0).to_dense(), ref.grad.to_tensor(0))


@pytest.mark.parametrize("layout", list(SPARSE))
def test_cached_facts_let_the_index_go(fast, layout):
    """Index facts are cached per index tensor while it lives (Note [Index facts of a
    grouping]): no cached fact may hold its own index, or the tensor and its cache entries
    would live for ever."""
    import gc
    import weakref

    from layouts import _index

    def reduce_and_forget():
        data, mask, stored = _matrix(torch.float64, specials=False)
        mt = _sparse(data, mask, stored, layout)
        for dim in (0, 1, None):
            for op in ("sum", "mean", "amax", "argmax", "var", "logsumexp"):
                if op == "logsumexp" and dim is None:
                    continue
                getattr(mt, op)(dim) if dim is not None else getattr(mt, op)()
        mt.sum(1, keepdim=True), mt.sum(0, keepdim=True), mt.softmax(1)
        return [weakref.ref(t) for t in mt._storage.index]

    gc.collect()  # entries of earlier tests' garbage go first
    before = len(_index._CACHE)
    refs = reduce_and_forget()
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    assert len(_index._CACHE) == before


def _native_calls(monkeypatch, *names: str) -> list:
    """The results of every call of the native functions ``names`` from now on (None where
    the kernel did not apply), recorded; a skip without the native kernels."""
    if not native.available():
        pytest.skip(f"native kernels: {native.status()}")
    calls = []
    for name in names:
        kernel = getattr(native, name)
        monkeypatch.setattr(native, name,
                            lambda *a, k=kernel, **kw: calls.append(k(*a, **kw)) or calls[-1])
    return calls


def _special_matrix(dtype, specials, scale, layout):
    """:func:`_matrix` times ``scale`` (differences that over- and underflow ``exp``) with
    a one-element row, as a sparse ``layout`` MaskedTensor; its data and mask."""
    data, mask, stored = _matrix(dtype, specials=specials)
    data = data * scale
    mask[7] &= torch.arange(13) == 4  # a one-element row (when stored)
    mask[7, 4] = stored[7, 4] = True
    mask &= stored
    return _sparse(data, mask, stored, layout), data, mask


def _var_reference(data, mask, dim, keepdim, correction, std):
    """The masked variance (std) over ``dim`` (None: every element) of dense data, written
    with ``torch.where`` in float64: the result and where it is specified (more than
    ``correction`` specified elements)."""
    dims = tuple(range(data.dim())) if dim is None else (dim,)
    x = data.double()
    count = mask.sum(dims, keepdim=True)
    mean = torch.where(mask, x, 0).sum(dims, keepdim=True) / count.clamp(min=1)
    sq = torch.where(mask, (x - mean) ** 2, 0).sum(dims, keepdim=True)
    dof = count - correction
    var = sq / torch.where(dof > 0, dof, 1)
    var, dof = (var, dof) if keepdim else (var.squeeze(dims), dof.squeeze(dims))
    return (var.sqrt() if std else var).to(data.dtype), dof > 0


@pytest.mark.parametrize("layout", list(SPARSE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op,correction", [("var", 0), ("var", 1), ("var", 2), ("std", 1),
                                           ("var_mean", 2), ("std_mean", 0)])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, False), (1, True), (0, True),
                                         (None, False)])
@pytest.mark.parametrize("specials", [True, False], ids=["inf-nan", "finite"])
def test_var_in_one_native_pass_matches_dense(monkeypatch, layout, dtype, op, correction,
                                              dim, keepdim, specials):
    """var / std / var_mean / std_mean of a sparse matrix, which runs in one native call
    (``masked_var``: count, sum, mean, squared deviations, variance): the float64
    ``torch.where`` reference and the strided route, with empty, fully masked and
    one-element groups, +-inf and NaN."""
    passes = _native_calls(monkeypatch, "moments")
    data, mask, stored = _matrix(dtype, specials=specials)
    mask[7] &= torch.arange(13) == 4  # a one-element row (when stored)
    mask[7, 4] = stored[7, 4] = True
    stored[:, 9] = False  # an empty column (row 3 refills _matrix's): a key slot, no group
    mask &= stored
    mt = _sparse(data, mask, stored, layout)
    args = () if dim is None else (dim,)
    kwargs = {"correction": correction} | ({} if dim is None else {"keepdim": keepdim})
    got = getattr(torch, op)(mt, *args, **kwargs)
    assert passes and all(p is not None for p in passes)  # the native pass ran
    want = getattr(torch, op)(ms.masked_tensor(data, mask), *args, **kwargs)
    var, specified = _var_reference(data, mask, dim, keepdim, correction, "std" in op)
    for g, w in zip(*((got, want) if op.endswith("_mean") else ((got,), (want,)))):
        check_invariants(g)
        _same(g, w)
    first = got[0] if op.endswith("_mean") else got
    assert_masked_equal(first, var, specified)


@pytest.mark.parametrize("layout", list(SPARSE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, False), (1, True), (None, False)])
@pytest.mark.parametrize("specials", [True, False], ids=["inf-nan", "finite"])
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_logsumexp_in_one_native_pass_matches_dense(monkeypatch, layout, dtype, dim, keepdim,
                                                    specials, scale):
    """logsumexp of a sparse matrix, which runs in one native call (``masked_logsumexp``:
    max, sum of ``exp(v - max)``, log): the float64 reference ``torch.logsumexp`` of the
    specified values (the others -inf), with empty, fully masked and one-element groups,
    +-inf and NaN, and values whose differences over- and underflow ``exp`` (``scale``)."""
    passes = _native_calls(monkeypatch, "logsumexp_all", "logsumexp_lines",
                           "logsumexp_scatter")
    mt, data, mask = _special_matrix(dtype, specials, scale, layout)
    dims = (0, 1) if dim is None else dim
    got = torch.logsumexp(mt, dims, keepdim=keepdim)
    assert passes and all(p is not None for p in passes)  # the native pass ran
    want = torch.logsumexp(torch.where(mask, data.double(), -INF), dims, keepdim=keepdim)
    specified = mask.any(dims, keepdim=keepdim) if dim is not None else mask.any()
    check_invariants(got)
    assert_masked_equal(got, want.to(dtype), specified)
    _same(got, torch.logsumexp(ms.masked_tensor(data, mask), dims, keepdim=keepdim))


@pytest.mark.parametrize("layout", list(SPARSE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("specials", [True, False], ids=["inf-nan", "finite"])
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_softmax_in_one_native_call_matches_dense(monkeypatch, layout, dtype, dim, op,
                                                  specials, scale):
    """softmax / log_softmax of a sparse matrix, which runs in one native call along the
    stored lines and across them (``_native.softmax``: lines, or group ids): the float64
    reference of the specified values (the others -inf), with empty, fully masked and
    one-element slices, +-inf and NaN (a NaN or +inf slice is NaN, as torch.softmax), and
    values whose differences over- and underflow ``exp`` (``scale``)."""
    calls = _native_calls(monkeypatch, "softmax")
    mt, data, mask = _special_matrix(dtype, specials, scale, layout)
    got = getattr(torch, op)(mt, dim)
    along_lines = dim == (0 if layout == "csc" else 1)
    assert len(calls) == 1 and calls[0] is not None  # native ran
    want = getattr(torch, op)(torch.where(mask, data.double(), -INF), dim)
    check_invariants(got)
    assert_masked_equal(got, want.to(dtype), mask)
    _same(got, getattr(torch, op)(ms.masked_tensor(data, mask), dim))
    s = got._storage  # every unspecified stored element is +0.0 (the zero fill's rule)
    unspecified = s.values[~s.mask]
    assert (unspecified == 0).all() and not torch.signbit(unspecified).any()
    if layout != "csc" or along_lines:  # the kernel wrote those zeros (CSC across its
        # lines runs through COO): its output is the result, not filled again; tagged
        assert s.values is calls[0] and is_zero_filled(s.values, s.mask)


def test_softmax_of_a_sparse_vector_in_one_native_call(monkeypatch):
    """A 1-D COO vector is one group: the native call over every element."""
    calls = _native_calls(monkeypatch, "softmax")
    data = torch.tensor([1., NAN, 3., -INF, 800., 0.5])
    mask = torch.tensor([True, False, True, True, False, True])
    mt = ms.masked_tensor(data.to_sparse(), mask.to_sparse())
    for op in ("softmax", "log_softmax"):
        got = getattr(torch, op)(mt, 0)
        want = getattr(torch, op)(torch.where(mask, data.double(), -INF), 0)
        assert_masked_equal(got, want.float(), mask)
    assert len(calls) == 2 and all(c is not None for c in calls)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_var_over_group_ids_that_are_not_narrowed(monkeypatch, layout):
    """Where no narrowed copy of the group ids exists (Note [Narrow group indices]: too many
    groups), the variance scatters over the int64 group ids."""
    if not native.available():
        pytest.skip(f"native kernels: {native.status()}")
    monkeypatch.setattr(native, "narrow", lambda *args, **kwargs: None)
    moments, index_dtypes = native.moments, []

    def recorded(values, mask, correction, **kwargs):
        index_dtypes.append(kwargs["index"].dtype)
        out = moments(values, mask, correction, **kwargs)
        assert out is not None  # the native call ran
        return out

    monkeypatch.setattr(native, "moments", recorded)
    data, mask, stored = _matrix(torch.float64, specials=False)
    stored[:, 9] = False
    mask &= stored
    for correction in (0, 1):
        got = torch.var(_sparse(data, mask, stored, layout), 0, correction=correction)
        _same(got, torch.var(ms.masked_tensor(data, mask), 0, correction=correction))
    assert index_dtypes and all(d == torch.int64 for d in index_dtypes)
