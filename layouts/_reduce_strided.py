"""Reductions of the strided layout: dense torch reductions over the reduced dims.

Every element is stored, so a group is a dense slice: ``reduce`` is ``torch.sum(dims)``
& co., ``expand`` a broadcast, ``select`` a sort along the flattened reduced dims. The
core fills unspecified elements with the op's identity before calling ``reduce``.

Note [Fused masked sum]
~~~~~~~~~~~~~~~~~~~~~~~
``torch.where(mask, data, 0).sum(dim)`` is memory-bound twice over: ``where`` writes a
full-size temporary (and its CPU kernel is not vectorized), then ``sum`` reads it again;
counting with ``mask.sum(dim)`` is as slow. Without autograd, :func:`fused_masked_sum`
walks the tensor in cache-sized row blocks: the mask, negated once as int8 (-1 / 0), is
copied block by block into an integer buffer of the data's width (sign extension makes
all-ones / zero bits; minus its sum is the count) and AND-ed with the data's bits, which
leaves each specified element bit for bit and a +0 elsewhere (NaN or inf under the mask
included), and the block is summed from cache. It is exact, reads data and mask once and
allocates one small buffer (and the int8 mask); ``benchmarks/bench_core.py`` times it.
It is the CPU forward of the strided sum family (Note [One kernel route]): with autograd
the same pass runs, recorded with the family's backward. For other dtypes / layouts of
memory / devices the plain ``where`` path runs.
Under torch.compile / torch.export (``torch.compiler.is_compiling()``) the plain path runs
too: Inductor fuses ``where + sum`` into one pass by itself, while the Python block loop
would be unrolled into hundreds of small kernels (``benchmarks/bench_compile.py``). There
every kernel reads the mask through :func:`vector_mask` (Note [Compiled mask loads]); outputs
keep the input's own mask (``restore``).
"""

from __future__ import annotations

import math

import torch

from . import _native
from ._grouping import (
    Grouping,
    fill_unspecified,
    plain_eager,
    reduce_dense,
    reduced_shape,
    sort_order,
)
from ._index import linearize
from ._vector_mask import vector_mask
from .registry import Storage

# Same-size integer views for a bitwise "where(mask, x, 0)" (Note [Fused masked sum]).
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.int32: torch.int32,
        torch.int64: torch.int64}


