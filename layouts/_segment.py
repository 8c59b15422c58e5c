"""Segment reductions for sparse layouts: group the stored values, reduce per group.

A reduction over ``dims`` of a COO storage splits the dims into *sparse* ones (rows of the
index tensor) and *dense* ones (trailing dims of a hybrid tensor's values):

- reducing dense dims only is a reduction of the values tensor; the output keeps the
  index tensor (the same object);
- reducing every sparse dim makes one group of all stored values (``values.sum(0)``);
- otherwise every stored value gets a *group id* from its coordinates along the kept
  sparse dims (their linear key): when the kept dims lead, the coalesced order is sorted
  and ``unique_consecutive`` finds the groups in one pass; when the kept key space is
  small (at most a few times nnz) a ``bincount`` over it does; else ``unique`` sorts.
  Values then reduce with ``index_add`` / ``scatter_reduce`` (``include_self=False``), all
  differentiable with respect to the values.

Everything is O(nnz) (O(nnz log nnz) when a sort is needed, O(nnz + kept key space) for the
bincount path); nothing is densified, so a 100000 x 100000 matrix with 1000 stored entries
reduces in microseconds. Every group has at least one stored element. When no sparse dim is
left (a full reduction) the result is a strided storage, as ``torch.sparse.sum`` returns a
dense tensor then.

CSR is grouped from its (row, col) coordinates directly, over the same values in the same
order (no COO copy); layouts without their own ``group`` builder are reduced
through their COO form (:func:`via_coo`); their results are COO (or strided for full
reductions).
"""

from __future__ import annotations

import torch

from ._grouping import Grouping, reduce_dense, reduced_shape, sort_order
from ._index import linearize, rows_from_crow
from .registry import Storage, get_layout

_SLOTS_PER_NNZ = 4  # bincount grouping while the kept key space is <= 4 * nnz + 4096


