"""Filling unspecified values with 0, fast and exact: ``zero_fill(values, mask)``.

>>> import torch
>>> zero_fill(torch.tensor([1.0, float("nan")]), torch.tensor([True, False]))
tensor([1., 0.])
"""

from __future__ import annotations

import torch

from .pointwise import broadcasts_to

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def _bitwise_zero_fill(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, values, 0)`` as an AND of the bits with an all-ones/all-zeros word
    (Note [Zero fill by bits])."""
    bits = _BITS[values.dtype]
    return (values.view(bits) & -compact(mask).to(bits)).view(values.dtype)


def compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its broadcast (stride 0) dims cut to size 1: it broadcasts back to ``t``'s
    shape, and an elementwise op on it touches each stored element once (an attention mask
    expanded over heads)."""
    for d in range(t.dim()):
        if t.stride(d) == 0 and t.shape[d] > 1:
            t = t.narrow(d, 0, 1)
    return t


class _ZeroFill(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, mask):  # type: ignore[override]
        ctx.save_for_backward(mask)
        return _bitwise_zero_fill(values, mask)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return _bitwise_zero_fill(grad, mask), None


def zero_fill(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with unspecified entries set to 0 (NaN and inf under the mask included);
    differentiable, the gradient is 0 at unspecified entries.

    Note [Zero fill by bits]
    ~~~~~~~~~~~~~~~~~~~~~~~~
    ``torch.where(mask, values, 0)`` costs ~3.5 ns per element on CPU (its bool condition takes
    a slow path); ``values * mask`` is 4x faster but keeps NaN and inf under the mask. ANDing the
    float's bits with ``-mask`` as an integer (all ones or all zeros) is exact, as fast as the
    multiplication, and gives +0.0 under the mask. A mask broadcast over some dims (stride 0,
    e.g. an attention mask expanded over heads) is converted once per stored element. Other
    dtypes (integers, complex), and a mask that ``values`` would have to broadcast to, use
    ``torch.where``.
    """
    if (values.dtype not in _BITS or mask.dtype != torch.bool
            or not broadcasts_to(tuple(mask.shape), tuple(values.shape))):
        return torch.where(mask, values, torch.zeros((), dtype=values.dtype))
    if torch.is_grad_enabled() and values.requires_grad:
        return _ZeroFill.apply(values, mask)
    return _bitwise_zero_fill(values, mask)
