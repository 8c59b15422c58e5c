"""The cumsum family: the running sum along lines, as ``masked_sparse::cumsum_lines``.

Note [The cumsum family]
~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once:

- per line (``offsets``: int64 pointers from 0 to the number of values; the lines hold
  every element, in order; empty lines allowed), the running sum of the values along dim
  0, restarting at each line. No mask: the caller fills the unspecified elements with 0
  first (``masked_sparse``'s scans), so they add nothing.
- On CPU the native kernel (``_native.cumsum_lines``: accumulated in double and rounded
  at every element, ``torch.cumsum`` of each line bit for bit); elsewhere the segmented
  scan of torch ops (:func:`segmented_cumsum`, Note [Segmented running sum]): within a
  rounding of the sequential sum, inf and NaN confined to their line and the elements
  after them, no host sync.
- Gradient: the reverse running sum along the same lines (the lines flipped, their running
  sums, flipped back: the family again, so the double backward works too).

The route is the families' (Note [Kernel families as ops]): the direct call, a Function
with the backward above when the values require grad, the op while torch.compile traces
(for 1-D real floating values and int64 offsets), the torch ops under other tracers.
:func:`cumsum_lines` serves real floating values; it returns None for others (integers,
complex: the caller's own exact paths).

>>> cumsum_lines(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 2, 4])).tolist()
[1.0, 3.0, 3.0, 7.0]
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _native
from ._ops import FLOATS, LIB
from ._route import direct, traced

Tensor = torch.Tensor


def _forward(values: Tensor, offsets: Tensor) -> Tensor:
    """The implementation for the values' device: the native kernel on CPU where it
    applies, else the torch ops."""
    out = _native.cumsum_lines(values, offsets) if values.is_cpu else None
    return out if out is not None else segmented_cumsum(values, offsets)


class _CumsumLines(torch.autograd.Function):
    """:func:`cumsum_lines` recorded with its backward, :func:`reverse_cumsum_lines`."""

    @staticmethod
    def forward(ctx, values: Tensor, offsets: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(offsets)
        return _forward(values, offsets)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple:  # type: ignore[override]
        (offsets,) = ctx.saved_tensors
        return reverse_cumsum_lines(grad, offsets), None


def cumsum_lines(values: Tensor, offsets: Tensor) -> Tensor | None:
    """Per line of ``offsets`` the running sum of ``values`` (Note [The cumsum family]);
    differentiable; None for values that are not real floating point."""
    if not values.is_floating_point():
        return None
    if direct(values):
        return _forward(values, offsets)
    if traced(values):
        if (torch.compiler.is_compiling() and values.dtype in FLOATS and values.dim() == 1
                and offsets.dim() == 1 and offsets.dtype == torch.long):
            return cumsum_lines_op(values, offsets)
        return segmented_cumsum(values, offsets)
    return _CumsumLines.apply(values, offsets)


def reverse_cumsum_lines(grad: Tensor, offsets: Tensor, running: Any = None) -> Tensor:
    """The backward of a running sum per line: the reverse running sum of ``grad`` along
    the lines of ``offsets`` -- the lines flipped, their running sums, flipped back. The
    running sum is ``running`` (the op, in its own backward), else :func:`cumsum_lines`
    (recorded when ``grad`` requires grad).

    >>> reverse_cumsum_lines(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 3, 4])).tolist()
    [6.0, 5.0, 3.0, 4.0]
    """
    flipped, back = grad.flip(0), (offsets[-1] - offsets).flip(0)
    out = (cumsum_lines if running is None else running)(flipped, back)
    if out is None:  # (not floating point)
        out = segmented_cumsum(flipped, back)
    return out.flip(0)


def segmented_cumsum(values: Tensor, offsets: Tensor) -> Tensor:
    """The running sum of ``values`` along dim 0 restarting at each line of ``offsets``
    (int, from 0 to ``values.shape[0]``, empty lines allowed), by torch ops alone: the
    implementation of every device without the kernel, with no host sync.

    Note [Segmented running sum]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch has no segmented scan. Subtracting each line's start from one running sum over
    every line would carry the earlier lines into a line (their rounding, their inf and
    NaN), and padding the lines into blocks needs the longest line on the host. So the
    elements go in blocks of ``_SCAN_BLOCK`` (a fixed width: padding known from the shape)
    and each block is scanned by doubling (Hillis-Steele, with the lines' first elements
    as flags): after the step of width ``k`` an element holds the sum of the up to ``2k``
    elements of its line ending at it within its block. What a line carries into a block
    is the same scan, one level down, over the blocks' last elements (a segment starts at
    a block holding a line's first element), added to the elements before the block's
    first line start. No element ever reads another line; the sum runs in float64 for
    float32 and narrower (float32 on MPS, which has no float64), rounded once at the end:
    within a rounding of the kernel's sequential sum (and of ``torch.cumsum``), NaN and inf
    confined to their line and to the elements after them, as torch's.

    >>> segmented_cumsum(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 2, 2, 4])).tolist()
    [1.0, 3.0, 3.0, 7.0]
    """
    n = values.shape[0]
    head = torch.zeros(n + 1, dtype=torch.bool, device=values.device)
    head = head.index_fill(0, offsets.long(), True)[:n]  # each line's first element
    wide = values.dtype
    if values.dtype in (torch.float16, torch.bfloat16, torch.float32):
        wide = torch.float32 if values.device.type == "mps" else torch.float64
    out = _flagged_scan(values.reshape(n, math.prod(values.shape[1:])).to(wide), head)
    return out.reshape(values.shape).to(values.dtype)


_SCAN_BLOCK = 32


def _flagged_scan(x: Tensor, head: Tensor) -> Tensor:
    """The running sums of ``x`` (n, m) along dim 0 restarting where ``head`` (n, bool;
    ``head[0]`` True) is: Note [Segmented running sum]."""
    n, m, width = x.shape[0], x.shape[1], _SCAN_BLOCK
    blocks = -(-n // width)
    pad = blocks * width - n
    if pad:  # each padding element a line of its own
        x = torch.cat([x, x.new_zeros(pad, m)])
        head = torch.cat([head, head.new_ones(pad)])
    xs, flags = x.view(blocks, width, m), head.view(blocks, width)
    slot = torch.arange(width, device=x.device)
    step = 1
    while step < width:
        before = torch.cat([xs.new_zeros(blocks, step, m), xs[:, :-step]], 1)
        keep = flags | (slot < step)
        xs = torch.where(keep.unsqueeze(-1), xs, xs + before)
        flags = flags | torch.cat([flags.new_zeros(blocks, step), flags[:, :-step]], 1)
        step *= 2
    if blocks > 1:  # what the open line carries into each block
        carry = _flagged_scan(xs[:, -1], flags[:, -1])[:-1]
        xs = torch.cat([xs[:1], torch.where(flags[1:].unsqueeze(-1), xs[1:],
                                            xs[1:] + carry.unsqueeze(1))])
    return xs.reshape(blocks * width, m)[:n]


# -- the op ---------------------------------------------------------------------------------
@torch.library.custom_op(f"{LIB}::cumsum_lines", mutates_args=())
def cumsum_lines_op(values: Tensor, offsets: Tensor) -> Tensor:
    """The running sum of 1-D ``values`` restarting at each line of ``offsets`` (int64,
    from 0 to the number of values); the implementation of every device but the CPU: the
    torch ops of :func:`segmented_cumsum`."""
    return segmented_cumsum(values, offsets)


@cumsum_lines_op.register_kernel("cpu")
def _(values, offsets):
    return _forward(values.contiguous(), offsets.contiguous())


@cumsum_lines_op.register_fake
def _(values, offsets):
    return torch.empty_like(values, memory_format=torch.contiguous_format)


def _setup(ctx, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(inputs[1])


def _backward(ctx, grad):
    (offsets,) = ctx.saved_tensors
    return reverse_cumsum_lines(grad, offsets, running=cumsum_lines_op), None


cumsum_lines_op.register_autograd(_backward, setup_context=_setup)
