"""Inductor compiles models whose weights are strided MaskedTensors (forward, and backward
for a weight that requires grad), with and without ``fullgraph``; the results equal eager and
the dense ``torch.where`` reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_masked_equal,
    make_masked,
    where0,
)


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
