"""``layouts.compact_rows``: the entries a mask keeps, row by row, and each row's offset --
the native one-pass kernel and the torch fallback against ``masked_select`` + ``cumsum``.

The reference is built from torch ops alone (``masked_select`` of the values, the row
counts' exclusive running sum), for random shapes including 0 rows, 0 columns, every entry
masked and none, both id dtypes embedding_bag takes, with the native kernels on and off.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layouts


def _reference(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    counts = mask.to(torch.int64).sum(1)
    offsets = torch.cumsum(counts, 0) - counts
    return torch.masked_select(values, mask), offsets


@st.composite
def _ids_and_mask(draw):
    rows = draw(st.integers(0, 9))
    length = draw(st.integers(0, 40))
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-2**31, 2**31 - 1, (rows, length), generator=g).to(dtype)
    mask = torch.rand(rows, length, generator=g) < density
    return values, mask


@settings(max_examples=80, deadline=None)
@given(_ids_and_mask(), st.booleans())
def test_compact_rows_matches_masked_select_and_cumsum(case, native):
    values, mask = case
    with contextlib.nullcontext() if native else layouts.native_disabled():
        flat, offsets = layouts.compact_rows(values, mask)
    ref_flat, ref_offsets = _reference(values, mask)
    assert flat.dtype == values.dtype and offsets.dtype == torch.int64
    assert flat.is_contiguous()
    assert torch.equal(flat, ref_flat)
    assert torch.equal(offsets, ref_offsets)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_compact_rows_reads_views_and_broadcast_masks(dtype):
    """A transposed (non-contiguous) values tensor and an expanded mask: the same entries,
    in row-major order of the 2-D view."""
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 100, (7, 5), generator=g).to(dtype).t()
    mask = (torch.rand(1, 7, generator=g) < 0.5).expand(5, 7)
    flat, offsets = layouts.compact_rows(values, mask)
    ref_flat, ref_offsets = _reference(values, mask)
    assert torch.equal(flat, ref_flat) and torch.equal(offsets, ref_offsets)


def test_compact_rows_rejects_other_shapes():
    with pytest.raises(ValueError, match="compact_rows: expected 2-D values"):
        layouts.compact_rows(torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="compact_rows"):
        layouts.compact_rows(torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 2).bool())
