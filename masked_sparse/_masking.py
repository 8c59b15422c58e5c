"""Masking by a condition on the data, as numpy.ma: ``masked_where`` and ``masked_invalid``.

Both take a plain tensor or a MaskedTensor of any layout and return a MaskedTensor of the
same layout over the very same index tensors and values: only the mask narrows, nothing is
densified. An element stays specified where it was specified and the condition does not
mask it. The result is differentiable with respect to ``x``; its gradient carries the
result's mask.

>>> import torch, masked_sparse as ms
>>> x = torch.tensor([1., float("nan"), float("inf"), 4.])
>>> ms.masked_invalid(x)
MaskedTensor(
  [  1.0000,       --,       --,   4.0000]
)
>>> ms.masked_where(x > 2, ms.masked_invalid(x)).to_tensor(0)
tensor([1., 0., 0., 0.])
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from ._autograd import on_values
from ._shapes import broadcasts_to
from ._tensor import MaskedTensor

__all__ = ["masked_invalid", "masked_where"]


def _as_masked(x: Any, op: str) -> MaskedTensor:
    """``x`` as a MaskedTensor: a plain tensor of any layout has every stored element
    specified (differentiable with respect to it)."""
    if isinstance(x, MaskedTensor):
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor or a MaskedTensor, got "
                        f"{type(x).__name__}")
    from .functional import _masked

    return _masked(x, None, op, plain=False)


def _narrowed(storages: list[Storage], keep: torch.Tensor) -> Storage:
    s = storages[0]
    return s.with_values(s.values, s.mask & keep)


def _with_mask_and(mt: MaskedTensor, keep: torch.Tensor) -> MaskedTensor:
    """``mt`` specified only where it was and ``keep`` (shaped like its stored values)."""
    return on_values(_narrowed, [mt], keep)


def masked_invalid(x: torch.Tensor) -> MaskedTensor:
    """``x`` with NaN, +inf and -inf unspecified (``numpy.ma.masked_invalid``).

    ``x`` is a plain tensor (every stored element specified) or a MaskedTensor of any
    layout; the result keeps its layout and index tensors. Integer and bool data have no
    invalid values: the mask is kept.

    >>> import torch, masked_sparse as ms
    >>> sp = torch.tensor([[0., float("nan")], [2., 0.]]).to_sparse_csr()
    >>> ms.masked_invalid(sp).sum()
    MaskedTensor(  2.0000, True)
    """
    mt = _as_masked(x, "masked_invalid")
    v = mt._storage.values
    if not (v.is_floating_point() or v.is_complex()):
        return _with_mask_and(mt, torch.ones((), dtype=torch.bool, device=v.device))
    return _with_mask_and(mt, torch.isfinite(v.detach()))


def masked_where(condition: torch.Tensor, x: torch.Tensor) -> MaskedTensor:
    """``x`` with the elements where ``condition`` is True unspecified
    (``numpy.ma.masked_where``).

    ``x`` is a plain tensor or a MaskedTensor of any layout; the result keeps its layout
    and index tensors. ``condition`` is a bool tensor (strided or sparse: an element it
    does not store is False) or a bool MaskedTensor such as ``mt > 0.5``, whose unspecified
    elements make the result's unspecified too. It must broadcast to ``x``'s shape.

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([0.2, 0.7, 0.9]), torch.tensor([True, True, False]))
    >>> ms.masked_where(mt > 0.5, mt)
    MaskedTensor(
      [  0.2000,       --,       --]
    )
    """
    mt = _as_masked(x, "masked_where")
    s = mt._storage
    if not isinstance(condition, torch.Tensor):
        raise TypeError(f"masked_where: condition must be a bool tensor or MaskedTensor, got "
                        f"{type(condition).__name__}")
    if condition.dtype != torch.bool:
        raise TypeError(f"masked_where: condition must have dtype torch.bool, got "
                        f"{condition.dtype}; pass (condition != 0)")
    if not broadcasts_to(tuple(condition.shape), tuple(s.shape)):
        raise ValueError(f"masked_where: condition of shape {tuple(condition.shape)} must "
                         f"broadcast to x's shape {tuple(s.shape)}")
    if isinstance(condition, MaskedTensor):
        cond, specified = layouts.read_at(condition._storage, s)
        keep = specified & ~cond
    else:
        c = _as_masked(condition.detach(), "masked_where")._storage
        cond, stored = layouts.read_at(c, s)
        keep = ~(cond & stored)  # an element a sparse condition does not store is False
    return _with_mask_and(mt, keep)
