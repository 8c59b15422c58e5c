"""Shape, indexing and movement kernels of the sparse COO layout.

Every kernel keeps the storage coalesced and works in O(nnz) (O(nnz log nnz) when the
element order changes and the entries must be re-sorted): index tensors are computed from
the old ones, values and mask are moved with the same differentiable gather
(``index_select`` on dim 0), so autograd through the values comes for free. Nothing is
densified. Ops along the dense (trailing) dims of a hybrid tensor run on the values and
keep the very same index tensor.

Note [Selecting every sparse dim]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``select`` / ``squeeze`` that remove the last sparse dim leave a tensor with no sparse dim:
at most one stored entry (the storage is coalesced). As torch does for ``s[i, j]`` on a
sparse COO tensor, the result is strided: its data is that entry (or zeros) and its mask is
the entry's mask (or False). It holds no more than the entry's dense part.

Kernels take the normalized arguments documented in ``masked_sparse/ops/shape.py``
(Note [Shape op signatures]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._index import coalesce_coo, linearize, sort_key
from .registry import Kernel, Storage, get_layout

aten = torch.ops.aten


def _unsupported(op: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"MaskedTensor[sparse_coo] {op}: {why}; use .to_dense() first")


def _sd(s: Storage) -> int:
    return s.index[0].shape[0]


def _build(s: Storage, indices: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           shape: Sequence[int]) -> Storage:
    if indices.shape[0] == 0:  # Note [Selecting every sparse dim]
        strided = get_layout("strided")
        if values.shape[0]:
            return strided.build((), values[0], mask[0], tuple(shape))
        return strided.build((), values.new_zeros(values.shape[1:]),
                             mask.new_zeros(mask.shape[1:]), tuple(shape))
    return s.layout.build((indices,), values, mask, tuple(shape))


def _take(s: Storage, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return s.values.index_select(0, pos), s.mask.index_select(0, pos)


def _coalesced(indices: torch.Tensor, sparse_shape: Sequence[int],
               pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``indices`` sorted row-major, and the composed gather ``pos`` (None: no change).

    ``indices`` must be unique; ``pos`` says which old entry each column came from.
    """
    keys = linearize(indices, tuple(sparse_shape))
    if keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all()):
        return indices, pos
    perm = torch.argsort(sort_key(keys, math.prod(sparse_shape)))  # unique: order is defined
    return indices.index_select(1, perm), perm if pos is None else pos.index_select(0, perm)


def _finish(s: Storage, indices: torch.Tensor, shape: Sequence[int],
            pos: torch.Tensor | None = None) -> Storage:
    """Sort ``indices`` (gathering the entries ``pos`` of ``s``) and build the result."""
    indices, pos = _coalesced(indices, shape[: indices.shape[0]], pos)
    values, mask = (s.values, s.mask) if pos is None else _take(s, pos)
    return _build(s, indices, values, mask, shape)


def _on_values(s: Storage, fn: Callable[..., torch.Tensor], shape: Sequence[int],
               *args: Any) -> Storage:
    """Run ``fn(tensor, *args)`` on values and mask; the index tensor is kept."""
    return s.layout.build(s.index, fn(s.values, *args), fn(s.mask, *args), tuple(shape))


def _vdim(s: Storage, dim: int) -> int:
    return dim - _sd(s) + 1


def permute(s: Storage, dims: tuple[int, ...]) -> Storage:
    sd, nd = _sd(s), len(s.shape)
    if sorted(dims[:sd]) != list(range(sd)):
        raise _unsupported("permute", f"cannot move dims between the sparse dims (< {sd}) and "
                                      f"the dense dims of a hybrid tensor")
    shape = [s.shape[d] for d in dims]
    out = s
    if tuple(dims[sd:]) != tuple(range(sd, nd)):
        vdims = (0,) + tuple(d - sd + 1 for d in dims[sd:])
        out = _on_values(s, torch.permute, s.shape, vdims)
    if tuple(dims[:sd]) == tuple(range(sd)):
        return out.layout.build(out.index, out.values, out.mask, shape)
    indices = s.index[0].index_select(0, torch.tensor(dims[:sd], device=s.index[0].device))
    if list(dims[1:sd]) == sorted(dims[1:sd]):
        # The entries are sorted by the old dims; among those with one coordinate along
        # dims[0] they stay sorted by the others, so a stable sort by that coordinate alone
        # orders them (a 2-D transpose: a sort on one narrow key instead of the full keys).
        first, perm = torch.sort(sort_key(indices[0], s.shape[dims[0]]), stable=True)
        indices = torch.cat([first.to(indices.dtype)[None], indices[1:].index_select(1, perm)])
        return _build(out, indices, *_take(out, perm), shape)
    return _finish(out, indices, shape)


def transpose(s: Storage, dim0: int, dim1: int) -> Storage:
    dims = list(range(len(s.shape)))
    dims[dim0], dims[dim1] = dim1, dim0
    return permute(s, tuple(dims))


