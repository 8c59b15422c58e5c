"""The per-head product's kernels (``layouts/_per_head.py``, Note [The per-head product's
kernels]) and the heads-as-groups softmax (Note [Heads as groups]): the native CPU kernels
and the torch-op implementation (what other devices run, here with the native kernels off)
against a dense ``einsum`` / ``softmax`` reference, forward, gradients and second
derivatives, on random shapes, heads, features and patterns.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layouts
from layouts import _per_head
from layouts.kernels import Groups, masked_softmax
from layouts.kernels._groups import per_head

COO = layouts.get_layout("sparse_coo")
DTYPES = [torch.float32, torch.float64]


def storage(rows: int, cols: int, heads: tuple, density: float, seed: int,
            dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    index = (torch.rand(rows, cols, generator=g) < density).nonzero().T
    values = torch.randn((index.shape[1],) + heads, generator=g, dtype=dtype)
    mask = torch.rand(values.shape, generator=g) < 0.7
    return COO.build((index,), values, mask, torch.Size((rows, cols) + heads)), g


def dense_of(s) -> torch.Tensor:
    (index,) = s.index
    return torch.zeros(s.shape, dtype=s.values.dtype).index_put((index[0], index[1]), s.values)


def reference(s, values, dense, contract):
    a = torch.zeros(s.shape, dtype=values.dtype).index_put(tuple(s.index[0]), values)
    heads = "".join("hgk"[: values.dim() - 1])
    free = "f" * (dense.dim() - values.dim())
    sparse = "ij" if contract == 1 else "ji"
    return torch.einsum(f"{sparse}{heads},j{heads}{free}->i{heads}{free}", a, dense)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 7), cols=st.integers(1, 7), heads=st.sampled_from([(), (1,), (3,),
                                                                             (2, 2)]),
       free=st.sampled_from([(), (1,), (5,)]), density=st.floats(0, 1),
       contract=st.sampled_from([0, 1]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16), native=st.booleans())
def test_product_and_gradients_equal_the_dense_einsum(rows, cols, heads, free, density,
                                                      contract, dtype, seed, native):
    s, g = storage(rows, cols, heads, density, seed, dtype)
    lines = cols if contract == 1 else rows
    dense0 = torch.randn((lines,) + heads + free, generator=g, dtype=dtype)
    values = s.values.clone().requires_grad_()
    dense = dense0.clone().requires_grad_()
    with layouts.native_disabled() if not native else nullcontext():
        out = _per_head.per_head_mm(s, values, dense, contract=contract)
        grad = torch.randn(out.shape, generator=g, dtype=dtype)
        got = torch.autograd.grad(out, (values, dense), grad)
    rv, rd = s.values.clone().requires_grad_(), dense0.clone().requires_grad_()
    ref = reference(s, rv, rd, contract)
    want = torch.autograd.grad(ref, (rv, rd), grad)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype is torch.float32 else {}
    torch.testing.assert_close(out, ref, **tol)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine, theirs, **tol)


@pytest.mark.parametrize("native", [True, False])
def test_second_derivatives(native):
    s, g = storage(5, 4, (2,), 0.6, seed=3)
    values = s.values.clone().requires_grad_()
    dense = torch.randn(4, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    with layouts.native_disabled() if not native else nullcontext():
        assert torch.autograd.gradcheck(lambda v, d: _per_head.per_head_mm(s, v, d),
                                        (values, dense))
        assert torch.autograd.gradgradcheck(lambda v, d: _per_head.per_head_mm(s, v, d),
                                            (values, dense))


@pytest.mark.parametrize("dtype", DTYPES)
def test_native_kernels_equal_the_torch_ops(dtype):
    """The two implementations side by side on a larger pattern (sums in another order:
    equal to rounding)."""
    s, g = storage(60, 50, (4,), 0.2, seed=4, dtype=dtype)
    dense = torch.randn(50, 4, 8, generator=g, dtype=dtype)
    native = _per_head.per_head_mm(s, s.values, dense)
    with layouts.native_disabled():
        composed = _per_head.per_head_mm(s, s.values, dense)
    torch.testing.assert_close(native, composed)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), width=st.sampled_from(
           [1, 2, 3, 4, 5, 6, 7, 8, 10, 16, 32, 33, 64]), density=st.floats(0, 1),
       contract=st.sampled_from([0, 1]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**16))
def test_one_head_lines_of_every_width(rows, cols, width, density, contract, dtype, seed):
    """One head: the native product over the sorted rows (runs of a line accumulated in
    registers, each constant width and the runtime one) and over the unsorted columns (the
    transpose), with empty lines, against the dense einsum."""
    s, g = storage(rows, cols, (1,), density, seed, dtype)
    lines = cols if contract == 1 else rows
    dense = torch.randn(lines, 1, width, generator=g, dtype=dtype)
    got = _per_head.per_head_mm(s, s.values, dense, contract=contract)
    want = reference(s, s.values, dense, contract)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype is torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)


def test_an_index_out_of_range_is_an_error_not_a_crash():
    s, g = storage(4, 4, (2,), 0.8, seed=5)
    index = s.index[0].clone()
    index[1, 0] = 99  # a column past the end
    bad = COO.build((index,), s.values, s.mask, s.shape)
    with pytest.raises(ValueError, match="per-head product.*out of range.*rebuild"):
        _per_head.per_head_mm(bad, bad.values, torch.ones(4, 2, 3, dtype=torch.float64))


def test_specified_lines_per_head():
    s, _ = storage(6, 5, (3,), 0.5, seed=6)
    full = torch.zeros(s.shape, dtype=torch.bool).index_put(tuple(s.index[0]), s.mask)
    assert torch.equal(layouts.per_head_specified(s), full.any(1))
    assert torch.equal(layouts.per_head_specified(s, contract=0), full.any(0))


def test_specified_lines_per_head_over_features():
    """With ``features`` the lines' mask is repeated over them (the product's output mask),
    contiguous, kept per mask: a new mask object gives its own lines."""
    s, _ = storage(6, 5, (3,), 0.5, seed=6)
    full = torch.zeros(s.shape, dtype=torch.bool).index_put(tuple(s.index[0]), s.mask)
    got = layouts.per_head_specified(s, features=(2, 4))
    assert got.is_contiguous() and got.shape == (6, 3, 2, 4)
    assert torch.equal(got, full.any(1)[:, :, None, None].expand(6, 3, 2, 4))
    assert layouts.per_head_specified(s, features=(2, 4)) is got  # cached
    other = type(s)(s.layout, s.index, s.values, torch.zeros_like(s.mask), s.shape)
    assert not layouts.per_head_specified(other, features=(2, 4)).any()


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("kind", ["lines", "scatter"])
@pytest.mark.parametrize("heads", [1, 3])
def test_heads_as_groups_softmax_is_each_heads_softmax(kind, heads, native):
    """Softmax over groups of rows of ``(nnz, H)`` values: each head apart, as the 1-D
    softmax of that head's column; gradients too."""
    g = torch.Generator().manual_seed(7)
    rows = torch.randint(0, 5, (30,), generator=g).sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                         torch.bincount(rows, minlength=5).cumsum(0)])
    groups = Groups(30, offsets=offsets) if kind == "lines" else Groups(30, index=rows, n=5)
    values = torch.randn(30, heads, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(30, heads, generator=g) < 0.7
    assert per_head(groups, values) is not None
    with layouts.native_disabled() if not native else nullcontext():
        out, zeroed = masked_softmax(groups, values, mask, False)
    grad = torch.randn(30, heads, generator=g, dtype=torch.float64)
    (got,) = torch.autograd.grad(out, values, grad)
    ref_in = values.detach().clone().requires_grad_()
    dense = torch.full((5, 30, heads), -torch.inf, dtype=torch.float64)
    dense = dense.index_put((rows, torch.arange(30)), torch.where(mask, ref_in, -torch.inf))
    ref = dense.softmax(1).nan_to_num(0)[rows, torch.arange(30)]
    (want,) = torch.autograd.grad(ref, ref_in, grad)
    assert zeroed
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(got, torch.where(mask, want, 0))
