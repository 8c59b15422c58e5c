"""``grad_values``: an incoming gradient read at a storage's stored positions, 0 where the
gradient leaves an element unspecified -- whichever route answers (the pattern itself,
another pattern, a plain gradient), against ``torch.where`` on the dense forms."""

from __future__ import annotations

import pytest
import torch

import masked_sparse as ms
from masked_sparse._autograd import grad_values
from masked_sparse._tensor import _wrap

LAYOUTS = ["strided", "sparse_coo", "sparse_csr"]


def _masked(data: torch.Tensor, mask: torch.Tensor, layout: str) -> ms.MaskedTensor:
    mt = ms.masked_tensor(data, mask)
    return {"strided": mt, "sparse_coo": mt.to_sparse_coo(),
            "sparse_csr": mt.to_sparse_csr()}[layout]


def _dense_at(s, values: torch.Tensor) -> torch.Tensor:
    return _wrap(s.with_values(values)).to_dense().to_tensor(0)


def _random_storage(layout: str, seed: int, density: float):
    """A random (4, 5) storage of ``layout`` and the generator that made it."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(4, 5, generator=g) < density
    return _masked(torch.randn(4, 5, generator=g), mask, layout)._storage, g


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_gradient_over_the_very_pattern_is_its_values(layout):
    s, g = _random_storage(layout, 0, 0.6)
    grad = _wrap(s.with_values(torch.randn(s.values.shape, generator=g)))
    with torch.no_grad():
        got = grad_values(grad, s)
    assert got is grad._storage.values  # no copy, no fill: the same mask object


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_gradient_over_another_mask_is_zero_where_it_is_unspecified(layout):
    s, g = _random_storage(layout, 1, 0.7)
    grad_mask = s.mask & (torch.rand(s.mask.shape, generator=g) > 0.5)
    grad_data = torch.randn(s.values.shape, generator=g)
    grad_data[~grad_mask] = float("nan")  # never read
    grad = _wrap(s.with_values(grad_data, grad_mask))
    with torch.no_grad():
        got = grad_values(grad, s)
    want = torch.where(grad_mask, grad_data, 0.0)
    torch.testing.assert_close(_dense_at(s, got), _dense_at(s, want), rtol=0, atol=0)


def test_a_plain_gradient_is_read_at_the_stored_positions():
    mask = torch.tensor([[True, False, True], [False, True, False]])
    x = _masked(torch.ones(2, 3), mask, "sparse_coo")
    grad = torch.arange(6.).view(2, 3)
    with torch.no_grad():
        got = grad_values(grad, x._storage)
    assert got.tolist() == grad[mask].tolist()
