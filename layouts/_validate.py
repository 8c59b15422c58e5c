"""Checks of a user's torch sparse tensor before any kernel reads its indices.

torch builds sparse tensors without checking their indices unless asked
(``check_invariants=True`` or ``torch.sparse.check_sparse_tensor_invariants``); a negative
or out-of-range index then makes ``coalesce`` / ``index_put`` write outside their buffers
(a wrong row at best, ``double free or corruption`` at worst). :func:`check_sparse_input`
runs the checks torch skipped, in O(nnz) vectorized passes -- cheap next to coalescing or
converting -- and raises ``ValueError`` naming the op, the index tensor, the offending
value and the bound.

>>> import torch
>>> bad = torch.sparse_coo_tensor([[0, -1]], [1., 2.], (3,), check_invariants=False)
>>> try:
...     check_sparse_input("masked_tensor", data=bad)
... except ValueError as e:
...     print(str(e).split(";")[0])
masked_tensor: the data's indices[0] holds -1 at position 1, outside [0, 3) (dim 0 has size 3)
"""

from __future__ import annotations

import math

import torch

_COMPRESSED = {  # layout -> (pointer method, index method, outer axis, inner axis names)
    torch.sparse_csr: ("crow_indices", "col_indices", 0, "row", "column"),
    torch.sparse_csc: ("ccol_indices", "row_indices", 1, "column", "row"),
    torch.sparse_bsr: ("crow_indices", "col_indices", 0, "block row", "block column"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", 1, "block column", "block row"),
}
_FIX = "rebuild it with valid indices (torch.sparse_{}_tensor(..., check_invariants=True) " \
       "finds them)"


def check_sparse_input(op: str, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` if the indices of a torch sparse tensor are malformed.

    ``tensors`` are named by role (``data=..., mask=...``: the names word the message);
    strided ones pass unchecked, and index tensors shared with an earlier one (the usual
    data/mask pair) are checked once. COO: every index within ``[0, size)`` of its dim and,
    for a tensor flagged coalesced, sorted and distinct. CSR/CSC/BSR/BSC (2-D): pointer and
    index tensors of one integer dtype, pointers of length ``n + 1`` starting at 0,
    non-decreasing and ending at nnz, indices within bounds, sorted and distinct within each
    row (column).
    """
    seen = set()
    for what, t in tensors.items():
        if t.layout == torch.sparse_coo:
            index = (t._indices(),)
        elif t.layout in _COMPRESSED and t.dim() == 2:
            ptr_name, idx_name = _COMPRESSED[t.layout][:2]
            index = (getattr(t, ptr_name)(), getattr(t, idx_name)())
        else:
            continue
        key = (t.layout, t.shape, t.is_coalesced() if t.layout == torch.sparse_coo else None,
               tuple((i.data_ptr(), i.shape, i.stride(), i.dtype) for i in index))
        if key in seen:
            continue
        seen.add(key)
        if t.layout == torch.sparse_coo:
            _check_coo(t, op, what)
        else:
            _check_compressed(t, op, what)


def _first_bad(bad: torch.Tensor) -> int:
    return int(bad.nonzero()[0, 0])


def _check_range(idx: torch.Tensor, size: int, op: str, name: str, bound: str,
                 fix: str) -> None:
    if idx.numel() == 0:
        return
    low, high = torch.aminmax(idx)
    if int(low) < 0 or int(high) >= size:
        at = _first_bad((idx < 0) | (idx >= size))
        raise ValueError(f"{op}: {name} holds {int(idx[at])} at position {at}, outside "
                         f"[0, {size}) ({bound}); {fix}")


def _check_coo(t: torch.Tensor, op: str, what: str) -> None:
    indices, fix = t._indices(), _FIX.format("coo")
    shape = tuple(t.shape[: t.sparse_dim()])
    for d, size in enumerate(shape):
        _check_range(indices[d], size, op, f"the {what}'s indices[{d}]",
                     f"dim {d} has size {size}", fix)
    if t.is_coalesced() and indices.shape[1] > 1 and math.prod(shape) < 2**62:
        at = first_unsorted(indices, shape)
        if at is not None:
            raise ValueError(f"{op}: the {what} is flagged coalesced but its indices are not "
                             f"sorted and distinct (column {at}); build it without "
                             f"is_coalesced=True, or {fix}")


def first_unsorted(indices: torch.Tensor, shape: tuple[int, ...],
                   chunk: int = 1 << 18) -> int | None:
    """The first column of a COO index whose row-major key is not above the previous one,
    or None: whether it is sorted and distinct (coalesced), in O(nnz).

    Keys are built a chunk at a time: small temporaries stay in the allocator's cache
    (one 8 MB key tensor per call costs more in fresh pages than the comparison itself).
    """
    nnz = indices.shape[1]
    for start in range(0, nnz - 1, chunk):
        part = indices[:, start: start + chunk + 1]
        keys = part[0].clone()
        for d in range(1, len(shape)):
            keys.mul_(shape[d]).add_(part[d])
        bad = keys[1:] <= keys[:-1]
        if bool(bad.any()):
            return start + _first_bad(bad) + 1
    return None


def _check_compressed(t: torch.Tensor, op: str, what: str) -> None:
    ptr_name, idx_name, outer, line, other = _COMPRESSED[t.layout]
    ptr, idx = getattr(t, ptr_name)(), getattr(t, idx_name)()
    fix = _FIX.format(str(t.layout).removeprefix("torch.sparse_"))
    block = tuple(t.values().shape[1:3]) if t.layout in (torch.sparse_bsr,
                                                         torch.sparse_bsc) else (1, 1)
    grid = (t.shape[0] // block[0], t.shape[1] // block[1])
    n_outer, n_inner = grid[outer], grid[1 - outer]
    p, i = f"the {what}'s {ptr_name}", f"the {what}'s {idx_name}"
    if ptr.dtype != idx.dtype or ptr.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: {p} ({ptr.dtype}) and {idx_name} ({idx.dtype}) must share one "
                         f"dtype, int32 or int64; convert both, e.g. with .to(torch.int64)")
    if ptr.dim() != 1 or ptr.numel() != n_outer + 1 or idx.dim() != 1:
        raise ValueError(f"{op}: {p} must be 1-D of length {n_outer + 1} (one more than the "
                         f"{n_outer} {line}s of shape {tuple(t.shape)}), got "
                         f"{tuple(ptr.shape)}; {fix}")
    nnz = idx.numel()
    if int(ptr[0]) != 0 or int(ptr[-1]) != nnz:
        raise ValueError(f"{op}: {p} must start at 0 and end at nnz = {nnz}, got "
                         f"{int(ptr[0])} ... {int(ptr[-1])}; {fix}")
    steps = ptr[1:] - ptr[:-1]
    if n_outer and int(steps.min()) < 0:
        at = _first_bad(steps < 0)
        raise ValueError(f"{op}: {p} decreases from {int(ptr[at])} to {int(ptr[at + 1])} at "
                         f"position {at + 1}; it must be non-decreasing; {fix}")
    _check_range(idx, n_inner, op, i, f"the number of {other}s", fix)
    at = first_unsorted_in_lines(ptr, idx)
    if at is not None:
        raise ValueError(f"{op}: {i} must be sorted and distinct within each {line}, "
                         f"but position {at} is not; {fix}")


def first_unsorted_in_lines(ptr: torch.Tensor, idx: torch.Tensor) -> int | None:
    """The first position of ``idx`` not above the one before it in its line (the lines
    given by the pointers ``ptr``, valid), or None: whether the inner indices of a
    compressed tensor are sorted and distinct within each line, in O(nnz) -- ``idx``
    increases everywhere but where a new line starts, checked without building per-element
    line numbers.

    >>> first_unsorted_in_lines(torch.tensor([0, 2, 4]), torch.tensor([0, 3, 1, 1]))
    3
    """
    nnz = idx.numel()
    if nnz < 2:
        return None
    bad = idx[1:] <= idx[:-1]
    starts = ptr[1:-1] - 1
    bad[starts[(starts >= 0) & (starts < nnz - 1)]] = False
    return _first_bad(bad) + 1 if bool(bad.any()) else None
