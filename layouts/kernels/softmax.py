"""The softmax family: softmax and log_softmax within each group over its specified
elements, as ``masked_sparse::softmax``.

Note [The softmax family]
~~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once (``g`` a ``keepdim=True`` grouping: the output has the
elements' shape):

- within each group, ``softmax`` (``log``: ``log_softmax``) of its specified elements; an
  unspecified element weighs nothing and gets 0.
- The group's maximum is subtracted first (detached: it cancels in value and gradient); a
  maximum of -inf (every specified value -inf) is shifted by 0, so the group is
  ``0/0 = NaN``, as torch's softmax gives; a +inf or NaN maximum makes the whole group
  NaN, as torch's. Unspecified elements are shifted to 0, not -inf, before ``exp`` (torch's
  CPU exp is much slower on arguments that underflow) and left out of the sum.
- Gradient: ``p * (g - sum(g * p))`` for softmax, ``g - exp(out) * sum(g)`` for
  log_softmax, over each group's specified elements; +0.0 at unspecified ones. On CPU one
  native pass where nothing records it (``_native.backward``, after the per-group sum);
  the softmax's along lines (a sparse matrix's rows, a graph's neighbours) in one native
  call, sum and pass together (``_native.softmax_backward``: the same bits).
- On CPU one native call (the maximum, the sum of ``exp`` in double, Note [Native exp],
  the division or the log); elsewhere the torch ops.

:func:`masked_softmax` returns the output and whether it already holds 0 at every
unspecified element (the family's does). The strided slices along one dim take torch's own
softmax of the values filled with -inf instead, on every device (Note [Fused masked
softmax]): it may leave NaN in a fully masked slice, and says so (the caller zero-fills).

>>> from layouts.kernels import Groups
>>> v, m = torch.tensor([0., 7., 0.]), torch.tensor([True, False, True])
>>> masked_softmax(Groups(3), v, m, False)[0].tolist()
[0.5, 0.0, 0.5]
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _native
from .._fill import fill_constant, fill_unspecified, zero_unspecified, zero_unspecified_
from ._groups import native_backward, native_ids, native_softmax_backward, per_head
from ._ops import LIB, describe, groups, register_autograd
from ._route import Family, direct, run, traced
from .reduce import masked_reduce, masked_sum

Tensor = torch.Tensor


def _cpu(g: Any, values: Tensor, mask: Tensor, log: bool) -> Tensor | None:
    """The softmax in one native call (zeros at unspecified elements written), or None
    where no kernel applies."""
    kind = g.kind
    if kind == "lines":
        return _native.softmax(values, mask, log, g.offsets, g.which)
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.softmax(values, mask, log) if mask.shape[0] else None
    ids = native_ids(g, values, mask)
    return None if ids is None else _native.softmax(values, mask, log, index=ids, n=g.n)


def _torch(g: Any, values: Tensor, mask: Tensor, log: bool) -> Tensor:
    top = masked_reduce(g, values, mask, "amax").detach()
    top = torch.where(torch.isneginf(top), fill_constant(0, top), top)
    shifted = zero_unspecified(values - g.expand(top), mask)
    e = shifted.exp()
    total = g.expand(masked_reduce(g, e, mask, "sum"))
    return zero_unspecified(shifted - total.log() if log else e / total, mask)


class SOFTMAX(Family):
    """Softmax (``log``: log_softmax) within each group over the specified elements, 0 at
    every other element (Note [The softmax family])."""

    name = "softmax"

    @staticmethod
    def native(g, values, mask, log):
        out = _cpu(g, values, mask, log)
        return None if out is None else (out,)

    @staticmethod
    def torch(g, values, mask, log):
        return (_torch(g, values, mask, log),)

    @staticmethod
    def backward(g, values, mask, outs, grads, log):
        (grad,), (out,) = grads, outs
        what = "log_softmax" if log else "softmax"
        if log:
            total = masked_sum(g, grad, mask)[0]
            native = native_backward(g, what, mask, total, x=out, y=grad, what=what)
            if native is not None:
                return native
            return zero_unspecified_(grad - out.exp() * g.expand(total), mask)
        fused = native_softmax_backward(g, mask, out, grad)
        if fused is not None:
            return fused
        total = masked_sum(g, grad * out, mask)[0]
        native = native_backward(g, what, mask, total, x=out, y=grad, what=what)
        if native is not None:
            return native
        return zero_unspecified_(out * (grad - g.expand(total)), mask)

    @staticmethod
    def op(g, values, mask, log):
        spec = describe(g, values, mask)
        return None if spec is None else (softmax_op(values, mask, *spec, log),)


@torch.library.custom_op(f"{LIB}::softmax", mutates_args=())
def softmax_op(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
               index: Tensor | None, n: int, log: bool) -> Tensor:
    """The softmax family within each group, 0 at unspecified elements."""
    return SOFTMAX.torch(groups(values, offsets, which, index, n), values, mask, log)[0]


@softmax_op.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, log):
    return SOFTMAX.forward(groups(values, offsets, which, index, n), values, mask, log)[0]


@softmax_op.register_fake
def _(values, mask, offsets, which, index, n, log):
    return torch.empty_like(values)


register_autograd(softmax_op, SOFTMAX, 7)


def masked_softmax(g: Any, values: Tensor, mask: Tensor, log: bool) -> tuple[Tensor, bool]:
    """Softmax (``log``: log_softmax) within each group of a ``keepdim=True`` grouping over
    the specified elements (Note [The softmax family]), and whether the result already
    holds 0 at every unspecified element; differentiable."""
    if g.kind == "dense" and len(g.dims) == 1:
        dim = g.dims[0]
        if not log and _fused_softmax_applies(values, mask):
            return _MaskedSoftmax.apply(values, mask, dim), True
        filled = fill_unspecified(values, mask, -math.inf)  # weighs nothing
        return (torch.log_softmax if log else torch.softmax)(filled, dim), False
    flat = None if traced(values) else per_head(g, values)
    if flat is not None:  # Note [Heads as groups]
        if flat.kind == "lines" and values.is_cpu and direct(values):
            out = _native.softmax(values, mask, log, flat.offsets, flat.which)  # one head
            if out is not None:
                return out, True
        out, zeroed = masked_softmax(flat, values.reshape(-1), mask.reshape(-1), log)
        return out.view_as(values), zeroed
    if direct(values):
        out = _cpu(g, values, mask, log) if values.is_cpu else None
        return (out if out is not None else _torch(g, values, mask, log)), True
    return run(SOFTMAX, g, values, mask, log)[0], True


def masked_softmax_backward(g: Any, out: Tensor, mask: Tensor, grad: Tensor,
                            log: bool) -> Tensor:
    """The gradient of :func:`masked_softmax`'s values over a grouping that is not dense,
    from its output ``out`` (0 at unspecified elements) and the output's gradient ``grad``
    (never read at unspecified elements): the family's backward (Note [The softmax
    family]), over the heads as groups where ``out`` has dense dims (Note [Heads as
    groups]); +0.0 at every unspecified element. Not recorded: for a caller that records
    the softmax as one node of its own.

    >>> from layouts.kernels import Groups
    >>> out, m = torch.tensor([0.5, 0., 0.5]), torch.tensor([True, False, True])
    >>> masked_softmax_backward(Groups(3), out, m, torch.tensor([1., 9., 0.]), False).tolist()
    [0.25, 0.0, -0.25]
    """
    flat = per_head(g, out)
    if flat is not None:
        fused = None if log else native_softmax_backward(flat, mask, out, grad)  # one head
        if fused is not None:
            return fused
        grad = masked_softmax_backward(flat, out.reshape(-1), mask.reshape(-1),
                                       grad.reshape(-1), log)
        return grad.view_as(out)
    return SOFTMAX.backward(g, out, mask, (out,), (grad,), log)


# Note [Fused masked softmax]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Attention's ``softmax(as_masked_tensor(scores, mask), -1)`` under autograd, as the dense
# ``-inf`` recipe computes it: one ``where`` to -inf, torch's softmax, and nothing else that
# allocates. The softmax output is exact 0 at every unspecified element of a line holding
# a specified one (exp(-inf) = 0); only a fully masked line is 0/0, so the output is then
# zero filled *in place* by its bits (``zero_unspecified_``: an integer product with the
# mask compacted over its broadcast dims, one head-shared mask read once per stored
# element, NaN bits become +0.0). That zero-filled output is what autograd saves: the
# softmax gradient ``p * (g - sum(g * p))`` is then 0 wherever ``p`` is (every unspecified
# element), and the same in-place fill of the gradient clears any NaN or inf the incoming
# gradient held there. The result is tagged zero filled, so the matrix product after it
# fills nothing. While torch.compile traces (AOTAutograd runs this Function on fake
# tensors) both in-place fills are one ``where`` that Inductor fuses into the softmax's
# kernels: the graph then saves the zero-filled output, as the dense recipe saves its
# softmax, and the product reads that very buffer (no second filled copy). torch.func
# transforms, double backward (the backward builds a graph: ``where`` instead) and dtypes
# without a same-width integer take the plain route. Measured by
# ``benchmarks.bench_training_ops`` (attention rows).

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fused_softmax_applies(values: Tensor, mask: Tensor) -> bool:
    if torch._C._are_functorch_transforms_active() or torch.compiler.is_dynamo_compiling():
        return False
    if torch.compiler.is_compiling():  # traced: any device, any float dtype
        return values.dtype.is_floating_point and mask.dtype == torch.bool \
            and mask.shape == values.shape
    return (values.dtype in _FUSED_DTYPES and mask.dtype == torch.bool
            and mask.shape == values.shape and values.device.type == "cpu")


class _MaskedSoftmax(torch.autograd.Function):
    """Softmax over the specified elements along ``dim``, 0 elsewhere (Note [Fused masked
    softmax])."""

    @staticmethod
    def forward(ctx, values: Tensor, mask: Tensor, dim: int) -> Tensor:
        filled = fill_unspecified(values, mask, -math.inf)  # (a where while tracing)
        out = torch.softmax(filled, dim)
        del filled
        if not out.is_contiguous():
            out = out.contiguous()
        out = zero_unspecified_(out, mask)
        ctx.save_for_backward(out, mask)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        out, mask = ctx.saved_tensors
        g = torch._softmax_backward_data(grad, out, ctx.dim, out.dtype)
        if torch.is_grad_enabled():  # create_graph: stay differentiable
            return torch.where(mask, g, fill_constant(0, g)), None, None
        if not g.is_contiguous():
            g = g.contiguous()
        return zero_unspecified_(g, mask), None, None
