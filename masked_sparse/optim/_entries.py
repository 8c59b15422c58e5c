"""Where a gradient is specified in the tensor an optimizer updates: the lazy step's entries.

Note [Lazy steps on gathered entries]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A lazy step (Note [Lazy updates]) is the dense algorithm on the entries a gradient
specifies. Every gradient form becomes one :class:`Entries` of the *target* (the parameter,
or a MaskedTensor parameter's stored values):

- *rows* of ``target.view(-1, width)`` with the gradient's ``(n, width)`` values there: a
  torch COO gradient's rows (an embedding's), a sparse MaskedTensor gradient's positions
  (Note [Flat positions]); or
- the *whole* target with a gradient of its shape: a strided MaskedTensor gradient, or any
  gradient of a MaskedTensor parameter read at the parameter's stored positions;

with ``keep``, the elements that take part (the gradient's mask and the parameter's, None
where all do). The parameter and each state tensor are *gathered* at the entries -- rows
by ``index_select``, the whole target by a copy --, torch's own functional optimizer
(``torch.optim.adam.adam`` & co., ``foreach`` / ``fused`` as for dense gradients) steps the
gathered tensors, and :meth:`Entries.scatter_` writes them back where ``keep`` holds
(``index_copy_`` / ``where``): nothing else is read or written, O(nnz) for a sparse
gradient, and on the entries it updates a lazy step gives ``torch.optim``'s own numbers --
the ones the dense path gives where the gradient is dense, and the ones the multi-tensor
path of masked parameters gives (Note [Gradients over the parameter's pattern]). Every
size depends on the inputs' sizes only, and no step reads a value on the host: nothing here
syncs a device (Note [Duplicate rows without a host sync]).

Note [Duplicate rows without a host sync]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
An uncoalesced COO gradient (``nn.Embedding(sparse=True)``'s) may name a row several
times; the step must see their sum. ``coalesce()`` would compact the rows, an output size
only the data knows (a host sync on CUDA). Instead the ``n`` rows are sorted (by
``coalesce()``'s own sort), each is numbered by its run of equal rows (a ``cumsum`` of the
run starts), the values are summed per run with ``index_add_`` into an ``(n, width)``
buffer (filled with ``-0.0``, the exact additive identity) and read back at every row of the
run (:func:`summed_rows`). Every duplicate then carries the same sum and gathers the same
state, so the step computes the same bits for it, and ``index_copy_`` writes identical values
however often a row appears. On the CPU the sums are ``coalesce()``'s, bit for bit; CUDA's
``index_add_`` adds duplicates in any order. The CPU, where an output size the data decides
costs no sync, calls ``coalesce()`` itself: the same sums, and the step then runs over the
distinct rows only.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from layouts import Storage, linearize

from .._fill import all_specified
from .._tensor import MaskedTensor
from . import _scatter
from ._same_pattern import same_pattern
from ._scatter import as_masked_grad, gather_at, positions

__all__ = ["Entries", "entries_for", "summed_rows"]


class Entries:
    """Where a gradient is specified in a target tensor, and its values there.

    ``rows`` (int64, ``(n,)``) are rows of ``target.view(-1, width)`` and ``grad`` is
    ``(n, width)`` -- ``(n,)`` when ``width`` is 1: single elements of the flat target --;
    or ``rows`` is None and ``grad`` has the target's shape. ``keep`` (bool, broadcastable
    to ``grad``) marks the elements that take part, None for all. A row may repeat only
    with the same values at each repeat (:func:`summed_rows`): a step computes the same
    bits for each, and the write back writes them.

    >>> t = torch.zeros(4, 2)
    >>> e = Entries(torch.tensor([3, 1]), 2, torch.ones(2, 2), None)
    >>> e.scatter_(t, e.gather(t) + e.grad); t.sum(1).tolist()
    [0.0, 2.0, 0.0, 2.0]
    """

    __slots__ = ("grad", "keep", "rows", "width")

    def __init__(self, rows: torch.Tensor | None, width: int, grad: torch.Tensor,
                 keep: torch.Tensor | None) -> None:
        self.rows, self.width, self.grad, self.keep = rows, width, grad, keep

    def restricted(self, mask: torch.Tensor) -> Entries:
        """These entries where ``mask`` (a bool tensor shaped like the target) is True."""
        at = self.read(mask)
        keep = at if self.keep is None else self.keep & at
        return Entries(self.rows, self.width, self.grad, keep)

    def _rows_of(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the rows the entries index: flat for single elements (``index_select``
        and ``scatter_`` of a 1-D tensor take torch's fastest paths)."""
        return t.reshape(-1) if self.width == 1 else t.reshape(-1, self.width)

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` at the entries, to compute from (the whole of ``t`` itself, not a copy)."""
        if self.rows is None:
            return t
        return self._rows_of(t).index_select(0, self.rows)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` at the entries, as a tensor a step may change in place and
        :meth:`scatter_` writes back (``t`` itself where every element takes part)."""
        if self.rows is None:
            return t if self.keep is None else t.clone()
        return self._rows_of(t).index_select(0, self.rows)

    def scatter_(self, t: torch.Tensor, new: torch.Tensor) -> None:
        """Write ``new`` (shaped as :meth:`gather` gives) into ``t`` at the entries where
        ``keep`` holds; every other element of ``t`` keeps its bits."""
        new = new.to(t.dtype)
        if self.rows is None:
            if self.keep is not None:
                torch.where(self.keep, new, t, out=t)
            elif new is not t:
                t.copy_(new)
            return
        if self.keep is not None:
            new = torch.where(self.keep, new, self.read(t))
        work = t if t.is_contiguous() else t.contiguous()
        if self.width == 1:
            work.view(-1).scatter_(0, self.rows, new)
        else:
            work.view(-1, self.width).index_copy_(0, self.rows, new)
        if work is not t:
            t.copy_(work)


def summed_rows(rows: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, values)`` sorted by row, each row carrying the sum of all its values (Note
    [Duplicate rows without a host sync]): sizes stay ``n``, no host sync.

    >>> r, v = summed_rows(torch.tensor([2, 0, 2]), torch.tensor([[1.], [5.], [3.]]))
    >>> r.tolist(), v.flatten().tolist()
    ([0, 2, 2], [5.0, 4.0, 4.0])
    """
    n = rows.numel()
    if n < 2:
        return rows, values
    rows, order = torch.sort(rows)  # coalesce()'s sort: on the CPU, its sums bit for bit
    starts = torch.ones(n, dtype=torch.bool, device=rows.device)
    torch.ne(rows[1:], rows[:-1], out=starts[1:])
    run = torch.cumsum(starts, 0).sub_(1)
    sums = torch.full(values.shape, -0.0, dtype=values.dtype, device=values.device)
    sums.index_add_(0, run, values.index_select(0, order))
    return rows, sums.index_select(0, run)


