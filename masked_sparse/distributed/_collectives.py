"""Masked collectives: ``all_reduce``, ``all_gather``, ``broadcast``, ``gather``, ``scatter``.

Each takes a MaskedTensor of any layout and returns MaskedTensors in the input's layout
(and format: a BSR input keeps its blocksize). Underneath: the entries of
:mod:`._entries` and dense collectives of ``torch.distributed`` only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._tensor import MaskedTensor, _wrap
from ._entries import (
    METHODS,
    OPS,
    Entries,
    all_gather_rows,
    as_wire,
    entries_of,
    gather_meta,
    local_meta,
    make_plan,
    reduce_entries,
    storage_from,
)


def _check(mt, what: str) -> MaskedTensor:
    if not isinstance(mt, MaskedTensor):
        raise TypeError(f"masked_sparse.distributed.{what}: expected a MaskedTensor, got "
                        f"{type(mt).__name__}; use torch.distributed.{what} for plain tensors "
                        f"or wrap it with ms.masked_tensor(t, mask)")
    return mt


def _rebuild(e: Entries, like: MaskedTensor) -> MaskedTensor:
    s = like._storage
    return _wrap(storage_from(e, s.layout, s.layout.options_of(s)))


def _shape_meta(e: Entries) -> list[int]:
    return [len(e.shape), e.shape.numel(), e.sparse_dim, hash(tuple(e.shape)) % 2**62]


def _meta(e: Entries) -> torch.Tensor:
    """This rank's row count, flags and shape, on the data's device (NCCL needs CUDA)."""
    return torch.tensor(local_meta(e) + _shape_meta(e), device=e.keys.device)


def _check_same_shape(metas: torch.Tensor, e: Entries, what: str) -> None:
    if bool((metas[:, 2:] != metas[0, 2:]).any()):
        raise ValueError(f"masked_sparse.distributed.{what}: the ranks hold MaskedTensors of "
                         f"different shapes or sparse dims (this rank: {tuple(e.shape)}, "
                         f"sparse_dim {e.sparse_dim}); every rank must pass the same shape")


def all_reduce(mt: MaskedTensor, op: str = "sum", *, group=None,
               method: str = "auto") -> MaskedTensor:
    """The masked reduction of ``mt`` over the ranks of ``group``, in ``mt``'s layout.

    An element is specified iff some rank specifies it; ``"sum"``, ``"prod"``, ``"amax"``,
    ``"amin"`` reduce over the ranks that specify it and ``"mean"`` divides their sum by
    their number. ``method`` picks the exchange: ``"gather"`` (stored entries),
    ``"dense"`` (a dense all-reduce) or ``"auto"``, the one that moves fewer bytes
    (Note [Gather or dense: the byte rule]). Every rank gets the same, coalesced result.

    Example (two ranks, run under ``torchrun --nproc-per-node 2``)::

        rank = dist.get_rank()
        mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, rank == 1]))
        msd.all_reduce(mt, "mean")      # [1.0, 2.0], both specified
    """
    _check(mt, "all_reduce")
    if op not in OPS:
        raise ValueError(f"masked_sparse.distributed.all_reduce: unknown op {op!r}; use one of "
                         f"{OPS}")
    if method not in METHODS:
        raise ValueError(f"masked_sparse.distributed.all_reduce: unknown method {method!r}; use "
                         f"one of {METHODS}")
    if op == "mean" and not (mt.dtype.is_floating_point or mt.dtype.is_complex):
        raise TypeError(f"masked_sparse.distributed.all_reduce: 'mean' needs a floating dtype, "
                        f"got {mt.dtype}; convert with mt.to(torch.float32)")
    if mt.dtype == torch.bool:
        raise TypeError("masked_sparse.distributed.all_reduce: bool MaskedTensors cannot be "
                        "reduced; convert with mt.to(torch.uint8)")
    e = entries_of(mt._storage)
    metas = gather_meta(_meta(e), group)
    _check_same_shape(metas, e, "all_reduce")
    plan = make_plan(e, metas[:, :2], method, dist.get_world_size(group))
    return _rebuild(reduce_entries(e, op, plan, group), mt)


def _gather_all(mt: MaskedTensor, group, what: str) -> list[Entries]:
    """Every rank's entries, stored-but-unspecified ones included (its own nnz)."""
    e = entries_of(mt._storage, drop_unspecified=False)
    metas = gather_meta(_meta(e), group)
    _check_same_shape(metas, e, what)
    counts = metas[:, 0].tolist()
    ranks = all_gather_rows([e.keys, e.values, e.mask], counts, group)
    return [e._replace(keys=k, values=v, mask=m) for k, v, m in ranks]


