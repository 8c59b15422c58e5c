"""SGD with momentum on the elements a mask keeps, in one native pass (CPU).

Note [SGD momentum in one pass]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch's multi-tensor SGD with momentum reads and writes each tensor in separate passes
(``buf *= momentum``, ``buf += (1 - dampening) * grad``, ``param -= lr * buf``). A masked
parameter whose gradient covers its pattern must also keep the gradient's unspecified
values out of the step -- they may be anything, NaN included -- which through torch's step
costs one more pass over the gradient (a zero fill into a new tensor) before it: most of the
step again. ``ms_sgd_momentum`` in ``_native.c`` does it all per element: torch's operations
in torch's order (Note there), where the mask holds, and elsewhere it writes back the
parameter's and the buffer's own bits (a select, never arithmetic on the unspecified
gradient value). It needs no invariant on the buffer's unspecified entries: they are never
read into a result. On the elements it updates the numbers are torch's up to the rounding
of a fused multiply-add in torch's scalar tail (an ulp). None where it does not apply --
another device, the native kernels off (``layouts.native_disabled()``), other dtypes,
non-contiguous tensors, autograd: the caller runs torch's step.
"""

from __future__ import annotations

import torch

from . import _native

__all__ = ["sgd_momentum_"]


def sgd_momentum_(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None,
                  mask: torch.Tensor, *, lr: float, momentum: float, dampening: float,
                  weight_decay: float, nesterov: bool, maximize: bool) -> torch.Tensor | None:
    """One SGD momentum step of ``param`` in place where ``mask`` is True (Note [SGD
    momentum in one pass]): the momentum buffer ``buf`` (None on the first step: a new
    buffer, 0 where ``mask`` is False) is updated in place and returned. Returns None, and
    changes nothing, where the native kernel does not apply.

    >>> p, m = torch.ones(3), torch.tensor([True, False, True])
    >>> buf = sgd_momentum_(p, torch.tensor([1., float("nan"), 2.]), None, m, lr=0.5,
    ...                     momentum=0.9, dampening=0, weight_decay=0, nesterov=False,
    ...                     maximize=False)
    >>> buf is None or (p.tolist(), buf.tolist()) == ([0.5, 1.0, 0.0], [1.0, 0.0, 2.0])
    True
    """
    dtype, shape = param.dtype, param.shape
    if not (_native._eager_cpu(param) and type(grad) is torch.Tensor
            and type(mask) is torch.Tensor and grad.dtype is dtype and grad.shape == shape
            and mask.dtype is torch.bool and mask.shape == shape and grad.is_cpu
            and mask.is_cpu and param.is_contiguous() and grad.is_contiguous()
            and mask.is_contiguous()
            and (buf is None or (type(buf) is torch.Tensor and buf.dtype is dtype
                                 and buf.shape == shape and buf.is_cpu
                                 and buf.is_contiguous()))
            and _native._library() is not None):
        return None
    kernel = _native._SGD.get(dtype)
    if kernel is None:
        return None
    first = buf is None
    if first:
        buf = torch.zeros_like(param, memory_format=torch.contiguous_format)
    kernel(param.data_ptr(), grad.data_ptr(), buf.data_ptr(), mask.data_ptr(), param.numel(),
           float(lr), float(momentum), float(dampening), float(weight_decay), int(nesterov),
           int(maximize), int(first))
    # Written behind autograd's back: bump the version counters as torch's in-place ops do
    # (caches keyed by a tensor's version -- a dense buffer of the weight, a known fill --
    # must see the change).
    torch.autograd.graph.increment_version(param)
    torch.autograd.graph.increment_version(buf)
    return buf
