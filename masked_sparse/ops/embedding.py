"""Embedding lookups with masked ids: ``F.embedding`` and ``F.embedding_bag``.

The ids are a MaskedTensor of integers, in any layout; an unspecified id takes no part --
it is never looked up, never counted in a bag, never renormalized by ``max_norm`` and
adds nothing to the gradient of ``weight`` (which is a plain tensor, as in torch).

- ``F.embedding(ids, weight)`` is a MaskedTensor of shape ``ids.shape + (D,)``: a dense
  layout gives a dense result (an unspecified id's row is unspecified, value 0); a sparse
  layout gives a *hybrid sparse COO* result -- one stored ``(D,)`` row per specified id,
  never a row for an unspecified one (COO: the one layout here with dense dims per element).
- ``F.embedding_bag(ids, weight, mode=...)`` takes ``(B, L)`` ids, one bag per row, and
  returns torch's plain ``(B, D)`` tensor, computed by torch's fused kernel on the flat
  specified ids with the offsets their mask gives (an empty bag is torch's zero row).
  Gradients reach ``weight``, sparse with ``sparse=True``.

>>> import torch, torch.nn.functional as F, masked_sparse as ms
>>> weight = torch.arange(6.).view(3, 2)
>>> ids = ms.masked_tensor(torch.tensor([[0, 2], [1, -1]]),
...                        torch.tensor([[True, True], [True, False]]))
>>> F.embedding_bag(ids, weight, mode="sum")
tensor([[4., 6.],
        [2., 3.]])
>>> F.embedding(ids, weight)[1]
MaskedTensor(
  [
    [  2.0000,   3.0000],
    [      --,       --]
  ]
)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import layouts
from layouts import Storage

from .._autograd import on_values
from .._registry import implements
from .._tensor import MaskedTensor


def _check(ids: Any, weight: Any, op: str) -> None:
    if not isinstance(ids, MaskedTensor):
        raise TypeError(f"{op}: a MaskedTensor weight is not supported (got ids of type "
                        f"{type(ids).__name__}); pass weight as a plain tensor "
                        f"(weight.to_tensor(0)) or the ids as a MaskedTensor")
    if isinstance(weight, MaskedTensor):
        raise TypeError(f"{op}: the weight must be a plain tensor, got a "
                        f"{weight.layout} MaskedTensor; pass weight.to_tensor(0)")
    dtype = ids._storage.values.dtype
    if dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: expected integer ids (int64 or int32), got a MaskedTensor "
                        f"of {dtype}; cast with ids.long()")


def specified_ids(s: Storage, first_only: bool = False
                  ) -> tuple[torch.Tensor | None, torch.Tensor, Any]:
    """``(coords, ids, coo_layout)``: the specified ids in row-major order, their
    coordinates (``(ndim, n)``; only the first, ``(1, n)``, with ``first_only``) and the
    layout they come from (the layout's COO form; a dense layout gives ``s.values[s.mask]``
    and no coordinates). A sparse storage whose stored ids are all specified is read as
    it is (one host read of the mask's minimum instead of two compactions)."""
    # masked_select, not ``t[mask]``: boolean indexing takes a slower general path.
    if not s.index:
        return None, torch.masked_select(s.values, s.mask), s.layout
    coo = s.layout.to_coo(s)  # coalesced: row-major order
    index, keep = coo.index[0], coo.mask
    if first_only:
        index = index[:1]
    if bool(keep.view(torch.uint8).amin()) if keep.numel() else True:  # all stored specified
        return index, coo.values, coo.layout
    coords = torch.masked_select(index, keep).view(index.shape[0], -1)
    return coords, torch.masked_select(coo.values, keep), coo.layout


def _embed(storages: list[Any], opts: dict[str, Any]) -> Storage:
    """The ``F.embedding`` kernel under ``on_values``: rows of ``weight`` at the specified
    ids, over the ids' own pattern (dense) or as hybrid COO rows (sparse)."""
    s, weight = storages
    dim = weight.shape[-1]
    if not s.index:
        mask = s.mask.unsqueeze(-1).expand(*s.mask.shape, dim)
        if opts["max_norm"] is None and not opts["scale_grad_by_freq"] and not opts["sparse"]:
            # One gather over every position; an unspecified id reads row 0 and is zeroed
            # with its gradient (no renorm, no count, no sparse gradient entry to mislead).
            ids = layouts.zero_unspecified(s.values, s.mask)
            rows = layouts.zero_unspecified(F.embedding(ids, weight, **opts), mask)
        else:
            rows = weight.new_zeros(*s.values.shape, dim)
            rows = rows.index_put((s.mask,), F.embedding(torch.masked_select(s.values, s.mask),
                                                          weight, **opts))
        return Storage(s.layout, (), rows, mask, torch.Size((*s.shape, dim)))
    coords, ids, coo_layout = specified_ids(s)
    rows = F.embedding(ids, weight, **opts)
    mask = torch.ones(rows.shape, dtype=torch.bool, device=rows.device)
    return coo_layout.build((coords,), rows, mask, (*s.shape, dim))


@implements(F.embedding)
def _embedding(op: Any, input: Any, weight: Any, padding_idx: int | None = None,
               max_norm: float | None = None, norm_type: float = 2.0,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> MaskedTensor:
    _check(input, weight, "embedding")
    if padding_idx is not None:  # torch's normalization of a negative padding_idx
        padding_idx = padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
    opts = dict(padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)
    return on_values(_embed, [input, weight], opts)


@implements(F.embedding_bag)
def _embedding_bag(op: Any, input: Any, weight: Any, offsets: Any = None,
                   max_norm: float | None = None, norm_type: float = 2.0,
                   scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                   per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: int | None = None) -> torch.Tensor:
    _check(input, weight, "embedding_bag")
    s = input._storage
    if len(s.shape) != 2:
        raise ValueError(f"embedding_bag: masked ids must be 2-D (bags, ids per bag), got "
                         f"shape {tuple(s.shape)}; reshape them, or pass flat ids and "
                         f"offsets as plain tensors")
    if offsets is not None or include_last_offset:
        raise ValueError("embedding_bag: with masked ids every row is one bag and the "
                         "offsets come from the mask; drop offsets= and include_last_offset=")
    coords, ids, _ = specified_ids(s, first_only=per_sample_weights is None)
    bags = s.shape[0]
    if coords is None:  # (a byte sum: torch's bool sum takes a slower path on CPU)
        counts = s.mask.view(torch.uint8).sum(1, dtype=ids.dtype)
    else:
        counts = torch.bincount(coords[0], minlength=bags)
    bounds = torch.zeros(bags + 1, dtype=ids.dtype, device=ids.device)
    torch.cumsum(counts, 0, out=bounds[1:])
    if per_sample_weights is not None:
        if isinstance(per_sample_weights, MaskedTensor) or per_sample_weights.shape != s.shape:
            raise ValueError(f"embedding_bag: per_sample_weights must be a plain tensor of "
                             f"the ids' shape {tuple(s.shape)} (read at the specified ids)")
        per_sample_weights = (per_sample_weights[s.mask] if coords is None
                              else per_sample_weights[coords[0], coords[1]])
    if max_norm is not None or per_sample_weights is not None or mode not in _MODES:
        return F.embedding_bag(ids, weight, bounds, max_norm=max_norm, norm_type=norm_type,
                               scale_grad_by_freq=scale_grad_by_freq, mode=mode,
                               sparse=sparse, per_sample_weights=per_sample_weights,
                               include_last_offset=True, padding_idx=padding_idx)
    # F.embedding_bag's own argument checks hold by construction here (1-D ids, offsets
    # from 0, a known mode): its kernel directly.
    return torch.embedding_bag(weight, ids, bounds, scale_grad_by_freq, _MODES[mode], sparse,
                               None, True, padding_idx)[0]


_MODES = {"sum": 0, "mean": 1, "max": 2}
