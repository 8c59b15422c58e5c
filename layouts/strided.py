"""The strided layout: dense data and a dense bool mask of the same shape.

Invariants
----------
- ``index == ()``; ``values`` is the data and has ``shape``; ``mask`` is bool with ``shape``.
- Every position is stored; a position is specified where ``mask`` is True.
- The values under a False mask are arbitrary: never read them without masking.
"""

from __future__ import annotations

from typing import Any

import torch

from ._lines import dense_lines
from ._reduce_strided import StridedGrouping
from ._shape_strided import SHAPE_OPS as _SHAPE_OPS
from ._vector_mask import vector_mask
from .kernels._route import traced
from .kernels.arg_extreme import masked_arg
from .registry import Layout, Storage, get_layout, register_layout, takes_layout


@takes_layout
def _from_strided(layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
    """Also ``from_torch``: a user's strided data and mask are the storage."""
    return layout.build((), data, mask, data.shape)


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    return values


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    """Also the ``get_data`` kernel: the values are the data (a strided tensor every
    transform can hold; no check of the result needed)."""
    return values


def _to_tensor(storage: Storage, value: Any) -> torch.Tensor:
    """Compiled code fills through the vector-loaded mask (Note [Compiled mask loads]);
    eager code takes the generic ``masked_fill``."""
    if not torch.compiler.is_compiling():
        return NotImplemented
    return storage.values.masked_fill(~vector_mask(storage.mask), value)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    # Broadcasting in the op itself reads the dense operand; nothing to gather.
    return dense


def _to_coo(storage: Storage) -> Storage:
    return get_layout("sparse_coo").from_strided(storage.values, storage.mask)


@takes_layout
def _from_coo(layout: Layout, storage: Storage) -> Storage:
    return layout.build((), storage.densify(), storage.densify(storage.mask, False), storage.shape)


def _masked_arg(storage: Storage, dims: tuple[int, ...], keepdim: bool, op: str,
                with_values: bool) -> Storage:
    """The ``reduction`` kernel of ``argmax`` / ``argmin`` (``op`` "amax" / "amin") over
    every dim: the row-major position is the position in the contiguous values, so the
    sparse layouts' one native pass (:func:`masked_arg`: the masked extreme, then the first
    specified element reaching it, NaN first) serves the flattened values, in place of the
    dozen torch ops of the generic route. ``NotImplemented`` (the generic route) where
    that does not apply: along some dims, ``keepdim``, a 0-d or non-contiguous storage, a
    tracer, no native kernel (another device).

    >>> s = _from_strided(get_layout("strided"), torch.tensor([[1., 7.], [7., 2.]]),
    ...                   torch.tensor([[True, False], [True, True]]))
    >>> out = _masked_arg(s, (0, 1), False, "amax", False)
    >>> out is NotImplemented or out.values.item() == 2
    True
    """
    values, mask = storage.values, storage.mask
    if (keepdim or with_values or not dims or len(dims) != values.dim() or traced(values)
            or mask.shape != values.shape or not values.is_contiguous()
            or not mask.is_contiguous()):
        return NotImplemented
    n = values.numel()
    flat = storage.layout.build((), values.view(n), mask.view(n), (n,))
    return masked_arg(flat, (0,), False, op, False, coords=_flat_coords)


def _flat_coords(storage: Storage, i: int) -> list[int]:
    return [i]


def _validate(storage: Storage, full: bool = False) -> None:
    if storage.values.shape != storage.shape or storage.mask.shape != storage.shape:
        raise ValueError(f"strided masked tensor: data {tuple(storage.values.shape)} and mask "
                         f"{tuple(storage.mask.shape)} must both have shape {tuple(storage.shape)}")


register_layout(Layout(
    name="strided",
    torch_layout=torch.strided,
    index_names=(),
    from_torch=_from_strided,
    from_strided=_from_strided,
    densify=_densify,
    to_torch=_to_torch,
    to_tensor=_to_tensor,
    get_data=_to_torch,
    gather=_gather,
    to_coo=_to_coo,
    from_coo=_from_coo,
    validate=_validate,
    reduction={torch.ops.aten.argmax.default: _masked_arg,
               torch.ops.aten.argmin.default: _masked_arg},
    group=StridedGrouping,
    lines=dense_lines,
    shape_ops=_SHAPE_OPS,
    doc=__doc__ or "",
))
