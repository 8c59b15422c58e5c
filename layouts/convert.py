"""Conversions between registered layouts, through the COO hub.

Every layout converts to and from COO, so any pair converts without a per-pair function;
a layout may add a direct path in its ``conversions`` table (keyed by the target's name).
Conversions are exact: specified positions and their values are kept, unspecified stay
unspecified. They are written with differentiable torch ops on the values.
"""

from __future__ import annotations

import torch

from .registry import Layout, Storage, get_layout


def convert(storage: Storage, target: Layout | torch.layout | str) -> Storage:
    """``storage`` in the ``target`` layout.

    >>> import torch, layouts
    >>> s = layouts.get_layout("strided").from_torch(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> convert(s, torch.sparse_csr).index[0].tolist()
    [0, 1, 2]
    """
    target = get_layout(target)
    source = storage.layout
    if source is target:
        return storage
    direct = source.conversions.get(target.name)
    if direct is not None:
        return direct(storage)
    return target.from_coo(source.to_coo(storage))


def drop_unspecified(storage: Storage) -> Storage:
    """The same tensor with only its specified elements stored (sparse layouts)."""
    if not storage.index:
        return storage
    coo = storage.layout.to_coo(storage)
    keep = coo.mask if coo.mask.dim() == 1 else coo.mask.flatten(1).any(1)
    (indices,) = coo.index
    coo = coo.layout.build((indices[:, keep],), coo.values[keep], coo.mask[keep], coo.shape)
    return storage.layout.from_coo(coo)
