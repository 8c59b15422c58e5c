"""Shape, indexing and movement kernels of the sparse CSR layout (2-D only).

Row ops (``select``, ``slice``/``narrow``, ``index_select`` along dim 0) read the row
pointers directly: O(rows + selected nnz). ``transpose``/``t`` returns **CSR** (the CSR
storage of the transposed matrix, re-sorted by column in O(nnz log nnz)); torch would give
CSC. Every other op runs the COO kernel on the COO form (an O(nnz) conversion, nothing
densified).

Result layout: a 2-D result is CSR; any other result is sparse COO (the sparse layout of
every rank): ``mt[i]`` / ``select`` and ``masked_select`` give 1-D COO, ``unsqueeze`` or
``stack`` 3-D COO, ``view(-1)`` 1-D COO; selecting both dims (``mt[i, j]``) gives a 0-d
strided tensor, as the COO kernels do (Note [Selecting every sparse dim]).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _shape_coo as coo
from ._index import crow_from_rows, rows_from_crow
from .registry import Kernel, Storage

aten = torch.ops.aten


def _via_coo(kernel: Kernel) -> Kernel:
    """Run a COO kernel on the COO form; a 2-D sparse result comes back as CSR."""

    def run(target: Storage | list[Storage], *args: Any) -> Storage:
        if isinstance(target, list):
            layout = target[0].layout
            out = kernel([s.layout.to_coo(s) for s in target], *args)
        else:
            layout = target.layout
            out = kernel(layout.to_coo(target), *args)
        if out.index and len(out.shape) == 2 and out.index[0].shape[0] == 2:
            return layout.from_coo(out)
        return out

    return run


def _take(s: Storage, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return s.values.index_select(0, pos), s.mask.index_select(0, pos)


def transpose(s: Storage, dim0: int, dim1: int) -> Storage:
    if dim0 == dim1:
        return s
    crow, col = s.index
    nrows, ncols = s.shape
    rows = rows_from_crow(crow, col.numel())
    # Entries are sorted by (row, col); a stable sort by col gives (col, row) order.
    new_rows, perm = torch.sort(col, stable=True)
    new_crow = crow_from_rows(new_rows, ncols)
    return s.layout.build((new_crow, rows[perm]), *_take(s, perm), (ncols, nrows))


def permute(s: Storage, dims: tuple[int, ...]) -> Storage:
    return s if tuple(dims) == (0, 1) else transpose(s, 0, 1)


def _row_select(s: Storage, dim: int, index: int) -> Storage:
    if dim != 0:
        return coo.select(s.layout.to_coo(s), dim, index)
    from .sparse_coo import SPARSE_COO

    crow, col = s.index
    a, b = int(crow[index]), int(crow[index + 1])
    indices = col[a:b].long().unsqueeze(0)
    return SPARSE_COO.build((indices,), s.values[a:b], s.mask[a:b], (s.shape[1],))


def _row_slice(s: Storage, dim: int, start: int, end: int, step: int) -> Storage:
    if dim != 0:
        return _via_coo(coo.slice_)(s, dim, start, end, step)
    if step != 1:
        index = torch.arange(start, end, step, device=s.index[0].device)
        return _row_index_select(s, 0, index)
    crow, col = s.index
    a, b = int(crow[start]), int(crow[end])
    return s.layout.build((crow[start:end + 1] - a, col[a:b]), s.values[a:b], s.mask[a:b],
                          (end - start, s.shape[1]))


def _row_index_select(s: Storage, dim: int, index: torch.Tensor) -> Storage:
    if dim != 0:
        return _via_coo(coo.index_select)(s, dim, index)
    crow, col = s.index
    index = index.to(crow.dtype)
    starts = crow[index]
    counts = crow[index + 1] - starts
    new_crow = torch.cat([crow.new_zeros(1), counts.cumsum(0).to(crow.dtype)])
    total = int(new_crow[-1])
    pos = torch.repeat_interleave((starts - new_crow[:-1]).long(), counts.long(),
                                  output_size=total) + torch.arange(total, device=crow.device)
    return s.layout.build((new_crow, col[pos]), *_take(s, pos), (index.numel(), s.shape[1]))


SHAPE_OPS: dict[str, Kernel] = {
    **{name: _via_coo(kernel) for name, kernel in coo.SHAPE_OPS.items()},
    aten.transpose.int: transpose,
    aten.permute.default: permute,
    aten.select.int: _row_select,
    aten.slice.Tensor: _row_slice,
    aten.index_select.default: _row_index_select,
}
