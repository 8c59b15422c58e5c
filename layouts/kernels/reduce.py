"""The reduce family: the masked sum, sum of squares, product, maximum and minimum per
group, as ``masked_sparse::reduce``.

Note [The reduce family]
~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once (the groupings only describe the groups):

- ``masked_reduce(g, values, mask, op)`` is, per group of ``g``,
  ``reduce(where(mask, values, start))``: an unspecified element reads 0 for ``"sum"``, 1
  for ``"prod"``, the op's identity for ``"amax"`` / ``"amin"`` (-inf / +inf, an integer
  dtype's min / max), whatever it holds (NaN and inf included); ``"sumsq"`` is the sum of
  the squares of ``where(mask, values, 0)``. A group without a specified element holds 0,
  1 or the identity; :func:`masked_reduce_zeroed` writes 0 there instead (what a result
  holds where it is unspecified).
- Accumulation: the CPU kernels sum floats in double (a row sum and a column sum of the
  same entries agree, whatever the cancellation: Note [Native reductions]) and multiply in
  the values' type; the torch ops accumulate as torch's own reductions do (float32 in
  float32; float16 and bfloat16 in float32, returned in their dtype).
- Gradient (the family's backward, itself differentiable): ``sum``, the incoming gradient
  at every specified element; ``sumsq``, twice the value times it; ``amax`` / ``amin``,
  split equally among the specified elements equal to the group's extreme (torch's
  ``amax`` rule); ``prod``, torch's own rule through the torch ops (zeros included), first
  order only. Unspecified elements get +0.0 whatever they hold.

Implementations: on CPU one native pass over values, mask and groups (``_native.all`` /
``lines`` / ``scatter``; a strided reduction over every dim as one group of the flattened
values; a strided sum along dims in the row blocks of Note [Fused masked sum]), else the
torch ops; on every other device the fill, then the raw kernel of the device table (Note
[The device table]). The backward on CPU is one native pass where nothing records it
(``_native.backward``: expand, ties), else masked torch ops.

>>> from layouts.kernels import Groups
>>> v, m = torch.tensor([1., 2., 3.]), torch.tensor([True, False, True])
>>> masked_reduce(Groups(3, index=torch.tensor([0, 1, 1]), n=2), v, m, "amax").tolist()
[1.0, 3.0]
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _native
from .._fill import fill_unspecified, plain_eager, start, zero_unspecified, zero_unspecified_
from ._groups import native_backward, native_scatter, operand, reduced_shape
from ._ops import LIB, describe, groups, register_autograd, size
from ._route import Family, direct, run

Tensor = torch.Tensor


# -- the implementations -----------------------------------------------------------------
def _cpu(g: Any, values: Tensor, mask: Tensor, op: str) -> Tensor | None:
    """The native kernels' ``op`` per group (``op`` "count": of ``mask``), or None where
    they do not apply (other kinds, dtypes or devices, dense dims, no library)."""
    kind = g.kind
    if kind == "lines":
        return _native.lines(values, mask, op, g.offsets, g.which)
    if kind == "dense":
        out = _full(g, op, values, mask)
        if out is None and op == "sum":
            fused = fused_masked_sum(values, mask, g.dims, g.keepdim, False)
            out = None if fused is None else fused[0]
        return out
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.reduce_all(values, mask, op) if mask.shape[0] else None
    return native_scatter(g, values, lambda ids, n: _native.scatter(values, mask, op, ids, n))


def _full(g: Any, op: str, values: Tensor, mask: Tensor) -> Tensor | None:
    """A strided reduction over every dim of contiguous ``values`` ("sum", "sumsq",
    "prod", "amax", "amin", or "count" of ``mask``) in one native pass over the flattened
    values, else None."""
    if (len(g.dims) != values.dim() or not g.dims or not values.numel()
            or mask.shape != values.shape or not values.is_contiguous()
            or not mask.is_contiguous()):
        return None
    flat = mask.view(-1)
    out = _native.count_all(flat) if op == "count" else \
        _native.reduce_all(values.view(-1), flat, op)
    return None if out is None else out.view(g.out_shape)


def _torch(g: Any, values: Tensor, mask: Tensor, op: str) -> Tensor:
    """The torch ops: the fill, then the grouping's plain reduction (the raw kernels)."""
    if op == "sumsq":
        filled = zero_unspecified(values, mask)
        return g.reduce(filled * filled, "sum")
    return g.reduce(fill_unspecified(values, mask, start(op, values.dtype)), op)


