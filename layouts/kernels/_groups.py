"""The groups of a reduction as the kernel families read them, and the raw torch kernels.

Note [Groups as a record]
~~~~~~~~~~~~~~~~~~~~~~~~~
A family reads only what describes the groups, from a grouping (``layouts.Grouping``: its
index facts, cached per index tensor) or from a :class:`Groups` record of plain tensors (a
custom op's arguments). The fields:

``kind``
    ``"all"`` (every element one group), ``"lines"`` (runs of consecutive elements between
    ``offsets``), ``"scatter"`` (a group id per element), ``"each"`` (every element its
    own group: no index dim reduced), ``"dense"`` (a strided tensor's slices over ``dims``)
    or ``"generic"`` (anything else: only the grouping's own ``reduce`` / ``expand``).
``n``
    the number of groups (all, lines, scatter, each); ``element_shape`` the values' shape.
``offsets``, ``which``
    lines: int64 pointers from 0 to the number of elements, and the listed lines (one
    group each, in order; None: every line is a group).
``ids``
    lines and scatter: the int64 group of every element (the line of each element for
    lines), built once per index tensor where the grouping caches its facts.
``narrowed_ids(values)``
    scatter: the group ids as the native kernels read them fastest (Note [Narrow group
    indices]), or None; ``slots``: None, or ``(keys, nslots, present)`` where elements
    fall into key slots and the present ones are the groups (Note [Reducing into key
    slots]: the kernels reduce into the slots and pick the groups after).
``column_order()``
    scatter: ``(perm, offsets)``, a stable permutation sorting the elements by group and
    the groups' offsets in that order (Note [Column order]).
``value_dims``, ``keepdim``
    trailing dense dims of the values reduced too (a hybrid COO tensor); ``dims``,
    ``keepdim``, ``out_shape``, ``shape`` for ``"dense"``.
``positions()``
    each element's row-major position within the reduced dims (``argmax``).
``reduce(values, op)``, ``expand(out)``, ``count(mask)``
    the plain reduction per group (:func:`raw_reduce` for the kinds above), a per-group
    tensor broadcast back onto the elements (:func:`raw_expand`), and the number of
    specified elements per group (int64; a grouping caches it per mask).

Note [Column order]
~~~~~~~~~~~~~~~~~~~
Across the stored lines (a CSR's column sums) the groups are scattered, and the raw
kernels are atomics (``index_add`` / ``scatter_reduce``). ``segment_reduce`` needs each
group's elements consecutive: the values gathered by a permutation sorting the elements by
group (stable: storage order within a group), then the groups' offsets. Both depend on the
index alone, so a grouping builds them once per index tensor with its other facts (an
``argsort`` and a count per group, no host sync) and every reduction over that index pays
one gather. The device table says where that beats the atomics (Note [The device table]).

>>> g = Groups(4, offsets=torch.tensor([0, 1, 4]))
>>> g.reduce(torch.tensor([1., 2., 3., 4.]), "sum").tolist()
[1.0, 9.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .. import _native
from .._fill import identity, zero_unspecified
from .._index import cached
from . import _device_table
from ._route import traced

OPS = ("sum", "prod", "amax", "amin", "any", "all")
_SEGMENT = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}
_HALF = (torch.float16, torch.bfloat16)
_transforms_active = torch._C._are_functorch_transforms_active


def reduced_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> torch.Size:
    """``shape`` with ``dims`` removed (or kept with size 1)."""
    if keepdim:
        return torch.Size(1 if d in dims else n for d, n in enumerate(shape))
    return torch.Size(n for d, n in enumerate(shape) if d not in dims)


def reduce_dense(values: torch.Tensor, dims: tuple[int, ...], keepdim: bool,
                 op: str) -> torch.Tensor:
    """``values`` reduced with ``op`` over ``dims`` with dense torch ops.

    ``dims=()`` reduces nothing (unlike ``torch.sum(x, ())``); size-0 reduced dims give
    0 (False for ``any``, True for ``all``) instead of torch's error for ``amax`` & co.
    """
    if not dims:
        return values.bool() if op in ("any", "all") else values
    if any(values.shape[d] == 0 for d in dims) and op != "sum":
        shape = reduced_shape(values.shape, dims, keepdim)
        if op in ("any", "all"):
            return torch.full(shape, op == "all", dtype=torch.bool, device=values.device)
        return torch.zeros(shape, dtype=values.dtype, device=values.device)
    if op in ("any", "all") and values.dtype == torch.bool and not torch.compiler.is_compiling():
        # uint8 amax/amin are vectorized; bool any/all are much slower on CPU. Inductor
        # compiles the plain any/all well and fails on the uint8 view of a bool tensor.
        small = values.view(torch.uint8)
        out = small.amax(dims, keepdim=keepdim) if op == "any" else small.amin(dims, keepdim)
        return out.view(torch.bool)
    if op == "sum":
        if (values.dtype == torch.bool and len(dims) == values.dim()
                and not torch.compiler.is_compiling()):
            # A whole mask's count (a mean's backward): ``count_nonzero`` reads the bytes
            # once, where a bool ``sum`` first converts every element to int64.
            count = torch.count_nonzero(values)
            return count.reshape((1,) * values.dim()) if keepdim else count
        return values.sum(dims, keepdim=keepdim)
    if op == "amax":
        return values.amax(dims, keepdim=keepdim)
    if op == "amin":
        return values.amin(dims, keepdim=keepdim)
    if op == "any":
        return values.any(dims, keepdim=keepdim)
    if op == "all":
        return values.all(dims, keepdim=keepdim)
    if op == "prod":
        for d in sorted(dims, reverse=True):
            values = values.prod(d, keepdim=keepdim)
        return values
    raise ValueError(f"reduce: unknown op {op!r}; expected one of {OPS}")


# -- the raw kernels per kind ---------------------------------------------------------------
def raw_reduce(g: Any, values: torch.Tensor, op: str) -> torch.Tensor:
    """``values`` (shaped as ``g``'s elements) reduced per group of ``g`` with ``op`` in
    :data:`OPS`: dense torch reductions for ``"dense"``, else along dim 0 by the kind
    (with any ``value_dims`` reduced densely first), the raw kernel per op and device from
    the device table (Note [The device table]); differentiable in ``values``. A group
    without an element reads the op's identity (the kernels' convention)."""
    kind = g.kind
    if kind == "dense":
        return reduce_dense(values, g.dims, g.keepdim, op)
    if kind == "generic":
        return g.reduce(values, op)
    v = values
    if op == "sum" and v.dtype == torch.bool:
        v = v.long()
    value_dims = g.value_dims
    if value_dims:
        v = reduce_dense(v, value_dims, True, op)
    if kind == "all":
        if v.shape[0]:
            v = reduce_dense(v, (0,), True, op)
        elif g.n:  # (a record's one group, of no element)
            v = reduce_dense(v.new_zeros((1,) + tuple(v.shape[1:])), (0,), True, op)
    elif kind in ("lines", "scatter"):
        v = _grouped(g, v, op)
    if value_dims and not g.keepdim:
        v = v.squeeze(value_dims)
    return v


def _grouped(g: Any, v: torch.Tensor, op: str) -> torch.Tensor:
    """``v`` reduced along dim 0 into ``g``'s lines or scattered groups by the raw kernel
    of the device table (Note [The device table]).

    Note [segment_reduce under torch.func]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch has no batching rule, forward AD or double backward for ``segment_reduce``:
    inside a transform the group ids route (``index_add`` / ``scatter_reduce``) runs. The
    families' own backwards never differentiate it (they run the families again).
    """
    name = "index_add"
    if v.is_floating_point() and op in _SEGMENT and not _transforms_active():
        name = _device_table.kernel(op, g.kind, v.device, v.shape[0])
        if name == "segment":
            if v.dtype in _HALF and op == "sum":  # accumulated in float32, as torch's sums
                return _segment(g, v.float(), op).to(v.dtype)
            return _segment(g, v, op)
    shape = (g.n,) + tuple(v.shape[1:])
    ids = g.ids
    if op == "sum" and name != "scatter":
        if v.dtype in _HALF:
            return v.new_zeros(shape, dtype=torch.float32).index_add(
                0, ids, v.float()).to(v.dtype)
        return v.new_zeros(shape).index_add(0, ids, v)
    if op in ("any", "all"):  # counting is faster than a bool scatter
        hits = (v if op == "any" else ~v.bool()).to(torch.int32)
        counts = torch.zeros(shape, dtype=torch.int32, device=v.device).index_add_(0, ids, hits)
        return counts > 0 if op == "any" else counts == 0
    index = ids.view((-1,) + (1,) * (v.dim() - 1)).expand_as(v)
    if op == "sum":  # (the table's "scatter" for a sum)
        wide = v.float() if v.dtype in _HALF else v
        return wide.new_zeros(shape).scatter_reduce(0, index, wide, "sum").to(v.dtype)
    if not (v.requires_grad and torch.is_grad_enabled()) and not traced(v):
        # Nothing to differentiate: starting from the identity, include_self=True saves
        # the initialization pass of False (an empty group reads the identity).
        init = 1 if op == "prod" else identity(op, v.dtype)
        return v.new_full(shape, init).scatter_reduce_(0, index, v, op)
    # scatter_reduce's backward shares the gradient of amax/amin with the initial ``self``
    # value when it ties with the result, even with include_self=False; NaN never ties.
    init = v.new_full(shape, float("nan")) if v.is_floating_point() and op != "prod" \
        else v.new_ones(shape)
    return init.scatter_reduce(0, index, v, op, include_self=False)


def _segment(g: Any, v: torch.Tensor, op: str) -> torch.Tensor:
    """``segment_reduce`` of ``v`` over ``g``'s lines (its pointers; the listed lines
    picked after), or over its column order (Note [Column order])."""
    if g.kind == "lines":
        out = torch.segment_reduce(v, _SEGMENT[op], offsets=g.offsets, unsafe=True)
        return out if g.which is None else out.index_select(0, g.which)
    perm, offsets = g.column_order()
    return torch.segment_reduce(v.index_select(0, perm), _SEGMENT[op], offsets=offsets,
                                unsafe=True)


def raw_expand(g: Any, out: torch.Tensor) -> torch.Tensor:
    """A per-group tensor ``out`` broadcast back onto ``g``'s elements (each element reads
    its group's value)."""
    kind = g.kind
    if kind == "dense":
        if not g.keepdim:
            for d in g.dims:
                out = out.unsqueeze(d)
        return out.expand(g.shape)
    if kind == "generic":
        return g.expand(out)
    if g.value_dims and not g.keepdim:
        for d in g.value_dims:
            out = out.unsqueeze(d)
    if kind == "lines":
        if out.dim() > 1:  # (a keepdim result's values)
            out = out.squeeze(1)
        out = out.index_select(0, g.ids)
    elif kind == "scatter":
        out = out.index_select(0, g.ids)
    return out.expand(g.element_shape)


