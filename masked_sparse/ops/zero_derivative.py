"""Pointwise ops whose derivative torch writes as a plain zero tensor: differentiated on the
values, so a MaskedTensor operand gets a masked (zero) gradient.

Note [Zero derivatives]
~~~~~~~~~~~~~~~~~~~~~~~
Most pointwise ops run torch's own derivative formula on the MaskedTensor (Note [Two
levels]), and the formula's ops keep the mask. A few formulas instead build their zero
from sizes alone -- ``sgn`` of a real tensor, ``copysign``'s and ``nextafter``'s ``other``
(``at::_efficientzerotensor``) -- a plain tensor with no MaskedTensor argument to dispatch
on, so the leaf's ``.grad`` would come back plain. These ops are therefore intercepted
above autograd and differentiated on the values (``on_values``, Note [Autograd on the
values]): each MaskedTensor operand gets a gradient over its own storage.
``tests/autograd/test_pointwise_gradients.py`` runs every differentiable pointwise op of
torch's registry, so an op that joins this kind is found there.
"""

from __future__ import annotations

from typing import Any

import torch

from layouts import Storage

from .._autograd import on_values
from .._registry import implements
from .._tensor import MaskedTensor, requires_grad_of
from .pointwise import align, broadcast, read_plain


def _on_storages(storages: list[Any], op: Any, template: tuple) -> Storage:
    """``op`` on the values of the masked operands (aligned) and the plain ones read at
    their positions; ``template`` holds the non-tensor arguments (None marks a tensor)."""
    masked = [s for s in storages if isinstance(s, Storage)]
    if all(s.shape == masked[0].shape for s in masked):
        aligned = align(op, masked)
    else:
        aligned = broadcast(op, masked)
    ref = aligned[0]
    given, lined_up = iter(storages), iter(aligned)
    args = []
    for a in template:
        if a is not None:
            args.append(a)
            continue
        t = next(given)
        args.append(next(lined_up).values if isinstance(t, Storage) else read_plain(op, ref, t))
    return ref.with_values(op(*args))


@implements(torch.sgn, torch.Tensor.sgn, torch.copysign, torch.Tensor.copysign,
            torch.nextafter, torch.Tensor.nextafter)
def zero_derivative(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The op on the values; differentiated there when an operand requires grad."""
    wanted = any(isinstance(a, torch.Tensor) and requires_grad_of(a) for a in args)
    if kwargs or not (wanted and torch.is_grad_enabled()):
        with torch._C.DisableTorchFunctionSubclass():
            return op(*args, **kwargs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    template = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
    if not any(isinstance(t, MaskedTensor) for t in tensors):
        with torch._C.DisableTorchFunctionSubclass():
            return op(*args)
    return on_values(_on_storages, tensors, op, template)
