"""The logsumexp family: the log of the sum of ``exp`` of the specified elements per
group, as ``masked_sparse::logsumexp``.

Note [The logsumexp family]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once:

- per group, ``log(sum(exp(x)))`` over its specified elements; 0 where the caller's bool
  ``specified`` (one per group: the groups holding a specified element, the result's
  mask) is False.
- The sum runs around the group's maximum, which cancels in value and gradient (and is
  detached: no backward pass for it); a maximum that is not finite shifts by 0, so a group
  of -inf gives ``log 0 = -inf``, one holding +inf gives inf, one holding NaN gives NaN, as
  torch's ``logsumexp``. Unspecified elements are shifted to 0, not -inf, before ``exp``
  (torch's CPU exp is much slower on arguments that underflow) and left out of the sum.
- On CPU one native call per reduction (the maximum, the sum of ``exp`` in double with
  the C file's own exp, Note [Native exp]: within an ULP of ``torch.exp``, and the log);
  elsewhere the torch ops, in the values' type.
- Gradient: ``exp(x - out)`` (the softmax of the group) times the incoming gradient at
  every specified element, +0.0 elsewhere (the difference filled before its ``exp``: what
  an unspecified element holds never reaches one).

>>> from layouts.kernels import Groups
>>> v, m = torch.tensor([0., 5., 0.]), torch.tensor([True, False, True])
>>> round(masked_logsumexp(Groups(3), v, m, torch.tensor([True])).item(), 4)
0.6931
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _native
from .._fill import fill_constant, fill_unspecified, zero_unspecified, zero_unspecified_
from ._groups import native_backward, native_deviations, native_ids
from ._ops import LIB, describe, groups, register_autograd, size
from ._route import Family, direct, run
from .reduce import masked_reduce

Tensor = torch.Tensor


def _cpu(g: Any, values: Tensor, mask: Tensor, specified: Tensor) -> Tensor | None:
    """The logsumexp per group in one native call, or None where no kernel applies."""
    kind = g.kind
    if kind == "lines":
        return _native.logsumexp_lines(values, mask, g.offsets, g.which)
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.logsumexp_all(values, mask) if mask.shape[0] else None
    ids = native_ids(g, values, mask)
    return None if ids is None else _native.logsumexp_scatter(values, mask, ids, specified,
                                                              g.n)


def _torch(g: Any, values: Tensor, mask: Tensor, specified: Tensor) -> Tensor:
    top = masked_reduce(g, values, mask, "amax").detach()
    top = torch.where(torch.isfinite(top), top, fill_constant(0, top))
    total = masked_sumexp(g, values, mask, top)
    out = torch.log(torch.where(specified, total, fill_constant(1, total))) + top
    return zero_unspecified(out, specified)


def masked_sumexp(g: Any, values: Tensor, mask: Tensor, center: Tensor) -> Tensor:
    """Per group, the sum of ``exp(values - center)`` over the specified elements (the
    others add nothing, whatever they hold): a logsumexp's second pass, in one native pass
    where a kernel applies (Note [Native exp])."""
    out = native_deviations(g, "sumexp", values, mask, center) if values.is_cpu else None
    if out is not None:
        return out
    # exp in place: the fill's output is a new tensor that no backward reads
    shifted = fill_unspecified(values - g.expand(center), mask, 0).exp_()
    return masked_reduce(g, shifted, mask, "sum")


class LOGSUMEXP(Family):
    """Per group, the masked logsumexp (Note [The logsumexp family])."""

    name = "logsumexp"

    @staticmethod
    def native(g, values, mask, specified):
        out = _cpu(g, values, mask, specified)
        return None if out is None else (out,)

    @staticmethod
    def torch(g, values, mask, specified):
        return (_torch(g, values, mask, specified),)

    @staticmethod
    def backward(g, values, mask, outs, grads, specified):
        (grad,), (out,) = grads, outs
        native = native_backward(g, "exp", mask, grad, b=out, x=values, what="logsumexp")
        if native is not None:
            return native
        weight = zero_unspecified(values - g.expand(out), mask).exp()
        return zero_unspecified_(g.expand(grad) * weight, mask)

    @staticmethod
    def op(g, values, mask, specified):
        spec = describe(g, values, mask)
        return None if spec is None else (logsumexp_op(values, mask, *spec, specified),)


@torch.library.custom_op(f"{LIB}::logsumexp", mutates_args=())
def logsumexp_op(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
                 index: Tensor | None, n: int, specified: Tensor) -> Tensor:
    """The logsumexp family per group, 0 where ``specified`` is False."""
    return LOGSUMEXP.torch(groups(values, offsets, which, index, n), values, mask,
                           specified)[0]


@logsumexp_op.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, specified):
    return LOGSUMEXP.forward(groups(values, offsets, which, index, n), values, mask,
                             specified)[0]


@logsumexp_op.register_fake
def _(values, mask, offsets, which, index, n, specified):
    return values.new_empty(size(offsets, which, index, n))


register_autograd(logsumexp_op, LOGSUMEXP, 7)


def masked_logsumexp(g: Any, values: Tensor, mask: Tensor, specified: Tensor) -> Tensor:
    """Per group, the log of the sum of ``exp`` of its specified elements, 0 where
    ``specified`` (the groups with one) is False (Note [The logsumexp family]);
    differentiable. The direct call where nothing is recorded or traced."""
    if direct(values):
        out = _cpu(g, values, mask, specified) if values.is_cpu else None
        return out if out is not None else _torch(g, values, mask, specified)
    return run(LOGSUMEXP, g, values, mask, specified)[0]
