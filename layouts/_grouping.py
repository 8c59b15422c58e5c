"""Reductions as *groupings*: which output element each stored element reduces into.

A reduction over a set of dims partitions a tensor's elements into groups, one per output
element. A layout answers every reduction (sum, mean, var, argmax, median, softmax, ...)
by building one :class:`Grouping` for its storage: a description of the groups, cached
per index tensor where it comes from the index alone (Note [Index facts of a grouping]).
The core (``masked_sparse``) writes the semantics once in terms of the primitives below
and of the kernel families (``layouts.kernels``: ``masked_sum``, ``masked_var``,
``masked_softmax``, ...), which read the grouping's description (Note [Groups as a
record]) and compute -- dense ``torch.sum(dim)`` for strided, one native pass or segment /
scatter kernels over the stored values for sparse layouts. A layout registers its builder
as ``group=builder``; a layout without one is reduced through its COO form
(``layouts.group_by``), in O(nnz), never densified.

Primitives (all on plain tensors, differentiable with respect to ``values``)
--------------------------------------------------------------------------
``source``
    The storage whose ``values``/``mask`` the other primitives take (the input storage
    itself, or its COO form for layouts reduced through COO).
``reduce(values, op)``
    ``values`` shaped like ``source.values``, reduced per group with ``op`` in
    :data:`OPS`; the result holds the output storage's values. Every group of a sparse
    grouping has at least one stored element; a group without any element (a size-0
    reduced dim) reads 0 (False for ``any``, True for ``all``).
``expand(out)``
    An output-values tensor broadcast back onto ``source.values`` (each element reads its
    group's value): how means and maxima are subtracted before a second pass.
``positions()``
    Each element's row-major index within the reduced dims (its coordinate along the dim
    for one reduced dim, its linear index when every dim is reduced), broadcastable to
    ``source.values``: what ``argmax`` / ``max(dim)`` return.
``select(values, mask, rank)``
    Per group, the element of ascending-order ``rank`` among the ``mask``-ed elements
    (NaN sorts last), as ``(values, positions)``: how medians are picked.
``build(out_values, out_mask)``
    The output :class:`Storage` (its layout is the layout's choice).
``restore(values)``
    An elementwise result (shaped like ``source.values``) as a storage of the *input's*
    layout, sharing its index tensors where possible (softmax).

and the description the kernel families read (Note [Groups as a record]): ``kind``
(``"generic"`` here: a grouping known only by the primitives above), ``n``, ``offsets``,
``which``, ``ids``, ``narrowed_ids``, ``slots``, ``column_order``, ``value_dims``,
``count``.

>>> import torch, layouts
>>> s = layouts.get_layout("strided").from_torch(torch.ones(2, 3), torch.ones(2, 3).bool())
>>> g = layouts.group_by(s, (1,), keepdim=False)
>>> g.reduce(s.values, "sum").tolist()
[3.0, 3.0]
"""

from __future__ import annotations

import torch

from .kernels._groups import OPS, column_order
from .registry import Storage

__all__ = ["OPS", "Grouping", "sort_order"]


class Grouping:
    """How the elements of one storage fall into the groups of a reduction over ``dims``.

    Subclasses implement the primitives described in the module docstring; ``dims`` is a
    sorted tuple of non-negative dims, ``keepdim`` keeps them with size 1.
    """

    source: Storage
    dims: tuple[int, ...]
    keepdim: bool
    out_shape: torch.Size

    # -- the description the kernel families read (Note [Groups as a record]) -----------
    kind = "generic"
    offsets: torch.Tensor | None = None
    which: torch.Tensor | None = None
    value_dims: tuple[int, ...] = ()
    slots: tuple | None = None

    @property
    def element_shape(self) -> torch.Size:
        return self.source.values.shape

    @property
    def n(self) -> int:
        raise NotImplementedError

    @property
    def ids(self) -> torch.Tensor:
        raise NotImplementedError

    def narrowed_ids(self, values: torch.Tensor) -> torch.Tensor | None:
        return None

    def column_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        return column_order(self.ids, self.n)

    def count(self, mask: torch.Tensor) -> torch.Tensor:
        """Per group, the number of True elements of the bool ``mask`` (int64)."""
        return self.reduce(mask, "sum")

    # -- the primitives -----------------------------------------------------------------
    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        raise NotImplementedError

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def positions(self) -> torch.Tensor:
        raise NotImplementedError

    def select(self, values: torch.Tensor, mask: torch.Tensor,
               rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        raise NotImplementedError

    def restore(self, values: torch.Tensor) -> Storage:
        raise NotImplementedError


def sort_order(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Indices along ``dim`` that put the ``mask``-ed elements first, in ascending order of
    value (NaN last, ties by position), then the others."""
    order = torch.argsort(values.detach(), dim=dim, stable=True)
    unmasked = (~mask).gather(dim, order).to(torch.uint8)
    return order.gather(dim, torch.argsort(unmasked, dim=dim, stable=True))
