"""Leaving and changing storage: ``get_data``, ``to_tensor`` and layout conversions.

All of them are differentiable; a gradient flowing back always reaches the MaskedTensor
as a MaskedTensor over its own storage (its mask, its index tensors).
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .._autograd import grad_on, on_values
from .._memory import check_fits
from .._registry import implements
from .._tensor import MaskedTensor, _wrap, requires_grad_of


class _GetData(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mt: MaskedTensor) -> torch.Tensor:
        ctx.storage = s = mt._storage
        return _data(s, s.values.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> MaskedTensor:
        if isinstance(grad, MaskedTensor):
            return grad
        s = ctx.storage
        return _wrap(s.with_values(grad_on(grad, s)[0]))


def get_data(mt: MaskedTensor) -> torch.Tensor:
    """The data of ``mt`` in its layout (see :meth:`MaskedTensor.get_data`)."""
    if torch.is_grad_enabled() and requires_grad_of(mt):
        return _GetData.apply(mt)
    s = mt._storage
    return _data(s, s.values)


def _data(s: Storage, values: torch.Tensor) -> torch.Tensor:
    """The layout's ``get_data`` kernel, else its plain torch form (``to_torch``)."""
    own = s.layout.get_data
    out = own(s, values) if own is not None else NotImplemented
    return s.layout.to_torch(s, values) if out is NotImplemented else out


def _fill(s: Storage, value: Any) -> torch.Tensor:
    """The layout's ``to_tensor`` kernel, else the values filled and put in torch form."""
    own = s.layout.to_tensor
    out = own(s, value) if own is not None else NotImplemented
    if out is not NotImplemented:
        return out
    if not s.index:
        return s.values.masked_fill(~s.mask, value)
    if isinstance(value, (int, float, bool)) and value == 0:
        return s.layout.to_torch(s, s.values.masked_fill(~s.mask, value))
    check_fits(f"to_tensor({value!r}) of a {s.layout.name} MaskedTensor", "strided", s.shape,
               s.values.numel(), s.values.dtype, s.values.device,
               "to_tensor(0) stays sparse; or reduce or slice it before filling")
    return s.densify(s.values.masked_fill(~s.mask, value), value)


class _ToTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mt: MaskedTensor, value: Any) -> torch.Tensor:
        ctx.storage = s = mt._storage
        return _fill(s.with_values(s.values.detach()), value)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[MaskedTensor, None]:
        s = ctx.storage
        return _wrap(s.with_values(grad_on(grad, s)[0])), None


def to_tensor(mt: MaskedTensor, value: Any) -> torch.Tensor:
    """``mt`` with masked-out positions filled with ``value`` (:meth:`MaskedTensor.to_tensor`)."""
    if torch.is_grad_enabled() and requires_grad_of(mt):
        return _ToTensor.apply(mt, value)
    return _fill(mt._storage, value)


def _convert(storages: list[Storage], target: Any, options: dict[str, Any]) -> Storage:
    return layouts.convert(storages[0], target, **options)


def to_layout(mt: MaskedTensor, layout: Any, **options: Any) -> MaskedTensor:
    """``mt`` in another registered layout: exact, differentiable, O(nnz) between sparse ones.

    ``layout`` is a ``torch.layout``, a registered layout's name or a
    :class:`layouts.Layout`; ``options`` are passed to that layout's conversion (for
    example a block layout's ``blocksize=(2, 2)``, as torch's ``to_sparse_bsr`` takes it).

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> ms.to_layout(mt, torch.sparse_csr).layout
    torch.sparse_csr
    >>> mt.to_sparse_bsr((1, 2)).get_data().values().shape
    torch.Size([2, 1, 2])
    """
    target = layouts.get_layout(layout)
    s = mt._storage
    if s.layout is target and (not options or options == target.options_of(s)):
        return mt
    if s.index:  # from a sparse layout, the result may grow with the shape (Note [Memory rule])
        check_fits(f"converting a {s.layout.name} MaskedTensor to {target.name}", target.name,
                   s.shape, s.values.numel(), s.values.dtype, s.values.device,
                   f"keep it in {s.layout.name} (its ops never densify; to_tensor(0) stays "
                   f"sparse), or reduce or slice it first", options)
    return on_values(_convert, [mt], target, options)


@implements(torch.Tensor.to_dense)
def _to_dense(op: Any, mt: MaskedTensor, dtype: Any = None, *,
              masked_grad: Any = None) -> MaskedTensor:
    out = to_layout(mt, torch.strided)
    return out if dtype is None else out.to(dtype)


def _options(**given: Any) -> dict[str, Any]:
    """The conversion options a torch method was given (those left at None are absent)."""
    return {k: (tuple(v) if k == "blocksize" else v) for k, v in given.items() if v is not None}


@implements(torch.Tensor.to_sparse)
def _to_sparse(op: Any, mt: MaskedTensor, sparse_dim: Any = None, *, layout: Any = None,
               blocksize: Any = None, dense_dim: Any = None) -> MaskedTensor:
    if sparse_dim is not None and sparse_dim != mt.dim():
        raise NotImplementedError(f"MaskedTensor to_sparse(sparse_dim={sparse_dim}): only "
                                  f"sparse_dim == ndim ({mt.dim()}) is supported; convert with "
                                  f".to_sparse() and keep dense dims out of the mask")
    return to_layout(mt, torch.sparse_coo if layout is None else layout,
                     **_options(blocksize=blocksize, dense_dim=dense_dim))


# Torch's own conversion methods, one generic handler each: the target layout and the
# options reach the registered layout unchanged (a layout that is not registered raises
# NotImplementedError in get_layout, naming the registered ones).
@implements(torch.Tensor.to_sparse_coo)
def _to_sparse_coo(op: Any, mt: MaskedTensor) -> MaskedTensor:
    return to_layout(mt, torch.sparse_coo)


# Positional parameters of torch's compressed-format conversion methods (torch's API).
_TORCH_COMPRESSED = {"to_sparse_csr": ("dense_dim",), "to_sparse_csc": ("dense_dim",),
                     "to_sparse_bsr": ("blocksize", "dense_dim"),
                     "to_sparse_bsc": ("blocksize", "dense_dim")}


@implements(*(getattr(torch.Tensor, name) for name in _TORCH_COMPRESSED))
def _to_compressed(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> MaskedTensor:
    name = op.__name__
    params = _TORCH_COMPRESSED[name]
    if len(args) > len(params) or set(kwargs) - set(params):
        raise TypeError(f"{name}: expected arguments {params}, got {args} {kwargs}")
    given = dict(zip(params, args), **kwargs)
    target = getattr(torch, name.removeprefix("to_"))  # to_sparse_csr -> torch.sparse_csr
    return to_layout(mt, target, **_options(**given))
