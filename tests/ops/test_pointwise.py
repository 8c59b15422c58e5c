"""Unary and binary elementwise ops on every layout, against the dense ``torch.where`` reference."""

from __future__ import annotations

import operator

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    layout_params,
    make_masked,
)
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

FLOAT_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "positive": torch.positive, "sign": torch.sign,
    "sgn": torch.sgn, "signbit": torch.signbit, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": lambda x: torch.log(x.abs()), "log2": lambda x: x.abs().log2(),
    "log10": lambda x: torch.log10(x.abs()), "log1p": lambda x: torch.log1p(x.abs()),
    "sqrt": lambda x: x.abs().sqrt(), "rsqrt": lambda x: x.abs().rsqrt(), "square": torch.square,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": lambda x: (x / 2).asin(), "acos": lambda x: torch.acos(x / 2), "atan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh,
    "acosh": lambda x: torch.acosh(x.abs() + 1), "atanh": lambda x: torch.atanh(x / 2),
    "sigmoid": torch.sigmoid, "logit": lambda x: torch.logit(x.abs() / 2.1),
    "erf": torch.erf, "erfc": torch.erfc, "erfinv": lambda x: torch.erfinv(x / 2),
    "lgamma": torch.lgamma, "digamma": torch.digamma, "i0": torch.i0, "sinc": torch.sinc,
    "ceil": torch.ceil, "floor": torch.floor, "round": torch.round,
    "round_decimals": lambda x: torch.round(x, decimals=1), "trunc": torch.trunc,
    "frac": torch.frac, "fix": torch.fix, "deg2rad": torch.deg2rad, "rad2deg": torch.rad2deg,
    "angle": torch.angle, "isnan": torch.isnan, "isinf": torch.isinf,
    "isfinite": torch.isfinite, "nan_to_num": lambda x: torch.nan_to_num(x.log()),
    "clamp": lambda x: torch.clamp(x, -0.5, 0.5), "clip": lambda x: x.clip(min=0.1),
    "clamp_tensor": lambda x: torch.clamp(x, min=torch.full_like(x, -0.3)),
    "pow_scalar": lambda x: x.abs().pow(1.5), "pow_op": lambda x: x ** 2,
    "float_cast": lambda x: x.double(), "half_cast": lambda x: x.half(),
    "to_dtype": lambda x: x.to(torch.float64), "logical_not": torch.logical_not,
    "method_exp": lambda x: x.exp(), "neg_op": operator.neg, "abs_op": abs,
}
INT_UNARY = {
    "bitwise_not": torch.bitwise_not, "neg": torch.neg, "abs": torch.abs, "sign": torch.sign,
    "logical_not": torch.logical_not, "float": lambda x: x.float(), "square": torch.square,
    "invert_op": operator.invert,
}


def _check_unary(fn, layout, dtype, shape=(4, 6)):
    mt, data, mask = make_masked(shape, layout, dtype, seed=1)
    out = fn(mt)
    check_invariants(out, layout)
    assert_masked_equal(out, fn(data), mask)
    if layout != torch.strided:  # the index tensors are kept, the very same objects
        assert all(a is b for a, b in zip(out._storage.index, mt._storage.index))


@pytest.mark.parametrize("name", sorted(FLOAT_UNARY))
@layout_params()
def test_float_unary(name, layout):
    _check_unary(FLOAT_UNARY[name], layout, torch.float32)


@pytest.mark.parametrize("name", sorted(INT_UNARY))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
@layout_params()
def test_int_unary(name, dtype, layout):
    _check_unary(INT_UNARY[name], layout, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64,
                                   torch.complex64, torch.int16, torch.uint8, torch.bool])
@layout_params()
def test_dtypes(dtype, layout):
    fn = torch.logical_not if dtype == torch.bool else (lambda x: x * 2)
    _check_unary(fn, layout, dtype)


@pytest.mark.parametrize("name", ["exp_", "abs_", "neg_", "sqrt_", "clamp_", "mul_", "add_"])
@layout_params()
def test_unary_inplace(name, layout):
    mt, data, mask = make_masked((3, 5), layout, seed=2)
    args = {"clamp_": (-0.2, 0.2), "mul_": (3.0,), "add_": (1.0,)}.get(name, ())
    prep = (lambda t: t.abs()) if name == "sqrt_" else (lambda t: t)
    mt = prep(mt)
    index_before = mt._storage.index
    out = getattr(mt, name)(*args)
    assert out is mt
    assert mt._storage.index is index_before
    assert_masked_equal(mt, getattr(prep(data).clone(), name)(*args), mask)


BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": torch.sub, "sub_alpha": lambda a, b: a.sub(b, alpha=0.5), "mul": torch.mul,
    "div": torch.div, "true_divide": torch.true_divide,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: a.div(b, rounding_mode="trunc"),
    "floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
    "pow": lambda a, b: torch.pow(a.abs(), b), "atan2": torch.atan2, "hypot": torch.hypot,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2, "copysign": torch.copysign,
    "nextafter": torch.nextafter, "xlogy": lambda a, b: torch.xlogy(a, b.abs()),
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "op_add": operator.add, "op_sub": operator.sub,
    "op_mul": operator.mul, "op_truediv": operator.truediv, "op_floordiv": operator.floordiv,
    "op_mod": operator.mod, "op_pow": lambda a, b: abs(a) ** b, "op_eq": operator.eq,
    "op_ne": operator.ne, "op_lt": operator.lt, "op_le": operator.le, "op_gt": operator.gt,
    "op_ge": operator.ge,
}
INT_BINARY = {
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "op_and": operator.and_, "op_or": operator.or_,
    "op_xor": operator.xor, "lshift": lambda a, b: a << (b.abs() % 4),
    "rshift": lambda a, b: torch.bitwise_right_shift(a, b.abs() % 4),
    "add": torch.add, "mul": torch.mul, "remainder": lambda a, b: a % (b.abs() + 1),
}


def _pair(layout, dtype, shape=(4, 6)):
    a, da, mask = make_masked(shape, layout, dtype, seed=3)
    b_data = make_masked(shape, torch.strided, dtype, seed=4)[1]
    # b: same specified set as a, built independently (distinct index objects).
    b, db, _ = make_masked(shape, layout, dtype, data=b_data, mask=mask, seed=5)
    return a, da, b, db, mask


@pytest.mark.parametrize("name", sorted(BINARY))
@layout_params()
def test_binary_masked_masked(name, layout):
    a, da, b, db, mask = _pair(layout, torch.float32)
    fn = BINARY[name]
    out = fn(a, b)
    check_invariants(out, layout)
    assert_masked_equal(out, fn(da, db), mask)


@pytest.mark.parametrize("name", sorted(INT_BINARY))
@layout_params()
def test_binary_int(name, layout):
    a, da, b, db, mask = _pair(layout, torch.int64)
    fn = INT_BINARY[name]
    assert_masked_equal(fn(a, b), fn(da, db), mask)


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "atan2", "op_sub", "op_pow",
                                  "lt"])
@pytest.mark.parametrize("plain_shape", [(4, 6), (6,), (1, 6), ()])
@layout_params()
def test_binary_masked_plain(name, plain_shape, layout):
    a, da, mask = make_masked((4, 6), layout, seed=6)
    t = make_masked(plain_shape, torch.strided, seed=7)[1]
    fn = BINARY[name]
    for out, ref in [(fn(a, t), fn(da, t)), (fn(t.abs() + 0.5, a), fn(t.abs() + 0.5, da))]:
        check_invariants(out, layout)
        assert_masked_equal(out, ref, mask)


@pytest.mark.parametrize("expr", ["mt + 2", "2 + mt", "mt - 1.5", "1.5 - mt", "mt * 3",
                                  "3 * mt", "mt / 4", "4 / mt", "mt ** 2", "2 ** mt", "-mt",
                                  "mt // 2", "mt % 0.7", "mt > 0"])
@layout_params()
def test_binary_scalar(expr, layout):
    mt, data, mask = make_masked((5, 3), layout, seed=8)
    out = eval(expr, {"mt": mt})
    check_invariants(out, layout)
    assert_masked_equal(out, eval(expr, {"mt": data}), mask)


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "div_", "pow_", "iadd", "imul"])
@layout_params()
def test_binary_inplace(op, layout):
    a, da, b, db, mask = _pair(layout, torch.float64)
    a = a.abs()
    da = da.abs()
    if op == "iadd":
        a += b
        da = da + db
    elif op == "imul":
        a *= b
        da = da * db
    else:
        getattr(a, op)(b)
        da = getattr(da.clone(), op)(db)
    assert_masked_equal(a, da, mask)