class REDUCE(Family):
    """Per group, the masked ``op`` (Note [The reduce family])."""

    name = "reduce"

    @staticmethod
    def native(g, values, mask, op):
        out = _cpu(g, values, mask, op)
        return None if out is None else (out,)

    @staticmethod
    def torch(g, values, mask, op):
        return (_torch(g, values, mask, op),)

    @staticmethod
    def backward(g, values, mask, outs, grads, op):
        (grad,), (out,) = grads, outs
        if op == "sum":
            native = native_backward(g, "expand", mask, grad, what=op)
            return native if native is not None else zero_unspecified_(g.expand(grad), mask)
        if op == "sumsq":
            return zero_unspecified_(2 * operand(values, mask) * g.expand(grad), mask)
        if op in ("amax", "amin"):  # split among the specified ties, as torch's amax
            native = native_backward(g, "ties", mask, grad, b=out, x=values, what=op)
            if native is not None:
                return native
            hit = mask & (values == g.expand(out))
            ties = g.reduce(hit, "sum").to(grad.dtype)  # counted by the raw kernels
            share = grad / ties.clamp(min=1)
            return zero_unspecified_(g.expand(share), hit)
        # prod: differentiate the torch ops (torch's own rule for zeros), first order only
        with torch.enable_grad():
            leaf = values.detach().requires_grad_()
            again = _torch(g, leaf, mask, op)
            return torch.autograd.grad(again, leaf, grad)[0]

    @staticmethod
    def op(g, values, mask, op):
        spec = describe(g, values, mask)
        return None if spec is None else (reduce_op(values, mask, *spec, op),)


# -- the op ---------------------------------------------------------------------------------
@torch.library.custom_op(f"{LIB}::reduce", mutates_args=())
def reduce_op(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
              index: Tensor | None, n: int, op: str) -> Tensor:
    """The reduce family per group (Note [The reduce family]); the implementation of every
    device but the CPU (the torch ops).

    >>> v, m = torch.tensor([1., 2., 3.]), torch.tensor([True, False, True])
    >>> torch.ops.masked_sparse.reduce(v, m, None, None, None, 1, "sum").tolist()
    [4.0]
    """
    return REDUCE.torch(groups(values, offsets, which, index, n), values, mask, op)[0]


@reduce_op.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, op):
    return REDUCE.forward(groups(values, offsets, which, index, n), values, mask, op)[0]


@reduce_op.register_fake
def _(values, mask, offsets, which, index, n, op):
    return values.new_empty(size(offsets, which, index, n))


register_autograd(reduce_op, REDUCE, 7)


# -- the entry points ---------------------------------------------------------------------
def masked_reduce(g: Any, values: Tensor, mask: Tensor, op: str) -> Tensor:
    """Per group of ``g``, the masked ``op`` ("sum", "sumsq", "prod", "amax", "amin";
    Note [The reduce family]); differentiable.

    The direct call (Note [Kernel families as ops]): without autograd to record and no
    tracer, the implementation for the values' device runs here as a function; the rest
    goes through the route (``_route.run``).
    """
    if direct(values):
        out = _cpu(g, values, mask, op) if values.is_cpu else None
        return out if out is not None else _torch(g, values, mask, op)
    return run(REDUCE, g, values, mask, op)[0]


def masked_reduce_zeroed(g: Any, values: Tensor, mask: Tensor, op: str,
                         specified: Tensor) -> Tensor | None:
    """Per group, :func:`masked_reduce` with 0 where ``specified`` (the groups holding a
    specified element) is False -- the result values of an amax, amin, prod or 2-norm --
    from the native kernel, its fresh output zeroed in place by one native fill (no check
    whether any group is empty, no second output); None where no native kernel applies
    (autograd to record, a tracer, another device, no library): the caller reduces and
    fills (``benchmarks/profile_overhead.py --fixed`` measures both).

    >>> import layouts
    >>> s = layouts.get_layout("strided").from_strided(torch.tensor([[1., 5.], [2., 0.]]),
    ...     torch.tensor([[True, True], [False, False]]))
    >>> g = layouts.group_by(s, (1,), False)
    >>> out = masked_reduce_zeroed(g, s.values, s.mask, "amax", torch.tensor([True, False]))
    >>> out is None or out.tolist() == [5.0, 0.0]
    True
    """
    if not (direct(values) and values.is_cpu):
        return None
    out = _cpu(g, values, mask, op)
    if out is None:
        return None
    if specified.numel() == 1 and specified.dtype is torch.bool:  # one group: read it (CPU)
        return out if specified.item() else zero_unspecified(out, specified)
    if _native.fill(out, specified, 0, out=out) is None:
        return zero_unspecified(out, specified)
    return out


