"""Conversions between registered layouts, through the COO hub.

Every layout converts to and from COO, so any pair converts without a per-pair function;
a layout may add a direct path in its ``conversions`` table (keyed by the target's name).
Conversions are exact: specified positions and their values are kept, unspecified stay
unspecified. They are written with differentiable torch ops on the values.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .registry import Layout, Storage, get_layout


def convert(storage: Storage, target: Layout | torch.layout | str, **options: Any) -> Storage:
    """``storage`` in the ``target`` layout; ``options`` go to the target's ``from_coo``.

    A storage already in ``target`` is returned as is, unless ``options`` ask for another
    format of it (e.g. a new ``blocksize``).

    >>> import torch, layouts
    >>> s = layouts.get_layout("strided").from_torch(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> convert(s, torch.sparse_csr).index[0].tolist()
    [0, 1, 2]
    """
    target = get_layout(target)
    source = storage.layout
    if options:
        _check_options(target, options)
    if source is target and (not options or options == source.options_of(storage)):
        return storage
    direct = source.conversions.get(target.name) if source is not target else None
    if direct is not None:
        return direct(storage, **options)
    return target.from_coo(source.to_coo(storage), **options)


def _check_options(target: Layout, options: dict[str, Any]) -> None:
    try:
        inspect.signature(target.from_coo).bind(None, **options)
    except TypeError:
        raise TypeError(f"to_layout({target.name}): unsupported conversion options "
                        f"{sorted(options)} for this layout") from None


def drop_unspecified(storage: Storage) -> Storage:
    """The same tensor with only its specified elements stored (sparse layouts)."""
    if not storage.index:
        return storage
    coo = storage.layout.to_coo(storage)
    keep = coo.mask if coo.mask.dim() == 1 else coo.mask.flatten(1).any(1)
    (indices,) = coo.index
    coo = coo.layout.build((indices[:, keep],), coo.values[keep], coo.mask[keep], coo.shape)
    return storage.layout.from_coo_like(coo, storage)