class StridedGrouping(Grouping):
    """Groups of a dense tensor: the slices over ``dims``."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.input = self.source = storage
        if torch.compiler.is_compiling():  # Note [Compiled mask loads]
            self.source = storage.with_values(storage.values, vector_mask(storage.mask))
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(storage.shape, dims, keepdim)

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        return reduce_dense(values, self.dims, self.keepdim, op)

    def _native_reduce(self, op: str, values: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor | None:
        out = self._native_full(op, values, mask)
        if out is None and op == "sum":
            fused = fused_masked_sum(values, mask, self.dims, self.keepdim, False)
            out = None if fused is None else fused[0]
        return out

    def masked_sum(self, values: torch.Tensor, mask: torch.Tensor,
                   with_count: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if with_count and not (values.requires_grad and torch.is_grad_enabled()):
            # the count in the same pass (the total is the sum family's forward, bit for bit)
            total = self._native_full("sum", values, mask)
            if total is not None:
                return total, self._native_full("count", mask, mask)
            fused = fused_masked_sum(values, mask, self.dims, self.keepdim, True)
            if fused is not None:
                return fused
        return super().masked_sum(values, mask, with_count)

    def _native_full(self, op: str, values: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor | None:
        """A reduction over every dim of contiguous ``values`` ("sum", "amax", "amin", or
        "count" of ``mask``) in one native pass (Note [Native reductions]), else None."""
        if (len(self.dims) != values.dim() or not self.dims or not values.numel()
                or mask.shape != values.shape or not values.is_contiguous()
                or not mask.is_contiguous()):
            return None
        flat = mask.view(-1)
        out = _native.count_all(flat) if op == "count" else \
            _native.reduce_all(values.view(-1), flat, op)
        return None if out is None else out.view(self.out_shape)

    def softmax(self, values: torch.Tensor, mask: torch.Tensor,
                log: bool) -> tuple[torch.Tensor, bool]:
        if len(self.dims) != 1:
            return super().softmax(values, mask, log)
        if not log and _fused_softmax_applies(values, mask):
            return _MaskedSoftmax.apply(values, mask, self.dims[0]), True
        filled = fill_unspecified(values, mask, -math.inf)  # weighs nothing
        return (torch.log_softmax if log else torch.softmax)(filled, self.dims[0]), False

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if not self.keepdim:
            for d in self.dims:
                out = out.unsqueeze(d)
        return out.expand(self.source.shape)

    def positions(self) -> torch.Tensor:
        shape = self.source.shape
        device = self.source.values.device
        coords = []
        for d in self.dims:
            view = [1] * len(shape)
            view[d] = shape[d]
            coords.append(torch.arange(shape[d], device=device).view(view))
        return linearize(coords, [shape[d] for d in self.dims])

    def select(self, values: torch.Tensor, mask: torch.Tensor,
               rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.source.shape
        kept = [d for d in range(len(shape)) if d not in self.dims]
        kept_shape = [shape[d] for d in kept]
        size = 1
        for d in self.dims:
            size *= shape[d]
        if size == 0:
            return (values.new_zeros(self.out_shape),
                    torch.zeros(self.out_shape, dtype=torch.long, device=values.device))
        perm = kept + list(self.dims)
        v = values.permute(perm).reshape(kept_shape + [size])
        m = mask.permute(perm).reshape(kept_shape + [size])
        order = sort_order(v, m)
        at = order.gather(-1, rank.reshape(kept_shape + [1]).clamp(0, size - 1))
        return v.gather(-1, at).reshape(self.out_shape), at.reshape(self.out_shape)

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        return self.source.layout.build((), out_values, out_mask, out_values.shape)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.input.with_values(values)  # the input's own mask object


_BLOCK = 1 << 18  # elements per row block (stays in cache)
_FUSE_MIN = 1 << 16


def fused_masked_sum(values: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...],
                     keepdim: bool, with_count: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(where(mask, values, 0).sum(dims), mask.sum(dims))`` in row blocks, or None when the
    fast path does not apply (see Note [Fused masked sum])."""
    bits = BITS.get(values.dtype)
    if (bits is None or not dims or values.numel() < _FUSE_MIN or values.device.type != "cpu"
            or not plain_eager(values) or type(values) is not torch.Tensor
            or not values.is_contiguous() or not mask.is_contiguous()):
        return None
    shape = values.shape
    nrows = shape[0]
    row = values.numel() // nrows
    if row > _BLOCK:
        return None
    step = max(1, _BLOCK // row)
    out_shape = reduced_shape(shape, dims, True)
    across = 0 in dims  # blocks of dim 0 add up into one output, else fill their own rows
    total = torch.zeros(out_shape, dtype=values.dtype)
    count = torch.zeros(out_shape, dtype=torch.long) if with_count else None
    buf = torch.empty((min(step, nrows),) + tuple(shape[1:]), dtype=bits)
    data_bits = values.view(bits)
    signs = mask.view(torch.int8).neg()  # -1 / 0: sign-extends to all bits / none
    for start in range(0, nrows, step):
        stop = min(nrows, start + step)
        block = buf[: stop - start]
        block.copy_(signs[start:stop])
        if count is not None:
            part = block.sum(dims, keepdim=True, dtype=torch.int32).neg_()  # < 2**31
            if across:
                count += part
            else:
                count[start:stop] = part
        block.bitwise_and_(data_bits[start:stop])
        part = block.view(values.dtype).sum(dims, keepdim=True, dtype=values.dtype)
        if across:
            total += part
        else:
            total[start:stop] = part
    if not keepdim:
        total = total.squeeze(dims)
        count = count.squeeze(dims) if count is not None else None
    return total, count


# Note [Fused masked softmax]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Attention's ``softmax(as_masked_tensor(scores, mask), -1)`` under autograd, as the dense
# ``-inf`` recipe computes it: one ``where`` to -inf, torch's softmax, and nothing else that
# allocates. The softmax output is exact 0 at every unspecified element of a line holding
# a specified one (exp(-inf) = 0); only a fully masked line is 0/0, so the output is then
# zero filled *in place* by its bits (an integer product with the mask compacted over its
# broadcast dims: one head-shared mask is read once per stored element, NaN bits become
# +0.0). That zero-filled output is what autograd saves: the softmax gradient
# ``p * (g - sum(g * p))`` is then 0 wherever ``p`` is (every unspecified element), and the
# same in-place fill of the gradient clears any NaN or inf the incoming gradient held
# there. The result is tagged zero filled, so the matrix product after it fills nothing.
# While torch.compile traces (AOTAutograd runs this Function on fake tensors) both in-place
# fills are one ``where`` that Inductor fuses into the softmax's kernels: the graph then
# saves the zero-filled output, as the dense recipe saves its softmax, and the product
# reads that very buffer (no second filled copy). torch.func transforms, double backward
# (the backward builds a graph: ``where`` instead) and dtypes without a same-width integer
# take the plain route. Measured by ``benchmarks.bench_training_ops`` (attention rows).


def _compact(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with its broadcast (stride 0) dims cut to size 1."""
    for d in range(mask.dim()):
        if mask.stride(d) == 0 and mask.shape[d] > 1:
            mask = mask.narrow(d, 0, 1)
    return mask


def _fused_softmax_applies(values: torch.Tensor, mask: torch.Tensor) -> bool:
    if torch._C._are_functorch_transforms_active() or torch.compiler.is_dynamo_compiling():
        return False
    if torch.compiler.is_compiling():  # traced: any device, any float dtype
        return values.dtype.is_floating_point and mask.dtype == torch.bool \
            and mask.shape == values.shape
    return (values.dtype in _INT_OF and mask.dtype == torch.bool
            and mask.shape == values.shape and values.device.type == "cpu")


def _zero_fill_(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous, fresh) with every unspecified element set to +0.0 in place;
    while tracing, one ``where`` that Inductor fuses into the kernel computing ``t``."""
    if torch.compiler.is_compiling():
        return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))
    t.view(_INT_OF[t.dtype]).mul_(_compact(mask))
    return t


_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


class _MaskedSoftmax(torch.autograd.Function):
    """Softmax over the specified elements along ``dim``, 0 elsewhere (Note [Fused masked
    softmax])."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
        filled = fill_unspecified(values, mask, -math.inf)  # (a where while tracing)
        out = torch.softmax(filled, dim)
        del filled
        if not out.is_contiguous():
            out = out.contiguous()
        out = _zero_fill_(out, mask)
        ctx.save_for_backward(out, mask)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out, mask = ctx.saved_tensors
        g = torch._softmax_backward_data(grad, out, ctx.dim, out.dtype)
        if torch.is_grad_enabled():  # create_graph: stay differentiable
            return torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device)), None, None
        if not g.is_contiguous():
            g = g.contiguous()
        return _zero_fill_(g, mask), None, None
