"""Matrix products on sparse storages, computed on the stored values.

The kernels here know nothing of masks' meaning: the core (``masked_sparse.ops.linalg``)
passes storages whose unspecified values are already zeroed and decides the output mask.
What the layouts provide:

- ``sparse_mm(storage, dense, transpose=False)``: ``S @ dense`` (or ``S.T @ dense``) for a 2-D
  sparse storage ``S``, a dense result, differentiable with respect to ``storage.values`` and
  ``dense``. A layout supplies it as the ``aten.mm.default`` entry of its ``linalg`` table
  (COO, CSR and CSC do, through torch's CSR matmul); any other layout goes through its COO form.
- ``specified_lines(storage, dim)``: which rows (``dim=0``) or columns (``dim=1``) hold a
  specified element, in O(nnz): the ``aten.any.dim`` entry of a layout's ``linalg`` table
  (``any`` of the specified set over the other dim, a dense bool vector), else through COO.
- ``sparse_sparse_mm(a, b)``: the product of two sparse storages over their specified
  elements: an output element is stored iff at least one term exists (COO result).

Note [Sampled gradient]
~~~~~~~~~~~~~~~~~~~~~~~
For ``out = S @ D`` the gradient of ``S`` is ``G @ D.T`` read at ``S``'s stored positions
only. ``torch.sparse.sampled_addmm`` computes exactly those ``nnz`` dot products (O(nnz * n)
time, no ``m x k`` dense intermediate), which is what :class:`_SparseDenseMM` does in
backward; torch's own backward of ``sparse.mm`` for COO forms the dense product first.

>>> import torch, layouts
>>> coo = layouts.get_layout("sparse_coo")
>>> s = coo.from_strided(torch.tensor([[1., 0.], [0., 2.]]), torch.eye(2, dtype=torch.bool))
>>> sparse_mm(s, torch.ones(2, 3)).tolist()
[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
"""

from __future__ import annotations

import torch

from ._index import cached, crow_from_rows, linearize, rows_from_crow, sort_key
from .registry import Storage, get_layout

