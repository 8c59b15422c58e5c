"""The shortcuts taken for speed give the results of the general paths they skip.

- Note [Pointwise fast path]: one MaskedTensor alone, with a scalar / 0-d plain tensor, or
  with a MaskedTensor sharing its index and mask objects, skips ``align``; the result must
  equal the general path's (values, mask, layout, the same index objects).
- ``_equal_bool`` compares bool masks 8 bytes at a time; it must agree with ``torch.equal``.
- ``broadcasts_to`` replaces ``torch.broadcast_shapes`` (slow); it must give its answers.
- Note [Binding once per signature]: reductions bind their arguments without ``inspect``;
  the bound arguments and every error message must be ``inspect``'s. Result dtypes are
  probed once per (op, dtype, arguments): the cache must not leak between them.
- Note [Accessors without autograd]: ``get_data`` / ``to_tensor`` without a gradient skip
  the autograd Function; ``to_tensor(0)`` fills with one ``where``.
- ``safe_root`` without a gradient takes the plain root; values must be the guarded ones.
- Note [The device table]: off the native kernels, a group reduction takes one of three raw
  torch kernels (``segment_reduce``, ``index_add``, ``scatter_reduce``), per op, kind and
  device; each must give the dense reference, along and across the stored lines.
- ``torch.ones_like`` / ``zeros_like`` of a MaskedTensor are answered in
  ``__torch_function__``; they must give what the aten route gives (values, dtype, the same
  mask and index objects, ``requires_grad``, inference tensors).
- ``_OnValues`` reads each input's ``requires_grad`` once; an input that does not require
  grad, next to one that does, must get no gradient.
- A whole bool mask's count (a mean's backward) is ``count_nonzero``; it must be the bool
  ``sum``'s, in dtype and shape too, for contiguous, strided, broadcast and empty masks.
"""

from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    dense_of,
    make_masked,
)

import layouts
import layouts._fill as layout_fill
import layouts.kernels._device_table as device_table
import masked_sparse as ms
import masked_sparse._fill as fill
import masked_sparse.ops.pointwise as pointwise
import masked_sparse.ops.reductions_args as A

