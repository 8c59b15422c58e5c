"""The entries a mask keeps, row by row: flat values and the offset of each row.

Note [Compacting rows in one pass]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``torch.masked_select`` followed by a count per row and a ``cumsum`` reads the mask three
times and the values once, each pass a kernel of its own; ``embedding_bag`` with masked ids
spends most of its overhead there (``benchmarks/bench_training_ops.py``). On the CPU one
native pass (``ms_compact_rows`` in ``_native.c``) does all of it: every value is stored at
the next free slot and the slot moves on by the mask byte, so there is no branch on the
mask (one on a random mask mispredicts once in a few elements), and the offset of a row is
the slot at its start. Elsewhere -- another device, the native kernels off
(``layouts.native_disabled()``), other dtypes, autograd -- the torch ops run: the same
results. On a non-CPU device they wait for the device (the output's size is the number of
kept entries, a host read): callers that must not sync do not call this there.
"""

from __future__ import annotations

import torch

from . import _native

__all__ = ["compact_rows"]


def compact_rows(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(flat, offsets)`` of 2-D ``values`` and a bool ``mask`` of their shape:
    ``flat = values[mask]`` in row-major order and ``offsets[r]`` (int64) the number of
    entries kept before row ``r`` -- ``embedding_bag``'s flat ids and offsets, one bag per
    row. Integer values (int32, int64) on the CPU take one native pass (Note [Compacting
    rows in one pass]); everything else the torch ops (``masked_select``, ``cumsum``).

    >>> ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    >>> flat, offsets = compact_rows(ids, torch.tensor([[True, False, True], [False, True, False]]))
    >>> flat.tolist(), offsets.tolist()
    ([4, 6, 8], [0, 2])
    """
    shape = values.shape
    if len(shape) != 2 or mask.shape != shape or mask.dtype is not torch.bool:
        raise ValueError(f"compact_rows: expected 2-D values and a bool mask of their shape, "
                         f"got values {tuple(shape)} and a {mask.dtype} mask "
                         f"{tuple(mask.shape)}")
    kernel = (_native._COMPACT.get(values.dtype) if _native._eager_cpu(values)
              and type(mask) is torch.Tensor and mask.is_cpu
              and _native._library() is not None else None)
    if kernel is not None:
        values, mask = values.contiguous(), mask.contiguous()
        rows, length = shape
        n = rows * length
        if values.dtype is torch.int64:  # one buffer: the ids, then the offsets
            buffer = torch.empty(n + rows, dtype=torch.int64)
            out, offsets = buffer[:n], buffer[n:]
        else:
            out, offsets = torch.empty(n, dtype=values.dtype), torch.empty(rows,
                                                                           dtype=torch.int64)
        kept = kernel(values.data_ptr(), mask.data_ptr(), rows, length, out.data_ptr(),
                      offsets.data_ptr())
        return out[:kept], offsets
    counts = (mask.view(torch.uint8) if mask.is_contiguous() else mask.to(torch.uint8)
              ).sum(1, dtype=torch.int64)
    return torch.masked_select(values, mask), torch.cumsum(counts, 0).sub_(counts)
