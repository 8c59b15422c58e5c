"""float16 / bfloat16 reductions and softmax in every layout accumulate in float32 and keep
their dtype: values against float64 references on the specified elements, gradients
through the casts against float64 autograd."""

from __future__ import annotations

import pytest
import torch
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


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", list(HALF_OPS))
def test_half_precision_accumulates_in_float32_and_keeps_its_dtype(layout, dtype, op):
    # 200 + noise: a float16 sum of 1000 of them overflows; bfloat16 loses the noise.
    g = torch.Generator().manual_seed(0)
    data = (200 + torch.rand(2, 1000, generator=g)).to(dtype)
    mask = torch.rand(2, 1000, generator=g) < 0.9
    mt, _, _ = make_masked_in((2, 1000), layout, dtype=dtype, data=data, mask=mask)
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


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_bfloat16_full_mean_is_as_accurate_as_torch(layout):
    g = torch.Generator().manual_seed(1)
    data = torch.rand(200, 500, generator=g).bfloat16()
    mask = torch.rand(200, 500, generator=g) < 0.7
    mt, _, _ = make_masked_in((200, 500), layout, dtype=torch.bfloat16, data=data, mask=mask)
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