CALLS = {
    "sqrt": lambda a, b: torch.sqrt(a),
    "mt + mt (shared)": lambda a, b: a + b,
    "mt * python scalar": lambda a, b: a * 2.5,
    "mt - 0-d tensor": lambda a, b: a - torch.tensor(1.5),
    "pow(mt, mt)": lambda a, b: torch.pow(b, a),
    "frexp (tuple out)": lambda a, b: torch.frexp(a),
    "mt > mt (bool out)": lambda a, b: a > b,
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_fast_path_matches_general_path(layout, call, monkeypatch):
    a, _, _ = make_masked((5, 7), layout, torch.float64, seed=3)
    b = a.abs()  # shares a's index and mask objects
    fast = CALLS[call](a, b)
    monkeypatch.setattr(pointwise, "_fast_path", lambda func, args: None)
    general = CALLS[call](a, b)
    fast_t = fast if isinstance(fast, tuple) else (fast,)
    general_t = general if isinstance(general, tuple) else (general,)
    for f, g in zip(fast_t, general_t):
        fs, gs = f._storage, g._storage
        assert fs.layout is gs.layout and f.dtype == g.dtype and f.shape == g.shape
        assert all(x is y for x, y in zip(fs.index, a._storage.index))
        assert fs.mask is a._storage.mask
        torch.testing.assert_close(fs.values, gs.values, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(fs.mask, gs.mask)
        check_invariants(f, layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_fast_path_declines_distinct_masks(layout):
    a, _, _ = make_masked((4, 6), layout, seed=1)
    c, _, _ = make_masked((4, 6), layout, seed=2)  # another mask: must still raise
    with pytest.raises(ValueError, match="masks"):
        a + c


@pytest.mark.parametrize("n", [0, 1, 7, 8, 24, 1001, 4096])
@pytest.mark.parametrize("offset", [0, 1, 8])
def test_equal_bool_agrees_with_torch_equal(n, offset):
    g = torch.Generator().manual_seed(n + offset)
    base = torch.rand(n + offset, generator=g) < 0.5
    x = base[offset:]
    y = x.clone()
    assert pointwise._equal_bool(x, y) is torch.equal(x, y) is True
    if n:
        for pos in {0, n // 2, n - 1}:
            z = y.clone()
            z[pos] = ~z[pos]
            assert pointwise._equal_bool(x, z) is torch.equal(x, z) is False
    # non-contiguous operands take the plain comparison
    m = torch.rand(8, 2 * max(n, 1), generator=g) < 0.5
    assert pointwise._equal_bool(m[:, ::2], m[:, ::2].clone()) is True


def test_broadcasts_to_agrees_with_torch_broadcast_shapes():
    sizes = (0, 1, 2)
    for la, lb in itertools.product(range(4), range(4)):
        for a in itertools.product(sizes, repeat=la):
            for b in itertools.product(sizes, repeat=lb):
                try:
                    expected = torch.broadcast_shapes(a, b) == torch.Size(b)
                except RuntimeError:
                    expected = False
                assert pointwise.broadcasts_to(a, b) is expected, (a, b)


_MT = ms.masked_tensor(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
BINDS = [
    (A.sig_sum, (_MT,), {}), (A.sig_sum, (_MT, 1), {}), (A.sig_sum, (_MT, (0, 1), True), {}),
    (A.sig_sum, (_MT,), {"dim": 1, "keepdim": True, "dtype": torch.float64}),
    (A.sig_sum, (_MT,), {"axis": 0, "keepdims": True}), (A.sig_sum, (), {"input": _MT}),
    (A.sig_sum, (), {"self": _MT, "dim": 0}), (A.sig_var, (_MT, 1), {"correction": 0}),
    (A.sig_var, (_MT, None, True), {}), (A.sig_norm, (_MT, 2, 1, False, None, None), {}),
    (A.sig_softmax, (_MT, 1), {"dtype": torch.float64}),
    # errors: inspect's own message, whichever path finds them
    (A.sig_sum, (_MT, 0, True, 1), {}), (A.sig_sum, (_MT,), {"bogus": 1}),
    (A.sig_sum, (_MT, 0), {"dim": 1}), (A.sig_sum, (), {}), (A.sig_logsumexp, (_MT,), {}),
    (A.sig_sum, (_MT,), {"dim": 0, "axis": 1}), (A.sig_sum, (torch.ones(2),), {}),
    (A.sig_sum, (_MT,), {"out": torch.ones(2)}),
]


def _bind_by_inspect(sig, args, kwargs):
    """The binding before Note [Binding once per signature]: inspect on every call."""
    kwargs = {A._ALIASES.get(k, k): v for k, v in kwargs.items()}
    try:
        bound = inspect.signature(sig).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"op(): {e}") from None
    bound.apply_defaults()
    out = dict(bound.arguments)
    if out.pop("out", None) is not None:
        raise TypeError("op(): out= is not supported with a MaskedTensor input; use the "
                        "returned MaskedTensor")
    if not isinstance(out["input"], ms.MaskedTensor):
        raise TypeError(f"op(): expected a MaskedTensor input, got {type(out['input']).__name__}")
    return out


@pytest.mark.parametrize("case", range(len(BINDS)))
def test_bind_agrees_with_inspect(case):
    sig, args, kwargs = BINDS[case]
    try:
        expected = _bind_by_inspect(sig, args, kwargs)
    except TypeError as e:
        with pytest.raises(TypeError) as got:
            A.bind(sig, args, kwargs, "op")
        assert str(got.value) == str(e)
        return
    assert A.bind(sig, args, kwargs, "op") == expected


def test_result_dtype_cache_keeps_ops_dtypes_and_arguments_apart():
    for _ in range(2):  # the second round reads the cache
        assert A.result_dtype(torch.sum, torch.int32) == torch.int64
        assert A.result_dtype(torch.sum, torch.int32, dtype=torch.float64) == torch.float64
        assert A.result_dtype(torch.sum, torch.float16) == torch.float16
        assert A.result_dtype(torch.prod, torch.bool) == torch.int64
        assert A.result_dtype(torch.linalg.vector_norm, torch.complex64, 2) == torch.float32
        with pytest.raises(RuntimeError):  # an error is raised on every call, not cached
            A.result_dtype(torch.mean, torch.int32)
    assert A.result_dtype(torch.mean, torch.int32, dtype=torch.float32) == torch.float32
    assert A.result_dtype(torch.linalg.vector_norm, torch.float32, math.nan) == torch.float32


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool,
                                   torch.complex64], ids=str)
def test_accessors_without_grad_match_the_reference(layout, dtype):
    mt, data, mask = make_masked((5, 7), layout, torch.float64, seed=4)
    data = data.masked_fill(~mask & (torch.arange(35).view(5, 7) % 2 == 0), math.nan)
    data = data.masked_fill(~mask & (torch.arange(35).view(5, 7) % 3 == 0), -math.inf)
    mt, data, mask = make_masked((5, 7), layout, dtype, seed=4, data=data.to(dtype), mask=mask)
    filled = mt.to_tensor(0)
    assert filled.layout == layout and filled.dtype == dtype
    expected = torch.where(mask, data, torch.zeros((), dtype=dtype))
    torch.testing.assert_close(filled.to_dense(), expected, rtol=0, atol=0)
    assert torch.equal(mt.to_tensor(False if dtype == torch.bool else 0.0).to_dense(), expected)
    got = mt.get_data()
    assert got.layout == layout
    if layout == torch.sparse_coo:  # the same index memory, not a copy
        assert got.indices().data_ptr() == mt._storage.index[0].data_ptr()
    elif layout != torch.strided:  # the same columns; the row pointers are a copy (O(rows)),
        crow, col = mt._storage.index  # since torch's zero_() on CSR zeroes them in place
        assert got.col_indices().data_ptr() == col.data_ptr()
        assert got.crow_indices().data_ptr() != crow.data_ptr()
        assert torch.equal(got.crow_indices(), crow)
    torch.testing.assert_close(dense_of(mt)[0], got.to_dense(), rtol=0, atol=0,
                               equal_nan=True)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_accessors_with_and_without_grad_agree(layout):
    mt, _, _ = make_masked((4, 5), layout, torch.float64, seed=5)
    leaf = mt.clone().requires_grad_()
    for plain, graphed in ((mt.get_data(), leaf.get_data()),
                           (mt.to_tensor(0), leaf.to_tensor(0)),
                           (mt.to_tensor(2.5), leaf.to_tensor(2.5))):
        assert graphed.requires_grad and not plain.requires_grad
        assert plain.layout == graphed.layout
        torch.testing.assert_close(plain.to_dense(), graphed.detach().to_dense())


BY_BITS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@pytest.mark.parametrize("dtype", list(BY_BITS) + [torch.int64, torch.int8, torch.bool,
                                                   torch.complex64], ids=str)
def test_zero_fill_by_bits_matches_where(dtype, monkeypatch):
    # Note [Zero fill by bits]: the four float dtypes fill by their integer bits, the others
    # (where an integer product would be slower or wrong) by ``where``; same result.
    bits_calls = []
    by_bits = fill._bitwise_zero_fill
    monkeypatch.setattr(layout_fill, "_FILL_MIN", 1)  # the exact fill of a full-size mask
    monkeypatch.setattr(fill, "_bitwise_zero_fill",
                        lambda v, m: bits_calls.append(v.dtype) or by_bits(v, m))
    g = torch.Generator().manual_seed(8)
    values = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    values[0, 0, :3] = torch.tensor([math.nan, math.inf, -0.0])
    values = values.to(dtype) if dtype != torch.bool else values > 0
    full = torch.rand(3, 4, 5, generator=g) < 0.5
    full[0, 0, :2] = False                                   # NaN and inf under the mask
    full[0, 0, 2] = True                                     # a specified -0.0 stays -0.0
    heads = (torch.rand(1, 4, 5, generator=g) < 0.5).expand(3, 4, 5)   # stride-0 dim
    for mask in (full, heads):
        got = fill.zero_fill(values, mask)
        ref = torch.where(mask, values, torch.zeros((), dtype=dtype))
        assert got.dtype == dtype
        if dtype in BY_BITS:   # bit for bit: +0.0 where unspecified, -0.0 kept
            same_width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
            got, ref = got.view(same_width), ref.view(same_width)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    assert bits_calls == ([dtype, dtype] if dtype in BY_BITS else [])


def _lines_case(layout: str) -> tuple[ms.MaskedTensor, torch.Tensor, torch.Tensor]:
    """A 2-D masked tensor with an empty line, an all-masked line, inf and NaN."""
    g = torch.Generator().manual_seed(7)
    data = torch.randn(9, 6, generator=g, dtype=torch.float64)
    stored = torch.rand(9, 6, generator=g) < 0.7
    mask = stored & (torch.rand(9, 6, generator=g) < 0.7)
    stored[2] = mask[2] = False                      # an empty row
    stored[:, 4] = mask[:, 4] = False                # an empty column
    stored[5] = True
    mask[5] = False                                  # a stored, all-masked row
    mask[7, 0] = stored[7, 0] = True
    data[7, 0], data[0, 1] = math.inf, math.nan      # specified inf; NaN where stored
    mask[0, 1] = stored[0, 1] = True
    data[5] = math.nan                               # NaN under the mask
    data = torch.where(stored, data, 0.0)
    idx = stored.nonzero().t()
    sparse_data = torch.sparse_coo_tensor(idx, data[stored], data.shape).coalesce()
    sparse_mask = torch.sparse_coo_tensor(idx, mask[stored], mask.shape).coalesce()
    mt = ms.masked_tensor(sparse_data, sparse_mask)
    if layout != "coo":
        mt = ms.to_layout(mt, getattr(torch, layout))
    return mt, data, mask


LINE_OPS = {
    "sum": lambda mt, d: torch.sum(mt, d), "mean": lambda mt, d: mt.mean(d),
    "var": lambda mt, d: mt.var(d), "sum keepdim": lambda mt, d: mt.sum(d, keepdim=True),
    "count_nonzero": lambda mt, d: torch.count_nonzero(mt, d),
}


LINE_OPS.update({"amax": lambda mt, d: torch.amax(mt, d), "prod": lambda mt, d: mt.prod(d),
                 "argmin": lambda mt, d: mt.argmin(d),
                 "logsumexp": lambda mt, d: torch.logsumexp(mt, d)})


@pytest.mark.parametrize("layout", ["coo", "sparse_csr", "sparse_csc"])
@pytest.mark.parametrize("op", list(LINE_OPS))
@pytest.mark.parametrize("across", [False, True], ids=["along", "across"])
def test_every_raw_kernel_of_the_device_table_agrees(layout, op, across, monkeypatch):
    """Each raw kernel the table may pick (Note [The device table]) -- ``segment_reduce``
    over the line pointers or the column order, ``index_add``, ``scatter_reduce`` -- gives
    the dense reference, along and across the stored lines, native kernels off."""
    along = 0 if layout == "sparse_csc" else 1
    dim = 1 - along if across else along
    ref = None
    for name in device_table.KERNELS:
        monkeypatch.setattr(device_table, "kernel", lambda *args, _name=name: _name)
        mt, data, mask = _lines_case(layout)  # a fresh mask: no counts cached by the last run
        with layouts.native_disabled():
            out = LINE_OPS[op](mt, dim)
        if ref is None:
            ref = LINE_OPS[op](ms.masked_tensor(data, mask), dim)
            ref_data, ref_mask = dense_of(ref)
        check_invariants(out)
        assert_masked_equal(out, ref_data, ref_mask, equal_nan=True)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.5, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_safe_root_without_grad_matches_the_guarded_root(p, dtype):
    """``safe_root`` skips its guards without a gradient to protect: the values must be the
    guarded path's (taken under autograd), zeros, infinities and NaN included."""
    from masked_sparse.ops.reductions import safe_root

    s = torch.tensor([0.0, 1e-30, 0.25, 4.0, 7.5, math.inf, math.nan], dtype=dtype)
    plain = safe_root(s, p)
    guarded = safe_root(s.clone().requires_grad_(), p).detach()
    torch.testing.assert_close(plain, guarded, rtol=0, atol=0, equal_nan=True)
    want = torch.where(s == 0, torch.zeros((), dtype=dtype), s.pow(1.0 / p))
    torch.testing.assert_close(plain, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("like", ["ones_like", "zeros_like"])
@pytest.mark.parametrize("kwargs", [{}, {"dtype": torch.float32}, {"requires_grad": True},
                                    {"dtype": torch.float64, "layout": torch.strided}],
                         ids=["plain", "dtype", "requires_grad", "layout"])
def test_values_like_above_matches_the_aten_route(layout, like, kwargs):
    mt, _, mask = make_masked((4, 6), layout, torch.float64, seed=6)
    got = getattr(torch, like)(mt, **kwargs)
    aten_kwargs = {k: v for k, v in kwargs.items() if k != "requires_grad"}
    expected = getattr(torch.ops.aten, like).default(mt, **aten_kwargs)
    assert isinstance(got, ms.MaskedTensor) and got.layout == layout
    assert got.dtype == expected.dtype == kwargs.get("dtype", torch.float64)
    assert got.requires_grad == kwargs.get("requires_grad", False) and got.is_leaf
    s, e = got._storage, expected._storage
    assert s.mask is mt._storage.mask and all(a is b for a, b in zip(s.index, mt._storage.index))
    assert torch.equal(s.values, e.values)
    assert torch.equal(s.values, torch.full_like(e.values, 1 if like == "ones_like" else 0))
    assert_masked_equal(got.detach(), torch.full((4, 6), 1.0 if like == "ones_like" else 0.0,
                                                 dtype=got.dtype), mask)
    with torch.inference_mode():
        assert getattr(torch, like)(mt).is_inference()


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("which", ["masked", "plain"])
def test_on_values_gradient_only_for_inputs_that_require_it(layout, which):
    a, data, mask = make_masked((4, 5), layout, torch.float64, seed=7)
    w = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    a = a.clone().requires_grad_() if which == "masked" else a
    w = w.clone().requires_grad_() if which == "plain" else w
    out = a @ w  # one masked op (on_values) over a MaskedTensor and a plain operand
    grad = torch.autograd.grad(out.to_tensor(0).sum(), a if which == "masked" else w)[0]
    filled = torch.where(mask, data, torch.zeros((), dtype=data.dtype))
    if which == "masked":
        assert_masked_equal(grad, w.sum(1).expand(4, 5), mask)
    else:
        torch.testing.assert_close(grad, filled.T @ torch.ones(4, 3, dtype=torch.float64))
    assert (w if which == "masked" else a).grad is None


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "broadcast", "empty"])
def test_whole_mask_count_matches_bool_sum(kind, keepdim):
    from layouts.kernels._groups import reduce_dense

    g = torch.Generator().manual_seed(0)
    mask = {"contiguous": lambda: torch.rand(5, 7, generator=g) < 0.4,
            "transposed": lambda: (torch.rand(7, 5, generator=g) < 0.4).t(),
            "broadcast": lambda: (torch.rand(1, 7, generator=g) < 0.4).expand(5, 7),
            "empty": lambda: torch.zeros(0, 7, dtype=torch.bool)}[kind]()
    dims = tuple(range(mask.dim()))
    got = reduce_dense(mask, dims, keepdim, "sum")
    expected = mask.sum(dims, keepdim=keepdim)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)
