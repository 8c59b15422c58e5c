"""``torch.utils.data`` support: MaskedTensor samples batch with ``default_collate``.

Importing ``masked_sparse`` registers :func:`collate_masked` in torch's
``default_collate_fn_map``, so a ``DataLoader`` (any ``num_workers``) stacks masked samples
along a new dim 0 -- in the samples' layout, or in sparse COO when that layout has no
shape kernels or cannot hold the batch (CSR, CSC and BSR are 2-D: a batch of matrices is a
3-D COO tensor). Worker processes send MaskedTensors back by pickling their inner tensors
(``MaskedTensor.__reduce_ex__``).

>>> import torch, masked_sparse as ms
>>> from torch.utils.data import default_collate
>>> a = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
>>> default_collate([a, a]).shape
torch.Size([2, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from ._tensor import MaskedTensor

# The shape kernels torch.stack is built from (shape_ops is keyed by aten overloads).
_STACKING = (torch.ops.aten.cat.default, torch.ops.aten.unsqueeze.default)


def collate_masked(batch: Sequence[MaskedTensor], *,
                   collate_fn_map: dict[type, Callable[..., Any]] | None = None
                   ) -> MaskedTensor:
    """Stack MaskedTensor samples along a new dim 0 (see the module docstring)."""
    batch = list(batch)
    layouts_seen = {t._storage.layout for t in batch}
    if len(layouts_seen) > 1 or any(k not in batch[0]._storage.layout.shape_ops
                                    for k in _STACKING):
        batch = [t.to_sparse_coo() for t in batch]
    return torch.stack(batch, 0)


default_collate_fn_map[MaskedTensor] = collate_masked