def select(s: Storage, dim: int, index: int) -> Storage:
    shape = s.shape[:dim] + s.shape[dim + 1:]
    if dim >= _sd(s):
        return _on_values(s, torch.select, shape, _vdim(s, dim), index)
    indices = s.index[0]
    pos = (indices[dim] == index).nonzero().squeeze(1)
    kept = torch.cat([indices[:dim], indices[dim + 1:]])[:, pos]
    return _build(s, kept, *_take(s, pos), shape)


def slice_(s: Storage, dim: int, start: int, end: int, step: int) -> Storage:
    size = len(range(start, end, step))
    shape = s.shape[:dim] + (size,) + s.shape[dim + 1:]
    if dim >= _sd(s):
        return _on_values(s, lambda t: t[(slice(None),) * _vdim(s, dim) +
                                         (slice(start, end, step),)], shape)
    indices = s.index[0]
    c = indices[dim]
    keep = (c >= start) & (c < end)
    if step != 1:
        keep &= (c - start) % step == 0
    pos = keep.nonzero().squeeze(1)
    out = indices[:, pos]  # advanced indexing: already a new tensor
    out[dim] = (out[dim] - start) // step
    return _build(s, out, *_take(s, pos), shape)


def index_select(s: Storage, dim: int, index: torch.Tensor) -> Storage:
    shape = s.shape[:dim] + (index.numel(),) + s.shape[dim + 1:]
    if dim >= _sd(s):
        return _on_values(s, torch.index_select, shape, _vdim(s, dim), index)
    indices = s.index[0]
    # Each stored entry with coordinate c along ``dim`` goes to every j with index[j] == c:
    # the j's are order[lo[c] : lo[c] + count[c]] in the stably sorted index.
    order = torch.sort(index, stable=True)[1]
    c = indices[dim]
    size = s.shape[dim]
    if size <= max(c.numel(), 1 << 16):  # a per-coordinate table: O(size + nnz), no search
        table = torch.bincount(index, minlength=size)
        counts, lo = table[c], (table.cumsum(0) - table)[c]
    else:
        sorted_index = index[order]
        lo = torch.searchsorted(sorted_index, c)
        counts = torch.searchsorted(sorted_index, c, right=True) - lo
    hit = (counts > 0).nonzero().squeeze(1)
    counts, lo = counts[hit], lo[hit]
    total = int(counts.sum())
    entry = torch.repeat_interleave(hit, counts, output_size=total)
    first = torch.repeat_interleave(lo - (counts.cumsum(0) - counts), counts, output_size=total)
    out = indices[:, entry]  # advanced indexing: already a new tensor
    out[dim] = order[first + torch.arange(total, device=c.device)]
    return _finish(s, out, shape, entry)


def unsqueeze(s: Storage, dim: int) -> Storage:
    shape = s.shape[:dim] + (1,) + s.shape[dim:]
    if dim > _sd(s):
        return _on_values(s, torch.unsqueeze, shape, _vdim(s, dim))
    indices = s.index[0]
    zeros = indices.new_zeros(1, indices.shape[1])
    return s.layout.build((torch.cat([indices[:dim], zeros, indices[dim:]]),), s.values,
                          s.mask, shape)


def squeeze(s: Storage, dims: tuple[int, ...]) -> Storage:
    sd = _sd(s)
    shape = tuple(n for d, n in enumerate(s.shape) if d not in dims)
    out = s
    dense = tuple(_vdim(s, d) for d in dims if d >= sd)
    if dense:
        out = _on_values(s, torch.squeeze, s.shape, dense)
    sparse = [d for d in dims if d < sd]
    if not sparse:
        return out.layout.build(out.index, out.values, out.mask, shape)
    keep = [d for d in range(sd) if d not in sparse]
    return _build(out, s.index[0][keep], out.values, out.mask, shape)


def reshape(s: Storage, shape: tuple[int, ...]) -> Storage:
    sd = _sd(s)
    dense = tuple(s.shape[sd:])
    if dense and tuple(shape[len(shape) - len(dense):]) != dense:
        raise _unsupported("reshape", f"the dense dims {dense} of a hybrid tensor must stay "
                                      f"the trailing dims of the new shape {tuple(shape)}")
    new_sparse = tuple(shape[: len(shape) - len(dense)])
    if new_sparse == tuple(s.shape[:sd]):
        return s.layout.build(s.index, s.values, s.mask, shape)
    if not new_sparse:  # every sparse dim disappears: at most one entry
        return _build(s, s.index[0][:0], s.values, s.mask, shape)
    # Row-major linear keys do not change: the order (coalescing) is kept, values too.
    keys = linearize(s.index[0], tuple(s.shape[:sd]))
    indices = torch.stack(torch.unravel_index(keys, new_sparse)) if keys.numel() else \
        keys.new_zeros(len(new_sparse), 0)
    return s.layout.build((indices,), s.values, s.mask, shape)


