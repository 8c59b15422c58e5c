"""The wire form of a masked tensor and the masked reduction across ranks.

Every layout converts to COO (the hub of the layout protocol), so a masked tensor of any
layout travels as :class:`Entries`: the row-major linear *keys* of its stored sparse
positions, one row of values and of mask per key. The reduction across ranks is written
once on entries, with dense collectives only (``all_gather_into_tensor`` of packed, padded
rows or ``all_reduce`` of dense buffers), so the same code runs on gloo and NCCL and a rank with
nothing stored takes part like any other.

Note [Gather or dense: the byte rule]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Per tensor, every rank knows every rank's number of stored rows ``n_r`` (one small
all-gather) and picks, identically, the method that moves fewer bytes into each rank:

- *gather*: ``(W - 1) * max_r n_r * (key + row of values [+ row of mask])`` -- one padded
  all-gather of packed rows: key (int32 when the sparse positions fit, else int64), values
  and, only when some rank has a stored entry that is not specified, the mask as one byte
  per element (Note [Packed rows]);
- *dense*: ``2 (W - 1) / W * P * (row of values + count)`` -- a ring all-reduce of the
  values scattered into a dense buffer over the ``P`` sparse positions, plus a count of the
  ranks that specify each row (one byte while ``W < 256``; per element when masks travel).

``W`` is the world size. Ties go to *gather* (it keeps the work O(nnz)). ``method="gather"``
or ``"dense"`` forces either. The count is what a plain dense all-reduce (Horovod's
``sparse_as_dense``) lacks: without it the union of the ranks' patterns is lost and a lazy
optimizer would update every row. The rule counts bytes, the cost on a network; where
bandwidth is cheap (one machine, NVLink) the gather method's reduction over ``W * n`` rows
(``unique`` + ``index_add_``) can take longer than the dense all-reduce it avoids at high
density -- force ``method="dense"`` there.

Note [Packed rows]
~~~~~~~~~~~~~~~~~
Keys, values and mask of a row travel side by side in one ``uint8`` row (fields ordered
widest item first, the row padded to the widest item so every field can be viewed in
place), so the gather method costs two collectives whatever the tensor: the row counts,
then the rows. Ranks with fewer rows than the longest send padding rows whose key is one
past the last position: the reduction runs on the received buffer as it is and drops that
one extra key, instead of copying out every rank's valid rows.

Note [Masked reduction across ranks]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
An element of the result is specified iff some rank specifies it. Its value reduces the
values of the ranks that specify it: unspecified entries enter the reduction as the op's
identity (0 for sum, 1 for prod, -inf / +inf for amax / amin), and ``mean`` divides the sum
by the number of ranks that specify the element, not by the world size. Gathered entries are
deduplicated with ``torch.unique`` (sorted keys), so the result is coalesced.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from layouts import Storage, all_true, get_layout, linearize


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """``all_gather_into_tensor``, which torch 2.13 renamed ``all_gather_single``."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


OPS = ("sum", "mean", "prod", "amax", "amin")
METHODS = ("auto", "gather", "dense")


class Entries(NamedTuple):
    """Stored rows of a masked tensor: sorted unique keys, values and mask per key."""

    keys: torch.Tensor          # int64 (n,): row-major positions over ``shape[:sparse_dim]``
    values: torch.Tensor        # (n, *shape[sparse_dim:])
    mask: torch.Tensor          # bool, like ``values``
    shape: torch.Size
    sparse_dim: int

    @property
    def sparse_numel(self) -> int:
        return math.prod(self.shape[: self.sparse_dim])


def entries_of(storage: Storage, *, drop_unspecified: bool = True) -> Entries:
    """``storage`` (any layout) as entries; rows with no specified element are dropped."""
    coo = storage.layout.to_coo(storage)
    (indices,) = coo.index
    values, mask = coo.values, coo.mask
    if drop_unspecified and not all_specified(mask):
        keep = mask if mask.dim() == 1 else mask.flatten(1).any(1)
        if not bool(keep.all()):
            indices, values, mask = indices[:, keep], values[keep], mask[keep]
    sparse_dim = indices.shape[0]
    return Entries(linearize(indices, storage.shape[:sparse_dim]), values, mask, storage.shape,
                   sparse_dim)


