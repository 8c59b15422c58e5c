"""Scans and sorts along one dim: a storage's stored elements arranged line by line.

A scan or a sort along ``dim`` works on *lines*: the elements that share every other
coordinate, in order of their coordinate along ``dim``. :func:`lines_along` gives the
:class:`Lines` of a storage; the core (``masked_sparse/ops/scans.py``, ``order.py``) writes
the masked semantics once in terms of its two primitives, and the layouts only compute:

``scan(values, op)``
    ``op`` in :data:`SCANS` along each line of ``values`` (shaped like the source's values,
    already filled with the op's identity where unspecified): values in the source's order
    and, for ``cummax`` / ``cummin``, the coordinate along ``dim`` of each running extreme.
``sort(values, mask, descending, k)``
    Per line, the ``mask``-ed elements in ascending (descending) order of value -- stable,
    NaN as torch places it -- then the other stored elements; the first ``k`` of them (all
    with ``k=None``). Returns the result storage (slot ``j`` of a line at coordinate ``j``
    along ``dim``) and, shaped like its values, the input coordinate of each element.

Strided storages (and the dense dims of a hybrid COO tensor) are lines already: the torch
op runs along the dim. Sparse storages are arranged through their COO form: a line is a
run of the element order sorted by (other coordinates, coordinate along ``dim``) -- the
coalesced order itself when ``dim`` is the last sparse dim, CSR's own order along its
rows. Scans then run on padded blocks ``(lines, width)``, lines bucketed by length in
powers of two so padding at most doubles the work (Note [Padded lines]); sorts are two
stable sorts over all stored values. Everything is O(nnz) memory, O(nnz log nnz) time, and
differentiable with respect to the values; nothing is densified.

>>> import torch, layouts
>>> coo = layouts.get_layout("sparse_coo")
>>> s = coo.from_strided(torch.tensor([[1., 0., 2.], [0., 3., 4.]]),
...                      torch.tensor([[True, False, True], [False, True, True]]))
>>> lines_along(s, 1).scan(s.values, "cumsum")[0].tolist()
[1.0, 3.0, 3.0, 7.0]
"""

from __future__ import annotations

import torch

from ._index import linearize
from .registry import Storage

SCANS = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")


def stable_order(values: torch.Tensor, mask: torch.Tensor, dim: int,
                 descending: bool) -> torch.Tensor:
    """Indices along ``dim`` putting the ``mask``-ed elements first, in ascending
    (descending) stable order of value, then the others in their order."""
    order = torch.argsort(values.detach(), dim=dim, descending=descending, stable=True)
    unmasked = (~mask).gather(dim, order).to(torch.uint8)
    return order.gather(dim, torch.argsort(unmasked, dim=dim, stable=True))


