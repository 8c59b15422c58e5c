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
coalesced order itself when ``dim`` is the last sparse dim, CSR's (CSC's) own order along
its rows (columns). Scans and sorts then run as the torch op on padded blocks ``(lines,
width)``, lines bucketed by length in powers of two so padding at most doubles the work
(Note [Padded lines]); ``topk`` takes one ``topk`` of unique keys (Note [Top-k keys]).
Everything is O(nnz) memory, O(nnz log nnz) time, and differentiable with respect to the
values; nothing is densified. Layouts register the builder as ``lines``;
one without it is arranged through its COO form.

>>> import torch, layouts
>>> coo = layouts.get_layout("sparse_coo")
>>> s = coo.from_strided(torch.tensor([[1., 0., 2.], [0., 3., 4.]]),
...                      torch.tensor([[True, False, True], [False, True, True]]))
>>> lines_along(s, 1).scan(s.values, "cumsum")[0].tolist()
[1.0, 3.0, 3.0, 7.0]
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._index import cached, crow_from_rows, linearize, rows_from_crow, sort_key
from .kernels._groups import column_order
from .kernels.cumsum import cumsum_lines
from .registry import Storage, get_layout

SCANS = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")


def stable_order(values: torch.Tensor, mask: torch.Tensor, dim: int,
                 descending: bool, tier: torch.Tensor | None = None) -> torch.Tensor:
    """Indices along ``dim`` putting the ``mask``-ed elements first, in ascending
    (descending) stable order of value, then the others.

    ``tier`` (uint8, default ``~mask``) orders the groups: every tier-0 element, then
    tier 1, ... (padding gets its own last tier)."""
    order = torch.argsort(values.detach(), dim=dim, descending=descending, stable=True)
    tier = (~mask).to(torch.uint8) if tier is None else tier
    return order.gather(dim, torch.argsort(tier.gather(dim, order), dim=dim, stable=True))


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


_MONO_BITS = {torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16}


def _top_order(block: torch.Tensor, tier: torch.Tensor, descending: bool,
               k: int) -> torch.Tensor | None:
    """The first ``min(k, width)`` slots of ``stable_order`` along dim 1, by one ``topk``
    on unique int64 keys (tier, value, slot), or None for dtypes wider than 32 bits.

    Note [Top-k keys]
    ~~~~~~~~~~~~~~~~~
    ``topk`` is not stable, so ties would be picked arbitrarily. Packing (tier: 2 bits,
    the value's order-preserving 32-bit image, the slot: 29 bits) into one int64 makes
    every key distinct and its order exactly the stable sort's: floats map through their
    bits (sign-flipped so that unsigned order is numeric order; -0.0 is +0.0 and every NaN
    one NaN above +inf, as torch sorts), integers by an offset; descending flips the value
    bits only, so NaN leads and the tier and slot order stay.
    """
    width = block.shape[1]
    if width >= 1 << 29 or block.dim() != 2:
        return None
    if block.dtype in _MONO_BITS:
        x = block.float() + 0.0  # -0.0 -> +0.0
        x = torch.where(torch.isnan(x), torch.full((), float("nan")), x)
        bits = x.view(torch.int32).long() & 0xFFFFFFFF
        mono = torch.where(bits >= 1 << 31, 0xFFFFFFFF - bits, bits + (1 << 31))
    elif block.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        mono = block.long() + (1 << 31)
    else:
        return None
    if descending:
        mono = 0xFFFFFFFF - mono
    slot = torch.arange(width, device=block.device)
    key = (tier.long() << 61) | (mono << 29) | slot
    return torch.topk(key, min(k, width), dim=1, largest=False, sorted=True).indices


