"""Broadcasting between MaskedTensor operands (Note [Broadcasting masked operands]) and
torch's own gradient clipping on masked gradients, on every layout, against dense
references computed with ``torch.where``."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, dense_of, make_masked
from hypothesis import assume, given
from hypothesis import strategies as st

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ALL = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
TORCH_LAYOUT = {"strided": torch.strided, "sparse_coo": torch.sparse_coo,
                "sparse_csr": torch.sparse_csr, "sparse_csc": torch.sparse_csc,
                "sparse_bsr": torch.sparse_bsr}
DTYPES = [torch.float32, torch.float64]


def masked(shape, layout, dtype=torch.float64, seed=0, **kw):
    """A MaskedTensor in any of the five layouts (COO with stored masked-out entries)."""
    base = torch.sparse_coo if layout != "strided" else torch.strided
    mt, data, mask = make_masked(shape, base, dtype=dtype, seed=seed, **kw)
    return ms.to_layout(mt, layout), data, mask


def zeroed(data, mask):
    return torch.where(mask, data, torch.zeros((), dtype=data.dtype))


EXPRS = {
    "row_normalize": (lambda m: m / m.sum(1, keepdim=True),
                      lambda d, m: d / zeroed(d, m).sum(1, keepdim=True)),
    "center_columns": (lambda m: m - m.mean(0, keepdim=True),
                       lambda d, m: d - zeroed(d, m).sum(0, keepdim=True)
                       / m.sum(0, keepdim=True).clamp(min=1)),
    "times_total": (lambda m: m * m.sum(), lambda d, m: d * zeroed(d, m).sum()),
    "total_first": (lambda m: m.amax() - m,
                    lambda d, m: torch.where(m, d, -torch.inf).max().to(d.dtype) - d),
}


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("expr", sorted(EXPRS))
def test_full_operand_with_its_own_reduction(layout, dtype, expr):
    mt, data, mask = masked((5, 6), layout, dtype, seed=1, density=0.7)
    fn, ref = EXPRS[expr]
    out = fn(mt)
    check_invariants(out, TORCH_LAYOUT[layout])
    assert_masked_equal(out, ref(data, mask), mask)
    if layout != "strided":  # the full-shape operand's pattern: the same index tensors
        assert all(a is b for a, b in zip(out._storage.index, mt._storage.index))
        assert out._storage.mask is mt._storage.mask


@pytest.mark.parametrize("layout", ALL)
def test_broadcast_operand_of_another_layout(layout):
    mt, data, mask = masked((4, 6), layout, seed=2, density=0.8)
    col_data = torch.rand(4, 1, dtype=torch.float64) + 1
    col = ms.masked_tensor(col_data, torch.ones(4, 1, dtype=torch.bool))
    assert_masked_equal(mt * col, data * col_data, mask)
    assert_masked_equal(col.to_sparse_coo() - mt, col_data - data, mask)
    row = ms.masked_tensor(torch.arange(6.0, dtype=torch.float64), torch.ones(6).bool())
    assert_masked_equal(torch.maximum(mt, row), torch.maximum(data, row.get_data()), mask)


@pytest.mark.parametrize("layout", ALL)
def test_no_operand_has_the_result_shape_gives_the_intersection(layout):
    a_data, b_data = torch.rand(3, 1, dtype=torch.float64), torch.rand(1, 4, dtype=torch.float64)
    a_mask, b_mask = torch.tensor([[True], [False], [True]]), torch.tensor([[True, False,
                                                                            True, True]])
    a = ms.to_layout(ms.masked_tensor(a_data, a_mask), layout)
    b = ms.to_layout(ms.masked_tensor(b_data, b_mask), layout)
    out = a + b
    check_invariants(out)
    assert out.shape == (3, 4)
    assert_masked_equal(out, a_data + b_data, a_mask & b_mask)
    assert_masked_equal(b * a, b_data * a_data, a_mask & b_mask)


@pytest.mark.parametrize("layout", ALL)
def test_losing_a_specified_element_raises_with_the_count(layout):
    mt, data, mask = masked((4, 5), layout, seed=3, density=1.0)
    col_mask = torch.tensor([[True], [False], [True], [False]])
    col = ms.masked_tensor(torch.ones(4, 1), col_mask)
    with pytest.raises(ValueError, match=r"div: .* would lose 10 specified element\(s\)"):
        mt / col
    with pytest.raises(ValueError, match="would lose 10"):
        col * mt


@pytest.mark.parametrize("layout", ALL)
def test_same_shape_rule_and_bad_shapes_unchanged(layout):
    a, _, mask = masked((4, 4), layout, seed=4)
    b, _, _ = masked((4, 4), layout, seed=4, mask=~mask)
    with pytest.raises(ValueError, match="add.*masks of MaskedTensor operands must match"):
        a + b
    c, _, _ = masked((3, 4), layout, seed=5)
    with pytest.raises(ValueError, match=r"mul: .*\(4, 4\), \(3, 4\) do not broadcast"):
        a * c


def test_inplace_into_the_smaller_operand_raises():
    a, _, _ = masked((4, 5), "strided", seed=6, density=1.0)
    col = ms.masked_tensor(torch.ones(4, 1, dtype=torch.float64), torch.ones(4, 1).bool())
    with pytest.raises(ValueError, match="in-place result of shape"):
        col.add_(a)
    a.mul_(col)  # into the full-shape operand: fine


@pytest.mark.parametrize("layout", ALL)
def test_inplace_broadcast_keeps_the_pattern(layout):
    mt, data, mask = masked((4, 5), layout, seed=7, density=0.8)
    index = mt._storage.index
    mt.mul_(ms.masked_tensor(torch.tensor(2.0, dtype=torch.float64), torch.tensor(True)))
    assert all(a is b for a, b in zip(mt._storage.index, index))
    assert_masked_equal(mt, data * 2, mask)


@pytest.mark.parametrize("layout", ALL)
def test_gradient_of_the_broadcast_operand_is_reduced_with_masked_semantics(layout):
    a_mt, a_data, a_mask = masked((4, 5), layout, seed=8, density=0.7)
    b_data = torch.rand(4, 1, dtype=torch.float64) + 0.5
    b_mask = torch.tensor([[True], [True], [False], [True]])
    a_mt, _, _ = masked((4, 5), layout, seed=8, data=a_data, mask=a_mask & b_mask)
    a = a_mt.requires_grad_()
    b = ms.masked_tensor(b_data, b_mask, requires_grad=True)
    w = torch.rand(4, 5, dtype=torch.float64)
    ((a * b - b).exp() * w).sum().backward()
    x, y = a_data.clone().requires_grad_(), b_data.clone().requires_grad_()
    both = a_mask & b_mask
    torch.where(both, (x * y - y).exp() * w, 0).sum().backward()
    assert_masked_equal(a.grad, x.grad, both)
    assert_masked_equal(b.grad.to_dense(), y.grad, both.any(1, keepdim=True))


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("expr", sorted(EXPRS)[:3])
def test_gradient_through_self_normalization(layout, expr):
    mt, data, mask = masked((5, 6), layout, seed=9, density=0.7)
    mt.requires_grad_()
    fn, ref = EXPRS[expr]
    w = torch.rand(5, 6, dtype=torch.float64)
    (fn(mt) ** 2 * w).sum().backward()
    x = data.clone().requires_grad_()
    torch.where(mask, ref(x, mask) ** 2 * w, 0).sum().backward()
    assert mt.grad.layout == TORCH_LAYOUT[layout]
    assert_masked_equal(mt.grad, x.grad, mask)


@st.composite
def broadcast_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    small = tuple(1 if draw(st.booleans()) else n for n in shape)
    small = small[draw(st.integers(0, ndim - 1)):]
    assume(small != shape)  # same shapes follow the equal-mask rule
    layout = draw(st.sampled_from(["strided", "sparse_coo"] + (
        ["sparse_csr", "sparse_csc"] if ndim == 2 else [])))
    return shape, small, layout, draw(st.floats(0, 1)), draw(st.integers(0, 2**16))


@given(broadcast_cases(), st.sampled_from(["add", "mul", "sub", "maximum"]))
def test_random_broadcasts_match_the_dense_rule(case, op):
    shape, small, layout, density, seed = case
    big, d_big, m_big = masked(shape, layout, seed=seed, density=density)
    g = torch.Generator().manual_seed(seed)
    d_small = torch.rand(small, generator=g, dtype=torch.float64)
    m_small = torch.rand(small, generator=g) < 0.7
    sm = ms.masked_tensor(d_small, m_small)
    fn = getattr(torch, op)
    lost = m_big & ~m_small.expand(shape)
    if bool(lost.any()):
        with pytest.raises(ValueError, match=f"would lose {int(lost.sum())} specified"):
            fn(big, sm)
        return
    out = fn(big, sm)
    check_invariants(out)
    assert_masked_equal(out, fn(d_big, d_small), m_big)
    data, mask = dense_of(fn(sm.to_sparse_coo(), big))
    assert torch.equal(mask, m_big)


# -- torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on masked gradients ------------------
def _params(layout, seed):
    params, refs = [], []
    for i, shape in enumerate([(4, 6), (3, 5)]):
        g, data, mask = masked(shape, layout, torch.float32, seed=seed + i, density=0.6)
        p = torch.nn.Parameter(torch.randn(shape))
        p.grad = g * 3
        params.append(p)
        refs.append((data * 3, mask))
    return params, refs


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("foreach", [None, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_over_specified_entries(layout, foreach, norm_type):
    params, refs = _params(layout, seed=20)
    dense = [torch.nn.Parameter(torch.zeros(d.shape)) for d, _ in refs]
    for p, (d, m) in zip(dense, refs):
        p.grad = zeroed(d, m)
    expected = torch.nn.utils.clip_grad_norm_(dense, 1.0, norm_type)
    total = torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type, foreach=foreach)
    assert isinstance(total, ms.MaskedTensor)
    torch.testing.assert_close(total.to_tensor(0), expected)
    for p, q, (_, m) in zip(params, dense, refs):
        assert p.grad.layout == TORCH_LAYOUT[layout]
        assert_masked_equal(p.grad, q.grad, m)


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("foreach", [None, True])
def test_clip_grad_value(layout, foreach):
    params, refs = _params(layout, seed=30)
    torch.nn.utils.clip_grad_value_(params, 0.5, foreach=foreach)
    for p, (d, m) in zip(params, refs):
        assert_masked_equal(p.grad, d.clamp(-0.5, 0.5), m)
