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
  specified ids with the offsets their mask gives (an empty bag is torch's zero row), or
  on every id with the unspecified ones in bags of their own (Note [Bags without a host
  sync]). Gradients reach ``weight``, sparse with ``sparse=True``.

Note [Bags without a host sync]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch's ``embedding_bag`` takes flat ids and the offset of each bag. On the CPU the
specified ids are selected and the offsets are the running count of specified ids per row
(for dense ids both in one pass, ``layouts.compact_rows``: Note [Compacting rows in one
pass]; its size is decided by the data) -- the inputs of
``embedding_bag(flat_ids, weight, offsets)``, so its numbers, reading the fewest rows. On
another device that selection would wait for the device (its output size is a host read),
so the ids are *reordered* instead, at a size known beforehand: the specified ones first, in
row-major order, then the unspecified ones, each replaced by the first specified id
(positions from two ``cumsum`` passes, one ``scatter``). The offsets are the CPU's for the
``B`` real bags, followed by ``B`` bags of at most ``ceil(n / B)`` of the trailing ids, whose
output is dropped. Every real bag holds exactly the CPU's ids in the CPU's order, so
``sum``, ``mean`` (over the specified ids only) and ``max`` give the same values, and an
empty bag is torch's zero row. The cost is reading the rows of the unspecified ids too. The
dropped bags' gradient is 0: the gradient of ``weight`` is the same up to the order torch
sums each row's terms in; a sparse one (``sparse=True``) also stores zero rows at the first
specified id, a row it updates anyway (only when no id at all is specified is that a row no
id names). ``scale_grad_by_freq``, which would count those repeats, selects the ids as the
CPU does (a host sync); every other option takes the reordering.
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


def compacts_on_host(t: torch.Tensor) -> bool:
    """True where selecting the specified ids costs no device sync: the CPU (Note [Bags
    without a host sync]). The tests turn it off to run the device route on the CPU."""
    return t.is_cpu


def _dense_ids(s: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(B, L)`` ids and mask of a dense storage (broadcast views expanded)."""
    ids, mask = s.values, s.mask
    if mask.shape != s.shape or ids.shape != s.shape:  # broadcast views
        ids, mask = ids.expand(s.shape), mask.expand(s.shape)
    return ids, mask


def _stored_bags(s: Storage) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(ids, keep, starts)`` of ``(B, L)`` sparse ids stored bag by bag (CSR, coalesced
    COO: the layout groups its rows as lines): the stored ids and their mask as they are,
    and the position of each bag's first stored id -- the row pointers the grouping keeps
    per index tensor, so no COO form and no counts are built. None for other layouts."""
    if not s.index or s.values.dim() != 1:
        return None
    g = layouts.group_by(s, (1,), keepdim=False)
    if g.kind != "lines" or g.offsets.shape[0] != s.shape[0] + 1:
        return None
    return s.values, s.mask, g.offsets[:-1]


def _bag_ids(s: Storage) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor | None]:
    """``(ids, keep, counts, where)`` of ``(B, L)`` ids: the stored ids in row-major order
    (for a dense layout, the ``(B, L)`` ids themselves), which of them are specified, the
    number of specified ids per bag, and each stored id's position in the ``(B, L)`` grid
    (None: every position is stored, in order)."""
    if not s.index:
        ids, mask = _dense_ids(s)
        # (a byte sum: torch's bool sum takes a slower path on CPU)
        counts = (mask.view(torch.uint8) if mask.is_contiguous() else mask.to(torch.uint8)
                  ).sum(1, dtype=torch.int64)
        return ids, mask, counts, None
    coo = s.layout.to_coo(s)  # coalesced: row-major order
    index, keep = coo.index[0], coo.mask
    counts = torch.zeros(s.shape[0], dtype=torch.int64, device=index.device).index_add_(
        0, index[0], keep.to(torch.int64))
    return coo.values, keep, counts, index


def _trash_bags(ids: torch.Tensor, keep: torch.Tensor, offsets: torch.Tensor,
                weights: torch.Tensor | None, rows: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Every id, the specified ones first, and ``2B`` offsets: the ``B`` real bags, then
    ``B`` bags of the unspecified ids (Note [Bags without a host sync]). No host sync."""
    ids, keep = ids.reshape(-1), keep.reshape(-1)
    weights = weights.reshape(-1) if weights is not None else None
    n, bags = ids.numel(), offsets.numel()
    specified = torch.cumsum(keep, 0)
    total = specified[-1:]
    others = torch.cumsum(keep.logical_not(), 0)
    dest = torch.where(keep, specified - 1, total + others - 1)
    # (when no id is specified, ids[0] may be anything: kept in range, it only fills)
    first = ids.index_select(0, keep.to(torch.uint8).argmax().reshape(1)).clamp_(0, rows - 1)
    order = torch.empty_like(ids).scatter_(0, dest, torch.where(keep, ids, first))
    chunk = -(-n // bags)
    tail = (total + torch.arange(bags, device=ids.device) * chunk).clamp_(max=n)
    if weights is not None:
        weights = torch.zeros_like(weights).scatter_(0, dest, weights)
    return order, torch.cat([offsets, tail]), weights


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
    if per_sample_weights is not None and (isinstance(per_sample_weights, MaskedTensor)
                                           or per_sample_weights.shape != s.shape):
        raise ValueError(f"embedding_bag: per_sample_weights must be a plain tensor of "
                         f"the ids' shape {tuple(s.shape)} (read at the specified ids)")
    bags, trash = s.shape[0], False
    if not s.index and compacts_on_host(s.values):
        # The CPU's selection, ids and offsets in one pass (Note [Compacting rows in one
        # pass] in layouts/_compact.py).
        ids, keep = _dense_ids(s)
        ids, starts = layouts.compact_rows(ids, keep)
        if per_sample_weights is not None:
            per_sample_weights = torch.masked_select(per_sample_weights, keep)
    elif (per_sample_weights is None and compacts_on_host(s.values)
          and (stored := _stored_bags(s)) is not None):
        ids, keep, starts = stored
        if not bool(keep.all()):  # a host read: this branch runs on the CPU only
            ids = torch.masked_select(ids, keep)
            kept = torch.zeros(keep.shape[0] + 1, dtype=torch.int64, device=keep.device)
            torch.cumsum(keep, 0, out=kept[1:])
            starts = kept.index_select(0, starts)
    else:
        ids, keep, counts, where = _bag_ids(s)
        starts = torch.cumsum(counts, 0).sub_(counts)
        if per_sample_weights is not None and where is not None:  # read at the stored ids
            per_sample_weights = per_sample_weights[where[0], where[1]]
        trash = (not scale_grad_by_freq and not compacts_on_host(ids) and bags > 0
                 and ids.numel() > 0)
        if trash:  # Note [Bags without a host sync]
            ids, starts, per_sample_weights = _trash_bags(ids, keep, starts,
                                                          per_sample_weights, weight.shape[0])
        elif where is None or int(counts.sum()) != ids.numel():  # (some) unspecified ids
            ids = torch.masked_select(ids, keep)
            if per_sample_weights is not None:
                per_sample_weights = torch.masked_select(per_sample_weights, keep)
    if max_norm is not None or per_sample_weights is not None or mode not in _MODES:
        out = F.embedding_bag(ids, weight, starts, max_norm=max_norm, norm_type=norm_type,
                              scale_grad_by_freq=scale_grad_by_freq, mode=mode, sparse=sparse,
                              per_sample_weights=per_sample_weights, padding_idx=padding_idx)
    else:
        # F.embedding_bag's own argument checks hold by construction here (1-D ids, offsets
        # from 0, a known mode): its kernel directly.
        out = torch.embedding_bag(weight, ids, starts, scale_grad_by_freq, _MODES[mode],
                                  sparse, None, False, padding_idx)[0]
    return out[:bags] if trash else out


_MODES = {"sum": 0, "mean": 1, "max": 2}
