"""Segment reductions for sparse layouts: group the stored values, reduce per group.

A reduction over ``dims`` of a COO storage splits the dims into *sparse* ones (rows of the
index tensor) and *dense* ones (trailing dims of a hybrid tensor's values):

- reducing dense dims only is a reduction of the values tensor; the output keeps the
  index tensor (the same object);
- reducing sparse dims gives every stored value a *group id*: the rank of its index
  columns restricted to the kept sparse dims (``unique`` of their linear keys; when the
  kept dims are a prefix of the sparse dims the coalesced order is already sorted, so
  one pass finds the groups). Values then reduce with ``index_add`` / ``scatter_reduce``
  (``include_self=False``), all differentiable with respect to the values.

Everything is O(nnz) (O(nnz log nnz) when a sort is needed); nothing is densified, so a
100000 x 100000 matrix with 1000 stored entries reduces in microseconds. Every group has at
least one stored element. When no sparse dim is left (a full reduction) the result is a
strided storage, as ``torch.sparse.sum`` returns a dense tensor then.

Layouts without their own ``reduction["group"]`` kernel are reduced through their COO form
(:func:`via_coo`); their results are COO (or strided for full reductions).
"""

from __future__ import annotations

import torch

from ._grouping import Grouping, reduce_dense, reduced_shape, sort_order
from ._index import linearize
from .registry import Storage, get_layout