@layout_params()
def test_shared_index_is_free_and_kept(layout):
    mt, data, mask = make_masked((5, 5), layout, seed=9)
    x = mt.exp()
    y = x * mt  # operands share index objects and mask objects: no comparison needed
    assert y._storage.mask is mt._storage.mask
    assert all(p is q for p, q in zip(y._storage.index, mt._storage.index))
    assert_masked_equal(y, data.exp() * data, mask)


@layout_params()
def test_mismatched_masks_raise(layout):
    a, _, mask = make_masked((4, 4), layout, seed=10)
    b, _, _ = make_masked((4, 4), layout, seed=10, mask=~mask)
    with pytest.raises(ValueError, match="add.*masks of MaskedTensor operands must match"):
        a + b
    c, _, _ = make_masked((4, 5), layout, seed=10)
    with pytest.raises(ValueError, match=r"mul.*shapes \(4, 4\), \(4, 5\) do not broadcast"):
        a * c


@layout_params()
def test_plain_tensor_must_broadcast_to_masked(layout):
    a, _, _ = make_masked((4, 4), layout)
    with pytest.raises(ValueError, match="must broadcast to the MaskedTensor's shape"):
        a + torch.ones(3, 4, 4)


def test_inplace_on_plain_with_masked_raises():
    a, _, _ = make_masked((3,), torch.strided)
    with pytest.raises(TypeError, match="mask would be lost"):
        torch.ones(3).add_(a)


@layout_params()
def test_same_specified_set_stored_differently(layout):
    # a stores masked-out entries, b stores only the specified ones: masks still match.
    if layout == torch.strided:
        pytest.skip("strided stores every position")
    a, da, mask = make_masked((6, 4), layout, seed=11, stored_masked=0.5)
    b = a.to_dense().to_sparse_coo()
    b = b if layout == torch.sparse_coo else b.to_sparse_csr()
    assert b._storage.values.shape[0] < a._storage.values.shape[0]
    assert_masked_equal(a + b, da + da, mask)


@st.composite
def shapes_and_layouts(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    ndim = 2 if layout == torch.sparse_csr else draw(st.integers(0 if layout == torch.strided
                                                                  else 1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    density = draw(st.floats(0, 1))
    seed = draw(st.integers(0, 2**16))
    return shape, layout, density, seed


@given(shapes_and_layouts(), st.sampled_from(["exp", "sigmoid", "abs", "neg"]),
       st.sampled_from(["add", "mul", "maximum", "op_sub"]))
def test_random_shapes_and_masks(case, unary, binary):
    shape, layout, density, seed = case
    a, da, mask = make_masked(shape, layout, density=density, seed=seed)
    out = getattr(torch, unary)(a) if unary != "op_sub" else -a
    assert_masked_equal(out, getattr(torch, unary)(da), mask)
    b, db, _ = make_masked(shape, layout, data=da * 2 + 1, mask=mask, seed=seed + 1)
    assert_masked_equal(BINARY[binary](out, b), BINARY[binary](getattr(torch, unary)(da), db),
                        mask)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_huge_sparse_never_densifies(layout):
    n, nnz = 100_000, 1000
    g = torch.Generator().manual_seed(0)
    idx = torch.unique(torch.randint(0, n * n, (nnz,), generator=g))
    indices = torch.stack([idx // n, idx % n])
    data = torch.sparse_coo_tensor(indices, torch.rand(idx.numel(), generator=g), (n, n))
    mask = torch.sparse_coo_tensor(indices, torch.rand(idx.numel(), generator=g) > 0.2, (n, n))
    if layout == torch.sparse_csr:
        data, mask = data.coalesce().to_sparse_csr(), mask.coalesce().to_sparse_csr()
    mt = ms.masked_tensor(data, mask)
    # A dense (n, n) float tensor would need 40 GB: any densification fails loudly.
    out = ((mt.exp() + mt) * torch.ones(n)) / (mt + 1)
    out = out.to_tensor(0)
    assert out.layout == layout
    assert out.values().numel() == idx.numel()
