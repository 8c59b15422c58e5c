"""``torch._foreach_*`` ops on lists holding MaskedTensors: one per-tensor op each.

``torch.nn.utils.clip_grad_norm_(..., foreach=True)`` and ``clip_grad_value_`` call
``_foreach_norm``, ``_foreach_mul_`` (with a 0-d total-norm tensor, which may itself be a
MaskedTensor: it broadcasts, Note [Broadcasting masked operands]) and
``_foreach_clamp_min_`` / ``_foreach_clamp_max_``. Each entry runs the matching per-tensor
aten op, so every element of the list gets the masked semantics of its own layout (a
norm over its specified entries); plain tensors in the list run the plain op.

>>> import torch, masked_sparse as ms
>>> g = ms.masked_tensor(torch.tensor([3., 4., 100.]), torch.tensor([True, True, False]))
>>> torch._foreach_norm([g])[0]
MaskedTensor(  5.0000, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._registry import ATEN

aten = torch.ops.aten


def _each(op: Callable[..., Any], inplace: bool) -> Callable[[Any, tuple, dict], Any]:
    def kernel(func: Any, args: tuple, kwargs: dict) -> Any:
        tensors, rest = args[0], args[1:]
        outs = [op(t, *rest, **kwargs) for t in tensors]
        return None if inplace else outs

    return kernel


def _norm(t: torch.Tensor, ord: Any = 2, dtype: Any = None) -> torch.Tensor:
    return aten.linalg_vector_norm.default(t, ord, dtype=dtype)


def _each_list(op: Callable[..., Any]) -> Callable[[Any, tuple, dict], Any]:
    def kernel(func: Any, args: tuple, kwargs: dict) -> Any:
        for t, other in zip(args[0], args[1]):
            op(t, other, *args[2:], **kwargs)

    return kernel


ATEN[aten._foreach_norm.Scalar] = _each(_norm, False)
ATEN[aten._foreach_mul_.Tensor] = _each(aten.mul_.Tensor, True)
ATEN[aten._foreach_mul_.Scalar] = _each(aten.mul_.Scalar, True)
ATEN[aten._foreach_mul_.List] = _each_list(aten.mul_.Tensor)
ATEN[aten._foreach_div_.Tensor] = _each(aten.div_.Tensor, True)
ATEN[aten._foreach_div_.Scalar] = _each(aten.div_.Scalar, True)
ATEN[aten._foreach_clamp_min_.Scalar] = _each(aten.clamp_min_.default, True)
ATEN[aten._foreach_clamp_max_.Scalar] = _each(aten.clamp_max_.default, True)
