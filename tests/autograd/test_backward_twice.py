"""A second ``backward`` through a graph with MaskedTensors in every layout: torch's own
error when the graph was freed, accumulation when it was retained."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
)

import masked_sparse as ms


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_second_backward_through_a_freed_graph_is_torchs_error(layout):
    leaf = torch.randn(3, 4, requires_grad=True)
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) < 0.6
    def build():
        y = ms.as_masked_tensor(leaf, mask)
        return ms.to_layout(y, layout) if layout != torch.sparse_bsr else y.to_sparse_bsr((1, 1))

    total = build().sum()
    total.backward()
    torch.testing.assert_close(leaf.grad, mask.float())
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*"
                                           "retain_graph=True"):
        total.backward()
    kept = build().sum()
    kept.backward(retain_graph=True)
    kept.backward()  # retained: a second backward accumulates
    torch.testing.assert_close(leaf.grad, 3 * mask.float())
