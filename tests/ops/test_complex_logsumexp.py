"""``logsumexp`` of complex MaskedTensors (with an empty group) against torch's own complex
``logsumexp`` of ``torch.where(mask, x, -inf)``, values and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    make_masked,
)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dim", [1, 0, None])
def test_complex_logsumexp_matches_torch(layout, dim):
    mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(4)) < 0.6
    mask[2] = False  # an empty group: unspecified
    mt, data, mask = make_masked((4, 5), layout, dtype=torch.complex128, seed=3, mask=mask)
    mt.requires_grad_()
    dims = (0, 1) if dim is None else dim
    got = torch.logsumexp(mt, dims)
    leaf = data.clone().requires_grad_()
    ref = torch.logsumexp(torch.where(mask, leaf, complex(-torch.inf, 0)), dims)
    specified = mask.any(dims) if dim is not None else mask.any()
    assert got.dtype == torch.complex128
    assert_masked_equal(got.to_dense(), torch.where(specified, ref, 0).detach(), specified)
    got.to_dense().to_tensor(0).abs().sum().backward()
    torch.where(specified, ref, 0).abs().sum().backward()
    assert_masked_equal(mt.grad.to_dense(), leaf.grad, mask)