def column_order(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, offsets)`` of Note [Column order] for the int64 group ``ids`` into ``n``
    groups: no host sync (the counts by ``index_add``, not ``bincount``).

    >>> perm, offsets = column_order(torch.tensor([1, 0, 1, 0]), 2)
    >>> perm.tolist(), offsets.tolist()
    ([1, 3, 0, 2], [0, 2, 4])
    """
    perm = torch.argsort(ids, stable=True)
    counts = torch.zeros(n, dtype=torch.long, device=ids.device).index_add_(
        0, ids, torch.ones_like(ids))
    return perm, torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def line_ids(offsets: torch.Tensor, which: torch.Tensor | None, size: int) -> torch.Tensor:
    """The (listed) line of every element, for lines holding every element in order: line
    ``i`` of the listed ones is group ``i``.

    >>> line_ids(torch.tensor([0, 2, 2, 3]), torch.tensor([0, 2]), 3).tolist()
    [0, 0, 1]
    """
    lengths = offsets.diff()
    if which is not None:
        lengths = lengths.index_select(0, which)
    return torch.repeat_interleave(torch.arange(lengths.shape[0], device=lengths.device),
                                   lengths, output_size=size)


def count(g: Any, mask: torch.Tensor) -> torch.Tensor:
    """Per group of ``g``, the number of True elements of the bool ``mask`` (int64): one
    native pass on CPU (``_native.count_*``), else a sum of the mask as int32 (exact below
    2**31 elements) by the raw kernels. A grouping keeps it per mask object (``count``,
    Note [Facts of a mask])."""
    out = _native_count(g, mask)
    if out is not None:
        return out
    small = mask.shape[0] < 2**31  # int32 counts cannot overflow
    return raw_reduce(g, mask.to(torch.int32 if small else torch.long), "sum").long()


def _native_count(g: Any, mask: torch.Tensor) -> torch.Tensor | None:
    kind = g.kind
    if kind == "lines":
        return _native.count_lines(mask, g.offsets, g.which)
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.count_all(mask) if mask.shape[0] else None
    return native_scatter(g, mask, lambda ids, n: _native.count_scatter(mask, ids, n))


# -- what the native kernels take of a record ------------------------------------------------
def native_scatter(g: Any, values: torch.Tensor, kernel: Any) -> torch.Tensor | None:
    """``kernel(index, n)`` over ``g``'s scattered groups, one native pass: over its
    narrowed group ids where it keeps them (the kernels write the groups directly), else
    over its key slots, the present ones picked after (Note [Reducing into key slots]),
    else over its group ids; None where the kernel does not apply."""
    narrowed = g.narrowed_ids(values)
    if narrowed is not None:
        out = kernel(narrowed, g.n)
        if out is not None:
            return out
    slots = g.slots
    if slots is None:
        return kernel(g.ids, g.n)
    keys, nslots, present = slots
    out = kernel(keys, nslots)
    if out is None or present.shape[0] == nslots:  # every slot a group
        return out
    return out.index_select(0, present)


def native_ids(g: Any, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """The group ids a scatter kernel reads for ``g`` (their narrowed copy where the
    grouping keeps one), or None where no kernel takes ``values`` and ``mask``."""
    if not _native._applies(values, mask):
        return None
    ids = g.narrowed_ids(values)
    return ids if ids is not None else g.ids


def native_deviations(g: Any, f: str, values: torch.Tensor, mask: torch.Tensor,
                      center: torch.Tensor) -> torch.Tensor | None:
    """Per group, the sum over the specified elements of ``f(values - center)`` (``f``
    "sqdev": the square, a variance's second pass; "sumexp": ``exp``, a logsumexp's) in
    one native pass (``_native.deviations_*``), or None where no kernel applies."""
    kind = g.kind
    if kind == "lines":
        return _native.deviations_lines(f, values, mask, center, g.offsets, g.which)
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.deviations_all(f, values, mask, center) if mask.shape[0] else None
    ids = native_ids(g, values, mask)
    return None if ids is None else _native.deviations_scatter(f, values, mask, center, ids,
                                                               g.n)


def operand(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` as a backward multiplies them: as they are when the backward is not
    differentiated (the result is filled once, at the end), else filled with 0 first, so
    that what an unspecified element holds (NaN, inf) never meets a zero gradient in the
    double backward (Note [Fill before transform])."""
    return zero_unspecified(values, mask) if torch.is_grad_enabled() else values


