"""Data-parallel gradients: :func:`sync_grads`.

Note [Gradients across ranks]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``sync_grads`` gives every parameter the gradient DDP would: the sum over ranks divided by
the world size ``W`` (not by the number of ranks that hold a gradient, so that ``W``
processes on ``W`` slices of a batch equal one process on the whole batch with a mean loss).
The ranks first agree on each gradient's *form* with one all-gather of a small table
(``None`` / dense / torch sparse / masked, its layout and sparse dims, its number of
stored rows), so a rank whose gradient is ``None`` or empty takes part with nothing to send
and still receives the result. Then:

- dense gradients (on any rank) are flattened into one buffer and all-reduced once;
- sparse and masked gradients go through the masked sum of :mod:`._entries` (gather or
  dense by the byte rule), so the result stores the union of the ranks' entries, coalesced,
  and stays sparse: a lazy optimizer (``ms.optim``) updates exactly the rows some rank
  touched, as one process on the whole batch does.

A gradient keeps its form: a torch sparse tensor comes back as a coalesced torch sparse
tensor of its layout (an uncoalesced ``nn.Embedding(sparse=True)`` gradient included), a
MaskedTensor as a MaskedTensor of its layout. If ranks disagree (dense here, sparse
there), the dense form wins.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

import layouts

from .._tensor import MaskedTensor, _wrap
from ..optim._scatter import as_masked_grad
from ._entries import (
    METHODS,
    Entries,
    empty_entries,
    entries_of,
    gather_meta,
    local_meta,
    make_plan,
    reduce_entries,
    storage_from,
)

_NONE, _DENSE, _SPARSE, _MASKED = 0, 1, 2, 3


def _kind(grad) -> int:
    if grad is None:
        return _NONE
    if isinstance(grad, MaskedTensor):
        return _MASKED
    return _DENSE if grad.layout == torch.strided else _SPARSE


def _layout_id(grad: torch.Tensor) -> int:
    layout = grad._storage.layout if isinstance(grad, MaskedTensor) else \
        layouts.get_layout(grad.layout)
    return layouts.registered_layouts().index(layout)


def sync_grads(params: Iterable[torch.Tensor], group=None, *, method: str = "auto") -> None:
    """Replace every parameter's ``.grad`` by the sum over ranks divided by the world size.

    Call it on every rank after ``backward()`` with the same parameters in the same order.
    Gradients may be dense, torch sparse (COO -- uncoalesced, hybrid -- CSR, CSC, BSR) or
    MaskedTensors of any layout; a rank whose gradient is ``None`` or stores nothing takes
    part normally and receives the result. Sparse and masked gradients stay sparse, holding
    the union of the ranks' entries (Note [Gradients across ranks]); ``method`` forces their
    exchange (``"gather"`` / ``"dense"``, Note [Gather or dense: the byte rule]).

    Example (one step of data-parallel training, every rank)::

        loss_fn(model(x_of_this_rank), y_of_this_rank).backward()
        msd.sync_grads(model.parameters())
        opt.step()
    """
    if method not in METHODS:
        raise ValueError(f"masked_sparse.distributed.sync_grads: unknown method {method!r}; use "
                         f"one of {METHODS}")
    params = [p for p in params if p.requires_grad]
    world = dist.get_world_size(group)
    kinds = [_kind(p.grad) for p in params]
    local = {i: entries_of(as_masked_grad(p.grad, "sync_grads")._storage)
             for i, (p, k) in enumerate(zip(params, kinds)) if k in (_SPARSE, _MASKED)}
    rows = [[k, -1, -1, 0, 1] if i not in local else
            [k, _layout_id(params[i].grad), local[i].sparse_dim] + local_meta(local[i])
            for i, k in enumerate(kinds)]
    device = params[0].device if params else "cpu"   # NCCL moves CUDA tensors only
    tables = gather_meta(torch.tensor(rows, dtype=torch.long, device=device).view(-1, 5),
                         group).cpu()  # a few ints per parameter, read on the host from here on
    dense = []
    for i, p in enumerate(params):
        column = tables[:, i]
        if bool((column[:, 0] == _DENSE).any()):
            dense.append(p)
        elif bool((column[:, 0] != _NONE).any()):
            _sync_sparse(p, local.get(i), column, world, method, group)
    _sync_dense(dense, world, group)


def _sync_sparse(p: torch.Tensor, e: Entries | None, table: torch.Tensor, world: int,
                 method: str, group) -> None:
    """The masked sum / W of one sparse or masked gradient; ``table``: ``(W, 5)`` forms."""
    given = int((table[:, 0] != _NONE).nonzero()[0, 0])       # the first rank with a gradient
    kind, layout_id, sparse_dim = table[given, :3].tolist()
    layout = layouts.registered_layouts()[layout_id]
    if e is None:
        e = empty_entries(p.shape, sparse_dim, p.dtype, p.device)
    plan = make_plan(e, table[:, 3:], method, world)
    total = reduce_entries(e, "sum", plan, group)
    total = total._replace(values=total.values / world)
    grad = p.grad
    options = {}
    if isinstance(grad, MaskedTensor) and grad._storage.layout is layout:
        options = layout.options_of(grad._storage)
    storage = storage_from(total, layout, options)
    p.grad = _wrap(storage) if kind == _MASKED else layout.to_torch(storage, storage.values)


def _sync_dense(params: list[torch.Tensor], world: int, group) -> None:
    if not params:
        return
    grads = [_dense_grad(p) for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat.div_(world)
    for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
        p.grad = g


def _dense_grad(p: torch.Tensor) -> torch.Tensor:
    g = p.grad
    if g is None:
        return torch.zeros(p.shape, dtype=p.dtype, device=p.device)
    if isinstance(g, MaskedTensor):
        return g.to_tensor(0).to_dense()
    return g.to_dense() if g.layout != torch.strided else g
