"""What an op says when torch has no kernel for it on the operands' device.

On CUDA (or MPS, meta, ...) a MaskedTensor op runs torch ops on its storage's plain
tensors. Where torch lacks one of them on that device (no sparse kernel, no kernel for the
dtype), torch's message names an aten operator and a dispatch key, not the masked op nor a
way forward. :func:`missing_kernel` turns such an error into a ``NotImplementedError`` that
names the op, the device and the way out (the CPU, where every op has a kernel); every other
error, and every error on the CPU, passes through unchanged.

>>> import torch
>>> exc = NotImplementedError("Could not run 'aten::addmm.out' with arguments from the "
...                           "'SparseCsrCUDA' backend.")
>>> str(missing_kernel(torch.matmul, (torch.empty(0, device="meta"),), exc)).split(":")[0]
'matmul on meta'
"""

from __future__ import annotations

from typing import Any

import torch

from ._registry import op_name

# What torch says when it has no kernel for an operator on a device or for a dtype there.
_TORCH_LACKS = ("Could not run '", "there was no fake impl or Meta kernel",
                "not implemented for '")


def _device_of(args: Any) -> torch.device | None:
    """The device of the first tensor among ``args`` (one level into lists and tuples)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            found = _device_of(a)
            if found is not None:
                return found
    return None


def missing_kernel(func: Any, args: tuple, exc: BaseException) -> NotImplementedError | None:
    """A ``NotImplementedError`` naming ``func``, the device and the way out where ``exc``
    is torch lacking a kernel on a non-CPU device; None where it is anything else."""
    message = str(exc)
    if not any(s in message for s in _TORCH_LACKS):
        return None
    device = _device_of(args)
    if device is None or device.type == "cpu":
        return None
    first = message.splitlines()[0][:200] if message else type(exc).__name__
    return NotImplementedError(
        f"{op_name(func)} on {device}: torch has no kernel on {device.type} for a step of it "
        f"({first}). Run this op on the CPU (mt.cpu(), then .to({str(device)!r}) on the "
        f"result), or use a layout or dtype torch supports on {device.type}.")
