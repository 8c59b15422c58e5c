"""The arg-extreme family: the masked maximum / minimum per group and where it is, as
``masked_sparse::arg_extreme``; and the full ``argmax`` / ``argmin`` kernel of the layouts'
``reduction`` tables (:func:`masked_arg`).

Note [The arg-extreme family]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once:

- per group, the masked extreme (``op`` "amax" / "amin": the reduce family's) and the
  smallest position (the grouping's ``positions()``: the row-major index within the
  reduced dims) of a specified element reaching it; NaN counts as the extreme, so the
  first specified NaN wins, as in torch's ``argmax``. Both are 0 where no element of the
  group is specified (the caller leaves them unspecified).
- torch's first-index rule, on every device: of the specified elements equal to the
  extreme, the first in row-major order. ``torch.masked.argmax`` fills the unspecified
  elements with the identity (-inf for argmax) and takes ``torch.argmax``: where the
  extreme *is* the identity (every specified element -inf, say) it may name an
  unspecified element before the first specified one. Here the answer is always a
  specified element -- the one deliberate difference; where torch's answer is a
  specified element, the two agree.
- Gradient of the extreme: the incoming gradient at the element the index names (as
  torch's ``max(dim)``), +0.0 elsewhere; the index is not differentiable.
- On CPU one native call (Note [Native arg-extremes]); elsewhere the torch ops (the masked
  extreme, the hits, the smallest of their positions per group), no host sync.

>>> from layouts.kernels import Groups
>>> v, m = torch.tensor([3., 7., 7.]), torch.tensor([True, False, True])
>>> top, at = masked_arg_extreme(Groups(3, positions=torch.arange(3)), v, m, "amax")
>>> top.tolist(), at.tolist()
([7.0], [2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _native
from .._fill import SAME_WIDTH_INT, zero_unspecified
from ..registry import Storage, get_layout
from ._groups import native_ids
from ._ops import LIB, describe, groups, register_autograd, size
from ._route import Family, direct, run, traced
from .reduce import masked_reduce

Tensor = torch.Tensor
_NONE = torch.iinfo(torch.long).max  # no position: not a hit


def _cpu(g: Any, values: Tensor, mask: Tensor, op: str) -> tuple | None:
    """``(extreme, position)`` per group in one native call, or None where no kernel
    applies."""
    kind = g.kind
    if (kind not in ("all", "lines", "scatter") or g.value_dims or not mask.shape[0]
            or not _native.arg_applies(values, mask, op)):  # dtype, device, 1-D
        return None
    if kind == "lines":
        return _native.arg_lines(values, mask, op, g.offsets, g.which, g.positions(), True)
    if kind == "all":  # (CPU: the kernels' offsets)
        return _native.arg_lines(values, mask, op, torch.tensor([0, mask.shape[0]]), None,
                                 g.positions(), True)
    ids = native_ids(g, values, mask)
    return _native.arg_scatter(values, mask, op, ids, g.n, g.positions(), True)


def _torch(g: Any, values: Tensor, mask: Tensor, op: str) -> tuple[Tensor, Tensor]:
    top = masked_reduce(g, values, mask, op)
    at = g.expand(top)
    hit = values == at
    if values.is_floating_point():
        hit = hit | (torch.isnan(values) & torch.isnan(at))
    at = g.reduce(torch.where(hit & mask, g.positions(), _NONE), "amin")
    found = at != _NONE
    return zero_unspecified(top, found), zero_unspecified(at, found)


class ARG(Family):
    """Per group, the masked extreme and its first position (Note [The arg-extreme
    family])."""

    name = "arg_extreme"

    @staticmethod
    def native(g, values, mask, op):
        return _cpu(g, values, mask, op)

    @staticmethod
    def torch(g, values, mask, op):
        return _torch(g, values, mask, op)

    @staticmethod
    def backward(g, values, mask, outs, grads, op):
        grad = grads[0]
        if grad is None:
            return torch.zeros_like(values)
        hit = mask & (g.positions() == g.expand(outs[1]))
        return zero_unspecified(g.expand(grad).expand_as(values), hit)

    @staticmethod
    def op(g, values, mask, op):
        spec = describe(g, values, mask)
        if spec is None:
            return None
        positions = g.positions()
        if positions.shape != values.shape:
            positions = positions.expand_as(values).contiguous()
        top, at = arg_extreme_op(values, mask, *spec, positions, op)
        return top, at


@torch.library.custom_op(f"{LIB}::arg_extreme", mutates_args=())
def arg_extreme_op(values: Tensor, mask: Tensor, offsets: Tensor | None,
                   which: Tensor | None, index: Tensor | None, n: int, positions: Tensor,
                   op: str) -> tuple[Tensor, Tensor]:
    """The arg-extreme family per group: the masked extreme and the first ``positions``
    reaching it."""
    g = groups(values, offsets, which, index, n, positions)
    top, at = ARG.torch(g, values, mask, op)
    return top, at


@arg_extreme_op.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, positions, op):
    g = groups(values, offsets, which, index, n, positions)
    top, at = ARG.forward(g, values, mask, op)
    return top, at


@arg_extreme_op.register_fake
def _(values, mask, offsets, which, index, n, positions, op):
    n = size(offsets, which, index, n)
    return values.new_empty(n), positions.new_empty(n)


register_autograd(arg_extreme_op, ARG, 8)


def masked_arg_extreme(g: Any, values: Tensor, mask: Tensor, op: str) -> tuple[Tensor, Tensor]:
    """Per group, the masked extreme (``op`` "amax" / "amin") and the smallest position of
    a specified element reaching it, both 0 where none is specified (Note [The arg-extreme
    family]); the extreme differentiable."""
    if direct(values):
        out = _cpu(g, values, mask, op) if values.is_cpu else None
        top, at = out if out is not None else _torch(g, values, mask, op)
        return top, at
    top, at = run(ARG, g, values, mask, op)
    return top, at


def masked_arg(storage: Storage, dims: tuple[int, ...], keepdim: bool, op: str,
               with_values: bool, coords: Callable[[Storage, int], list[int]]) -> Any:
    """The ``reduction`` kernel of ``argmax`` / ``argmin`` (``op`` "amax" / "amin") over
    every dim of a row-major storage with 1-D values (strided flattened, COO, CSR): the
    first specified extreme in storage order, which is the first in row-major order (NaN
    first) -- the native masked extreme, then the first specified element equal to it
    (``_native.first``); ``coords(storage, i)`` gives the coordinates of stored element
    ``i``. ``NotImplemented`` -- the generic route, the arg-extreme family on a grouping,
    which every device runs without a host read -- along some dims, with ``keepdim``, where
    no native kernel applies (another device, dtype or a tracer), or when no element is
    specified.

    >>> coo = get_layout("sparse_coo")
    >>> s = coo.from_strided(torch.tensor([[1., 5.], [7., 2.]]),
    ...                      torch.tensor([[True, True], [False, True]]))
    >>> out = masked_arg(s, (0, 1), False, "amax", False,
    ...                  lambda s, i: s.index[0][:, i].tolist())
    >>> out is NotImplemented or out.values.item() == 1
    True
    """
    values, mask = storage.values, storage.mask
    if (with_values or keepdim or len(dims) != len(storage.shape) or values.dim() != 1
            or values.numel() == 0 or values.dtype not in SAME_WIDTH_INT or traced(values)
            or not values.is_cpu):
        return NotImplemented
    if values.requires_grad:
        values = values.detach()  # an index: nothing to differentiate
    top = _native.reduce_all(values, mask, op)  # (not None: the kernels read both, first too)
    at = None if top is None else _native.first(values, mask, top, True)
    if at is None or at < 0:  # no kernel, or no element specified
        return NotImplemented
    key = 0  # the row-major position (``linearize``'s key), of Python ints: one tensor
    for c, n in zip(coords(storage, at), storage.shape):
        key = key * n + c
    # (CPU values: the kernels ran; scalar_tensor: the 0-d tensors torch.tensor(key) and
    # torch.tensor(True) build, without torch.tensor's parsing of a Python object)
    return get_layout("strided").build((), torch.scalar_tensor(key, dtype=torch.long),
                                       torch.scalar_tensor(True, dtype=torch.bool), ())
