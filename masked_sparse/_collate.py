"""``torch.utils.data`` support: MaskedTensor samples batch with ``default_collate``.

Importing ``masked_sparse`` registers :func:`collate_masked` in torch's
``default_collate_fn_map``, so a ``DataLoader`` (any ``num_workers``) stacks masked samples
along a new dim 0 -- dense samples in their layout, sparse ones in sparse COO, the hub
every layout converts through (CSR, CSC and BSR are 2-D: a batch of matrices is a 3-D COO
tensor); samples of several layouts, or that require grad, go through ``torch.stack``.
Worker processes send MaskedTensors back by pickling their inner tensors
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
from torch._C import DisableTorchFunctionSubclass
from torch.utils.data._utils.collate import default_collate_fn_map

import layouts

from ._tensor import MaskedTensor, _wrap

# The shape kernels torch.stack is built from (shape_ops is keyed by aten overloads).
_STACKING = (torch.ops.aten.cat.default, torch.ops.aten.unsqueeze.default)


def collate_masked(batch: Sequence[MaskedTensor], *,
                   collate_fn_map: dict[type, Callable[..., Any]] | None = None
                   ) -> MaskedTensor:
    """Stack MaskedTensor samples along a new dim 0 (see the module docstring).

    Samples that need no gradient are batched part by part -- one ``stack`` (or ``cat``) of
    the values, one of the masks, one of the indices (``layouts.stack_storages``) -- not
    through one ``torch.stack`` dispatch per sample; ``benchmarks.bench_training_ops``
    measures it against collating plain ``(data, mask)`` pairs.
    """
    batch = list(batch)
    fast = _stack_parts(batch)
    if fast is not None:
        return fast
    layouts_seen = {t._storage.layout for t in batch}
    if len(layouts_seen) > 1 or any(k not in batch[0]._storage.layout.shape_ops
                                    for k in _STACKING):
        batch = [t.to_sparse_coo() for t in batch]
    return torch.stack(batch, 0)


def _stack_parts(batch: list[MaskedTensor]) -> MaskedTensor | None:
    """The batch built from its parts, or None where ``torch.stack`` must do it (samples
    that require grad, of several layouts or shapes)."""
    if not batch or torch.compiler.is_compiling():
        return None
    # The eager storage object itself (Note [Storage attributes]): one attribute read per
    # sample, not the property's compile check each time; requires_grad read without the
    # __torch_function__ round trip.
    with DisableTorchFunctionSubclass():
        storages = [t._cached for t in batch if not t.requires_grad]
    if len(storages) != len(batch):
        return None
    stacked = layouts.stack_storages(storages)
    return None if stacked is None else _wrap(stacked)


default_collate_fn_map[MaskedTensor] = collate_masked