aten = torch.ops.aten


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
         shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def transposed_pattern(crow: torch.Tensor, col: torch.Tensor,
                       shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(crow_t, col_t, perm)``: the CSR pattern of ``S.T`` for ``S`` given by ``(crow, col)``
    of ``shape``, and the order of ``S``'s values in it (``values_t = values[perm]``).

    Note [Transposed pattern]
    ~~~~~~~~~~~~~~~~~~~~~~~~~
    ``S.T @ D`` is the backward of every ``S @ D`` (and the forward of ``D @ S``). torch
    multiplies a CSR matrix by a dense one row by row; its transposed product goes through
    an unsorted COO tensor that it sorts at every call. The pattern of ``S.T`` depends on
    the index tensors only, which training keeps from step to step while the values change,
    so it is computed once (one stable sort, cached per ``col`` / ``crow`` object and
    version, :func:`._index.cached`) and every product reads the values through ``perm``
    (one O(nnz) gather) into torch's CSR product (``benchmarks/bench_training.py``).

    >>> crow, col = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    >>> [t.tolist() for t in transposed_pattern(crow, col, (2, 3))]
    [[0, 1, 2, 3], [0, 1, 0], [0, 2, 1]]
    """
    m, k = shape
    nnz = col.numel()

    def compute() -> torch.Tensor:
        rows = rows_from_crow(crow, nnz)
        perm = torch.argsort(sort_key(col, k), stable=True)  # by column, rows stay sorted
        col_t = rows.index_select(0, perm).to(col.dtype)
        crow_t = crow_from_rows(col.index_select(0, perm), k).to(col.dtype)
        return torch.cat([crow_t, col_t, perm.to(col.dtype)])  # one cached tensor

    packed = cached(col, ("transposed", m, k), compute, data=crow)
    return packed[:k + 1], packed[k + 1:k + 1 + nnz], packed[k + 1 + nnz:]


def _pattern_mm(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                shape: tuple[int, int], dense: torch.Tensor, transpose: bool) -> torch.Tensor:
    """``S @ dense`` or ``S.T @ dense`` for ``S`` given by a CSR pattern and values (the
    transpose through its cached CSR pattern, Note [Transposed pattern])."""
    if not transpose:
        return torch.sparse.mm(_csr(crow, col, values, shape), dense)
    crow_t, col_t, perm = transposed_pattern(crow, col, shape)
    values_t = values.index_select(0, perm)
    return torch.sparse.mm(_csr(crow_t, col_t, values_t, (shape[1], shape[0])), dense)


class _SparseDenseMM(torch.autograd.Function):
    """``S @ D`` (``S.T @ D`` with ``transpose``) with the sampled gradient for ``S``'s values
    (Note [Sampled gradient]) and ``S.T @ G`` (``S @ G``) for ``D``."""

    @staticmethod
    def forward(ctx, values, dense, crow, col, shape, transpose):  # type: ignore[override]
        ctx.save_for_backward(values, dense)
        ctx.pattern = (crow, col, shape, transpose)
        return _pattern_mm(crow, col, values, shape, dense, transpose)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        values, dense = ctx.saved_tensors
        crow, col, shape, transpose = ctx.pattern
        grad_values = grad_dense = None
        if ctx.needs_input_grad[0]:
            left, right = (dense, grad) if transpose else (grad, dense)
            sampled = torch.sparse.sampled_addmm(
                _csr(crow, col, torch.zeros_like(values), shape), left.contiguous(),
                right.t().contiguous(), beta=0.0)
            grad_values = sampled.values()
        if ctx.needs_input_grad[1]:
            grad_dense = _pattern_mm(crow, col, values, shape, grad, not transpose)
        return grad_values, grad_dense, None, None, None, None


def _needs_grad(values: torch.Tensor, dense: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (values.requires_grad or dense.requires_grad)


def csr_pattern_mm(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                   shape: tuple[int, int], dense: torch.Tensor,
                   transpose: bool = False) -> torch.Tensor:
    """Differentiable ``S @ dense`` (``S.T @ dense``) for a CSR pattern and its values."""
    if values.numel() == 0:  # torch's CSR kernels reject some empty patterns
        out_rows = shape[1] if transpose else shape[0]
        return dense.new_zeros((out_rows, dense.shape[1]))
    if _needs_grad(values, dense):
        return _SparseDenseMM.apply(values, dense, crow, col, tuple(shape), transpose)
    return _pattern_mm(crow, col, values, tuple(shape), dense, transpose)


def coo_mm(storage: Storage, dense: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """The COO layout's ``aten.mm`` kernel: rows of a coalesced COO are sorted, so its CSR
    pointer is one O(nnz) pass and the product runs in torch's CSR matmul."""
    (indices,) = storage.index
    if indices.shape[0] != 2 or storage.values.dim() != 1:
        raise NotImplementedError(
            f"matrix product: a sparse_coo MaskedTensor operand must be 2-D without dense "
            f"dims, got shape {tuple(storage.shape)} with sparse_dim {indices.shape[0]}; use "
            f"a 2-D operand or .to_dense()")
    m, k = storage.shape
    values = storage.values
    if indices.shape[1] < m and not _needs_grad(values, dense):
        # Hypersparse (fewer entries than rows): a CSR row pointer would cost O(rows).
        pattern = indices.flip(0) if transpose else indices
        coo = torch.sparse_coo_tensor(pattern, values, (k, m) if transpose else (m, k),
                                      is_coalesced=not transpose, check_invariants=False)
        return torch.sparse.mm(coo, dense)
    crow = crow_from_rows(indices[0], m)
    return csr_pattern_mm(crow, indices[1], values, (m, k), dense, transpose)


def compressed_mm(storage: Storage, dense: torch.Tensor, transpose: bool = False, *,
                  axis: int = 0) -> torch.Tensor:
    """The ``aten.mm`` kernel of CSR (``axis=0``) and CSC (``axis=1``): a CSC matrix's
    ``(ccol, row)`` is the CSR pattern of its transpose, so CSC multiplies as a transposed
    CSR (scipy's ``_swap``)."""
    ptr, idx = storage.index
    m, k = storage.shape
    shape = (m, k) if axis == 0 else (k, m)
    return csr_pattern_mm(ptr, idx, storage.values, shape, dense, transpose != (axis == 1))


def sparse_mm(storage: Storage, dense: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """``S @ dense`` (``S.T @ dense`` with ``transpose``) for a 2-D sparse storage ``S``.

    The layout's ``linalg[aten.mm.default]`` kernel, else the COO kernel on its COO form
    (differentiable through ``to_coo``). ``dense`` is 2-D with ``S``'s dtype.
    """
    if torch.compiler.is_compiling():
        return _traced_mm(storage, dense, transpose)
    kernel = storage.layout.linalg.get(aten.mm.default)
    if kernel is None:
        storage = storage.layout.to_coo(storage)
        kernel = coo_mm
    return kernel(storage, dense, transpose)


def _traced_mm(storage: Storage, dense: torch.Tensor, transpose: bool) -> torch.Tensor:
    """``sparse_mm`` while torch.compile traces.

    Note [Sparse products under torch.compile]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch's fake tensors cannot build the torch sparse tensor that the eager product runs
    in. Its shape depends on the index sizes alone, though, so the traced product is the
    same sum written in plain ops over the stored elements: gather the rows of ``dense`` at
    the elements' columns, scale them by the values, add them into their rows
    (``index_add``: O(nnz * n), differentiable, one graph with its backward).
    """
    coo = storage.layout.to_coo(storage) if storage.index and len(storage.index) != 1 \
        else storage
    (indices,) = coo.index
    if indices.shape[0] != 2 or coo.values.dim() != 1:
        raise NotImplementedError(
            f"matrix product: a {storage.layout.name} MaskedTensor operand must be 2-D "
            f"without dense dims, got shape {tuple(storage.shape)}; use .to_dense()")
    rows, cols = (indices[1], indices[0]) if transpose else (indices[0], indices[1])
    nout = storage.shape[1] if transpose else storage.shape[0]
    terms = coo.values.unsqueeze(1) * dense.index_select(0, cols)
    return terms.new_zeros(nout, dense.shape[1]).index_add(0, rows, terms)


def _specified_coo(storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(2, n)`` and values of the specified elements of a 2-D sparse storage,
    in row-major order."""
    coo = storage.layout.to_coo(storage)
    (indices,) = coo.index
    if indices.shape[0] != 2 or coo.values.dim() != 1:
        raise NotImplementedError(
            f"matrix product: a {storage.layout.name} MaskedTensor operand must be 2-D without "
            f"dense dims, got shape {tuple(storage.shape)}; use .to_dense()")
    return indices[:, coo.mask], coo.values[coo.mask]


def _any_by_line(line: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Bool vector of length ``n``: True at the lines that hold a True ``mask`` entry (a uint8
    ``amax`` scatter: one pass over one byte per entry, where a weighted ``bincount`` or
    boolean indexing allocate and convert; ``python -m benchmarks.bench_linalg``)."""
    out = torch.zeros(n, dtype=torch.uint8, device=mask.device)
    return out.scatter_reduce_(0, line.long(), mask.view(torch.uint8), "amax").view(torch.bool)


def coo_mask_any(storage: Storage, dim: int) -> torch.Tensor:
    """The COO layout's ``aten.any.dim`` kernel on the specified set of a 2-D storage: a
    dense bool vector over the other dim (``dim=1``: rows with a specified element)."""
    (indices,) = storage.index
    if indices.shape[0] != 2 or storage.mask.dim() != 1:
        raise NotImplementedError(
            f"matrix product: a sparse_coo MaskedTensor operand must be 2-D without dense "
            f"dims, got shape {tuple(storage.shape)}; use .to_dense()")
    return _any_by_line(indices[1 - dim], storage.mask, storage.shape[1 - dim])


def compressed_mask_any(storage: Storage, dim: int, *, axis: int = 0) -> torch.Tensor:
    """The ``aten.any.dim`` kernel of CSR (``axis=0``) and CSC (``axis=1``): per compressed
    line from the pointer (a cumulative count of specified entries, no per-element line
    index), across lines by a scatter over the inner indices."""
    ptr, idx = storage.index
    if 1 - dim != axis:
        return _any_by_line(idx, storage.mask, storage.shape[1 - dim])
    counts = torch.zeros(idx.numel() + 1, dtype=torch.int32, device=idx.device)
    torch.cumsum(storage.mask, 0, dtype=torch.int32, out=counts[1:])  # int32: half of int64's bytes
    at_ptr = counts.index_select(0, ptr)  # index_select, not counts[ptr]: no advanced-indexing path
    return at_ptr[1:] > at_ptr[:-1]


def specified_lines(storage: Storage, dim: int) -> torch.Tensor:
    """Bool vector over ``shape[dim]``: True where that row/column has a specified element.

    The layout's ``linalg[aten.any.dim]`` kernel (``any`` over the *other* dim), else the COO
    kernel on its COO form.
    """
    kernel = storage.layout.linalg.get(aten.any.dim)
    if kernel is None:
        storage = storage.layout.to_coo(storage)
        kernel = coo_mask_any
    return kernel(storage, 1 - dim)


def sparse_sparse_mm(a: Storage, b: Storage, transpose_b: bool = False) -> Storage:
    """``A @ B`` (``A @ B.T``) over the specified elements of two 2-D sparse storages.

    Every pair of specified ``A[i, l]``, ``B[l, j]`` is one term; ``out[i, j]`` is stored (and
    specified) iff it has a term, so cancellation never drops a specified zero. The terms are
    enumerated through ``B``'s row pointer and summed per output key: O(number of terms),
    differentiable with respect to both values. Returns a coalesced COO storage.
    """
    ia, va = _specified_coo(a)
    ib, vb = _specified_coo(b)
    if transpose_b:
        ib = ib.flip(0)
        order = torch.argsort(linearize(ib, (b.shape[1], b.shape[0])))
        ib, vb = ib[:, order], vb[order]
    k, n = (b.shape[1], b.shape[0]) if transpose_b else (b.shape[0], b.shape[1])
    crow_b = crow_from_rows(ib[0], k)
    starts, counts = crow_b[ia[1]], crow_b[ia[1] + 1] - crow_b[ia[1]]
    total = int(counts.sum())
    term_a = torch.repeat_interleave(torch.arange(va.numel(), device=va.device), counts,
                                     output_size=total)
    first = torch.cumsum(counts, 0) - counts
    term_b = starts[term_a] + torch.arange(total, device=va.device) - first[term_a]
    keys = ia[0][term_a] * n + ib[1][term_b]
    out_keys, slot = torch.unique(keys, sorted=True, return_inverse=True)
    terms = va[term_a] * vb[term_b]
    values = terms.new_zeros(out_keys.numel()).index_add(0, slot, terms)
    indices = torch.stack([out_keys // n, out_keys % n])
    mask = torch.ones(out_keys.numel(), dtype=torch.bool, device=values.device)
    return get_layout("sparse_coo").build((indices,), values, mask, (a.shape[0], n))