def _unravel(keys: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Row-major coordinates ``(len(shape), n)`` of linear ``keys``."""
    rows = []
    for n in reversed(shape):
        rows.append(keys % n)
        keys = keys // n
    return torch.stack(rows[::-1]) if rows else keys.new_zeros((0, keys.numel()))


def _prod(sizes) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


class CooGrouping(Grouping):
    """Groups of a coalesced COO storage (hybrid allowed) for a reduction over ``dims``."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        (indices,) = storage.index
        shape = storage.shape
        nsparse = indices.shape[0]
        self.source = storage
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(shape, dims, keepdim)
        self.sparse_dims = tuple(d for d in dims if d < nsparse)
        # dims of the values tensor (dim 0 enumerates the stored elements)
        self.value_dims = tuple(d - nsparse + 1 for d in dims if d >= nsparse)
        dense_kept = reduced_shape(shape[nsparse:], [d - 1 for d in self.value_dims], True)
        self._dense_keepdim = dense_kept
        kept = [d for d in range(nsparse) if d not in dims]
        nnz = indices.shape[1]
        self.out_sparse_dim = nsparse if keepdim else len(kept)
        if not self.sparse_dims:
            self.gid = None
            self.ngroups = nnz
            self.out_indices = indices
            return
        if not kept:
            self.gid = torch.zeros(nnz, dtype=torch.long, device=indices.device)
            self.ngroups = min(nnz, 1)
            rows = indices.new_zeros((0, self.ngroups))
        else:
            sub = indices[kept]
            kept_shape = [shape[d] for d in kept]
            keys = linearize(sub, tuple(kept_shape))
            if kept == list(range(len(kept))):
                # Coalesced order sorts by the leading sparse dims: groups are runs.
                new = torch.ones(nnz, dtype=torch.bool, device=keys.device)
                new[1:] = keys[1:] != keys[:-1]
                self.gid = new.cumsum(0) - 1
                rows = sub[:, new]
            else:
                uniq, self.gid = torch.unique(keys, sorted=True, return_inverse=True)
                rows = _unravel(uniq, kept_shape)
            self.ngroups = rows.shape[1]
        if keepdim:
            out = indices.new_zeros((nsparse, self.ngroups))
            out[kept] = rows
            self.out_indices = out
        else:
            self.out_indices = rows

    # -- primitives --------------------------------------------------------------------
    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        v = values
        if op == "sum" and v.dtype == torch.bool:
            v = v.long()
        if self.value_dims:
            v = reduce_dense(v, self.value_dims, True, op)
        if self.gid is not None:
            v = self._scatter(v, op)
        if self.value_dims and not self.keepdim:
            v = v.squeeze(self.value_dims)
        return v

    def _scatter(self, v: torch.Tensor, op: str) -> torch.Tensor:
        shape = (self.ngroups,) + tuple(v.shape[1:])
        if op == "sum":
            return v.new_zeros(shape).index_add(0, self.gid, v)
        index = self.gid.view((-1,) + (1,) * (v.dim() - 1)).expand_as(v)
        if op in ("any", "all"):
            return torch.zeros(shape, dtype=torch.bool, device=v.device).scatter_reduce(
                0, index, v.bool(), "amax" if op == "any" else "amin", include_self=False)
        # Note: scatter_reduce's backward shares the gradient of amax/amin with the initial
        # ``self`` value when it ties with the result, even with include_self=False; NaN
        # never ties.
        init = v.new_full(shape, float("nan")) if v.is_floating_point() and op != "prod" \
            else v.new_ones(shape)
        return init.scatter_reduce(0, index, v, op, include_self=False)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if self.value_dims and not self.keepdim:
            for d in self.value_dims:
                out = out.unsqueeze(d)
        if self.gid is not None:
            out = out.index_select(0, self.gid)
        return out.expand(self.source.values.shape)

    def positions(self) -> torch.Tensor:
        (indices,) = self.source.index
        shape = self.source.shape
        vdim = self.source.values.dim()
        nsparse = indices.shape[0]
        pos = torch.zeros((), dtype=torch.long, device=indices.device)
        stride = 1
        for d in reversed(self.dims):
            if d < nsparse:
                coord = indices[d].view((-1,) + (1,) * (vdim - 1))
            else:
                view = [1] * vdim
                view[d - nsparse + 1] = shape[d]
                coord = torch.arange(shape[d], device=indices.device).view(view)
            pos = pos + coord * stride
            stride *= shape[d]
        return pos

    def _element_groups(self) -> tuple[torch.Tensor, int]:
        """The flat output-element id of every element of the values, and their count."""
        values = self.source.values
        base = self.gid if self.gid is not None else torch.arange(values.shape[0],
                                                                 device=values.device)
        inner = _prod(self._dense_keepdim)
        view = (-1,) + (1,) * (values.dim() - 1)
        local = torch.arange(inner, device=values.device).view(self._dense_keepdim)
        eg = base.view(view) * inner + local.expand(values.shape[1:])
        return eg, self.ngroups * inner

    def select(self, values: torch.Tensor, mask: torch.Tensor,
               rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        eg, nout = self._element_groups()
        ev, em, eg = values.reshape(-1), mask.reshape(-1), eg.reshape(-1)
        epos = self.positions().expand(values.shape).reshape(-1)
        out_shape = rank.shape
        if ev.numel() == 0:
            return ev.new_zeros(out_shape), torch.zeros(out_shape, dtype=torch.long,
                                                         device=ev.device)
        order = sort_order(ev, em, 0)
        order = order[torch.argsort(eg[order], stable=True)]
        counts = torch.bincount(eg, minlength=nout)
        starts = counts.cumsum(0) - counts
        at = order[(starts + rank.reshape(-1).clamp(min=0)).clamp(max=ev.numel() - 1)]
        return ev[at].reshape(out_shape), epos[at].reshape(out_shape)

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        coo = self.source.layout
        if self.gid is not None and self.out_sparse_dim == 0:
            if self.ngroups:
                v, m = out_values[0], out_mask[0]
            else:
                v = out_values.new_zeros(out_values.shape[1:])
                m = out_mask.new_zeros(out_mask.shape[1:])
            return get_layout("strided").build((), v, m, self.out_shape)
        return coo.build((self.out_indices,), out_values, out_mask, self.out_shape)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.source.with_values(values)


class CsrGrouping(CooGrouping):
    """A CSR storage grouped through its COO view (the same values, in the same order).

    The result is CSR when it is 2-D (``keepdim=True``), else COO / strided.
    """

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.csr = storage
        super().__init__(storage.layout.to_coo(storage), dims, keepdim)

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        out = super().build(out_values, out_mask)
        if self.keepdim and len(self.out_shape) == 2:
            return self.csr.layout.from_coo(out)
        return out

    def restore(self, values: torch.Tensor) -> Storage:
        return self.csr.with_values(values)


class ViaCooGrouping(CooGrouping):
    """Any layout without a grouping kernel, reduced through its COO form (O(nnz))."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.original = storage
        super().__init__(storage.layout.to_coo(storage), dims, keepdim)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.original.layout.from_coo_like(self.source.with_values(values), self.original)


def coo_group(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CooGrouping:
    """The sparse COO layout's ``reduction["group"]`` kernel."""
    return CooGrouping(storage, dims, keepdim)


def csr_group(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CsrGrouping:
    """The sparse CSR layout's ``reduction["group"]`` kernel."""
    return CsrGrouping(storage, dims, keepdim)


def via_coo(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CooGrouping:
    """The fallback grouping of a layout without a ``reduction["group"]`` kernel."""
    if storage.layout is get_layout("sparse_coo"):
        return CooGrouping(storage, dims, keepdim)
    return ViaCooGrouping(storage, dims, keepdim)