def flip(s: Storage, dims: tuple[int, ...]) -> Storage:
    sd = _sd(s)
    out = s
    dense = tuple(_vdim(s, d) for d in dims if d >= sd)
    if dense:
        out = _on_values(s, torch.flip, s.shape, dense)
    sparse = [d for d in dims if d < sd]
    if not sparse:
        return out
    indices = s.index[0].clone()
    for d in sparse:
        indices[d] = s.shape[d] - 1 - indices[d]
    return _finish(out, indices, s.shape)


def roll(s: Storage, shifts: tuple[int, ...], dims: tuple[int, ...]) -> Storage:
    if not dims:  # roll of the flattened tensor
        if len(s.shape) != _sd(s):
            raise _unsupported("roll", "roll without dims needs a tensor without dense dims")
        flat = reshape(s, (s.shape.numel(),))
        return reshape(roll(flat, shifts, (0,)), tuple(s.shape))
    sd = _sd(s)
    out = s
    dense = [(sh, _vdim(s, d)) for sh, d in zip(shifts, dims) if d >= sd]
    if dense:
        out = _on_values(s, torch.roll, s.shape, tuple(x for x, _ in dense),
                         tuple(d for _, d in dense))
    sparse = [(sh, d) for sh, d in zip(shifts, dims) if d < sd]
    if not sparse:
        return out
    indices = s.index[0].clone()
    for sh, d in sparse:
        indices[d] = (indices[d] + sh) % s.shape[d]
    return _finish(out, indices, s.shape)


def cat(storages: list[Storage], dim: int) -> Storage:
    sds = {_sd(s) for s in storages}
    if len(sds) != 1:
        raise _unsupported("cat", f"the inputs have different sparse dims {sorted(sds)}")
    first = storages[0]
    size = sum(s.shape[dim] for s in storages)
    shape = first.shape[:dim] + (size,) + first.shape[dim + 1:]
    if dim >= _sd(first):
        if not all(s.index[0] is first.index[0] or torch.equal(s.index[0], first.index[0])
                   for s in storages[1:]):
            raise _unsupported("cat", "concatenating along a dense dim needs the same indices "
                                      "in every input")
        v = torch.cat([s.values for s in storages], _vdim(first, dim))
        m = torch.cat([s.mask for s in storages], _vdim(first, dim))
        return first.layout.build(first.index, v, m, shape)
    parts, offset = [], 0
    for s in storages:
        indices = s.index[0]
        if offset:
            indices = indices.clone()
            indices[dim] += offset
        parts.append(indices)
        offset += s.shape[dim]
    indices = torch.cat(parts, 1)
    values = torch.cat([s.values for s in storages])
    mask = torch.cat([s.mask for s in storages])
    joined = first.layout.build((indices,), values, mask, shape)
    return _finish(joined, indices, shape)


def masked_select(s: Storage, index: torch.Tensor) -> Storage:
    """The elements of ``s`` where the bool tensor ``index`` is True, as a 1-D tensor.

    ``index`` is a plain bool tensor (dense or sparse) of ``s``'s shape; sparse indices are
    read at their stored True entries, so nothing is densified.
    """
    if len(s.shape) != _sd(s):
        raise _unsupported("masked_select", "a hybrid tensor (with dense dims) cannot be "
                                            "selected element-wise")
    shape = tuple(s.shape)
    if index.layout == torch.strided:
        chosen = index.expand(shape).nonzero().t()
    else:
        coo = coalesce_coo(index if index.layout == torch.sparse_coo else index.to_sparse_coo())
        if coo.dense_dim():
            raise _unsupported("masked_select", "the bool index must not have dense dims")
        chosen = coo._indices()[:, coo._values()]
    chosen_keys = linearize(chosen, shape)
    keys = linearize(s.index[0], shape)
    total = chosen_keys.numel()
    if total == 0:
        found = torch.zeros_like(keys, dtype=torch.bool)
        rank = keys
    else:
        rank = torch.searchsorted(chosen_keys, keys).clamp_(max=total - 1)
        found = chosen_keys[rank] == keys
    pos = found.nonzero().squeeze(1)
    return _build(s, rank[pos].unsqueeze(0), *_take(s, pos), (total,))


SHAPE_OPS: dict[Any, Kernel] = {
    aten.permute.default: permute,
    aten.transpose.int: transpose,
    aten.select.int: select,
    aten.slice.Tensor: slice_,
    aten.index_select.default: index_select,
    aten.unsqueeze.default: unsqueeze,
    aten.squeeze.dims: squeeze,
    aten.reshape.default: reshape,
    aten.view.default: reshape,  # values are never copied: a COO reshape is a view of them
    aten.flip.default: flip,
    aten.roll.default: roll,
    aten.cat.default: cat,
    aten.masked_select.default: masked_select,
}
