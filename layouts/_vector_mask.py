"""The strided mask as Inductor's CPU code can read it fast: :func:`vector_mask`.

Note [Compiled mask loads]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Inductor's C++ backend loads every bool buffer one element at a time: a vectorized kernel
reads it with ``at::vec::VecMask<float,1>::from(const bool*, count)``, a scalar loop that
fills a stack array and reloads it as a vector (``ATen/cpu/vec/vec_mask.h``; there is no
AVX2 / AVX-512 specialization), and ``mask.view(torch.uint8)`` does not help: a view of
the same width is a ``ReinterpretView`` whose loader loads the bool buffer and bitcasts
(``torch/_inductor/ir.py``). So a compiled ``torch.where(mask, x, 0).sum(1)`` spends its
time in that scalar loop, not on the data (``python -m benchmarks.bench_compile``).

A view to a dtype of *another* width is not a ``ReinterpretView``: Inductor calls
``aten.view.dtype`` itself (a free aliasing view), and the result is a real buffer of the
new dtype. ``mask.view(torch.int16).view(torch.uint8)`` therefore gives a uint8 buffer
(the same bytes, 0 or 1) that the kernel reads with one vector load; converted to int32
and compared with 0 it is a ``VecMask<int32_t,1>``, which selects float lanes directly
(compared as uint8 it would be a ``VecMask<uint8_t,1>``, whose cast to a float mask is a
scalar loop again). The result is the same bool tensor, computed inside the kernel instead
of loaded: exact, and ``where(vector_mask(m), x, 0).sum(1)`` reads the mask with vector
loads where ``where(m, x, 0).sum(1)`` runs the scalar loop (``bench_compile`` compares
them). The views need an even number of elements and a contiguous mask
at an even storage offset; any other mask is returned as it is (slow, still exact), and so
is a mask on another device (Triton loads bool buffers as bytes already) and one of fewer
than 16384 elements (static size), where the two ``view`` calls of the compiled wrapper
cost more than they save (``bench_compile`` at 64x64 and 128x128).
Callers use it only while torch.compile traces (``torch.compiler.is_compiling()``): eager
kernels read bool masks at full speed.

>>> import torch
>>> m = torch.tensor([[True, False], [False, True]])
>>> torch.equal(vector_mask(m), m)
True
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

# mask -> its vector mask, within one trace: one buffer per mask (see vector_mask).
_TRACED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_MIN_ELEMENTS = 1 << 14  # below: the two view calls cost more than the bool loads


def vector_mask(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` recomputed from a uint8 view of its bytes, for compiled code (Note
    [Compiled mask loads]); ``mask`` itself where the views do not apply.

    The result is remembered per mask object (a traced tensor: it lives as long as the
    trace): a second call, e.g. ``to_tensor(0)`` after ``softmax``, reuses it, so the
    fused kernel loads the mask bytes once instead of once per call.
    """
    known = _TRACED.get(mask)
    if known is not None:
        return known
    n = mask.numel()
    if (mask.device.type != "cpu" or mask.dtype != torch.bool
            or (isinstance(n, int) and n < _MIN_ELEMENTS) or n == 0
            or n % 2 or mask.storage_offset() % 2 or not mask.is_contiguous()):
        return mask
    flat = mask.reshape(-1).view(torch.int16).view(torch.uint8)
    out = _TRACED[mask] = (flat.to(torch.int32) != 0).view(mask.shape)
    return out
