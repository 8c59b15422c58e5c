"""Building MaskedTensors from user tensors: ``masked_tensor`` and ``as_masked_tensor``.

The checks of the user's tensors are the type's own (``_tensor.storage_from_tensors``, which
``MaskedTensor(data, mask)`` runs too); the differentiable routes of ``as_masked_tensor`` are
autograd Functions of ``_autograd.py`` (Note [as_masked_tensor's routes]; data and mask of
different layouts: Note [The mask's layout wins]).
"""

from __future__ import annotations

import torch

from . import _func
from ._autograd import as_masked, as_masked_across_layouts
from ._tensor import MaskedTensor, _wrap, storage_from_tensors, warn_if_requires_grad


def masked_tensor(data: torch.Tensor, mask: torch.Tensor, *,
                  requires_grad: bool = False) -> MaskedTensor:
    """A new MaskedTensor leaf holding a copy of ``data`` where ``mask`` is True.

    Like ``torch.tensor``, it copies the data (and mask) and is not connected to the
    autograd graph of ``data``; see :func:`as_masked_tensor` for the differentiable view.
    ``data`` and ``mask`` must have the same shape and layout (strided, sparse COO, sparse
    CSR or any registered one).

    >>> import torch, masked_sparse as ms
    >>> ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    MaskedTensor(
      [  1.0000,       --]
    )
    """
    if _dynamo_compiling() and _torch_sparse(data, mask):
        return _MASKED_TENSOR_OUTSIDE_GRAPH(data, mask, requires_grad=requires_grad)
    return _masked_tensor(data, mask, requires_grad=requires_grad)


def _masked_tensor(data: torch.Tensor, mask: torch.Tensor, *,
                   requires_grad: bool = False) -> MaskedTensor:
    if isinstance(data, torch.Tensor) and not isinstance(data, MaskedTensor):
        warn_if_requires_grad(data, stacklevel=4)  # (from the user's call)
        data = data.detach()
    storage = storage_from_tensors(data, mask, "masked_tensor")
    storage = storage.with_values(storage.values.clone(), storage.mask.clone())
    return _wrap(storage, requires_grad)


def as_masked_tensor(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """A MaskedTensor over ``data`` (no copy), differentiable with respect to ``data``.

    The gradient that reaches ``data`` is a MaskedTensor carrying ``mask``; when ``data``
    is itself a leaf, its ``.grad`` is a plain tensor of its layout, 0 where unspecified
    (Note [Plain gradients for plain leaves]).

    >>> import torch, masked_sparse as ms
    >>> x = torch.tensor([1., 1.], requires_grad=True)
    >>> ms.as_masked_tensor(x * 2, torch.tensor([False, True])).sum().backward()
    >>> x.grad
    MaskedTensor(
      [      --,   2.0000]
    )
    """
    if _dynamo_compiling() and _torch_sparse(data, mask):
        return _AS_MASKED_TENSOR_OUTSIDE_GRAPH(data, mask)
    return _as_masked_tensor(data, mask)


def _as_masked_tensor(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    if _func.active() and torch._C._functorch.is_functorch_wrapped_tensor(data):
        # Note [MaskedTensors in torch.func]: over the transform's own tracked data.
        if data.layout != torch.strided:
            raise NotImplementedError(_func.sparse_refusal("as_masked_tensor", str(data.layout)))
        return _wrap(storage_from_tensors(data, mask, "as_masked_tensor"))
    if (isinstance(data, torch.Tensor) and isinstance(mask, torch.Tensor)
            and data.layout != mask.layout and not isinstance(data, MaskedTensor)):
        # Note [The mask's layout wins]
        storage_from_tensors(data.detach(), mask, "as_masked_tensor")  # the checks
        return as_masked_across_layouts(data, mask)
    if torch.is_grad_enabled() and isinstance(data, torch.Tensor) and data.requires_grad:
        return as_masked(data, mask)
    return _wrap(storage_from_tensors(data, mask, "as_masked_tensor"))


# Note [Construction under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo cannot trace ``_make_wrapper_subclass``. Both constructors are therefore opaque
# calls in Dynamo's graph (``allow_in_graph``): AOTAutograd then runs them on fake tensors,
# where building the wrapper is ordinary Python, and traces the ops they do on the data.
# A graph cannot hold a torch sparse tensor (torch's fake tensors cannot build or read a
# CSR one: Note [Sparse results under torch.compile]), so a constructor given one -- the
# mask of a sparse MaskedTensor, ``ms.as_masked_tensor(U @ V.T, R.get_mask())`` -- runs
# outside the graph: the public functions, which Dynamo traces, send such a call to a
# ``torch.compiler.disable``-d copy (one graph break; the ops around it compile).
torch.compiler.allow_in_graph(_masked_tensor)
torch.compiler.allow_in_graph(_as_masked_tensor)
_dynamo_compiling = torch.compiler.is_dynamo_compiling


def _torch_sparse(*tensors: object) -> bool:
    """True if one of ``tensors`` is a plain tensor of a torch sparse layout."""
    return any(isinstance(t, torch.Tensor) and not isinstance(t, MaskedTensor)
               and t.layout != torch.strided for t in tensors)


_MASKED_TENSOR_OUTSIDE_GRAPH = torch.compiler.disable(_masked_tensor)
_AS_MASKED_TENSOR_OUTSIDE_GRAPH = torch.compiler.disable(_as_masked_tensor)
