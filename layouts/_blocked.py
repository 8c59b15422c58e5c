"""Masked reductions of stored values block by block: fill and reduce while in cache.

A masked sum over the groups of a sparse storage is ``reduce(where(mask, values, 0))``.
Written as two whole-array passes it writes the filled copy to memory and reads it back:
at 1e6-1e7 stored values that traffic, not the arithmetic, is the cost. Here the values
are walked in blocks of :data:`BLOCK` elements: each block is filled into one reused,
cache-sized integer buffer (the bitwise fill of Note [Bitwise fill]) and reduced from
there into the output, which holds one element per group (``index_add_`` /
``scatter_reduce_`` accumulate across blocks; runs of whole lines go through torch's CSR
sum or ``segment_reduce``). Exact: the same elements meet the same identity.

Forward only (no autograd), CPU, eager, 1-D values of a dtype with a same-size integer
view; :func:`applies` says when. Otherwise the callers run the whole-array ops.

>>> import torch
>>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
>>> scatter(v, m, 0, "sum", torch.tensor([0, 0, 1]), 2).tolist()
[1.0, 3.0]
"""

from __future__ import annotations

from typing import Any

import torch

from ._grouping import _BITS, plain_eager

BLOCK = 1 << 18  # elements per block (1-2 MB of values): fewer, larger blocks measured
# faster than L2-sized ones, as each block costs a few torch calls
OPS = ("sum", "amax", "amin")  # the ops of :func:`scatter` and :func:`segments`
MIN_SIZE = 1 << 16  # below this the whole-array ops cost less than the block loop


def applies(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """True when the block path runs for ``values`` and ``mask`` (see the module doc)."""
    return (values.dim() == 1 and values.numel() >= MIN_SIZE and values.dtype in _BITS
            and mask.shape == values.shape and plain_eager(values))


class _Filler:
    """Fills blocks of ``values`` (``value`` where ``mask`` is False) into one buffer."""

    def __init__(self, values: torch.Tensor, mask: torch.Tensor, value: Any,
                 size: int) -> None:
        bits = _BITS[values.dtype]
        self.dtype = values.dtype
        self.data = values.view(bits)
        self.keep = mask.view(torch.int8).neg()  # -1 / 0: sign-extends to all bits / none
        self.fill = torch.tensor(value, dtype=values.dtype).view(bits).item()
        self.buf = torch.empty(size, dtype=bits)  # the longest block
        self.out = torch.empty(size if self.fill else 0, dtype=bits)

    def __call__(self, start: int, stop: int) -> torch.Tensor:
        keep = self.buf[: stop - start]
        keep.copy_(self.keep[start:stop])  # all bits set where specified
        data = self.data[start:stop]
        if self.fill == 0:
            return keep.bitwise_and_(data).view(self.dtype)
        # ((data ^ f) & keep) ^ f: data where kept, f elsewhere
        out = torch.bitwise_xor(data, self.fill, out=self.out[: stop - start])
        return out.bitwise_and_(keep).bitwise_xor_(self.fill).view(self.dtype)


def scatter(values: torch.Tensor, mask: torch.Tensor, value: Any, op: str,
            index: torch.Tensor, n: int) -> torch.Tensor:
    """``out[index[i]] op= where(mask, values, value)[i]`` into ``n`` slots that start at
    ``value`` (the identity of ``op``: "sum", "amax", "amin"), block by block."""
    out = torch.full((n,), value, dtype=values.dtype)
    filler = _Filler(values, mask, value, min(BLOCK, values.numel()))
    for start in range(0, values.numel(), BLOCK):
        stop = min(values.numel(), start + BLOCK)
        block = filler(start, stop)
        if op == "sum":
            out.index_add_(0, index[start:stop], block)
        else:
            out.scatter_reduce_(0, index[start:stop], block, op)
    return out


def line_cuts(offsets: torch.Tensor,
              dtype: torch.dtype) -> list[tuple[int, int, int, int, torch.Tensor]]:
    """Runs of whole segments of about :data:`BLOCK` elements: ``(first, stop, start_elem,
    stop_elem, local_offsets)`` for segments ``first..stop-1`` given their ``offsets``
    (``n + 1`` non-decreasing int64 element positions); ``local_offsets`` are of ``dtype``
    (the index dtype). A segment longer than a block is a run of its own."""
    total = int(offsets[-1])
    targets = torch.arange(BLOCK, max(total, BLOCK), BLOCK, dtype=offsets.dtype)
    inner = torch.searchsorted(offsets, targets).tolist()
    bounds = sorted({0, *[min(max(b, 1), offsets.numel() - 1) for b in inner],
                     offsets.numel() - 1})
    pos = offsets.tolist()
    return [(a, b, pos[a], pos[b], (offsets[a:b + 1] - pos[a]).to(dtype))
            for a, b in zip(bounds, bounds[1:]) if b > a]


def segments(values: torch.Tensor, mask: torch.Tensor, value: Any, op: str,
             cuts: list[tuple[int, int, int, int, torch.Tensor]], n: int,
             inner: torch.Tensor, width: int) -> torch.Tensor:
    """Per segment (runs given by :func:`line_cuts`, ``n`` segments, none empty), the
    ``op`` reduction of ``where(mask, values, value)``: sums through torch's CSR sum
    (``inner`` and ``width``: the elements' inner indices and the matrix width),
    "amax" / "amin" through ``segment_reduce``."""
    out = torch.empty(n, dtype=values.dtype)
    filler = _Filler(values, mask, value, max(c[3] - c[2] for c in cuts) if cuts else 0)
    seg_op = {"amax": "max", "amin": "min"}.get(op)
    for first, stop, start_elem, stop_elem, offsets in cuts:
        block = filler(start_elem, stop_elem)
        if seg_op is not None:
            part = torch.segment_reduce(block, seg_op, offsets=offsets)
        else:
            lines = torch.sparse_csr_tensor(offsets, inner[start_elem:stop_elem], block,
                                            (stop - first, width), check_invariants=False)
            part = lines.sum(1, keepdim=True).values()
        out[first:stop] = part
    return out