def _slots(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, slot)`` of ``counts[i]`` consecutive slots in each row ``i``."""
    total = int(counts.sum())
    row = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                  output_size=total)
    return row, torch.arange(total, device=counts.device) - (counts.cumsum(0) - counts)[row]


class SparseLines(Lines):
    """Lines of a sparse storage along a sparse dim, through its COO form.

    ``order`` (None: the identity) lists the stored elements line by line, each line in
    increasing coordinate along ``dim``; ``lengths`` are the line lengths (all >= 1).
    ``coo`` is the COO form of the storage (or a function building it: CSR along its rows
    needs none for a scan), whose values are in the storage's order when ``same_order``.

    Note [Padded lines]
    ~~~~~~~~~~~~~~~~~~~
    torch has no segmented scan or sort, so lines are copied into blocks ``(lines,
    width)`` padded at the end and the torch op runs along dim 1: exact (inf, NaN, ties,
    stability and cummax's last-index rule are torch's own) and the padding never reaches a
    real slot -- it comes after it, and sorts flag it after every stored element. To bound
    the padding, lines are bucketed by ``ceil(log2(length))`` when one block would waste
    more than half of it: each bucket's width is at most twice its shortest line, so the
    blocks hold < 2 nnz slots, at one torch call per bucket. Short rows also sort faster
    than one long array (n log(width) instead of n log(nnz)).

    ``cumsum`` of real floating values is the cumsum family (``layouts.kernels.cumsum``,
    Note [The cumsum family]) over the line pointers ``offsets``: on CPU the native running
    sum per line (torch.cumsum's bits, with or without autograd; its backward, the reverse
    running sum along the same lines, is the same kernel on the flipped lines), elsewhere
    the segmented scan of torch ops (Note [Segmented running sum]: no padding, no line
    reading another, no host sync); while torch.compile traces, the op
    ``masked_sparse::cumsum_lines`` (along a CSR's rows the layout's own pointers, so the
    graph needs no size that depends on the data). A 2-D matrix's lines come from
    pointers kept per index tensor (Note [Lines from pointers]). ``cumsum`` of integers is
    one running sum in int64 with the sum of the previous line subtracted at each line's
    first value (exact: modular arithmetic); complex values pad (torch.cumsum's own bits
    per line).
    """

    def __init__(self, original: Storage, coo: Any, dim: int,
                 offsets: torch.Tensor | None = None, coord: Any = None,
                 indices: Any = None, order: torch.Tensor | None = None,
                 nnz: int | None = None) -> None:
        self.source, self.dim = original, dim
        self._coo, self._indices, self._rank, self._inverse = coo, None, None, None
        self._indices_fn = indices
        self._lengths: torch.Tensor | None = None
        self._starts: torch.Tensor | None = None
        self._offsets = offsets
        self.order: torch.Tensor | None = order
        self._coord = coord
        if offsets is not None:  # given by the layout (Note [Lines from pointers]): no COO
            self.same_order = True
            self.nnz = int(coord.numel()) if nnz is None else nnz
            return
        coo = self.coo
        (indices,) = coo.index
        self.same_order = coo.values is original.values  # CSR's COO keeps the order
        sd = indices.shape[0]
        others = [d for d in range(sd) if d != dim]
        shape = tuple(coo.shape)
        if len(others) == 1:
            key = indices[others[0]]
        elif others:
            key = linearize(indices[others], tuple(shape[d] for d in others))
        else:
            key = torch.zeros(indices.shape[1], dtype=torch.long, device=indices.device)
        if dim != sd - 1:  # unique keys: any sort orders them
            self.order = torch.argsort(sort_key(key * shape[dim] + indices[dim],
                                                math.prod(shape[:sd])))
            indices = indices.index_select(1, self.order)
            key = key.index_select(0, self.order)
        self._indices = indices
        self._coord = indices[dim]
        self._lengths = torch.unique_consecutive(key, return_counts=True)[1]
        self.nnz = int(indices.shape[1])

    @property
    def coord(self) -> torch.Tensor:
        """Each element's coordinate along ``dim`` (line order), built on first use where
        the layout gives it as a function (only cummax / cummin and sorts read it)."""
        if callable(self._coord):
            self._coord = self._coord()
        return self._coord

    @property
    def lengths(self) -> torch.Tensor:
        """The lengths of the non-empty lines, in line order (data-dependent in number)."""
        if self._lengths is None:
            counts = self._offsets.diff()
            self._lengths = counts[counts > 0]
        return self._lengths

    @property
    def starts(self) -> torch.Tensor:
        """Where each non-empty line starts (line order)."""
        if self._starts is None:
            self._starts = self.lengths.cumsum(0) - self.lengths
        return self._starts

    @property
    def offsets(self) -> torch.Tensor:
        """The line pointers (int64, from 0 to ``nnz``; a layout's own may list empty lines
        too): all a running sum per line needs, sized from the index alone, so a compiled
        ``cumsum`` along CSR rows traces without a data-dependent size."""
        if self._offsets is None:
            end = torch.full((1,), self.nnz, dtype=self.starts.dtype, device=self.starts.device)
            self._offsets = torch.cat([self.starts, end])
        return self._offsets

    @property
    def coo(self) -> Storage:
        if callable(self._coo):
            self._coo = self._coo()
        return self._coo

    @property
    def indices(self) -> torch.Tensor:
        """The COO indices in line order."""
        if self._indices is None and self._indices_fn is not None:
            self._indices = self._indices_fn()
        if self._indices is None:
            (indices,) = self.coo.index
            self._indices = indices if self.order is None else indices[:, self.order]
        return self._indices

    @property
    def rank(self) -> torch.Tensor:
        """Each element's slot in its line (line order)."""
        if self._rank is None:
            self._rank = torch.arange(self.nnz, device=self.lengths.device) - \
                torch.repeat_interleave(self.starts, self.lengths, output_size=self.nnz)
        return self._rank

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

    def _in_lines(self, values: torch.Tensor) -> torch.Tensor:
        if not self.same_order:
            values = self.source.layout.to_coo(self.source.with_values(values)).values
        return self.to_lines(values)

    def _restore(self, values: torch.Tensor) -> torch.Tensor:
        """Line-order values of the COO form as values of the original storage."""
        values = self.from_lines(values)
        if self.same_order:
            return values
        return self.source.layout.from_coo_like(self.coo.with_values(values),
                                                self.source).values

    # -- padded blocks (Note [Padded lines]) -------------------------------------------
    def _buckets(self) -> list[torch.Tensor | None]:
        """Line ids of each block (None: every line, in one block)."""
        n = self.lengths.numel()
        width = int(self.lengths.max()) if n else 0
        if n * width <= 2 * self.nnz + 4096:
            return [None]
        bucket = torch.ceil(torch.log2(self.lengths.double())).long()
        return [(bucket == b).nonzero().squeeze(1) for b in torch.unique(bucket).tolist()]

    def _blocks(self) -> list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, int]]:
        """Per block: its elements (line order; None = all), their (row, slot), its width."""
        out = []
        for lines in self._buckets():
            if lines is None:
                lengths, elems, total = self.lengths, None, self.nnz
            else:
                lengths = self.lengths[lines]
                total = int(lengths.sum())
                elems = _ranges(self.starts[lines], lengths, total)
            row = torch.repeat_interleave(torch.arange(lengths.numel(),
                                                       device=lengths.device),
                                          lengths, output_size=total)
            slot = self.rank if elems is None else self.rank[elems]
            out.append((elems, row, slot, int(lengths.max()) if lengths.numel() else 0))
        return out

    @staticmethod
    def _pad(v: torch.Tensor, row: torch.Tensor, slot: torch.Tensor, width: int,
             fill: Any) -> torch.Tensor:
        rows = int(row[-1]) + 1 if row.numel() else 0
        block = v.new_full((rows, width) + tuple(v.shape[1:]), fill)
        return block.index_put_((row, slot), v)  # in place: the block is new

    # -- scans -------------------------------------------------------------------------
    def scan(self, values, op):
        if self.nnz == 0:
            return values, (torch.zeros_like(values, dtype=torch.long)
                            if op in ("cummax", "cummin") else None)
        v = self._in_lines(values)
        out = self._restarting_sum(v) if op == "cumsum" else None
        extra = None
        if out is None:
            out, extra = self._padded_scan(v, op)
        out = self._restore(out)
        if extra is not None:  # element (line order) -> its coordinate along dim
            extra = self._restore(self.coord[extra])
        return out, extra

    def _restarting_sum(self, v: torch.Tensor) -> torch.Tensor | None:
        """The cumsum of each line by one running sum (Note [Padded lines]), or None: for
        real floating values the cumsum family (Note [The cumsum family]: one native pass
        on CPU, torch.cumsum's bits; the segmented scan of torch ops elsewhere)."""
        out = cumsum_lines(v, self.offsets)
        if out is not None:
            return out
        if v.is_complex():
            return None
        wide = v.to(torch.int64)
        if self.lengths.numel() > 1:
            line = torch.repeat_interleave(torch.arange(self.lengths.numel(), device=v.device),
                                           self.lengths, output_size=self.nnz)
            sums = wide.new_zeros((self.lengths.numel(),) + tuple(wide.shape[1:]))
            wide = wide.index_add(0, self.starts[1:], -sums.index_add(0, line, wide)[:-1])
        return wide.cumsum(0).to(v.dtype)

    def _padded_scan(self, v: torch.Tensor, op: str) -> tuple[torch.Tensor,
                                                                torch.Tensor | None]:
        outs, idxs, elems_all = [], [], []
        for elems, row, slot, width in self._blocks():
            part = v if elems is None else v.index_select(0, elems)
            out, idx = _torch_scan(self._pad(part, row, slot, width, 0), op, 1)
            outs.append(out[row, slot])
            if idx is not None:  # slot -> element (line order)
                first = self.starts[row] if elems is None else elems - slot
                idxs.append(idx[row, slot] + first.view((-1,) + (1,) * (v.dim() - 1)))
            elems_all.append(elems)
        if elems_all[0] is None:
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
        device = v.device
        perm = torch.empty(self.nnz, dtype=torch.long, device=device)  # slot -> element
        # topk keeps only the first k slots of each line: their (line, slot), computed once
        kept_slots = None if k is None else _slots(self.lengths.clamp(max=k))
        for (elems, row, slot, width), lines in zip(self._blocks(), self._buckets()):
            part_v = v if elems is None else v.index_select(0, elems)
            part_m = m if elems is None else m.index_select(0, elems)
            block_v = self._pad(part_v.detach(), row, slot, width, 0)
            tier = self._pad((~part_m).to(torch.uint8), row, slot, width, 2)  # padding last
            if k is None:
                order = stable_order(block_v, tier == 0, 1, descending, tier)
                first = self.starts[row] if elems is None else elems - slot
                # the element that lands in each slot
                at = order.view(-1).index_select(0, row * width + slot) + first
                if elems is None:
                    perm = at
                else:
                    perm.index_copy_(0, elems, at)
                continue
            order = _top_order(block_v, tier, descending, k)
            if order is None:
                order = stable_order(block_v, tier == 0, 1, descending, tier)[:, :k]
            if lines is None:
                starts, (row, slot) = self.starts, kept_slots
            else:  # a bucket: its own lines' kept slots
                starts = self.starts[lines]
                row, slot = _slots(self.lengths[lines].clamp(max=k))
            perm[starts[row] + slot] = order[row, slot] + starts[row]
        if kept_slots is None:
            indices = self.indices.clone()
            indices[self.dim] = self.rank
        else:
            row, slot = kept_slots
            kept = self.starts[row] + slot
            perm, indices = perm[kept], self.indices[:, kept]
            indices[self.dim] = slot
        shape = list(self.source.shape)
        shape[self.dim] = shape[self.dim] if k is None else k
        if self.dim != indices.shape[0] - 1:  # back to row-major (coalesced) order
            sparse_shape = tuple(shape[: indices.shape[0]])
            row_major = torch.argsort(sort_key(linearize(indices, sparse_shape),
                                               math.prod(sparse_shape)))
            perm, indices = perm.index_select(0, row_major), indices.index_select(1, row_major)
        coo = get_layout("sparse_coo").build((indices,), v.index_select(0, perm),
                                             m.index_select(0, perm), shape)
        positions = self.coord.index_select(0, perm)
        if self.source.layout is coo.layout:
            return coo, positions
        try:  # the input's layout when it can hold the result (Note [Sorted layout])
            ids = torch.arange(perm.numel(), device=perm.device)
            out = self.source.layout.from_coo_like(coo.with_values(ids), self.source)
        except ValueError:
            return coo, positions
        return (out.with_values(coo.values[out.values], coo.mask[out.values]),
                positions[out.values])


