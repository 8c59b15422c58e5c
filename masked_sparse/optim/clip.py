"""Gradient clipping for dense, torch sparse and masked gradients: torch's two functions.

``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` raise inside torch on sparse
gradients. These take the same arguments and return the same values for every gradient
form, working on the stored values in place (nothing is densified). When every gradient
is a plain dense tensor they *are* torch's functions (the call is handed over).

Note [Clipping the specified entries]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The norm of a gradient is the norm of its specified entries: every stored value of a
torch sparse tensor (an uncoalesced COO gradient is coalesced first, since the norm is
not linear in its duplicates), the values under the mask of a MaskedTensor. For
``norm_type > 0`` and ``inf`` that is the norm of the dense gradient with zeros
elsewhere, so the result is torch's on the dense equivalent; for ``0`` and ``-inf`` it
counts (minimizes over) the specified entries only. The total norm combines the
per-gradient norms as torch does (``vector_norm`` of their stack). Scaling multiplies the
stored values in place -- linear, so duplicates of an uncoalesced COO gradient need no
coalescing. Clamping a value is not linear, so ``clip_grad_value_`` first replaces an
uncoalesced COO ``p.grad`` by its coalesced form; stored values under a False mask are
scaled or clamped too, which changes nothing specified.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable

import torch

from .._tensor import MaskedTensor
from ._scatter import as_masked_grad

__all__ = ["clip_grad_norm_", "clip_grad_value_"]

def _parameters(parameters: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    parameters = list(parameters)
    if is_generator and not parameters:
        warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                      stacklevel=3)
    return parameters


def _is_plain_dense(grad: torch.Tensor) -> bool:
    return not isinstance(grad, MaskedTensor) and grad.layout == torch.strided


def _stored_values(grad: torch.Tensor, where: str) -> torch.Tensor:
    """The tensor holding ``grad``'s stored values, to be changed in place."""
    if isinstance(grad, MaskedTensor):
        return grad._storage.values
    if grad.layout == torch.strided:
        return grad
    if grad.layout == torch.sparse_coo:
        return grad._values()  # uncoalesced too: scaling is linear
    try:
        return grad.values()  # the compressed layouts
    except (RuntimeError, NotImplementedError):
        raise TypeError(f"ms.optim.{where}: unsupported gradient layout {grad.layout}; pass "
                        f"a dense, torch sparse or MaskedTensor gradient") from None


def _specified_values(grad: torch.Tensor, where: str) -> torch.Tensor:
    """The specified entries of ``grad`` (Note [Clipping the specified entries])."""
    if _is_plain_dense(grad):
        return grad
    s = as_masked_grad(grad, f"ms.optim.{where}")._storage
    if not isinstance(grad, MaskedTensor):
        return s.values  # a torch sparse gradient: every stored entry is specified
    return s.values.masked_select(s.mask)


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for dense, torch sparse and masked gradients.

    Returns the total norm of the gradients' specified entries (Note [Clipping the
    specified entries]) and scales every gradient in place by ``min(max_norm / (total +
    1e-6), 1)``. ``error_if_nonfinite=True`` raises ``RuntimeError`` on a NaN or infinite
    total, as torch does.

    >>> import torch, masked_sparse as ms
    >>> w = torch.nn.Parameter(torch.zeros(4))
    >>> w.grad = torch.sparse_coo_tensor([[0, 0, 3]], [1., 2., 4.], (4,))  # uncoalesced
    >>> ms.optim.clip_grad_norm_([w], max_norm=1.0)
    tensor(5.)
    >>> w.grad.to_dense()
    tensor([0.6000, 0.0000, 0.0000, 0.8000])
    """
    parameters = _parameters(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    if all(_is_plain_dense(g) for g in grads):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type,
                                              error_if_nonfinite, foreach)
    norm_type = float(norm_type)
    with torch.no_grad():
        values = [_specified_values(g, "clip_grad_norm_") for g in grads]
        values = [v for v in values if v.numel()]  # no entry: nothing to take the norm of
        if not values:  # the norm of no entry, on the gradients' device as torch's
            return torch.zeros((), device=grads[0].device)
        first_device = values[0].device
        if foreach is not False and len({v.device for v in values}) == 1:
            norms = torch._foreach_norm(values, norm_type)
        else:
            norms = [torch.linalg.vector_norm(v, norm_type) for v in values]
        total = torch.linalg.vector_norm(torch.stack([n.to(first_device) for n in norms]),
                                         norm_type)
        if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
            raise RuntimeError(
                f"ms.optim.clip_grad_norm_: the total norm of order {norm_type} for gradients "
                f"from `parameters` is non-finite, so it cannot be clipped. To disable this "
                f"error and scale the gradients by the non-finite norm anyway, set "
                f"`error_if_nonfinite=False`")
        coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for g in grads:
            stored = _stored_values(g, "clip_grad_norm_")
            stored.mul_(coef.to(stored.device))
    return total


def clip_grad_value_(parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float,
                     foreach: bool | None = None) -> None:
    """``torch.nn.utils.clip_grad_value_`` for dense, torch sparse and masked gradients.

    Clamps every specified gradient entry to ``[-clip_value, clip_value]`` in place; an
    uncoalesced COO ``p.grad`` is replaced by its coalesced form first (Note [Clipping the
    specified entries]).

    >>> import torch, masked_sparse as ms
    >>> w = torch.nn.Parameter(torch.zeros(3))
    >>> w.grad = torch.sparse_coo_tensor([[1, 1, 2]], [0.3, 0.3, -0.1], (3,))
    >>> ms.optim.clip_grad_value_([w], 0.5)
    >>> w.grad.to_dense()
    tensor([ 0.0000,  0.5000, -0.1000])
    """
    parameters = [p for p in _parameters(parameters) if p.grad is not None]
    if all(_is_plain_dense(p.grad) for p in parameters):
        return torch.nn.utils.clip_grad_value_(parameters, clip_value, foreach)
    clip_value = float(clip_value)
    with torch.no_grad():
        for p in parameters:
            g = p.grad
            if (not isinstance(g, MaskedTensor) and g.layout == torch.sparse_coo
                    and not g.is_coalesced()):
                p.grad = g = g.coalesce()
            _stored_values(g, "clip_grad_value_").clamp_(min=-clip_value, max=clip_value)
    return None
