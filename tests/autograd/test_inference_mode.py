"""Ops under ``torch.inference_mode()`` in every layout, on inputs built inside and outside
it: each result equals the dense ``torch.where`` reference or the same op run eagerly, and a
second call (any fact cached on an inference tensor) gives the same."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    dense_of,
    make_masked,
    make_masked_in,
    where0,
)

import masked_sparse as ms


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


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
@pytest.mark.parametrize("op", list(INFERENCE_OPS))
@pytest.mark.parametrize("built_inside", [True, False], ids=["inference_input", "plain_input"])
def test_every_op_runs_under_inference_mode(layout, op, built_inside):
    if op == "transpose" and layout == torch.sparse_bsr:
        pytest.skip("BSR has no transpose (it says so, with or without inference_mode)")
    fn, ref = INFERENCE_OPS[op]
    x, w = torch.randn(3, 5), torch.randn(5, 2)
    if built_inside:
        with torch.inference_mode():
            mt, data, mask = make_masked_in((4, 5), layout)
    else:
        mt, data, mask = make_masked_in((4, 5), layout)
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
