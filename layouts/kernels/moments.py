"""The moments family: the masked mean and variance per group, as
``masked_sparse::moments``.

Note [The moments family]
~~~~~~~~~~~~~~~~~~~~~~~~~
The semantics, stated once:

- mean: the sum of a group's specified elements over their count, 0 where none is
  specified; the group is specified iff its count is positive.
- variance with ``correction`` c (two passes: the mean, then the squared deviations of the
  specified elements from it, :func:`masked_sqdev`; ``|x - mean|**2`` for complex values):
  their sum over ``dof = count - c``, where ``dof`` is the count minus a float (a float
  tensor, as torch makes an int64 tensor minus a float). A group is specified iff
  ``dof > 0`` (numpy.ma's rule); where ``dof <= 0`` the variance is unspecified and holds
  0 (its value there is not defined: torch gives inf or NaN).
- Accumulation: the CPU kernels in double, in one call per reduction (count, sum, mean,
  squared deviations: ``_native.moments``); the torch ops as torch's own sums.
- Gradient: the mean's incoming gradient over the count at every specified element; the
  variance's ``2 (x - mean) / dof`` times its gradient (the mean's own term sums to 0), 0
  where ``dof <= 0``; unspecified elements get +0.0 whatever they hold. On CPU one native
  pass where nothing records it (``_native.backward``: expand, dev).

>>> from layouts.kernels import Groups
>>> v, m = torch.tensor([1., 9., 3.]), torch.tensor([True, False, True])
>>> [t.tolist() for t in masked_var(Groups(3), v, m, 1.0)]
[[2.0], [2.0], [True]]
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _native
from .._fill import fill_constant, zero_unspecified, zero_unspecified_
from ._groups import native_backward, native_deviations, native_ids, operand
from ._ops import LIB, describe, groups, register_autograd, size
from ._route import Family, direct, run
from .reduce import masked_sum

Tensor = torch.Tensor


def _cpu(g: Any, values: Tensor, mask: Tensor, correction: float | None) -> tuple | None:
    """``(var, mean, specified)`` (var None without a correction) in one native call, or
    None where no kernel applies."""
    kind = g.kind
    if kind == "lines":
        return _native.moments(values, mask, correction, g.offsets, g.which)
    if kind not in ("all", "scatter") or g.value_dims:
        return None
    if kind == "all":
        return _native.moments(values, mask, correction) if mask.shape[0] else None
    ids = native_ids(g, values, mask)
    if ids is None:
        return None
    counts = g.count(mask)  # (kept per mask object by a grouping)
    if counts.shape != (g.n,):
        return None
    return _native.moments(values, mask, correction, index=ids, counts=counts)


def _torch(g: Any, values: Tensor, mask: Tensor, correction: float | None) -> tuple:
    total, count = masked_sum(g, values, mask, with_count=True)
    mean = total / count.clamp(min=1)
    if correction is None:
        return mean, count > 0
    dof = count - correction  # float32, as torch makes an int64 tensor minus a float
    specified = dof > 0
    var = masked_sqdev(g, values, mask, mean) / torch.where(specified, dof,
                                                            fill_constant(1, dof))
    return zero_unspecified(var, specified), mean, specified


def masked_sqdev(g: Any, values: Tensor, mask: Tensor, center: Tensor) -> Tensor:
    """Per group, the sum of the squared deviations of the specified elements from the
    group's ``center`` (``|.|**2`` for complex values): a variance's second pass, in one
    native pass where a kernel applies."""
    out = native_deviations(g, "sqdev", values, mask, center) if values.is_cpu else None
    if out is not None:
        return out
    dev = zero_unspecified(values - g.expand(center), mask)
    return g.reduce((dev * dev.conj()).real if dev.is_complex() else dev * dev, "sum")


class MOMENTS(Family):
    """Per group, ``(var, mean, specified)`` for a ``correction``, ``(mean, specified)``
    for None (Note [The moments family])."""

    name = "moments"

    @staticmethod
    def native(g, values, mask, correction):
        out = _cpu(g, values, mask, correction)
        if out is None:
            return None
        return out[1:] if correction is None else out

    @staticmethod
    def torch(g, values, mask, correction):
        return _torch(g, values, mask, correction)

    @staticmethod
    def backward(g, values, mask, outs, grads, correction):
        count = g.reduce(mask, "sum").to(values.dtype)
        if correction is None:
            g_mean, g_var = grads[0], None
        else:
            g_var, g_mean = grads[0], grads[1]
        total = None
        share = None if g_mean is None else g_mean / count.clamp(min=1)
        if g_var is None and share is not None:
            out = native_backward(g, "expand", mask, share, what="mean")
            if out is not None:
                return out
        if share is not None:
            total = g.expand(share)
        if g_var is not None:  # 2 (x - mean) / dof; the mean's own term sums to 0
            dof = count - correction
            ok = dof > 0
            coef = zero_unspecified(2 * g_var / torch.where(ok, dof, fill_constant(1, dof)), ok)
            out = native_backward(g, "dev", mask, coef, b=outs[1], x=values, c=share,
                                  what="var")
            if out is not None:
                return out
            # unspecified elements (NaN or inf included) are filled once, at the end
            part = (operand(values, mask) - g.expand(outs[1])) * g.expand(coef)
            total = part if total is None else total + part
        if total is None:
            return torch.zeros_like(values)
        return zero_unspecified_(total.expand_as(values), mask)

    @staticmethod
    def op(g, values, mask, correction):
        spec = describe(g, values, mask)
        if spec is None:
            return None
        out = moments_op(values, mask, *spec, correction)
        return out[1:] if correction is None else out


# -- the op ---------------------------------------------------------------------------------
@torch.library.custom_op(f"{LIB}::moments", mutates_args=())
def moments_op(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
               index: Tensor | None, n: int, correction: float | None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """The moments family per group: ``(var, mean, specified)``, var empty without a
    correction (an op has a fixed number of outputs)."""
    out = MOMENTS.torch(groups(values, offsets, which, index, n), values, mask, correction)
    return _op_out(values, out, correction)


@moments_op.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, correction):
    out = MOMENTS.forward(groups(values, offsets, which, index, n), values, mask, correction)
    return _op_out(values, out, correction)


def _op_out(values: Tensor, out: tuple, correction: float | None) -> tuple:
    if correction is None:
        return (values.new_empty(0),) + tuple(out)
    return tuple(out)


@moments_op.register_fake
def _(values, mask, offsets, which, index, n, correction):
    n = size(offsets, which, index, n)
    var = values.new_empty(0 if correction is None else n)
    return var, values.new_empty(n), mask.new_empty(n)


def _adapt(correction: float | None, outs: tuple, grads: tuple) -> tuple:
    """The op's outputs as the family's: without a correction, less the empty variance."""
    return (outs[1:], grads[1:]) if correction is None else (outs, grads)


register_autograd(moments_op, MOMENTS, 7, _adapt)


# -- the entry points ---------------------------------------------------------------------
def masked_mean(g: Any, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per group, the mean of its specified elements (0 where none is) and whether it has
    one (Note [The moments family]); differentiable. The direct call where nothing is
    recorded or traced (Note [Kernel families as ops])."""
    if direct(values):
        out = _cpu(g, values, mask, None) if values.is_cpu else None
        if out is None:
            return _torch(g, values, mask, None)
        return out[1], out[2]
    mean, specified = run(MOMENTS, g, values, mask, None)
    return mean, specified


def masked_var(g: Any, values: Tensor, mask: Tensor,
               correction: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per group, the variance of its specified elements with ``correction`` (0 where
    ``count - correction <= 0``), their mean (0 where none is specified), and where the
    variance is specified (Note [The moments family]); differentiable."""
    if direct(values):
        out = _cpu(g, values, mask, correction) if values.is_cpu else None
        return out if out is not None else _torch(g, values, mask, correction)
    var, mean, specified = run(MOMENTS, g, values, mask, correction)
    return var, mean, specified