def masked_sum(g: Any, values: Tensor, mask: Tensor,
               with_count: bool = False) -> tuple[Tensor, Tensor | None]:
    """Per group, the sum of the specified elements and, with ``with_count``, their number
    (int64): for a strided grouping without autograd to record, both in one pass (the
    total is the sum family's forward, bit for bit); else :func:`masked_reduce` and the
    grouping's count."""
    if with_count and g.kind == "dense" and not (values.requires_grad
                                                 and torch.is_grad_enabled()):
        total = _full(g, "sum", values, mask)
        if total is not None:
            return total, _full(g, "count", mask, mask)
        fused = fused_masked_sum(values, mask, g.dims, g.keepdim, True)
        if fused is not None:
            return fused
    total = masked_reduce(g, values, mask, "sum")
    return total, (g.reduce(mask, "sum") if with_count else None)


# -- a strided sum in cache-sized blocks -------------------------------------------------------
# Same-size integer views for a bitwise "where(mask, x, 0)" (Note [Fused masked sum]).
_FUSED_BITS = {torch.float32: torch.int32, torch.float64: torch.int64,
               torch.int32: torch.int32, torch.int64: torch.int64}
_BLOCK = 1 << 18  # elements per row block (stays in cache)
_FUSE_MIN = 1 << 16


def fused_masked_sum(values: Tensor, mask: Tensor, dims: tuple[int, ...], keepdim: bool,
                     with_count: bool) -> tuple[Tensor, Tensor | None] | None:
    """``(where(mask, values, 0).sum(dims), mask.sum(dims))`` in row blocks, or None when
    the fast path does not apply.

    Note [Fused masked sum]
    ~~~~~~~~~~~~~~~~~~~~~~~
    ``torch.where(mask, data, 0).sum(dim)`` is memory-bound twice over: ``where`` writes a
    full-size temporary (and its CPU kernel is not vectorized), then ``sum`` reads it
    again; counting with ``mask.sum(dim)`` is as slow. Without autograd this walks the
    tensor in cache-sized row blocks: the mask, negated once as int8 (-1 / 0), is copied
    block by block into an integer buffer of the data's width (sign extension makes
    all-ones / zero bits; minus its sum is the count) and AND-ed with the data's bits, which
    leaves each specified element bit for bit and a +0 elsewhere (NaN or inf under the mask
    included), and the block is summed from cache. It is exact, reads data and mask once
    and allocates one small buffer (and the int8 mask); ``benchmarks/bench_core.py`` times
    it. It is the CPU forward of a strided sum along dims (the reduce family): with
    autograd the same pass runs, recorded with the family's backward. For other dtypes /
    layouts of memory / devices the plain ``where`` path runs. Under torch.compile /
    torch.export the plain path runs too: Inductor fuses ``where + sum`` into one pass by
    itself, while the Python block loop would be unrolled into hundreds of small kernels
    (``benchmarks/bench_compile.py``).
    """
    bits = _FUSED_BITS.get(values.dtype)
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
    for begin in range(0, nrows, step):
        stop = min(nrows, begin + step)
        block = buf[: stop - begin]
        block.copy_(signs[begin:stop])
        if count is not None:
            part = block.sum(dims, keepdim=True, dtype=torch.int32).neg_()  # < 2**31
            if across:
                count += part
            else:
                count[begin:stop] = part
        block.bitwise_and_(data_bits[begin:stop])
        part = block.view(values.dtype).sum(dims, keepdim=True, dtype=values.dtype)
        if across:
            total += part
        else:
            total[begin:stop] = part
    if not keepdim:
        total = total.squeeze(dims)
        count = count.squeeze(dims) if count is not None else None
    return total, count