def _unravel(keys: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Row-major coordinates ``(len(shape), n)`` of linear ``keys``."""
    rows = []
    for n in reversed(shape):
        rows.append(keys % n)
        keys = keys // n
    return torch.stack(rows[::-1])


def _prod(sizes) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


class CooGrouping(Grouping):
    """Groups of sparse storage given per-dim coordinates of its stored values.

    ``coords[d]`` is the index of every stored value along sparse dim ``d``; ``source``
    holds the values and mask (shape ``(nnz, *dense)``) in the same order.
    """

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool,
                 coords: list[torch.Tensor] | None = None) -> None:
        if coords is None:
            coords = list(storage.index[0])
        shape = storage.shape
        nsparse = len(coords)
        nnz = storage.values.shape[0]
        self.source = storage
        self.coords = coords
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(shape, dims, keepdim)
        self.sparse_dims = tuple(d for d in dims if d < nsparse)
        # dims of the values tensor (dim 0 enumerates the stored elements)
        self.value_dims = tuple(d - nsparse + 1 for d in dims if d >= nsparse)
        self._dense_keepdim = reduced_shape(shape[nsparse:], [d - 1 for d in self.value_dims],
                                            True)
        kept = [d for d in range(nsparse) if d not in dims]
        self.out_sparse_dim = nsparse if keepdim else len(kept)
        self.single = bool(self.sparse_dims) and not kept  # one group: all stored values
        self.gid: torch.Tensor | None = None
        self.ngroups = nnz
        device = storage.values.device
        if not self.sparse_dims:
            self.out_coords = coords
            return
        if self.single:
            self.ngroups = min(nnz, 1)
            rows = []
        else:
            kept_shape = [shape[d] for d in kept]
            keys = coords[kept[0]].long() if len(kept) == 1 else linearize(
                torch.stack([coords[d].long() for d in kept]), tuple(kept_shape))
            space = _prod(kept_shape)
            if kept == list(range(len(kept))):  # coalesced order sorts by leading dims
                uniq, self.gid = torch.unique_consecutive(keys, return_inverse=True)
            elif space <= _SLOTS_PER_NNZ * nnz + 4096:
                present = torch.bincount(keys, minlength=space) > 0
                uniq = present.nonzero().squeeze(1)
                self.gid = (present.cumsum(0) - 1)[keys]
            else:
                uniq, self.gid = torch.unique(keys, sorted=True, return_inverse=True)
            self.ngroups = uniq.numel()
            rows = list(_unravel(uniq, kept_shape)) if len(kept) > 1 else [uniq]
        if keepdim:
            zeros = torch.zeros(self.ngroups, dtype=torch.long, device=device)
            it = iter(rows)
            self.out_coords = [zeros if d in dims else next(it) for d in range(nsparse)]
        else:
            self.out_coords = rows

    # -- primitives --------------------------------------------------------------------
    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        v = values
        if op == "sum" and v.dtype == torch.bool:
            v = v.long()
        if self.value_dims:
            v = reduce_dense(v, self.value_dims, True, op)
        if self.single:
            v = reduce_dense(v, (0,), True, op) if v.shape[0] else v
        elif self.gid is not None:
            v = self._scatter(v, op)
        if self.value_dims and not self.keepdim:
            v = v.squeeze(self.value_dims)
        return v

    def _scatter(self, v: torch.Tensor, op: str) -> torch.Tensor:
        shape = (self.ngroups,) + tuple(v.shape[1:])
        if op == "sum":
            return v.new_zeros(shape).index_add(0, self.gid, v)
        if op in ("any", "all"):  # counting is several times faster than a bool scatter
            hits = (v if op == "any" else ~v.bool()).to(torch.int32)
            counts = torch.zeros(shape, dtype=torch.int32, device=v.device).index_add_(
                0, self.gid, hits)
            return counts > 0 if op == "any" else counts == 0
        index = self.gid.view((-1,) + (1,) * (v.dim() - 1)).expand_as(v)
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
        shape = self.source.shape
        vdim = self.source.values.dim()
        nsparse = len(self.coords)
        device = self.source.values.device
        pos = torch.zeros((), dtype=torch.long, device=device)
        stride = 1
        for d in reversed(self.dims):
            if d < nsparse:
                coord = self.coords[d].long().view((-1,) + (1,) * (vdim - 1))
            else:
                view = [1] * vdim
                view[d - nsparse + 1] = shape[d]
                coord = torch.arange(shape[d], device=device).view(view)
            pos = pos + coord * stride
            stride *= shape[d]
        return pos

    def _element_groups(self) -> tuple[torch.Tensor, int]:
        """The flat output-element id of every element of the values, and their count."""
        values = self.source.values
        n = values.shape[0]
        if self.gid is not None:
            base = self.gid
        elif self.single:
            base = torch.zeros(n, dtype=torch.long, device=values.device)
        else:
            base = torch.arange(n, device=values.device)
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
        if self.sparse_dims and self.out_sparse_dim == 0:
            if self.ngroups:
                v, m = out_values[0], out_mask[0]
            else:
                v = out_values.new_zeros(out_values.shape[1:])
                m = out_mask.new_zeros(out_mask.shape[1:])
            return get_layout("strided").build((), v, m, self.out_shape)
        coo = get_layout("sparse_coo")
        if not self.sparse_dims and self.source.layout is coo:
            indices = self.source.index[0]  # the very same index tensor
        else:
            indices = torch.stack([c.long() for c in self.out_coords]) if self.out_coords \
                else torch.zeros((0, out_values.shape[0]), dtype=torch.long,
                                 device=out_values.device)
        return coo.build((indices,), out_values, out_mask, self.out_shape)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.source.with_values(values)


class CsrGrouping(CooGrouping):
    """A CSR storage grouped by its (row, col) coordinates; values in their own order.

    A reduction along the rows (``dims == (1,)``) of floating values runs as
    ``torch.segment_reduce`` over ``crow_indices`` and broadcasts back with
    ``repeat_interleave``: no per-element index is built. The result is CSR when it is 2-D
    (``keepdim=True``), else COO / strided.
    """

    _SEGMENT_OPS = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        crow, col = storage.index
        self.by_rows = dims == (1,)
        if not self.by_rows:
            super().__init__(storage, dims, keepdim, [rows_from_crow(crow, col.numel()), col])
            return
        self.source = storage
        self.dims = dims
        self.keepdim = keepdim
        self.out_shape = reduced_shape(storage.shape, dims, keepdim)
        self.sparse_dims, self.value_dims, self._dense_keepdim = dims, (), torch.Size()
        self.out_sparse_dim = 2 if keepdim else 1
        self.single = False
        self.gid = None
        self.offsets = crow.long()
        counts = self.offsets.diff()
        nonempty = counts > 0
        self.rows = nonempty.nonzero().squeeze(1)
        self.lengths = counts[nonempty]
        self.ngroups = self.rows.numel()
        zeros = torch.zeros(self.ngroups, dtype=torch.long, device=crow.device)
        self.out_coords = [self.rows, zeros] if keepdim else [self.rows]
        self.coords = [None, col]  # rows are built only if a per-element index is needed

    def _with_gid(self) -> None:
        if self.by_rows and self.gid is None:
            self.gid = torch.repeat_interleave(
                torch.arange(self.ngroups, device=self.rows.device), self.lengths,
                output_size=self.source.values.shape[0])

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        if not self.by_rows:
            return super().reduce(values, op)
        if values.is_floating_point() and op in self._SEGMENT_OPS:
            seg = torch.segment_reduce(values, self._SEGMENT_OPS[op], offsets=self.offsets)
            return seg.index_select(0, self.rows)
        if values.dtype == torch.bool and op in ("sum", "any", "all"):
            hits = (values if op != "all" else ~values).to(torch.float64)
            counts = torch.segment_reduce(hits, "sum", offsets=self.offsets)[self.rows]
            return counts.long() if op == "sum" else (counts > 0 if op == "any" else
                                                      counts == 0)
        self._with_gid()
        return super().reduce(values, op)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if not self.by_rows:
            return super().expand(out)
        if self.keepdim:
            out = out.squeeze(1) if out.dim() > 1 else out
        return torch.repeat_interleave(out, self.lengths, dim=0,
                                       output_size=self.source.values.shape[0])

    def positions(self) -> torch.Tensor:
        if not self.by_rows:
            return super().positions()
        return self.coords[1].long()

    def _element_groups(self) -> tuple[torch.Tensor, int]:
        self._with_gid()
        return super()._element_groups()

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        out = super().build(out_values, out_mask)
        if self.keepdim and len(self.out_shape) == 2:
            return self.source.layout.from_coo(out)
        return out


class ViaCooGrouping(CooGrouping):
    """Any layout without a grouping kernel, reduced through its COO form (O(nnz))."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.original = storage
        super().__init__(storage.layout.to_coo(storage), dims, keepdim)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.original.layout.from_coo(self.source.with_values(values))


def coo_group(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CooGrouping:
    """The sparse COO layout's ``group`` builder."""
    return CooGrouping(storage, dims, keepdim)


def csr_group(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CsrGrouping:
    """The sparse CSR layout's ``group`` builder."""
    return CsrGrouping(storage, dims, keepdim)


def via_coo(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> CooGrouping:
    """The fallback grouping of a layout without a ``group`` builder."""
    if storage.layout is get_layout("sparse_coo"):
        return CooGrouping(storage, dims, keepdim)
    return ViaCooGrouping(storage, dims, keepdim)
