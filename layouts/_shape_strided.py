"""Shape, indexing and movement kernels of the strided layout: the op applied to data and mask.

A strided storage holds dense data and a dense mask of the same shape, so every op that
moves elements is computed by running the very same torch op on both tensors. The data
keeps torch's view semantics (``transpose``, ``select``, slicing, ``expand`` ... return views
of the data); the mask is treated as immutable, so sharing it is always safe. ``view`` runs
``reshape`` on the mask: data and mask may have different strides, and only the data must
follow ``view``'s no-copy contract.

Kernels take the normalized arguments documented in ``masked_sparse/ops/shape.py``
(Note [Shape op signatures]); a kernel for a list op (``cat``, ``stack``) takes a list of
storages.

>>> import torch, layouts
>>> s = layouts.get_layout("strided").from_strided(torch.arange(6.).view(2, 3),
...                                                torch.ones(2, 3, dtype=torch.bool))
>>> SHAPE_OPS[aten.transpose.int](s, 0, 1).values.shape
torch.Size([3, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .registry import Kernel, Storage

aten = torch.ops.aten


def _both(fn: Callable[..., torch.Tensor]) -> Kernel:
    """A kernel running ``fn(tensor, *args)`` on the data and on the mask."""

    def kernel(s: Storage, *args: Any) -> Storage:
        values, mask = fn(s.values, *args), fn(s.mask, *args)
        return s.layout.build((), values, mask, values.shape)

    return kernel


def _both_list(fn: Callable[..., torch.Tensor]) -> Kernel:
    """A kernel running ``fn([tensors], *args)`` on the data list and on the mask list."""

    def kernel(storages: list[Storage], *args: Any) -> Storage:
        values = fn([s.values for s in storages], *args)
        mask = fn([s.mask for s in storages], *args)
        return storages[0].layout.build((), values, mask, values.shape)

    return kernel


def _view(s: Storage, shape: tuple[int, ...]) -> Storage:
    values = s.values.view(shape)
    return s.layout.build((), values, s.mask.reshape(shape), values.shape)


def _slice(t: torch.Tensor, dim: int, start: int, end: int, step: int) -> torch.Tensor:
    return t[(slice(None),) * dim + (slice(start, end, step),)]


def _index(t: torch.Tensor, indices: list[torch.Tensor | None]) -> torch.Tensor:
    return torch.ops.aten.index.Tensor(t, indices)


SHAPE_OPS: dict[Any, Kernel] = {
    aten.view.default: _view,
    aten.reshape.default: _both(torch.reshape),
    aten.permute.default: _both(torch.permute),
    aten.transpose.int: _both(torch.transpose),
    aten.select.int: _both(torch.select),
    aten.slice.Tensor: _both(_slice),
    aten.index_select.default: _both(torch.index_select),
    aten.unsqueeze.default: _both(torch.unsqueeze),
    aten.squeeze.dims: _both(torch.squeeze),
    aten.expand.default: _both(torch.Tensor.expand),
    aten.repeat.default: _both(torch.Tensor.repeat),
    aten.flip.default: _both(torch.flip),
    aten.roll.default: _both(torch.roll),
    aten.unfold.default: _both(torch.Tensor.unfold),
    aten.gather.default: _both(torch.gather),
    aten.take.default: _both(torch.take),
    aten.masked_select.default: _both(torch.masked_select),
    aten.index.Tensor: _both(_index),
    torch.Tensor.__getitem__: _both(torch.Tensor.__getitem__),
    aten.cat.default: _both_list(torch.cat),
    aten.stack.default: _both_list(torch.stack),
}