class Lines:
    """The lines of one storage along one dim (see the module docstring)."""

    source: Storage
    dim: int

    def scan(self, values: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def sort(self, values: torch.Tensor, mask: torch.Tensor, descending: bool,
             k: int | None) -> tuple[Storage, torch.Tensor]:
        raise NotImplementedError


def _torch_scan(values: torch.Tensor, op: str, dim: int) -> tuple[torch.Tensor,
                                                                 torch.Tensor | None]:
    out = getattr(torch, op)(values, dim)
    if op in ("cummax", "cummin"):
        return out[0], out[1]
    return out, None


class DenseLines(Lines):
    """Lines along a dim of the values tensor itself (strided, or a hybrid's dense dim)."""

    def __init__(self, storage: Storage, dim: int, values_dim: int) -> None:
        self.source, self.dim, self.vdim = storage, dim, values_dim

    def scan(self, values, op):
        return _torch_scan(values, op, self.vdim)

    def sort(self, values, mask, descending, k):
        order = stable_order(values, mask, self.vdim, descending)
        if k is not None:
            order = order.narrow(self.vdim, 0, k)
        s = self.source
        shape = list(s.shape)
        shape[self.dim] = order.shape[self.vdim]
        out = s.layout.build(s.index, values.gather(self.vdim, order),
                             mask.gather(self.vdim, order), shape)
        return out, order


def _ranges(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a loop."""
    offsets = lengths.cumsum(0) - lengths
    shift = torch.repeat_interleave(starts - offsets, lengths, output_size=total)
    return shift + torch.arange(total, device=starts.device)


class SparseLines(Lines):
    """Lines of a COO storage along a sparse dim (CSR and others arrive as their COO form).

    ``order`` (None: the identity) lists the stored elements line by line, each line in
    increasing coordinate along ``dim``; ``lengths`` are the line lengths (all >= 1).

    Note [Padded lines]
    ~~~~~~~~~~~~~~~~~~~
    torch has no segmented scan, so lines are copied into blocks ``(lines, width)`` padded
    at the end and the torch op runs along dim 1: exact (inf, NaN, ties and cummax's
    last-index rule are torch's own) and the padding never reaches a real slot, since it
    comes after it. To bound the padding, lines are bucketed by ``ceil(log2(length))``:
    each bucket's width is at most twice its shortest line, so the blocks hold < 2 nnz
    slots, at one torch call per bucket (a single block when that already holds).
    ``cumsum`` of float32 (and narrower) or integer values whose values are all finite
    takes a faster path: one running sum over every line in float64 (int64), minus each
    line's starting total -- exact for integers (modular), within float32 rounding for
    float32 (float64 values always pad: their running total would lose digits).
    """

    def __init__(self, original: Storage, coo: Storage, dim: int,
                 order: torch.Tensor | None) -> None:
        (indices,) = coo.index
        self.source, self.coo, self.dim = original, coo, dim
        # CSR's COO form keeps its values in place: nothing to convert back and forth.
        self.same_order = coo.values is original.values
        nnz = indices.shape[1]
        sd = indices.shape[0]
        others = [d for d in range(sd) if d != dim]
        shape = tuple(coo.shape)
        device = indices.device
        key = linearize(indices[others], tuple(shape[d] for d in others)) if others else \
            torch.zeros(nnz, dtype=torch.long, device=device)
        if order is None and dim != sd - 1:
            order = torch.argsort(key * shape[dim] + indices[dim])
        self.order = order
        self.indices = indices if order is None else indices[:, order]
        key = key if order is None else key[order]
        self.coord = self.indices[dim]
        _, self.lengths = torch.unique_consecutive(key, return_counts=True)
        self.starts = self.lengths.cumsum(0) - self.lengths
        self.nnz = nnz
        self.rank = torch.arange(nnz, device=device) - torch.repeat_interleave(
            self.starts, self.lengths, output_size=nnz)
        self._inverse: torch.Tensor | None = None

    # -- moving between the source order and the line order ----------------------------
    def to_lines(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.order is None else t.index_select(0, self.order)

    def from_lines(self, t: torch.Tensor) -> torch.Tensor:
        if self.order is None:
            return t
        if self._inverse is None:
            self._inverse = torch.empty_like(self.order)
            self._inverse[self.order] = torch.arange(self.nnz, device=self.order.device)
        return t.index_select(0, self._inverse)

    def _restore(self, values: torch.Tensor) -> torch.Tensor:
        """Line-order values of the COO form as values of the original storage."""
        values = self.from_lines(values)
        if self.same_order:
            return values
        return self.source.layout.from_coo_like(self.coo.with_values(values),
                                                self.source).values

    # -- scans -------------------------------------------------------------------------
    def scan(self, values, op):
        if not self.same_order:
            values = self.source.layout.to_coo(self.source.with_values(values)).values
        v = self.to_lines(values)
        extra = None
        if self.nnz == 0:
            out = v
            if op in ("cummax", "cummin"):
                extra = torch.zeros(v.shape, dtype=torch.long, device=v.device)
        elif op == "cumsum" and self._running_sum_ok(v):
            out = self._running_sum(v)
        else:
            out, extra = self._padded_scan(v, op)
        out = self._restore(out)
        if extra is not None and self.nnz:  # element (line order) -> coordinate along dim
            extra = self._restore(self.coord[extra])
        return out, extra

    def _running_sum_ok(self, v: torch.Tensor) -> bool:
        if v.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return bool(torch.isfinite(v).all())
        return not v.is_floating_point() and not v.is_complex()

    def _running_sum(self, v: torch.Tensor) -> torch.Tensor:
        wide = v.to(torch.float64 if v.is_floating_point() else torch.int64)
        total = wide.cumsum(0)
        before = total - wide  # running total before each element
        return (total - before.index_select(0, self.starts).repeat_interleave(
            self.lengths, dim=0, output_size=self.nnz)).to(v.dtype)

    def _buckets(self) -> list[torch.Tensor]:
        """Groups of line ids whose padded block wastes less than half of it."""
        n = self.lengths.numel()
        width = int(self.lengths.max()) if n else 0
        if n * width <= 2 * self.nnz + 4096:
            return [torch.arange(n, device=self.lengths.device)]
        bucket = torch.ceil(torch.log2(self.lengths.double())).long()
        return [(bucket == b).nonzero().squeeze(1) for b in torch.unique(bucket).tolist()]

    def _padded_scan(self, v: torch.Tensor, op: str) -> tuple[torch.Tensor,
                                                                torch.Tensor | None]:
        outs, idxs, elems_all = [], [], []
        for lines in self._buckets():
            lengths = self.lengths[lines]
            total = int(lengths.sum())
            elems = _ranges(self.starts[lines], lengths, total)
            row = torch.repeat_interleave(torch.arange(lines.numel(), device=v.device),
                                          lengths, output_size=total)
            col = self.rank[elems]
            block = v.new_zeros((lines.numel(), int(lengths.max())) + tuple(v.shape[1:]))
            block = block.index_put((row, col), v.index_select(0, elems))
            out, idx = _torch_scan(block, op, 1)
            outs.append(out[row, col])
            if idx is not None:  # slot -> element (line order)
                idxs.append(idx[row, col] + self.starts[lines][row].view(
                    (-1,) + (1,) * (v.dim() - 1)))
            elems_all.append(elems)
        if len(outs) == 1 and outs[0].shape[0] == self.nnz:
            return outs[0], (idxs[0] if idxs else None)
        elems = torch.cat(elems_all)
        out = v.new_empty(v.shape).index_put((elems,), torch.cat(outs))
        idx = None
        if idxs:
            idx = torch.empty(v.shape, dtype=torch.long, device=v.device).index_put(
                (elems,), torch.cat(idxs))
        return out, idx

    # -- sorts -------------------------------------------------------------------------
    def sort(self, values, mask, descending, k):
        if not self.same_order:
            c = self.source.layout.to_coo(self.source.with_values(values, mask))
            values, mask = c.values, c.mask
        if values.dim() != 1:
            raise NotImplementedError(
                f"MaskedTensor[{self.source.layout.name}] sort along sparse dim {self.dim} of "
                f"a hybrid tensor (dense dims {tuple(values.shape[1:])}): sort it along a dense "
                f"dim, or convert with .to_dense() first")
        v, m = self.to_lines(values), self.to_lines(mask)
        by_value = torch.argsort(v.detach(), descending=descending, stable=True)
        line = torch.repeat_interleave(torch.arange(self.lengths.numel(), device=v.device),
                                       self.lengths, output_size=self.nnz)
        key = line[by_value] * 2 + (~m[by_value]).long()
        perm = by_value[torch.argsort(key, stable=True)]  # slot -> element (line order)
        indices = self.indices.clone()
        indices[self.dim] = self.rank
        keep = None if k is None else self.rank < k
        if keep is not None:
            perm, indices = perm[keep], indices[:, keep]
        shape = list(self.coo.shape)
        shape[self.dim] = shape[self.dim] if k is None else k
        if self.dim != indices.shape[0] - 1:  # back to row-major (coalesced) order
            row_major = torch.argsort(linearize(indices, tuple(shape[: indices.shape[0]])))
            perm, indices = perm[row_major], indices[:, row_major]
        coo = self.coo.layout.build((indices,), v[perm], m[perm], shape)
        positions = self.coord[perm]
        if self.source.layout is self.coo.layout:
            return coo, positions
        try:  # the input's layout when it can hold the result (Note [Sorted layout])
            ids = torch.arange(perm.numel(), device=perm.device)
            out = self.source.layout.from_coo_like(coo.with_values(ids), self.source)
        except ValueError:
            return coo, positions
        return (out.with_values(coo.values[out.values], coo.mask[out.values]),
                positions[out.values])


def dense_lines(storage: Storage, dim: int) -> Lines:
    """The strided layout's ``reduction["lines"]`` kernel."""
    return DenseLines(storage, dim, dim)


def sparse_lines(storage: Storage, dim: int) -> Lines:
    """Lines of any sparse storage through its COO form (COO's and CSR's kernel, and the
    fallback of a layout without one)."""
    coo = storage.layout.to_coo(storage)
    sd = coo.index[0].shape[0]
    if dim >= sd:  # a dense dim of a hybrid tensor: lines inside the values
        if storage.layout is not coo.layout:
            raise NotImplementedError(f"MaskedTensor[{storage.layout.name}]: no lines along "
                                      f"dense dim {dim}; convert with .to_sparse_coo()")
        return DenseLines(storage, dim, dim - sd + 1)
    return SparseLines(storage, coo, dim, None)


def lines_along(storage: Storage, dim: int) -> Lines:
    """The :class:`Lines` of ``storage`` along ``dim`` (non-negative).

    Uses the layout's ``reduction["lines"]`` kernel, else its COO form (O(nnz)).
    """
    builder = storage.layout.kernel("reduction", "lines")
    if builder is not None:
        return builder(storage, dim)
    if not storage.index:
        return dense_lines(storage, dim)
    return sparse_lines(storage, dim)
