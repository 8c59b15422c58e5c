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

This module reads the storages (below the type: ``MaskedTensor(data, mask)`` and
``masked_tensor`` build through it); the differentiable route of ``as_masked_tensor`` is
``_autograd.as_masked_across_layouts``.

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

import torch

import layouts
from layouts import Storage


def _mask_storage(mask: torch.Tensor) -> Storage:
    return layouts.get_layout(mask.layout).from_torch(mask, mask)


def data_storage(data: torch.Tensor) -> Storage:
    """A sparse ``data`` tensor's storage in its own layout (its pattern as the mask)."""
    return layouts.get_layout(data.layout).from_torch(data, data.bool())


def read_at_mask(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    """The storage of ``mask``'s layout and pattern holding ``data`` at its stored positions
    (Note [The mask's layout wins]); ``data`` and ``mask`` are checked plain tensors of one
    shape and device."""
    s = _mask_storage(mask)
    if data.layout == torch.strided:
        return s.with_values(s.layout.gather(s, data).expand(s.mask.shape))
    values, _ = layouts.read_at(data_storage(data), s)
    return s.with_values(values)


def storage_at_mask(op: str, data: torch.Tensor, mask: torch.Tensor) -> Storage:
    """``data`` read at the stored positions of a ``mask`` of another layout, after the
    checks that only such a pair needs (``_tensor.storage_from_tensors`` did the others)."""
    if (data.is_meta or mask.is_meta) and not torch.compiler.is_compiling():
        raise NotImplementedError(f"{op}: data ({data.layout}) and mask ({mask.layout}) of "
                                  f"different layouts on the meta device: reading one at the "
                                  f"other's positions needs their indices; use one layout")
    layouts.get_layout(mask.layout)  # an unregistered layout: its error, naming the others
    layouts.get_layout(data.layout)
    if not torch.compiler.is_compiling():
        layouts.check_sparse_input(op, data=data, mask=mask)
    return read_at_mask(data, mask)
