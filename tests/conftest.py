"""Shared fixtures: the layouts under test, a masked-tensor factory and invariant checks.

Every test builds its inputs with :func:`make_masked`, which returns the MaskedTensor *and*
its dense reference (data, mask), so each op can be checked against the same computation
done densely with ``torch.where``.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import layouts
import masked_sparse as ms

settings.register_profile("fast", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr]
LAYOUT_IDS = ["strided", "coo", "csr"]
FLOAT_DTYPES = [torch.float32, torch.float64]


def layout_params():
    return pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)


def random_values(shape, dtype, generator) -> torch.Tensor:
    """Random data of any dtype, away from 0 so that log/div/etc. stay finite."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.rand(shape, generator=generator, dtype=torch.float64) * 1.8 + 0.1
        x = x * torch.where(torch.rand(shape, generator=generator) > 0.5, 1.0, -1.0)
        if dtype.is_complex:
            x = torch.complex(x, torch.rand(shape, generator=generator, dtype=torch.float64))
        return x.to(dtype)
    low = 0 if dtype == torch.uint8 else -9
    return torch.randint(low, 10, shape, generator=generator).to(dtype)


def make_masked(shape, layout=torch.strided, dtype=torch.float32, density=0.6, seed=0,
                stored_masked=0.3, data=None, mask=None):
    """A MaskedTensor of ``layout`` and its dense reference ``(mt, data, mask)``.

    For sparse layouts a fraction ``stored_masked`` of the stored entries have mask False
    (stored but unspecified), so that tests exercise the authoritative-mask semantics.
    """
    g = torch.Generator().manual_seed(seed)
    if data is None:
        data = random_values(shape, dtype, g)
    if mask is None:
        mask = torch.rand(shape, generator=g) < density
    if layout == torch.strided:
        return ms.masked_tensor(data, mask), data, mask
    stored = mask | (torch.rand(shape, generator=g) < stored_masked)
    sparse_mask = _to_layout(torch.where(stored, mask, False), stored, layout)
    sparse_data = _to_layout(torch.where(stored, data, torch.zeros((), dtype=dtype)), stored,
                             layout)
    return ms.masked_tensor(sparse_data, sparse_mask), data, mask


def _to_layout(dense: torch.Tensor, stored: torch.Tensor, layout) -> torch.Tensor:
    """``dense`` as a torch sparse tensor storing exactly the ``stored`` positions."""
    idx = stored.nonzero().t()
    coo = torch.sparse_coo_tensor(idx, dense[stored], dense.shape).coalesce()
    return coo if layout == torch.sparse_coo else coo.to_sparse_csr()


def dense_of(mt: ms.MaskedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense data (0 where unstored) and mask of a MaskedTensor, without using its ops."""
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def check_invariants(mt: ms.MaskedTensor, layout=None) -> None:
    """The storage's full invariants, and the layout it reports."""
    s = mt._storage
    s.layout.validate(s, full=True)
    assert s.mask.dtype == torch.bool
    assert s.values.shape == s.mask.shape
    assert mt.shape == s.shape
    if layout is not None:
        assert mt.layout == layout
        assert s.layout is layouts.get_layout(layout)


def assert_masked_equal(mt, data, mask, *, rtol=None, atol=None, equal_nan=True) -> None:
    """``mt`` specifies exactly ``mask`` and agrees with ``data`` there."""
    assert isinstance(mt, ms.MaskedTensor), type(mt)
    got_data, got_mask = dense_of(mt)
    assert torch.equal(got_mask, mask.expand(got_mask.shape)), (got_mask, mask)
    ref = torch.where(mask, data, torch.zeros((), dtype=data.dtype))
    got = torch.where(got_mask, got_data, torch.zeros((), dtype=got_data.dtype))
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=equal_nan)
