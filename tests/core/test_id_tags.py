"""What the core remembers about tensor objects (``masked_sparse/_id_tags.py``): tags keyed
weakly by identity, and the answers kept with them (``all_specified``, the zero-fill tag),
which must follow in-place writes and die with their tensors."""

from __future__ import annotations

import gc

import pytest
import torch

from masked_sparse._fill import (
    _ALL_SPECIFIED,
    _DIRECT,
    all_specified,
    is_zero_filled,
    mark_zero_filled,
)
from masked_sparse._id_tags import IdTags


def test_a_tag_belongs_to_its_tensor_object_and_dies_with_it():
    tags = IdTags()
    a, b = torch.zeros(3), torch.zeros(3)
    tags.set(a, "a")
    assert tags.get(a) == "a" and tags.get(b) is None and bool(tags)
    tags.set(a, "again")  # rewritten in place, one entry
    assert tags.get(a) == "again" and len(tags._table) == 1
    del a
    gc.collect()
    assert not tags and tags.get(b) is None


def test_a_reused_id_reads_no_stale_tag():
    tags = IdTags()
    for _ in range(50):  # CPython reuses the ids of freed objects
        t = torch.zeros(2)
        assert tags.get(t) is None
        tags.set(t, "old")
        del t
    assert not tags


@pytest.mark.parametrize("numel", [4, _DIRECT + 8], ids=["compared", "reduced"])
def test_all_specified_follows_in_place_writes(numel):
    """The answer is kept per mask object and version, for every size: a write to the
    mask (a version bump) is seen on the next call, as a fresh ``mask.all()`` would."""
    mask = torch.ones(numel, dtype=torch.bool)
    assert all_specified(mask) is bool(mask.all()) is True
    assert _ALL_SPECIFIED.get(mask) is not None
    mask[numel // 2] = False
    assert all_specified(mask) is bool(mask.all()) is False
    mask.fill_(True)
    assert all_specified(mask) is True


def test_all_specified_reads_a_broadcast_mask_at_its_stored_size():
    row = torch.tensor([True, False, True])
    assert all_specified(row.expand(4, 3)) is False
    assert all_specified(torch.tensor([True]).expand(5, 6)) is True


def test_all_specified_of_an_inference_mask_is_answered_unkept():
    with torch.inference_mode():
        mask = torch.ones(3, dtype=torch.bool)
    assert all_specified(mask) is True and _ALL_SPECIFIED.get(mask) is None


def test_the_zero_fill_tag_is_dropped_by_a_write():
    mask = torch.tensor([True, False])
    values = mark_zero_filled(torch.tensor([1., 0.]), mask)
    assert is_zero_filled(values, mask)
    assert not is_zero_filled(values, mask.clone())  # another mask object
    values.add_(1)
    assert not is_zero_filled(values, mask)