def compressed_lines(storage: Storage, dim: int, axis: int) -> Lines:
    """The ``lines`` kernel of CSR (``axis=0``) and CSC (``axis=1``): along the
    uncompressed dim, the stored lines are the lines, in storage order (no COO copy);
    across them, the lines are the storage's columns (CSR; rows for CSC), in the column
    order kept per index (Note [Lines from pointers])."""
    ptr, idx = storage.index

    def coo() -> Storage:
        return storage.layout.to_coo(storage)

    def pair() -> tuple[torch.Tensor, torch.Tensor]:  # (row, col), storage order
        outer = rows_from_crow(ptr, idx.numel()).long()
        return (outer, idx.long()) if axis == 0 else (idx.long(), outer)

    if dim == 1 - axis:
        return SparseLines(storage, coo, dim, offsets=ptr.long(), coord=idx.long(),
                           indices=lambda: torch.stack(pair()))
    perm, offsets = _column_lines(idx, storage.shape[1 - axis])

    def indices() -> torch.Tensor:
        return torch.stack(pair()).index_select(1, perm)

    return SparseLines(storage, coo, dim, offsets=offsets, order=perm, nnz=idx.numel(),
                       coord=lambda: rows_from_crow(ptr, idx.numel()).long()[perm],
                       indices=indices)


