"""Data and mask of different layouts: the data is read at the mask's stored positions.

Note [The mask's layout wins]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``masked_tensor(data, mask)`` / ``as_masked_tensor(data, mask)`` with data and mask of
different layouts build a MaskedTensor of the *mask's* layout over the mask's pattern (its
index tensors' memory, no copy of them), the data read at the mask's stored positions --
the rule that already holds for sparse data of another pattern ("the mask's pattern is
authoritative"), now across layouts:

- dense data, sparse mask (``ms.as_masked_tensor(U @ V.T, R.get_mask())``): an O(nnz)
  gather of the data at the mask's positions; the mask is never densified;
- sparse data, strided mask: the mask stores every position, so the result is strided and
  the data is read densely (positions the data does not store read 0); keep it sparse by
  passing the mask in the data's layout (``mask.to_sparse_csr()``: positions the mask does
  not store are unspecified either way);
- sparse data, sparse mask of another layout: the data is looked up at the mask's
  positions by its COO keys (O(nnz log nnz)); absent entries read 0.

``as_masked_tensor`` stays differentiable with respect to the data, and the data gets a
*plain* gradient of its own layout, 0 where unspecified (a dense tensor for dense data:
what the dense reference gives, and what optimizers take); no MaskedTensor gradient can be
given to a tensor of another layout.

>>> import torch, masked_sparse as ms
>>> mask = torch.tensor([[True, False], [False, True]]).to_sparse_csr()
>>> x = torch.tensor([[1., 2.], [3., 4.]], requires_grad=True)
>>> mt = ms.as_masked_tensor(x * 10, mask)
>>> mt.layout, mt.to_tensor(0).to_dense().tolist()
(torch.sparse_csr, [[10.0, 0.0], [0.0, 40.0]])
>>> mt.sum().backward()
>>> x.grad
tensor([[10.,  0.],
        [ 0., 10.]])
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

import layouts
from layouts import Storage

from ._tensor import MaskedTensor, _wrap


def _mask_storage(mask: torch.Tensor) -> Storage:
    return layouts.get_layout(mask.layout).from_torch(mask, mask)


def _data_storage(data: torch.Tensor) -> Storage:
    """A sparse ``data`` tensor's storage in its own layout (its pattern as the mask)."""
    return layouts.get_layout(data.layout).from_torch(data, data.bool())


def read_at_mask(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    """The storage of ``mask``'s layout and pattern holding ``data`` at its stored positions
    (Note [The mask's layout wins]); ``data`` and ``mask`` are checked plain tensors of one
    shape and device."""
    s = _mask_storage(mask)
    if data.layout == torch.strided:
        return s.with_values(s.layout.gather(s, data).expand(s.mask.shape))
    values, _ = layouts.read_at(_data_storage(data), s)
    return s.with_values(values)


class _ReadAtMask(torch.autograd.Function):
    """:func:`read_at_mask` with the plain gradient of the data (Note [The mask's layout
    wins]): the incoming gradient at the mask's specified positions, 0 elsewhere, put back
    in the data's layout."""

    @staticmethod
    def forward(ctx, data: torch.Tensor, mask: torch.Tensor) -> Any:  # type: ignore[override]
        storage = read_at_mask(data.detach(), mask)
        ctx.storage = storage
        ctx.data_storage = None if data.layout == torch.strided else _data_storage(data.detach())
        return _wrap(storage)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        from ._autograd import grad_on

        s = ctx.storage
        values, mask = grad_on(grad, s)
        values = layouts.zero_unspecified(values, mask & s.mask)
        d = ctx.data_storage
        if d is None:  # dense data: the gradient scattered at the mask's positions
            return s.densify(values, 0), None
        at_data, _ = layouts.read_at(s.with_values(values), d)
        return d.layout.to_torch(d, at_data), None


def as_masked(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """``as_masked_tensor`` of data and mask of different layouts (checked)."""
    if torch.is_grad_enabled() and data.requires_grad:
        return _ReadAtMask.apply(data, mask)
    return _wrap(read_at_mask(data, mask))
