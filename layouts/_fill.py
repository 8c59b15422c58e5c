"""The exact fill of unspecified elements, and what they are filled with.

One fill for the whole package: :func:`fill_unspecified` (``torch.where(mask, values,
value)`` bit for bit), :func:`zero_unspecified` (the zero fill) and its in-place form for a
caller's fresh temporary, :func:`zero_unspecified_`. On CPU without autograd they run one
native pass of masked blends (``_native.fill``); everywhere else ``torch.where`` (other
devices, torch.compile -- Inductor fuses it --, torch.func, no native library). A mask
broadcast over some dims is applied at its stored size (:func:`broadcast_part`, Note [Fill
of a broadcast mask]). :func:`identity` and :func:`start` say what an unspecified element
reads in a reduction.

>>> zero_unspecified(torch.tensor([1., float("inf")]), torch.tensor([True, False])).tolist()
[1.0, 0.0]
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import _native

#: Same-size integer dtypes: the bits of a value of each dtype (``layouts.SAME_WIDTH_INT``).
SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32,
                  torch.float16: torch.int16, torch.bfloat16: torch.int16,
                  torch.int64: torch.int64, torch.int32: torch.int32, torch.int16: torch.int16,
                  torch.int8: torch.int8, torch.uint8: torch.uint8}
_BITS = SAME_WIDTH_INT
_FILL_MIN = 1 << 12  # below this, one ``where`` call costs less than the native call


def plain_eager(values: torch.Tensor) -> bool:
    """True when ``values`` may take a forward-only CPU fast path: a CPU tensor, eager (not
    compiling), no autograd to record and no ``torch.func`` transform active (their
    wrappers would meet dtype views and host reads they cannot follow)."""
    return (values.is_cpu and not torch.compiler.is_compiling()
            and not (values.requires_grad and torch.is_grad_enabled())
            and not torch._C._are_functorch_transforms_active())


def identity(op: str, dtype: torch.dtype) -> float | int | bool:
    """The identity of ``op`` ("amax" or "amin") in ``dtype``: what an unspecified element
    reads so that it never wins.

    >>> identity("amax", torch.int8), identity("amin", torch.float32)
    (-128, inf)
    """
    if dtype == torch.bool:
        return op == "amin"
    if dtype.is_floating_point:
        return -math.inf if op == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if op == "amax" else info.max


def start(op: str, dtype: torch.dtype) -> float | int | bool:
    """What an unspecified element reads in a masked ``op`` reduction: 0 for "sum" and
    "sumsq", 1 for "prod", else :func:`identity`."""
    return 0 if op in ("sum", "sumsq") else 1 if op == "prod" else identity(op, dtype)


def zero_unspecified(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, values, 0)``: exact (NaN and inf under the mask become 0)."""
    return fill_unspecified(values, mask, 0)