def _coo_entries(grad: torch.Tensor, sum_duplicates: bool = True) -> Entries:
    """A torch COO gradient (hybrid or not, coalesced or not) as rows of its shape. Its
    duplicates are summed by ``coalesce()`` on the CPU (fewer rows for the step), by
    :func:`summed_rows` elsewhere (Note [Duplicate rows without a host sync])."""
    if sum_duplicates and not grad.is_coalesced() and _scatter.on_cpu(grad):
        grad = grad.coalesce()
    k = grad.sparse_dim()
    rows = linearize(grad._indices(), tuple(grad.shape[:k]))
    width = math.prod(grad.shape[k:])
    values = grad._values().reshape((-1, width) if width != 1 else (-1,))
    if sum_duplicates and not grad.is_coalesced():
        rows, values = summed_rows(rows, values)
    return Entries(rows, width, values, None)


def _masked_entries(s: Storage) -> Entries:
    """A MaskedTensor gradient's storage as entries of its shape."""
    if not s.index:
        return Entries(None, 0, s.values.expand(s.shape), s.mask)
    pos = positions(s)
    shape = (-1, pos.width) if pos.width != 1 else (-1,)
    keep = None if _all_specified(s.mask) else s.mask.expand(s.values.shape).reshape(shape)
    return Entries(pos.flat, pos.width, s.values.reshape(shape), keep)


def _all_specified(mask: torch.Tensor) -> bool:
    """True when ``mask`` is known to be True everywhere: a host read, on the CPU only."""
    return _scatter.on_cpu(mask) and all_specified(mask)


