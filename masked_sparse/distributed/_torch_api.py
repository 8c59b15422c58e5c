"""``torch.distributed``'s own calls on MaskedTensors, with masked semantics.

Note [Where torch.distributed calls arrive]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The Python collectives of ``torch.distributed`` (``all_reduce``, ``broadcast``,
``all_gather``, ``gather``, ``scatter``, ``reduce``, ...) check ``has_torch_function`` on their
tensor argument, so a MaskedTensor sends them to ``__torch_function__`` with the public
function itself -- before any buffer is touched. That is where they are registered: the
handler runs the masked collective and writes the result into the caller's tensors in place
(the tensor object keeps its identity; a sparse one may store a new pattern, the union of the
ranks'), as torch's in-place collectives do. Below that, the C++ process group dispatches
``torch.ops.c10d.allreduce_`` / ``broadcast_`` / ... to ``__torch_dispatch__``, which is what
C++ callers reach (DDP's ``_broadcast_coalesced`` and its reducer): those expect to write
into dense buckets and get a ``Work`` back, which a masked tensor cannot honour, so they
raise a ``NotImplementedError`` that names the recipe (``split_for_ddp`` + ``sync_grads``).

``async_op=True`` returns a completed work handle: the masked collective has already run.
``ReduceOp.AVG`` means ``"mean"`` over the ranks that specify an element.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .._registry import implements
from .._tensor import MaskedTensor
from . import _collectives

# Handlers receive the function first (``_registry.implements``); ``func`` here, since
# ``op`` is all_reduce's own keyword.
_OPS = {"SUM": "sum", "PRODUCT": "prod", "MAX": "amax", "MIN": "amin", "AVG": "mean"}


def _op_name(op: Any) -> str:
    for name, ours in _OPS.items():
        if op == getattr(dist.ReduceOp, name):
            return ours
    raise NotImplementedError(f"torch.distributed.all_reduce(MaskedTensor): {op} has no masked "
                              f"meaning; use SUM, PRODUCT, MAX, MIN or AVG")


def _done(async_op: bool) -> Any:
    if not async_op:
        return None
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _assign(dst: Any, src: MaskedTensor, what: str) -> None:
    """Write ``src`` into ``dst`` in place: same object, new storage (its own layout)."""
    if not isinstance(dst, MaskedTensor):
        raise TypeError(f"torch.distributed.{what}: the output tensors must be MaskedTensors "
                        f"(got {type(dst).__name__}); pass e.g. [mt.clone() for _ in ranks]")
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"torch.distributed.{what}: output of shape {tuple(dst.shape)} and "
                         f"dtype {dst.dtype} for a MaskedTensor of shape {tuple(src.shape)} "
                         f"and dtype {src.dtype}")
    s = dst._storage
    new = src._storage
    if not s.index and not new.index:  # strided: write the data, keep the wrapper's strides
        s.values.copy_(new.values)
        dst._storage = s.with_values(s.values, new.mask.clone())
    else:
        dst._storage = s.layout.from_coo_like(new.layout.to_coo(new), s)


def _global(rank: int | None, group_rank: int | None, group) -> int:
    if group_rank is None:
        return 0 if rank is None else rank
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


@implements(dist.all_reduce)
def _all_reduce(func, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _assign(tensor, _collectives.all_reduce(tensor, _op_name(op), group=group), "all_reduce")
    return _done(async_op)


@implements(dist.broadcast)
def _broadcast(func, tensor, src=None, group=None, async_op=False, group_src=None):
    src = _global(src, group_src, group)
    _assign(tensor, _collectives.broadcast(tensor, src, group=group), "broadcast")
    return _done(async_op)


@implements(dist.all_gather)
def _all_gather(func, tensor_list, tensor, group=None, async_op=False):
    results = _collectives.all_gather(tensor, group=group)
    if len(tensor_list) != len(results):
        raise ValueError(f"torch.distributed.all_gather: tensor_list has {len(tensor_list)} "
                         f"tensors for {len(results)} ranks")
    for dst, src in zip(tensor_list, results):
        _assign(dst, src, "all_gather")
    return _done(async_op)


@implements(dist.gather)
def _gather(func, tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    dst = _global(dst, group_dst, group)
    results = _collectives.gather(tensor, dst, group=group)
    if results is not None:
        if gather_list is None or len(gather_list) != len(results):
            raise ValueError("torch.distributed.gather: rank dst needs a gather_list with one "
                             "MaskedTensor per rank")
        for out, src in zip(gather_list, results):
            _assign(out, src, "gather")
    return _done(async_op)


@implements(dist.scatter)
def _scatter(func, tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    src = _global(src, group_src, group)
    _assign(tensor, _collectives.scatter(scatter_list, tensor, src, group=group), "scatter")
    return _done(async_op)


_C10D = [getattr(torch.ops.c10d, name).default for name in (
    "allreduce_", "allreduce_coalesced_", "broadcast_", "allgather_", "_allgather_base_",
    "allgather_coalesced_", "reduce_", "gather_", "scatter_", "reduce_scatter_",
    "_reduce_scatter_base_", "alltoall_", "alltoall_base_", "send", "recv_")
    if hasattr(torch.ops.c10d, name)]


@implements(*_C10D)
def _c10d(func, *args, **kwargs):
    raise NotImplementedError(
        f"{func} on a MaskedTensor: torch.distributed's C++ callers (DistributedDataParallel's "
        f"buckets, coalesced collectives) move dense buffers and cannot carry a mask. Use "
        f"torch.distributed.all_reduce / broadcast / all_gather / gather / scatter on the "
        f"MaskedTensor, or masked_sparse.distributed; for DDP, call "
        f"masked_sparse.distributed.split_for_ddp(model) before wrapping it and "
        f"masked_sparse.distributed.sync_grads(...) after backward()")