def _column_lines(inner: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)``: the elements line by line across a matrix's stored lines
    (``inner``: each element's coordinate on the other axis, ``n`` lines), cached per index
    tensor.

    Note [Lines from pointers]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    A scan along a 2-D matrix's dim runs over its lines. A CSR's rows (a CSC's columns)
    are its stored lines, with pointers; a row-major COO's rows have the pointers of its
    row index (cached per index); across them, the lines are the columns, in the column
    order of the reductions (Note [Column order]: a stable sort by column keeps each
    column's elements in row order, and the offsets count every column, empty ones
    included). Both come from the index alone, are kept per index tensor, and take no host
    sync: a running sum (the cumsum family) reads nothing else, so a scan along either dim
    of a 2-D matrix runs without one on every device once its index is known.
    """
    return cached(inner, ("column lines", n), lambda: column_order(inner.long(), n))


def dense_lines(storage: Storage, dim: int) -> Lines:
    """The strided layout's ``lines`` kernel."""
    return DenseLines(storage, dim, dim)


def sparse_lines(storage: Storage, dim: int) -> Lines:
    """Lines of any sparse storage through its COO form (COO's kernel, and the fallback of
    a layout without one); a 2-D COO matrix by pointers (Note [Lines from pointers])."""
    coo = storage.layout.to_coo(storage)
    (indices,) = coo.index
    sd = indices.shape[0]
    if sd == 2 and len(coo.shape) == 2 and coo.values.dim() == 1 and coo is storage:
        rows, cols = indices
        if dim == 1:
            crow = cached(indices, "crow", lambda: crow_from_rows(rows, coo.shape[0]))
            return SparseLines(storage, coo, dim, offsets=crow.long(), coord=cols,
                               indices=lambda: indices)
        perm, offsets = _column_lines(cols, coo.shape[1])
        return SparseLines(storage, coo, dim, offsets=offsets, order=perm,
                           nnz=cols.numel(), coord=lambda: rows[perm],
                           indices=lambda: indices.index_select(1, perm))
    if dim >= sd:  # a dense dim of a hybrid tensor: lines inside the values
        if storage.layout is not coo.layout:
            raise NotImplementedError(f"MaskedTensor[{storage.layout.name}]: no lines along "
                                      f"dense dim {dim}; convert with .to_sparse_coo()")
        return DenseLines(storage, dim, dim - sd + 1)
    return SparseLines(storage, coo, dim)


def lines_along(storage: Storage, dim: int) -> Lines:
    """The :class:`Lines` of ``storage`` along ``dim`` (non-negative).

    Uses the layout's ``lines`` kernel, else its COO form (O(nnz)).
    """
    builder = storage.layout.lines
    if builder is not None:
        return builder(storage, dim)
    if not storage.index:
        return dense_lines(storage, dim)
    return sparse_lines(storage, dim)
