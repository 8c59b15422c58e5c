"""The sampled product: ``alpha * (A @ B) + beta * values`` at a storage's stored positions.

``sampled_mm(storage, left, right, alpha=1, beta=0)`` computes, for every stored element
``(i, j)`` of a 2-D storage, the dot product of row ``i`` of ``left`` (``m x k``) and column
``j`` of ``right`` (``k x n``): ``nnz`` dot products, O(nnz * k) time, no ``m x n``
intermediate. The result is shaped like ``storage.values`` (in the storage's own order), so
it is the values of a storage with the same index tensors. A storage without index tensors
(strided: every position stored) takes the dense ``addmm``. Differentiable with respect to
``left``, ``right`` and ``storage.values``; the layouts know nothing of masks here, the
caller zeroes the incoming gradient at unspecified positions.

Note [Sampled product]
~~~~~~~~~~~~~~~~~~~~~~
Forward and backward read the stored pattern in two CSR forms, both computed once per index
tensors (cached per index object and version, :func:`._index.cached`, like Note [Transposed
pattern]): the row-major pattern ``(crow, col)`` and the column-major one ``(ccol, row)``, with
the permutations from the storage's own order to each (none for a storage already row-major,
which COO and CSR are; CSC and BSR read theirs through the COO hub once). Then:

- forward: ``torch.sparse.sampled_addmm`` on the row-major pattern (one dot product per
  stored element, in torch's CSR kernel -- faster on CPU than gathering the rows of both
  factors, ``python -m benchmarks.bench_recommender``);
- backward, with ``G`` the incoming gradient over the pattern: ``grad_left = G @ right.T``
  (CSR x dense) and ``grad_right = (G.T @ left).T`` through the column-major pattern, so no
  sort and no ``.t().to_sparse_csr()`` per step; ``grad_values = beta * G``.

Under ``torch.compile``, and on devices without torch's sparse CSR kernels, the same values
come from torch ops on the stored coordinates: the rows of both factors gathered and reduced
over ``k`` in chunks, whose autograd is an ``index_add`` over the rows (no sort either).

>>> import torch, layouts
>>> csr = layouts.get_layout("sparse_csr")
>>> s = csr.from_strided(torch.zeros(2, 3), torch.tensor([[True, False, True],
...                                                       [False, True, False]]))
>>> sampled_mm(s, torch.ones(2, 4), torch.ones(4, 3), alpha=0.5).tolist()
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ._index import cached, crow_from_rows, sort_key
from .registry import Storage

_CSR_DEVICES = frozenset({"cpu", "cuda"})  # where torch has the CSR kernels used here
_CHUNK = 1 << 14  # stored elements per chunk of the gathered rows (bounds their memory)


def _csr(ptr: torch.Tensor, idx: torch.Tensor, values: torch.Tensor,
         shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_csr_tensor(ptr, idx, values, shape, check_invariants=False)


class _Pattern:
    """The stored pattern of a 2-D storage in row- and column-major CSR form (Note [Sampled
    product]), unpacked from the one cached tensor."""

    def __init__(self, packed: torch.Tensor, m: int, n: int, nnz: int) -> None:
        sizes = [m + 1, nnz, n + 1, nnz, nnz, nnz, nnz]
        if packed.numel() != sum(sizes):  # row-major already: no permutations to own order
            sizes = sizes[:4] + [0, 0, nnz]
        (self.crow, self.col, self.ccol, self.row, self.order, self.inverse,
         self.by_column) = packed.split(sizes)
        self.row_major = self.order.numel() == 0 and nnz > 0

    def own_to_rows(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.row_major else v.index_select(0, self.order)

    def rows_to_own(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.row_major else v.index_select(0, self.inverse)


def coordinates(storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of every stored element of a 2-D sparse storage, in the order of
    ``storage.values.reshape(-1)`` (read through the COO hub: any layout)."""
    ids = torch.arange(storage.values.numel(), device=storage.values.device)
    coo = storage.layout.to_coo(storage.with_values(ids.view(storage.values.shape)))
    (indices,) = coo.index
    if indices.shape[0] != 2 or coo.values.dim() != 1:
        raise NotImplementedError(
            f"sampled product: a {storage.layout.name} MaskedTensor must be 2-D without dense "
            f"dims, got shape {tuple(storage.shape)}; use a 2-D operand")
    rows = torch.empty_like(indices[0])
    cols = torch.empty_like(indices[1])
    rows[coo.values] = indices[0]
    cols[coo.values] = indices[1]
    return rows, cols


