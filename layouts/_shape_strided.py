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
>>> SHAPE_OPS["transpose"](s, 0, 1).values.shape
torch.Size([3, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .registry import Storage

Kernel = Callable[..., Any]


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


SHAPE_OPS: dict[str, Kernel] = {
    "view": _view,
    "reshape": _both(torch.reshape),
    "permute": _both(torch.permute),
    "transpose": _both(torch.transpose),
    "select": _both(torch.select),
    "slice": _both(_slice),
    "index_select": _both(torch.index_select),
    "unsqueeze": _both(torch.unsqueeze),
    "squeeze": _both(torch.squeeze),
    "expand": _both(torch.Tensor.expand),
    "repeat": _both(torch.Tensor.repeat),
    "flip": _both(torch.flip),
    "roll": _both(torch.roll),
    "unfold": _both(torch.Tensor.unfold),
    "gather": _both(torch.gather),
    "take": _both(torch.take),
    "masked_select": _both(torch.masked_select),
    "index": _both(_index),
    "getitem": _both(torch.Tensor.__getitem__),
    "cat": _both_list(torch.cat),
    "stack": _both_list(torch.stack),
}
