"""The ``MaskedTensor`` type: a ``torch.Tensor`` subclass over a layout's :class:`Storage`.

Note [Wrapper layout]
~~~~~~~~~~~~~~~~~~~~~
The C++ wrapper of every MaskedTensor is a storage-less *strided* tensor of the logical
shape; the storage's layout is what ``mt.layout`` / ``mt.is_sparse`` report (answered in
``__torch_function__``). So autograd and the dispatcher treat sparse masked tensors exactly
like strided ones -- no sparse-specific C++ path ever sees them -- while users see the
storage's layout. Layouts registered without a ``torch.layout`` report ``torch.strided``;
``ms.layout_of(mt)`` gives the registered :class:`layouts.Layout` for any tensor.

Note [Index sharing]
~~~~~~~~~~~~~~~~~~~~
Ops that keep the sparsity pattern build their result with ``storage.with_values(...)``,
which keeps the very same index tensor objects. Binary ops compare masks by identity first
(free), and only compare tensor contents when the objects differ.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

import layouts
from layouts import Storage

from . import _registry
from ._repr import storage_repr


class MaskedTensor(torch.Tensor):
    """A tensor whose elements are either specified (mask True) or unspecified.

    Data and mask share one layout (strided, sparse COO, sparse CSR or any registered
    layout) and, for sparse layouts, one set of index tensors. Build one with
    :func:`masked_sparse.masked_tensor` or :func:`masked_sparse.as_masked_tensor`.

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    >>> (mt * 10).to_tensor(0)
    tensor([10.,  0.])
    """

    _storage: Storage

    @staticmethod
    def __new__(cls, data: torch.Tensor, mask: torch.Tensor, requires_grad: bool = False):
        from ._construct import storage_from_tensors, warn_if_requires_grad

        warn_if_requires_grad(data)
        return _wrap(storage_from_tensors(data, mask, "MaskedTensor"), requires_grad)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    # -- the public accessors ------------------------------------------------------------
    def get_data(self) -> torch.Tensor:
        """The data, in the same layout; masked-out entries hold arbitrary values.

        Differentiable: the gradient reaching this tensor flows back as a MaskedTensor.
        """
        from .ops.conversion import get_data

        return get_data(self)

    def get_mask(self) -> torch.Tensor:
        """The bool mask (True = specified), in the same layout and with the same indices."""
        s = self._storage
        return s.layout.to_torch(s, s.mask)

    def to_tensor(self, value: Any) -> torch.Tensor:
        """A plain tensor with masked-out positions filled with ``value``.

        For sparse layouts and ``value == 0`` the result stays sparse with the same
        indices; any other fill value can only be expressed densely.
        """
        from .ops.conversion import to_tensor

        return to_tensor(self, value)

    def validate(self, full: bool = False) -> MaskedTensor:
        """Check the storage's invariants: O(1) by default, all of them with ``full=True``.

        Raises ``ValueError`` naming the broken invariant; returns ``self``.
        """
        s = self._storage
        s.layout.validate(s, full)
        if s.mask.dtype != torch.bool or s.mask.shape != s.values.shape:
            raise ValueError(f"MaskedTensor[{s.layout.name}]: mask must be bool with the shape "
                             f"of the values {tuple(s.values.shape)}, got {s.mask.dtype} "
                             f"{tuple(s.mask.shape)}")
        return self

    def is_sparse_coo(self) -> bool:
        """True if stored sparse COO (``torch.masked``'s method; see also ``mt.layout``)."""
        return self._storage.layout.torch_layout is torch.sparse_coo

    @property
    def masked_data(self) -> torch.Tensor:
        """The data tensor, as the first MaskedTensor prototype named it."""
        return self.get_data()

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        with torch.no_grad():
            return storage_repr(self._storage, self.dtype)

    __str__ = __repr__

    # -- routing -------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        handler = _registry.FUNCTIONS.get(func)
        if handler is not None:
            return handler(func, *args, **(kwargs or {}))
        with DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        handler = _registry.ATEN.get(func)
        if handler is None:
            from .ops.pointwise import resolve

            handler = resolve(func, args)
        return handler(func, *args, **(kwargs or {}))

    # -- torch.compile / serialization ---------------------------------------------------
    def __reduce_ex__(self, proto: int) -> tuple:  # pickle, torch.save (weights_only=True)
        from ._serialize import reduce_masked

        return reduce_masked(self, proto)

    def __deepcopy__(self, memo: dict) -> MaskedTensor:
        from ._serialize import deepcopy_masked

        return deepcopy_masked(self, memo)

    def __tensor_flatten__(self) -> tuple[list[str], tuple[str, int]]:
        n = len(self._storage.index)
        return ["_values", "_mask"] + [f"_index{i}" for i in range(n)], (
            self._storage.layout.name, n)

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: tuple[str, int],
                             outer_size: Any, outer_stride: Any) -> MaskedTensor:
        name, n = meta
        index = tuple(inner[f"_index{i}"] for i in range(n))
        storage = layouts.get_layout(name).build(index, inner["_values"], inner["_mask"],
                                                 outer_size)
        return _wrap(storage)

    @property
    def _values(self) -> torch.Tensor:
        return self._storage.values

    @property
    def _mask(self) -> torch.Tensor:
        return self._storage.mask

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_index") and name[6:].isdigit():
            return self._storage.index[int(name[6:])]
        raise AttributeError(f"'MaskedTensor' object has no attribute {name!r}")


def _wrap(storage: Storage, requires_grad: bool = False) -> MaskedTensor:
    """A MaskedTensor over ``storage`` (no copy, no check)."""
    values = storage.values
    strides = values.stride() if not storage.index else None
    out = torch.Tensor._make_wrapper_subclass(
        MaskedTensor, storage.shape, strides=strides, dtype=values.dtype, device=values.device,
        requires_grad=requires_grad)
    out._storage = storage
    return out


def requires_grad_of(t: torch.Tensor) -> bool:
    """``t.requires_grad`` without the ``__torch_function__`` round trip (1.5 µs less).

    Property reads on a MaskedTensor go through ``__torch_function__``; this one has no
    masked meaning, so hot paths (``get_data``, ``to_tensor``) read it directly.
    """
    with DisableTorchFunctionSubclass():
        return t.requires_grad


def is_masked_tensor(obj: Any) -> bool:
    """True if ``obj`` is a MaskedTensor.

    >>> import torch, masked_sparse as ms
    >>> ms.is_masked_tensor(torch.zeros(2))
    False
    """
    return isinstance(obj, MaskedTensor)


def layout_of(t: torch.Tensor) -> layouts.Layout:
    """The registered layout of a MaskedTensor or a plain tensor."""
    if isinstance(t, MaskedTensor):
        return t._storage.layout
    return layouts.get_layout(t.layout)