def empty_entries(shape: torch.Size, sparse_dim: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> Entries:
    """No stored row: what a rank with nothing (e.g. a ``None`` gradient) contributes."""
    rows = (0,) + tuple(shape[sparse_dim:])
    return Entries(torch.zeros(0, dtype=torch.long, device=device),
                   torch.zeros(rows, dtype=dtype, device=device),
                   torch.zeros(rows, dtype=torch.bool, device=device), torch.Size(shape),
                   sparse_dim)


def storage_from(e: Entries, layout, options: dict | None = None) -> Storage:
    """Entries back to a storage of ``layout`` (``options``: its format, e.g. blocksize)."""
    coo = get_layout(torch.sparse_coo).build((_unravel(e.keys, e.shape[: e.sparse_dim]),),
                                             e.values, e.mask, e.shape)
    return get_layout(layout).from_coo(coo, **(options or {}))


def _unravel(keys: torch.Tensor, sparse_shape: tuple[int, ...]) -> torch.Tensor:
    if not sparse_shape:
        return keys.new_zeros((0, keys.numel()))
    if len(sparse_shape) == 1:
        return keys[None]
    return torch.stack(torch.unravel_index(keys, sparse_shape))


# -- the plan: which method, how many bytes --------------------------------------------------
class Plan(NamedTuple):
    """The byte rule's inputs and verdict for one tensor (Note [Gather or dense])."""

    method: str             # "gather" or "dense"
    counts: list[int]       # stored rows per rank
    masks: bool             # some rank has a stored entry that is not specified
    gather_bytes: int       # bytes each rank receives with the gather method
    dense_bytes: int        # bytes each rank receives with the dense method


def key_dtype(sparse_numel: int) -> torch.dtype:
    """int32 keys while every position and the padding key ``sparse_numel`` fit."""
    return torch.int32 if sparse_numel < 2**31 - 1 else torch.int64


def make_plan(e: Entries, meta: torch.Tensor, method: str, world: int) -> Plan:
    """The plan from every rank's ``[rows, all specified]`` (``meta``: ``(W, 2)`` int64)."""
    counts = meta[:, 0].tolist()
    masks = not bool(meta[:, 1].all())
    row = math.prod(e.shape[e.sparse_dim:])
    itemsize = e.values.element_size()
    key = torch.empty((), dtype=key_dtype(e.sparse_numel)).element_size()
    packed = key + row * itemsize + (row if masks else 0)
    align = max(key, itemsize)
    gather = (world - 1) * max(counts) * (-(-packed // align) * align)   # Note [Packed rows]
    count = (row if masks else 1) * torch.empty((), dtype=_count_dtype(world)).element_size()
    dense = 2 * (world - 1) * e.sparse_numel * (row * itemsize + count) // world
    if method == "auto":
        method = "gather" if gather <= dense else "dense"
    return Plan(method, counts, masks, gather, dense)


def local_meta(e: Entries) -> list[int]:
    return [e.keys.numel(), int(all_specified(e.mask))]


def gather_meta(rows: torch.Tensor, group) -> torch.Tensor:
    """Every rank's small int64 ``rows`` tensor, stacked: ``(W, *rows.shape)``."""
    world = dist.get_world_size(group)
    rows = rows.contiguous()
    out = rows.new_empty((world * rows.shape[0],) + tuple(rows.shape[1:]))
    _all_gather_flat(out, rows, group=group)
    return out.view((world,) + tuple(rows.shape))


# -- one packed, padded all-gather of rows (Note [Packed rows]) --------------------------------
def as_wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed in a dtype every backend moves: bool as uint8, complex as its real
    pairs (a view: a collective writing into it writes into ``t``)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return torch.view_as_real(t) if t.is_complex() else t


def from_wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`as_wire`: ``t`` viewed back as ``dtype``."""
    if dtype == torch.bool:
        return t.view(torch.bool)
    return torch.view_as_complex(t) if dtype.is_complex else t


def all_gather_packed(parts: list[torch.Tensor], fills: list, counts: list[int],
                      group) -> list[torch.Tensor]:
    """Every rank's ``parts`` (``counts[r]`` rows each on rank r) in one all-gather.

    Returns, per part, a ``(W * longest, *row)`` view: rank r's rows start at
    ``r * longest``; padding rows hold ``fills``.
    """
    world, longest = len(counts), max(counts)
    wires = [as_wire(p) for p in parts]
    if longest == 0:                        # nothing stored anywhere: nothing to send
        return [p.new_empty((0,) + tuple(p.shape[1:])) for p in parts]
    widths = [math.prod(w.shape[1:]) * w.element_size() for w in wires]
    order = sorted(range(len(parts)), key=lambda k: -wires[k].element_size())
    offsets, row = {}, 0
    for k in order:                         # widest items first: every field stays aligned
        offsets[k], row = row, row + widths[k]
    align = max(w.element_size() for w in wires)
    row = -(-row // align) * align
    device = parts[0].device
    mine = torch.empty((longest, row), dtype=torch.uint8, device=device)
    fields = [_field(mine, offsets[k], widths[k], wires[k]) for k in range(len(parts))]
    for field, wire, part, fill in zip(fields, wires, parts, fills):
        field[: part.shape[0]] = wire
        field[part.shape[0]:] = fill
    out = torch.empty((world * longest, row), dtype=torch.uint8, device=device)
    _all_gather_flat(out, mine, group)
    return [from_wire(_field(out, offsets[k], widths[k], wires[k]), parts[k].dtype)
            for k in range(len(parts))]


def _field(buf: torch.Tensor, offset: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """Bytes ``offset:offset + width`` of every row of ``buf``, viewed like ``like``'s rows."""
    rows = buf[:, offset: offset + width].view(like.dtype)
    return rows.view((buf.shape[0],) + tuple(like.shape[1:]))


def all_gather_rows(parts: list[torch.Tensor], counts: list[int],
                    group) -> list[list[torch.Tensor]]:
    """Every rank's ``parts``, exactly (no padding): ``[rank][part]``."""
    gathered = all_gather_packed(parts, [0] * len(parts), counts, group)
    longest = max(counts)
    return [[g[r * longest: r * longest + n].contiguous() for g in gathered]
            for r, n in enumerate(counts)]


def all_specified(mask: torch.Tensor) -> bool:
    """``bool(mask.all())``, O(1) for the broadcast all-True masks of gradients."""
    if mask.numel() == 0:
        return True
    if all(st == 0 for st in mask.stride()):
        return bool(mask.reshape(-1)[0])
    return bool(mask.all())


# -- the masked reduction --------------------------------------------------------------------
def identity(op: str, dtype: torch.dtype) -> float | int | bool:
    if op in ("sum", "mean"):
        return 0
    if op == "prod":
        return 1
    if dtype.is_floating_point:
        return -math.inf if op == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if op == "amax" else info.max


_TORCH_OP = {"sum": "SUM", "mean": "SUM", "prod": "PRODUCT", "amax": "MAX", "amin": "MIN"}


def _count_dtype(world: int) -> torch.dtype:
    return torch.uint8 if world < 256 else torch.int32


def reduce_entries(e: Entries, op: str, plan: Plan, group) -> Entries:
    """The masked reduction of every rank's entries (Note [Packed rows], Note [Masked
    reduction across ranks])."""
    fill = identity(op, e.values.dtype)
    values = e.values if not plan.masks else torch.where(e.mask, e.values, fill)
    if plan.method == "gather":
        return _reduce_gathered(e, values, op, fill, plan, group)
    return _reduce_dense(e, values, op, fill, plan, group)


def _reduce_gathered(e: Entries, values: torch.Tensor, op: str, fill, plan: Plan,
                     group) -> Entries:
    # Padding rows carry the key ``sparse_numel`` (past every position): they reduce into
    # one extra row, dropped below, so the gathered buffers are used as they arrive.
    pad = e.sparse_numel
    parts = [e.keys.to(key_dtype(pad)), values] + ([e.mask] if plan.masks else [])
    gathered = all_gather_packed(parts, [pad, fill, False], plan.counts, group)
    keys, values = gathered[0], gathered[1].contiguous()   # index_add_ reads it contiguously
    mask = gathered[2] if plan.masks else None
    keys, where = torch.unique(keys.long(), sorted=True, return_inverse=True)
    out = values.new_full((keys.numel(),) + tuple(values.shape[1:]), fill)
    if op in ("sum", "mean"):
        out.index_add_(0, where, values)
    else:
        index = where.view((-1,) + (1,) * (values.dim() - 1)).expand(values.shape)
        out.scatter_reduce_(0, index, values, op, include_self=True)
    count = None
    if mask is not None or op == "mean":
        ones = mask.to(torch.int32) if mask is not None else torch.ones_like(where,
                                                                          dtype=torch.int32)
        count = ones.new_zeros((keys.numel(),) + tuple(ones.shape[1:])).index_add_(0, where, ones)
    if min(plan.counts) < max(plan.counts):   # drop the padding row (the last key)
        keys, out = keys[:-1], out[:-1]
        count = None if count is None else count[:-1]
    if count is None:
        return e._replace(keys=keys, values=out, mask=all_true(out))
    return _finish(e, keys, out, count, op)


def _reduce_dense(e: Entries, values: torch.Tensor, op: str, fill, plan: Plan,
                  group) -> Entries:
    world = len(plan.counts)
    row_shape = tuple(values.shape[1:])
    buf = values.new_full((e.sparse_numel,) + row_shape, fill)
    buf.index_copy_(0, e.keys, values)
    count_shape = (e.sparse_numel,) + (row_shape if plan.masks else ())
    count = torch.zeros(count_shape, dtype=_count_dtype(world), device=values.device)
    count.index_copy_(0, e.keys, e.mask.to(count.dtype) if plan.masks else
                      torch.ones_like(e.keys, dtype=count.dtype))
    wire = as_wire(buf)
    dist.all_reduce(wire, op=getattr(dist.ReduceOp, _TORCH_OP[op]), group=group)
    dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    buf = from_wire(wire, values.dtype)
    present = count if count.dim() == 1 else count.flatten(1).any(1)
    keys = present.nonzero().squeeze(1)
    out, count = buf.index_select(0, keys), count.index_select(0, keys)
    if not plan.masks and op != "mean":
        return e._replace(keys=keys, values=out, mask=all_true(out))
    return _finish(e, keys, out, count, op)


def _finish(e: Entries, keys: torch.Tensor, out: torch.Tensor, count: torch.Tensor,
            op: str) -> Entries:
    count = count.view(count.shape + (1,) * (out.dim() - count.dim()))
    if op == "mean":
        out = out / count.clamp(min=1).to(out.dtype if out.is_floating_point() else torch.float)
    return e._replace(keys=keys, values=out, mask=(count > 0).expand(out.shape))
