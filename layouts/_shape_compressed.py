"""Shape, indexing and movement kernels of the compressed layouts CSR and CSC (2-D only).

Line ops -- ``select``, ``slice``/``narrow`` and ``index_select`` along the compressed dim
(rows of CSR, columns of CSC) -- read the line pointers directly: O(lines + selected nnz).
``transpose``/``t`` keeps the layout (the storage of the transposed matrix, re-sorted by
the inner index in O(nnz log nnz)); torch would switch CSR and CSC. Every other op runs the
COO kernel on the COO form (an O(nnz) conversion, nothing densified).

Result layout: a 2-D result has the input's layout; any other result is sparse COO (the
sparse layout of every rank): ``mt[i]`` / ``select`` and ``masked_select`` give 1-D COO,
``unsqueeze`` or ``stack`` 3-D COO, ``view(-1)`` 1-D COO; selecting both dims
(``mt[i, j]``) gives a 0-d strided tensor, as the COO kernels do (Note [Selecting every
sparse dim]).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _shape_coo as coo
from ._index import crow_from_rows, rows_from_crow, sort_key
from .registry import Kernel, Storage, get_layout

aten = torch.ops.aten


def _via_coo(kernel: Kernel) -> Kernel:
    """Run a COO kernel on the COO form; a 2-D sparse result comes back in the input layout."""

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


def _lines_shape(s: Storage, axis: int, n: int) -> tuple[int, int]:
    """The shape of ``s`` with ``n`` lines along the compressed ``axis``."""
    return (n, s.shape[1]) if axis == 0 else (s.shape[0], n)


def _transpose(axis: int, s: Storage, dim0: int, dim1: int) -> Storage:
    if dim0 == dim1:
        return s
    ptr, idx = s.index
    outer = rows_from_crow(ptr, idx.numel())
    # Entries are sorted by (outer, inner); a stable sort by inner gives (inner, outer) order.
    new_outer, perm = torch.sort(sort_key(idx, s.shape[1 - axis]), stable=True)
    new_ptr = crow_from_rows(new_outer.to(idx.dtype), s.shape[1 - axis])
    return s.layout.build((new_ptr, outer.index_select(0, perm)), *_take(s, perm),
                          (s.shape[1], s.shape[0]))


def _permute(axis: int, s: Storage, dims: tuple[int, ...]) -> Storage:
    return s if tuple(dims) == (0, 1) else _transpose(axis, s, 0, 1)


def _line_select(axis: int, s: Storage, dim: int, index: int) -> Storage:
    if dim != axis:
        return coo.select(s.layout.to_coo(s), dim, index)
    ptr, idx = s.index
    a, b = int(ptr[index]), int(ptr[index + 1])
    return get_layout("sparse_coo").build((idx[a:b].long().unsqueeze(0),), s.values[a:b],
                                          s.mask[a:b], (s.shape[1 - axis],))


def _line_slice(axis: int, s: Storage, dim: int, start: int, end: int, step: int) -> Storage:
    if dim != axis:
        return _via_coo(coo.slice_)(s, dim, start, end, step)
    if step != 1:
        index = torch.arange(start, end, step, device=s.index[0].device)
        return _line_index_select(axis, s, dim, index)
    ptr, idx = s.index
    a, b = int(ptr[start]), int(ptr[end])
    return s.layout.build((ptr[start:end + 1] - a, idx[a:b]), s.values[a:b], s.mask[a:b],
                          _lines_shape(s, axis, end - start))


def _line_index_select(axis: int, s: Storage, dim: int, index: torch.Tensor) -> Storage:
    if dim != axis:
        return _via_coo(coo.index_select)(s, dim, index)
    ptr, idx = s.index
    index = index.to(ptr.dtype)
    starts = ptr[index]
    counts = ptr[index + 1] - starts
    new_ptr = torch.cat([ptr.new_zeros(1), counts.cumsum(0).to(ptr.dtype)])
    total = int(new_ptr[-1])
    pos = torch.repeat_interleave((starts - new_ptr[:-1]).long(), counts.long(),
                                  output_size=total) + torch.arange(total, device=ptr.device)
    return s.layout.build((new_ptr, idx[pos]), *_take(s, pos),
                          _lines_shape(s, axis, index.numel()))


def shape_ops(axis: int) -> dict[Any, Kernel]:
    """The ``shape_ops`` table of the compressed layout whose compressed dim is ``axis``."""
    def on_lines(kernel: Kernel) -> Kernel:
        def run(*args: Any) -> Storage:
            return kernel(axis, *args)
        return run

    return {
        **{name: _via_coo(kernel) for name, kernel in coo.SHAPE_OPS.items()},
        aten.transpose.int: on_lines(_transpose),
        aten.permute.default: on_lines(_permute),
        aten.select.int: on_lines(_line_select),
        aten.slice.Tensor: on_lines(_line_slice),
        aten.index_select.default: on_lines(_line_index_select),
    }