def _pattern(storage: Storage) -> _Pattern:
    m, n = storage.shape
    nnz = storage.values.numel()

    def compute() -> torch.Tensor:
        rows, cols = coordinates(storage)
        order = torch.argsort(rows * n + cols)  # own order -> row-major (unique keys)
        identity = storage.values.is_cpu and bool(
            torch.equal(order, torch.arange(nnz, device=order.device)))  # (CPU: no sync)
        r_rows, r_cols = (rows, cols) if identity else (rows[order], cols[order])
        by_column = torch.argsort(sort_key(r_cols, n), stable=True)  # rows stay sorted
        parts = [crow_from_rows(r_rows, m).long(), r_cols.long(),
                 crow_from_rows(r_cols[by_column], n).long(), r_rows[by_column].long()]
        if identity:
            return torch.cat(parts + [by_column])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(nnz, device=order.device)
        return torch.cat(parts + [order, inverse, order[by_column]])

    owner, data = storage.index[-1], (storage.index[0] if len(storage.index) > 1 else None)
    return _Pattern(cached(owner, ("sampled", m, n), compute, data=data), m, n, nnz)


class _SampledMM(torch.autograd.Function):
    """The CSR route of Note [Sampled product]."""

    @staticmethod
    def forward(ctx, values, left, right, pattern, shape, alpha, beta):  # type: ignore[override]
        m, n = shape
        if beta == 0:  # torch's convention: the input is not read (NaN under it stays out)
            start = torch.zeros(pattern.col.numel(), dtype=left.dtype, device=left.device)
        else:
            start = pattern.own_to_rows(values.reshape(-1))
        out = torch.sparse.sampled_addmm(_csr(pattern.crow, pattern.col, start, (m, n)),
                                         left, right, beta=beta, alpha=alpha).values()
        ctx.save_for_backward(left, right)
        ctx.pattern, ctx.shape, ctx.alpha, ctx.beta = pattern, shape, alpha, beta
        ctx.values_shape = values.shape
        return pattern.rows_to_own(out).view(values.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        left, right = ctx.saved_tensors
        p, (m, n), alpha, beta = ctx.pattern, ctx.shape, ctx.alpha, ctx.beta
        g = grad.reshape(-1)
        need_values, need_left, need_right = ctx.needs_input_grad[:3]
        grad_values = grad_left = grad_right = None
        if need_values:
            grad_values = (grad * beta).view(ctx.values_shape)
        scaled = g if alpha == 1 else g * alpha
        if need_left:  # G @ right.T over the row-major pattern
            grad_left = torch.sparse.mm(_csr(p.crow, p.col, p.own_to_rows(scaled), (m, n)),
                                        right.t())
        if need_right:  # (G.T @ left).T over the column-major pattern
            by_column = scaled.index_select(0, p.by_column)
            grad_right = torch.sparse.mm(_csr(p.ccol, p.row, by_column, (n, m)), left).t()
        return grad_values, grad_left, grad_right, None, None, None, None


def _gathered(rows: torch.Tensor, cols: torch.Tensor, left: torch.Tensor,
              right: torch.Tensor) -> torch.Tensor:
    """``(left[rows] * right.T[cols]).sum(-1)`` in chunks of stored elements: torch ops
    whose autograd is an ``index_add`` over the rows (the route of Note [Sampled product]
    under torch.compile and on other devices)."""
    right_t = right.t()
    parts = [(left.index_select(0, rows[i:i + _CHUNK])
              * right_t.index_select(0, cols[i:i + _CHUNK])).sum(-1)
             for i in range(0, rows.numel(), _CHUNK)]
    return torch.cat(parts) if parts else left.new_zeros(0)


def sampled_mm(storage: Storage, left: torch.Tensor, right: torch.Tensor, *,
               alpha: Any = 1, beta: Any = 0) -> torch.Tensor:
    """``alpha * (left @ right) + beta * storage.values`` at the stored positions of a 2-D
    storage, shaped like ``storage.values`` (Note [Sampled product]).

    ``left`` is ``m x k`` and ``right`` is ``k x n`` (pass ``V.T`` for ``U @ V.T``), dense,
    with the values' dtype and device. With ``beta == 0`` the values are not read.
    """
    values = storage.values
    if not storage.index:  # every position stored: the dense product
        if beta == 0:
            out = torch.mm(left, right)
            return out if alpha == 1 else out * alpha
        return torch.addmm(values, left, right, beta=beta, alpha=alpha)
    if len(storage.shape) != 2:
        raise NotImplementedError(
            f"sampled product: a {storage.layout.name} MaskedTensor must be 2-D, got shape "
            f"{tuple(storage.shape)}")
    if values.numel() == 0:  # torch's CSR kernels reject some empty patterns
        out = left.new_zeros(values.shape)
        return out if beta == 0 else out + values * beta
    if torch.compiler.is_compiling() or left.device.type not in _CSR_DEVICES:
        rows, cols = coordinates(storage)
        out = _gathered(rows, cols, left, right).view(values.shape)
        out = out if alpha == 1 else out * alpha
        return out if beta == 0 else out + values * beta
    return _SampledMM.apply(values, left, right, _pattern(storage), tuple(storage.shape),
                            alpha, beta)
