"""Leaving and changing storage: ``get_data``, ``to_tensor`` and layout conversions.

All of them are differentiable; a gradient flowing back always reaches the MaskedTensor
as a MaskedTensor over its own storage (its mask, its index tensors).
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .._autograd import on_values
from .._registry import implements
from .._tensor import MaskedTensor, _wrap


def _grad_as_values(s: Storage, grad: torch.Tensor) -> torch.Tensor:
    """A plain gradient (dense, or sparse in ``s``'s layout) read at ``s``'s positions."""
    if isinstance(grad, MaskedTensor):
        return layouts.convert(grad._storage, s.layout).values
    if grad.layout != torch.strided:
        mask = s.layout.to_torch(s, s.mask)
        return s.layout.from_torch(grad, mask).values
    return s.layout.gather(s, grad).expand_as(s.values)


class _GetData(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mt: MaskedTensor) -> torch.Tensor:
        ctx.storage = s = mt._storage
        return s.layout.to_torch(s, s.values.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> MaskedTensor:
        if isinstance(grad, MaskedTensor):
            return grad
        s = ctx.storage
        return _wrap(s.with_values(_grad_as_values(s, grad)))


def get_data(mt: MaskedTensor) -> torch.Tensor:
    """The data of ``mt`` in its layout (see :meth:`MaskedTensor.get_data`)."""
    if torch.is_grad_enabled() and mt.requires_grad:
        return _GetData.apply(mt)
    s = mt._storage
    return s.layout.to_torch(s, s.values)


def _fill(s: Storage, value: Any) -> torch.Tensor:
    filled = s.values.masked_fill(~s.mask, value)
    if not s.index:
        return filled
    if isinstance(value, (int, float, bool)) and value == 0:
        return s.layout.to_torch(s, filled)
    return s.densify(filled, value)


class _ToTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mt: MaskedTensor, value: Any) -> torch.Tensor:
        ctx.storage = s = mt._storage
        return _fill(s.with_values(s.values.detach()), value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[MaskedTensor, None]:
        s = ctx.storage
        return _wrap(s.with_values(_grad_as_values(s, grad))), None


def to_tensor(mt: MaskedTensor, value: Any) -> torch.Tensor:
    """``mt`` with masked-out positions filled with ``value`` (:meth:`MaskedTensor.to_tensor`)."""
    if torch.is_grad_enabled() and mt.requires_grad:
        return _ToTensor.apply(mt, value)
    return _fill(mt._storage, value)


def _convert(storages: list[Storage], target: Any) -> Storage:
    return layouts.convert(storages[0], target)


def to_layout(mt: MaskedTensor, layout: Any) -> MaskedTensor:
    """``mt`` in another registered layout: exact, differentiable, O(nnz) between sparse ones.

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> ms.to_layout(mt, torch.sparse_csr).layout
    torch.sparse_csr
    """
    if mt._storage.layout is layouts.get_layout(layout):
        return mt
    return on_values(_convert, [mt], layout)


@implements(torch.Tensor.to_dense)
def _to_dense(mt: MaskedTensor, dtype: Any = None, *, masked_grad: Any = None) -> MaskedTensor:
    out = to_layout(mt, torch.strided)
    return out if dtype is None else out.to(dtype)


@implements(torch.Tensor.to_sparse_coo)
def _to_sparse_coo(mt: MaskedTensor) -> MaskedTensor:
    return to_layout(mt, torch.sparse_coo)


@implements(torch.Tensor.to_sparse)
def _to_sparse(mt: MaskedTensor, *args: Any, layout: Any = None, **kwargs: Any) -> MaskedTensor:
    return to_layout(mt, torch.sparse_coo if layout is None else layout)


@implements(torch.Tensor.to_sparse_csr)
def _to_sparse_csr(mt: MaskedTensor, dense_dim: Any = None) -> MaskedTensor:
    return to_layout(mt, torch.sparse_csr)