def native_backward(g: Any, op: str, mask: torch.Tensor, a: torch.Tensor,
                    **operands: Any) -> torch.Tensor | None:
    """A family's gradient with respect to the elements in one native pass over ``g``'s
    groups (``_native.backward``: ``op``, the per-group ``a`` and the ``operands``), or
    None: where the backward is itself recorded (``create_graph=True``: the torch ops,
    differentiable, run), where a tracer runs, and where no kernel applies (other kinds,
    devices or dtypes, no library). No detach: grad mode is off here, and the kernel only
    reads its operands."""
    if torch.is_grad_enabled() or traced(a):  # (traced: fake or functorch tensors)
        return None
    kind = g.kind
    if kind == "lines":
        return _native.backward(op, mask, a, offsets=g.offsets, which=g.which, **operands)
    if kind not in ("all", "scatter") or g.value_dims or not mask.shape[0]:
        return None
    if kind == "all":
        offsets = torch.tensor([0, mask.shape[0]])  # (CPU: the only device kernels serve)
        return _native.backward(op, mask, a, offsets=offsets, **operands)
    ids = g.narrowed_ids(a)
    if ids is None:
        ids = g.ids
    return _native.backward(op, mask, a, index=ids, n=g.n, **operands)


def native_softmax_backward(g: Any, mask: torch.Tensor, out: torch.Tensor,
                            grad: torch.Tensor) -> torch.Tensor | None:
    """The softmax's gradient along ``g``'s lines in one native call
    (``_native.softmax_backward``: the same bits as the family's composed backward), or
    None where :func:`native_backward` would not run either, or ``g`` is not lines."""
    if g.kind != "lines" or torch.is_grad_enabled() or traced(grad):
        return None
    return _native.softmax_backward(out, grad, mask, g.offsets, g.which)


