"""The strided layout's grouping: dense slices over the reduced dims.

Every element is stored, so a group is a dense slice: ``reduce`` is ``torch.sum(dims)``
& co., ``expand`` a broadcast, ``select`` a sort along the flattened reduced dims. The
kernel families read it as the ``"dense"`` kind (Note [Groups as a record]): on CPU a
reduction over every dim is one native pass over the flattened values, a sum along dims
runs in row blocks (Note [Fused masked sum]), a softmax along one dim is torch's own of
the ``-inf`` filled values (Note [Fused masked softmax]). Under torch.compile /
torch.export every kernel reads the mask through :func:`vector_mask` (Note [Compiled mask
loads]); outputs keep the input's own mask (``restore``).
"""

from __future__ import annotations

import torch

from ._grouping import Grouping, sort_order
from ._index import linearize
from ._vector_mask import vector_mask
from .kernels._groups import raw_expand, reduce_dense, reduced_shape
from .registry import Storage


class StridedGrouping(Grouping):
    """Groups of a dense tensor: the slices over ``dims``."""

    kind = "dense"

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.input = self.source = storage
        if torch.compiler.is_compiling():  # Note [Compiled mask loads]
            self.source = storage.with_values(storage.values, vector_mask(storage.mask))
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(storage.shape, dims, keepdim)

    @property
    def shape(self) -> torch.Size:
        return self.source.shape

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        return reduce_dense(values, self.dims, self.keepdim, op)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        return raw_expand(self, out)

    def positions(self) -> torch.Tensor:
        shape = self.source.shape
        device = self.source.values.device
        coords = []
        for d in self.dims:
            view = [1] * len(shape)
            view[d] = shape[d]
            coords.append(torch.arange(shape[d], device=device).view(view))
        return linearize(coords, [shape[d] for d in self.dims], device)

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
        return self.input.with_values(values)  # the input's own mask object
