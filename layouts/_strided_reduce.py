"""Reductions of the strided layout: dense torch reductions over the reduced dims.

Every element is stored, so a group is a dense slice: ``reduce`` is ``torch.sum(dims)``
& co., ``expand`` a broadcast, ``select`` a sort along the flattened reduced dims. The
core fills unspecified elements with the op's identity before calling ``reduce``.
"""

from __future__ import annotations

import torch

from ._grouping import Grouping, reduce_dense, reduced_shape, sort_order
from .registry import Storage


class StridedGrouping(Grouping):
    """Groups of a dense tensor: the slices over ``dims``."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.source = storage
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(storage.shape, dims, keepdim)

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        return reduce_dense(values, self.dims, self.keepdim, op)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if not self.keepdim:
            for d in self.dims:
                out = out.unsqueeze(d)
        return out.expand(self.source.shape)

    def positions(self) -> torch.Tensor:
        shape = self.source.shape
        device = self.source.values.device
        pos = torch.zeros((), dtype=torch.long, device=device)
        stride = 1
        for d in reversed(self.dims):
            view = [1] * len(shape)
            view[d] = shape[d]
            pos = pos + torch.arange(shape[d], device=device).view(view) * stride
            stride *= shape[d]
        return pos

    def select(self, values: torch.Tensor, mask: torch.Tensor,
               rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.source.shape
        kept = [d for d in range(len(shape)) if d not in self.dims]
        kept_shape = [shape[d] for d in kept]
        size = 1
        for d in self.dims:
            size *= shape[d]
        if size == 0:
            return (values.new_zeros(self.out_shape),
                    torch.zeros(self.out_shape, dtype=torch.long, device=values.device))
        perm = kept + list(self.dims)
        v = values.permute(perm).reshape(kept_shape + [size])
        m = mask.permute(perm).reshape(kept_shape + [size])
        order = sort_order(v, m)
        at = order.gather(-1, rank.reshape(kept_shape + [1]).clamp(0, size - 1))
        return v.gather(-1, at).reshape(self.out_shape), at.reshape(self.out_shape)

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        return self.source.layout.build((), out_values, out_mask, out_values.shape)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.source.with_values(values)


def group(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> StridedGrouping:
    """The strided layout's ``reduction["group"]`` kernel."""
    return StridedGrouping(storage, dims, keepdim)