def per_head(g: Any, values: torch.Tensor) -> Groups | None:
    """``g``'s groups over the elements of hybrid ``values`` ``(nnz, h...)`` with every head
    a group of its own, as a :class:`Groups` record over the flat ``nnz * H`` elements (the
    values read as ``values.reshape(-1)``), so that the 1-D kernels, native ones included,
    serve several heads over one index in one call; None where ``values`` are 1-D, ``g``
    reduces dense dims too, or its kind is not lines or scatter.

    Note [Heads as groups]
    ~~~~~~~~~~~~~~~~~~~~~~
    A hybrid COO tensor's softmax over a sparse dim groups each head apart: element
    ``(e, h)`` joins group ``(group(e), h)``. One head reads ``g``'s own lines or group ids
    over ``nnz`` elements; ``H`` heads read the flat group ids ``group(e) * H + h``, built
    once per index (cached on ``g``'s ids, which the grouping caches per index tensor).
    The results are the per-element ones of the 2-D kernels, head by head. One head over
    groups that are runs of consecutive elements (a coalesced hybrid COO along its columns:
    each row's entries) reads them as lines on the CPU, as the 2-D matrix's softmax does
    (its row pointers): one pass per line, not a scatter into groups. There the softmax and
    its fused backward read the ``(nnz, 1)`` column of values as it is and write their
    result in its shape (``_native._column``): no reshape to the flat elements and back.

    >>> g = Groups(2, index=torch.tensor([1, 0]), n=2)
    >>> per_head(g, torch.zeros(2, 3)).index.tolist()
    [3, 4, 5, 0, 1, 2]
    """
    if values.dim() == 1 or g.value_dims or g.kind not in ("lines", "scatter"):
        return None
    heads = math.prod(values.shape[1:])
    size = values.shape[0] * heads
    if heads == 1:
        if g.kind == "lines":
            return Groups(size, offsets=g.offsets, which=g.which)
        runs = getattr(g, "run_offsets", None)
        if runs is not None and values.is_cpu:
            return Groups(size, offsets=runs)
        return Groups(size, index=g.ids, n=g.n)
    ids = g.ids

    def flat() -> torch.Tensor:
        return (ids[:, None] * heads + torch.arange(heads, device=ids.device)).reshape(-1)

    return Groups(size, index=cached(ids, ("heads as groups", heads), flat), n=g.n * heads)


