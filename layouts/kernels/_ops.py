"""The plumbing every family's ``torch.library`` op shares (Note [Kernel families as ops]).

Each family module defines one op, ``masked_sparse::<family>``, whose arguments start with
``(values, mask, offsets, which, index, n)``: the groups as plain tensors (a
:class:`~layouts.kernels._groups.Groups` record): every element in one group (no ``offsets``,
no ``index``), lines (``offsets``, int64 pointers, and the listed lines ``which``, None:
all; the listed lines hold every element, in order), or a scatter (the group ``index`` of
every element into ``n`` groups). Every output is sized from those arguments alone (1, the
number of lines, ``n``), so a fake (shape-only) implementation reads no data. The CPU
kernel is the family's ``forward`` (the native kernels where they apply, else the torch
ops), the default kernel (every other device) its ``torch``, the autograd its ``backward``
on the record: a compiled graph runs what eager code runs, bit for bit.

>>> import torch
>>> describe(Groups(3), torch.ones(3), torch.ones(3, dtype=torch.bool))
(None, None, None, 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._groups import Groups

LIB = "masked_sparse"
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def describe(g: Any, values: torch.Tensor, mask: torch.Tensor) -> tuple | None:
    """``(offsets, which, index, n)``: the groups of ``g`` as the ops take them, or None
    where they have no such form or the values are not 1-D real floats with a bool mask of
    their shape (the caller runs the torch ops, which the tracer records)."""
    kind = g.kind
    if (kind not in ("all", "lines", "scatter") or g.value_dims or values.dim() != 1
            or values.dtype not in FLOATS or mask.dtype != torch.bool
            or mask.shape != values.shape):
        return None
    if kind == "all":
        return None, None, None, 1
    if kind == "lines":
        return g.offsets, g.which, None, g.n
    return None, None, g.ids, g.n


def size(offsets: torch.Tensor | None, which: torch.Tensor | None,
         index: torch.Tensor | None, n: int) -> int:
    """The number of groups of an op's arguments (the length of its per-group outputs)."""
    if offsets is not None:
        return offsets.shape[0] - 1 if which is None else which.shape[0]
    return 1 if index is None else n


def groups(values: torch.Tensor, offsets: torch.Tensor | None, which: torch.Tensor | None,
           index: torch.Tensor | None, n: int, positions: torch.Tensor | None = None) -> Groups:
    """The record of an op's group arguments."""
    return Groups(values.shape[0], offsets, which, index, n, positions)


def register_autograd(op: Any, family: Any, nargs: int,
                      adapt: Callable[[Any, tuple, tuple], tuple] | None = None) -> None:
    """``op``'s autograd: the ``family``'s own backward on the record of its arguments
    (``adapt(arg, outs, grads)`` maps the op's outputs to the family's, where they differ);
    ``nargs`` is the op's number of arguments."""

    def setup(ctx, inputs: tuple, output: Any) -> None:
        values, mask, offsets, which, index, n, *rest = inputs
        ctx.set_materialize_grads(False)  # an output not used gets no gradient pass
        outs = output if isinstance(output, tuple) else (output,)
        positions = rest[0] if len(rest) == 2 else None
        ctx.save_for_backward(values, mask, offsets, which, index, positions, *outs)
        ctx.n, ctx.arg = n, rest[-1]

    def backward(ctx, *grads: torch.Tensor | None) -> tuple:
        values, mask, offsets, which, index, positions, *outs = ctx.saved_tensors
        g = groups(values, offsets, which, index, ctx.n, positions)
        outs, grads = tuple(outs), tuple(grads)
        if adapt is not None:
            outs, grads = adapt(ctx.arg, outs, grads)
        grad = family.backward(g, values, mask, outs, grads, ctx.arg)
        return (grad,) + (None,) * (nargs - 1)

    op.register_autograd(backward, setup_context=setup)