def grad_entries(grad: Any, shape: torch.Size, where: str,
                 sum_duplicates: bool = True) -> Entries:
    """Any gradient form as :class:`Entries` of a tensor of ``shape``."""
    if not isinstance(grad, MaskedTensor):
        if (isinstance(grad, torch.Tensor) and grad.layout == torch.sparse_coo
                and grad.shape == shape):
            return _coo_entries(grad, sum_duplicates)
        if (isinstance(grad, torch.Tensor) and grad.layout == torch.strided
                and grad.shape == shape):
            return Entries(None, 0, grad, None)
        grad = as_masked_grad(grad, where)  # other layouts; raises on what is no gradient
    if grad.shape != shape:
        raise ValueError(f"{where}: gradient of shape {tuple(grad.shape)} for a parameter of "
                         f"shape {tuple(shape)}")
    return _masked_entries(grad._storage)


def entries_for(param: torch.Tensor, grad: Any, where: str) -> tuple[torch.Tensor, Entries]:
    """``(target, entries)``: the plain tensor to update for ``param`` and the entries of it
    where ``grad`` is specified (for a MaskedTensor parameter, and the parameter too).

    >>> import masked_sparse as ms
    >>> g = torch.sparse_coo_tensor([[2, 0, 2]], [1., 5., 3.], (4,))
    >>> target, e = entries_for(torch.zeros(4), g, "example")
    >>> e.rows.tolist(), e.grad.flatten().tolist()   # on the CPU: coalesced
    ([0, 2], [5.0, 4.0])
    """
    if not isinstance(param, MaskedTensor):
        return param, grad_entries(grad, param.shape, where)
    ps = param._storage
    if not ps.index and ps.values.shape == ps.shape:  # every position stored
        e = grad_entries(grad, ps.shape, where)
        return ps.values, e.restricted(ps.mask)
    values, keep = _read_at_pattern(ps, grad, where)
    keep = ps.mask if keep is None else ps.mask & keep
    return ps.values, Entries(None, 0, values, keep)


def _read_at_pattern(ps: Storage, grad: Any,
                     where: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``grad``'s values and mask (None: all specified) at the stored positions of a sparse
    parameter storage ``ps``, shaped like its values; duplicates summed."""
    if isinstance(grad, MaskedTensor):
        if grad.shape != ps.shape:
            raise ValueError(f"{where}: gradient of shape {tuple(grad.shape)} for a parameter "
                             f"of shape {tuple(ps.shape)}")
        gs = grad._storage
        if same_pattern(ps, gs):
            return gs.values, gs.mask
        if not gs.index:
            return gather_at(gs.values.expand(gs.shape), ps), gather_at(
                gs.mask.expand(gs.shape), ps)
    elif (isinstance(grad, torch.Tensor) and grad.layout == torch.strided
          and grad.shape == ps.shape):
        return gather_at(grad, ps), None
    return _looked_up(ps, grad_entries(grad, ps.shape, where, sum_duplicates=False))


def _looked_up(ps: Storage, e: Entries) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries ``e`` (rows of the parameter's shape, repeats allowed) read at the stored
    elements of ``ps``: a binary search of each element's key among the parameter's sorted
    element keys, values added in with ``index_add_`` (repeats sum), found elements counted."""
    pos = positions(ps)
    n = ps.values.numel()
    device = ps.values.device
    inner = torch.arange(e.width, device=device)
    keys = (e.rows[:, None] * e.width + inner).reshape(-1)
    values = e.grad.reshape(-1).to(ps.values.dtype)
    pkeys = (pos.flat[:, None] * pos.width + torch.arange(pos.width, device=device)).reshape(-1)
    order = None
    if not pos.ordered:
        pkeys, order = torch.sort(pkeys)
    out = torch.full((n,), -0.0, dtype=values.dtype, device=device)
    hits = torch.zeros(n, dtype=torch.int32, device=device)
    if n and keys.numel():
        at = torch.searchsorted(pkeys, keys).clamp_(max=n - 1)
        found = pkeys.index_select(0, at) == keys
        if e.keep is not None:
            found &= e.keep.expand(e.grad.shape).reshape(-1)
        slot = at if order is None else order.index_select(0, at)
        zero = torch.full((), -0.0, dtype=values.dtype, device=device)
        out.index_add_(0, slot, torch.where(found, values, zero))
        hits.index_add_(0, slot, found.to(torch.int32))
    return out.view(ps.values.shape), hits.view(ps.values.shape) > 0