# -- a record of plain tensors ---------------------------------------------------------------
class Groups:
    """The groups of a custom op's arguments (Note [Groups as a record]): all
    (``offsets`` and ``index`` None), lines (``offsets``, ``which``) or scatter (the group
    ``index`` of every element into ``n`` groups), over ``size`` 1-D elements;
    ``positions`` for the arg family. Nothing is cached: the facts are built per call.

    >>> g = Groups(3, index=torch.tensor([1, 0, 1]), n=2)
    >>> g.expand(torch.tensor([5., 7.])).tolist()
    [7.0, 5.0, 7.0]
    """

    value_dims: tuple[int, ...] = ()
    keepdim = False
    slots = None

    def __init__(self, size: int, offsets: torch.Tensor | None = None,
                 which: torch.Tensor | None = None, index: torch.Tensor | None = None,
                 n: int = 1, positions: torch.Tensor | None = None) -> None:
        self.element_shape = (size,)
        self.offsets, self.which, self.index = offsets, which, index
        self._positions = positions
        if offsets is not None:
            self.kind = "lines"
            n = offsets.shape[0] - 1 if which is None else which.shape[0]
        elif index is None:
            self.kind, n = "all", 1
        else:
            self.kind = "scatter"
        self.n = n

    @property
    def ids(self) -> torch.Tensor:
        if self.kind == "scatter":
            return self.index.long()
        return line_ids(self.offsets, self.which, self.element_shape[0])

    def narrowed_ids(self, values: torch.Tensor) -> torch.Tensor | None:
        return self.index  # (the kernels read every index type the op takes)

    def column_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        return column_order(self.ids, self.n)

    def positions(self) -> torch.Tensor:
        return self._positions

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        return raw_reduce(self, values, op)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        return raw_expand(self, out)

    def count(self, mask: torch.Tensor) -> torch.Tensor:
        return count(self, mask)

    def describe(self) -> tuple:
        """``(offsets, which, index, n)``: the groups as the custom ops take them."""
        return self.offsets, self.which, self.index, self.n