def all_gather(mt: MaskedTensor, *, group=None) -> list[MaskedTensor]:
    """Every rank's ``mt``, in rank order, each in this rank's layout with its own entries.

    The exchange is one all-gather of the row counts, then one of every rank's stored keys,
    values and mask, packed side by side in padded rows.
    """
    _check(mt, "all_gather")
    return [_rebuild(e, mt) for e in _gather_all(mt, group, "all_gather")]


def gather(mt: MaskedTensor, dst: int = 0, *, group=None) -> list[MaskedTensor] | None:
    """Every rank's ``mt`` on rank ``dst`` (a list in rank order); ``None`` on the others.

    Built on the same exchange as :func:`all_gather` (NCCL has no variable-size gather):
    the other ranks receive the entries too and drop them.
    """
    _check(mt, "gather")
    gathered = _gather_all(mt, group, "gather")
    if dist.get_rank(group) != _group_rank(dst, group):
        return None
    return [_rebuild(e, mt) for e in gathered]


def broadcast(mt: MaskedTensor, src: int = 0, *, group=None) -> MaskedTensor:
    """Rank ``src``'s ``mt`` on every rank, in each rank's own layout (``mt`` gives it).

    Every rank passes a MaskedTensor of the same shape; only ``src``'s entries are sent.
    """
    _check(mt, "broadcast")
    e = entries_of(mt._storage, drop_unspecified=False)
    src_in_group = _group_rank(src, group)
    meta = _meta(e)
    dist.broadcast(meta, src, group=group)
    if dist.get_rank(group) != src_in_group and meta[2:].tolist() != _shape_meta(e):
        raise ValueError(f"masked_sparse.distributed.broadcast: rank {src} sends a MaskedTensor "
                         f"of another shape than this rank's {tuple(e.shape)}")
    n, sends = int(meta[0]), dist.get_rank(group) == src_in_group
    parts = []
    for t in (e.keys, e.values, e.mask):
        buf = t.contiguous() if sends else t.new_empty((n,) + t.shape[1:])
        dist.broadcast(as_wire(buf), src, group=group)   # a view: receives into buf
        parts.append(buf)
    return _rebuild(e._replace(keys=parts[0], values=parts[1], mask=parts[2]), mt)


def scatter(mts: list[MaskedTensor] | None, like: MaskedTensor, src: int = 0, *,
            group=None) -> MaskedTensor:
    """Rank ``src``'s ``mts[r]`` on rank ``r``, in the layout of each rank's ``like``.

    ``mts`` (one MaskedTensor per rank, each of ``like``'s shape) is read on ``src`` only;
    the others pass ``None``. One broadcast of the row counts, then a padded scatter of
    keys, values and mask.
    """
    _check(like, "scatter")
    me, world = dist.get_rank(group), dist.get_world_size(group)
    mine = entries_of(like._storage, drop_unspecified=False)
    if me == _group_rank(src, group):
        if mts is None or len(mts) != world:
            raise ValueError(f"masked_sparse.distributed.scatter: rank {src} must pass one "
                             f"MaskedTensor per rank ({world}), got "
                             f"{None if mts is None else len(mts)}")
        sent = [entries_of(_check(m, "scatter")._storage, drop_unspecified=False) for m in mts]
        if any(e.shape != mine.shape or e.sparse_dim != mine.sparse_dim for e in sent):
            raise ValueError(f"masked_sparse.distributed.scatter: every MaskedTensor in mts must "
                             f"have the shape {tuple(mine.shape)} of rank {src}'s like")
        counts = torch.tensor([e.keys.numel() for e in sent], device=mine.keys.device)
    else:
        sent, counts = None, torch.zeros(world, dtype=torch.long, device=mine.keys.device)
    dist.broadcast(counts, src, group=group)
    longest, n = int(counts.max()), int(counts[me])
    parts = []
    for field in ("keys", "values", "mask"):
        proto = getattr(mine, field)
        rows = (longest,) + tuple(proto.shape[1:])
        chunks = None
        if sent is not None:
            chunks = []
            for e in sent:
                t = getattr(e, field)
                pad = proto.new_zeros(rows)
                pad[: t.shape[0]] = t
                chunks.append(as_wire(pad))
        out = proto.new_empty(rows)
        dist.scatter(as_wire(out), chunks, src=src, group=group)   # a view: receives into out
        parts.append(out[:n])
    return _rebuild(mine._replace(keys=parts[0], values=parts[1], mask=parts[2]), like)


def _group_rank(global_rank: int, group) -> int:
    if group is None or group is dist.group.WORLD:
        return global_rank
    return dist.get_group_rank(group, global_rank)