def fill_unspecified(values: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    """``torch.where(mask, values, value)``, bit for bit: unspecified elements (NaN and inf
    included) read ``value``, specified ones keep their exact bits (-0.0 and NaN payloads).

    The one exact fill: differentiable (through ``torch.where``) when ``values`` requires
    grad; otherwise, on CPU, one native pass of masked blends (``_native.fill``: ``where``
    on CPU branches on its bool condition per element), or for a broadcast mask one
    integer product (Note [Fill of a broadcast mask]); ``torch.where`` everywhere else
    (other devices, torch.compile -- Inductor fuses it --, torch.func, no native library).

    >>> fill_unspecified(torch.tensor([1., float("nan")]), torch.tensor([True, False]),
    ...                  float("-inf")).tolist()
    [1.0, -inf]
    """
    if (values.dtype in _BITS and values.numel() >= _FILL_MIN and mask.shape == values.shape
            and plain_eager(values)):
        bits = _fill_bits(value, values.dtype)
        small = broadcast_part(mask) if mask.dtype == torch.bool else mask
        if small is not mask:  # Note [Fill of a broadcast mask]
            as_int = values.view(_BITS[values.dtype])
            if bits == 0:
                return (as_int * small).view(values.dtype)
            keep = small.to(as_int.dtype)
            return torch.addcmul((1 - keep) * bits, as_int, keep).view(values.dtype)
        out = _native.fill(values, mask, bits)
        if out is not None:
            return out
    return torch.where(mask, values, fill_constant(value, values))


def zero_unspecified_(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, t, 0)`` for ``t`` a fresh temporary of the caller's (its own
    result, which nothing else reads), written in place where nothing is differentiated:
    by the integer product of Note [Fill of a broadcast mask] for a broadcast mask, else
    one native pass (CPU); a new tensor otherwise (autograd recording, torch.compile --
    one ``where`` that Inductor fuses into the kernel computing ``t`` --, torch.func, a
    view or broadcast ``t``, other devices without a broadcast mask).

    >>> t = torch.tensor([1., float("nan")])
    >>> zero_unspecified_(t, torch.tensor([True, False])).tolist()
    [1.0, 0.0]
    """
    if (not torch.is_grad_enabled() and t.shape == mask.shape and t.dtype in _BITS
            and mask.dtype == torch.bool and not t._is_view() and t.is_contiguous()
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()):
        small = broadcast_part(mask)
        if small is not mask:
            t.view(_BITS[t.dtype]).mul_(small)
            return t
        if _native.fill(t, mask, 0, out=t) is not None:
            return t
    return zero_unspecified(t.expand_as(mask) if t.shape != mask.shape else t, mask)


def broadcast_part(mask: torch.Tensor, keep: int | None = None) -> torch.Tensor:
    """``mask`` with its broadcast (stride 0) dims cut to size 1, except dim ``keep``
    (``mask`` itself if none): it broadcasts back to ``mask``'s shape, and an elementwise op
    on it touches each stored element once (an attention mask expanded over heads).

    >>> m = torch.tensor([True, False]).expand(3, 2)
    >>> broadcast_part(m).shape, broadcast_part(m, keep=0).shape
    (torch.Size([1, 2]), torch.Size([3, 2]))

    Note [Fill of a broadcast mask]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A mask expanded over some dims (an attention mask shared by heads, a product's row mask
    expanded over the output's columns) is applied to the values' bits, viewed as an
    integer of the same width, with the compacted 0/1 mask: ``bits * keep`` for a zero fill,
    ``addcmul(fill_bits * (1 - keep), bits, keep)`` for any other value (one term is always
    0, so nothing overflows). Exact (each element keeps its bits or takes the fill's), each
    stored mask element read once, vectorized; ``where`` and the native blend would walk
    the expanded bool mask element by element. Measured by
    ``python -m benchmarks.bench_training_ops`` (attention rows).
    """
    if mask.is_contiguous():  # (a broadcast dim of size > 1 is never contiguous)
        return mask
    small = mask
    for d in range(mask.dim()):
        if d != keep and mask.stride(d) == 0 and mask.shape[d] > 1:
            small = small.narrow(d, 0, 1)
    return small


def fill_constant(value: Any, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of ``like``'s dtype and device, for ``where``.

    Below ``_FILL_MIN`` elements building it is a large part of a fill's fixed cost
    (``benchmarks/profile_overhead.py --fixed``): for plain eager CPU values (no tracer to
    see a shared constant, no dispatch mode), a Python number's tensor is built once per
    dtype (keyed as ``_fill_bits``: -0.0 is not 0.0) and reused; ``where`` only reads it,
    and nothing else sees it. The kept constants are CPU tensors and are only handed out
    for CPU values (``plain_eager``): any other device builds its own, on that device.
    """
    if (type(value) in (int, float, bool) and value == value and plain_eager(like)
            and not torch._C._len_torch_dispatch_stack()):
        key = (type(value), repr(value), like.dtype)
        fill = _FILL_TENSORS.get(key)
        if fill is None:
            with torch.inference_mode(False):  # (a normal tensor, whatever the mode)
                fill = torch.full((), value, dtype=like.dtype)
            if len(_FILL_TENSORS) < 1024:
                _FILL_TENSORS[key] = fill
        return fill
    return torch.full((), value, dtype=like.dtype, device=like.device)


#: (type, repr, dtype) -> 0-d tensor: CPU only (:func:`fill_constant`)
_FILL_TENSORS: dict[tuple, torch.Tensor] = {}


def _fill_bits(value: Any, dtype: torch.dtype) -> int:
    """The bits of ``value`` in ``dtype`` as an integer of its width; remembered for Python
    numbers (0, 1, +-inf: the usual fills), keyed by their repr (-0.0 is not 0.0)."""
    if type(value) is int and value == 0:  # (the zero fill: all bits 0 in every dtype)
        return 0
    number = type(value) in (int, float, bool) and value == value  # NaN: not remembered
    key = (type(value), repr(value), dtype) if number else None
    bits = _FILL_BITS.get(key) if number else None
    if bits is None:
        bits = torch.tensor(value, dtype=dtype).view(_BITS[dtype]).item()
        if number and len(_FILL_BITS) < 1024:
            _FILL_BITS[key] = bits
    return bits


_FILL_BITS: dict[tuple, int] = {}
