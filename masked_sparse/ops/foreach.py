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

from typing import Any

import torch

from .._registry import implements

aten = torch.ops.aten

#: Each foreach overload and the per-tensor op it applies (in place: returns None).
PER_TENSOR: dict[Any, Any] = {
    aten._foreach_norm.Scalar: aten.linalg_vector_norm.default,
    aten._foreach_mul_.Tensor: aten.mul_.Tensor,
    aten._foreach_mul_.Scalar: aten.mul_.Scalar,
    aten._foreach_div_.Tensor: aten.div_.Tensor,
    aten._foreach_div_.Scalar: aten.div_.Scalar,
    aten._foreach_clamp_min_.Scalar: aten.clamp_min_.default,
    aten._foreach_clamp_max_.Scalar: aten.clamp_max_.default,
}


@implements(*PER_TENSOR)
def _foreach(op: Any, tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    each = PER_TENSOR[op]
    outs = [each(t, *args, **kwargs) for t in tensors]
    return None if op._opname.endswith("_") else outs


@implements(aten._foreach_mul_.List)
def _foreach_mul_list(op: Any, tensors: list[torch.Tensor], others: list[torch.Tensor]) -> None:
    for t, other in zip(tensors, others):
        aten.mul_.Tensor(t, other)
