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
  The kernel families (``layouts.kernels``) then reduce the values over those groups --
  one native pass on CPU, else the raw torch kernel of the device table -- differentiable
  with respect to the values.

Everything is O(nnz) (O(nnz log nnz) when a sort is needed, O(nnz + kept key space) for the
bincount path); nothing is densified, so a 100000 x 100000 matrix with 1000 stored entries
reduces in O(nnz) time. Every group has at least one stored element. When no sparse dim is
left (a full reduction) the result is a strided storage, as ``torch.sparse.sum`` returns a
dense tensor then.

The compressed layouts (CSR, CSC) are grouped from their (row, col) coordinates directly,
over the same values in the same order (no COO copy); layouts without their own
``group`` builder are reduced through their COO form (:func:`group_by`); their
results are COO (or strided for full reductions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from . import _native
from ._fill import plain_eager
from ._grouping import Grouping
from ._index import cached, crow_from_rows, linearize, rows_from_crow, sort_key
from .kernels._groups import column_order, count, line_ids, raw_expand, raw_reduce, reduced_shape
from .kernels._route import eager
from .registry import Storage, get_layout

_SLOTS_PER_NNZ = 4  # bincount grouping while the kept key space is <= 4 * nnz + 4096
_compiling = torch.compiler.is_compiling


class CooGrouping(Grouping):
    """Groups of sparse storage given per-dim coordinates of its stored values.

    ``coords[d]`` is the index of every stored value along sparse dim ``d`` (by default the
    rows of a COO storage's index); ``source`` holds the values and mask (shape
    ``(nnz, *dense)``) in the same order, row-major unless ``row_major=False``. The result
    is a storage of the source's layout when it is COO, else of the registered COO layout.
    """

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool,
                 coords: list[torch.Tensor] | None = None, row_major: bool = True,
                 owner: torch.Tensor | None = None) -> None:
        self.coo = storage.layout if coords is None else get_layout("sparse_coo")
        if coords is None:  # the rows of the index, unbound when a pass reads them
            owner = storage.index[0]
        self._owner = owner
        self.source = storage
        self._coords = coords
        self.dims = dims
        self.keepdim = keepdim
        if owner is None or not eager(storage.values):
            facts = self._index_facts(row_major)
        else:  # Note [Index facts of a grouping]
            facts = cached(owner, ("grouping", dims, keepdim, _key(storage.shape), row_major),
                           partial(self._index_facts, row_major))
        self.__dict__.update(facts)
        self._facts = facts  # (where the narrowed group ids join them: _group_ids)
        if not self.sparse_dims:
            self.out_coords = self.coords

    @property
    def coords(self) -> list[torch.Tensor | None]:
        """Per sparse dim, the coordinate of every stored value (a COO storage's index
        rows, unbound on first use: a cached reduction reads none of them)."""
        if self._coords is None:
            self._coords = list(self.source.index[0].unbind(0))
        return self._coords

    @coords.setter
    def coords(self, value: list[torch.Tensor | None]) -> None:
        self._coords = value

    # Note [Index facts of a grouping]
    # What a grouping knows of its groups (their number, the present key slots, each
    # element's group id, the output's coordinates and index tensor) comes from the index
    # tensors, the dims and the shape alone: built once per index tensor and reused by every
    # eager reduction over it, as ``cached`` facts (a fixed cost less per reduction,
    # as much as the kernel of a small one). They never hold the index tensors themselves
    # or views of them (a cached fact must not keep its owner alive): those are read from
    # the storage per grouping.

    def _index_facts(self, row_major: bool) -> dict[str, Any]:
        """The attributes of this grouping that depend on the index only (see the Note)."""
        shape, dims, coords = self.source.shape, self.dims, self.coords
        nsparse = len(coords)
        nnz = self.source.values.shape[0]
        sparse_dims = tuple(d for d in dims if d < nsparse)
        value_dims = tuple(d - nsparse + 1 for d in dims if d >= nsparse)
        kept = [d for d in range(nsparse) if d not in dims]
        facts: dict[str, Any] = {
            "out_shape": reduced_shape(shape, dims, self.keepdim),
            "sparse_dims": sparse_dims, "value_dims": value_dims,
            # dims of the values tensor (dim 0 enumerates the stored elements)
            "_dense_keepdim": reduced_shape(shape[nsparse:], [d - 1 for d in value_dims], True),
            "out_sparse_dim": nsparse if self.keepdim else len(kept),
            "single": bool(sparse_dims) and not kept,  # one group: all stored values
            # Note [Groups as a record]: every element its own group, one group, scattered
            "kind": "each" if not sparse_dims else "scatter" if kept else "all",
            "_gid": None, "ngroups": nnz, "_present": None, "_out_index": None}
        if not sparse_dims:
            return facts
        device = self.source.values.device
        if not kept:
            facts["ngroups"] = min(nnz, 1)
            rows = []
        else:
            kept_shape = [shape[d] for d in kept]
            keys = linearize([coords[d] for d in kept], kept_shape)
            space = math.prod(kept_shape)
            slots = space <= _SLOTS_PER_NNZ * nnz + 4096
            if _compiling() and not slots:
                raise NotImplementedError(_data_dependent(self.source, dims))
            if row_major and kept == list(range(len(kept))) and not _compiling():
                # sorted by the leading dims: each group is a run of consecutive elements
                uniq, facts["_gid"], counts = torch.unique_consecutive(
                    keys, return_inverse=True, return_counts=True)
                facts["run_offsets"] = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            elif slots:
                # Note [Reducing into key slots]
                if _compiling():  # every slot a group (Note [Lines while tracing])
                    present = torch.ones(space, dtype=torch.bool, device=device)
                    uniq = torch.arange(space, device=device)
                else:
                    if plain_eager(keys):  # a count: faster than a bool index_put
                        present = torch.bincount(keys, minlength=space) > 0
                    else:  # (a transform)
                        present = torch.zeros(space, dtype=torch.bool, device=device)
                        present[keys] = True
                    uniq = present.nonzero().squeeze(1)
                facts.update(_present=present, _kept=kept, _kept_shape=kept_shape)
            else:
                uniq, facts["_gid"] = torch.unique(keys, sorted=True, return_inverse=True)
            facts["ngroups"] = uniq.numel()
            facts["_uniq"] = uniq
            rows = list(torch.unravel_index(uniq, kept_shape)) if len(kept) > 1 else [uniq]
        if self.keepdim:
            zeros = torch.zeros(facts["ngroups"], dtype=torch.long, device=device)
            it = iter(rows)
            rows = [zeros if d in dims else next(it) for d in range(nsparse)]
        facts["out_coords"] = rows
        if facts["out_sparse_dim"]:
            facts["_out_index"] = _index_of(rows, facts["ngroups"], device)
        return facts

    # Note [Reducing into key slots]
    # When the kept key space is small (at most a few slots per stored element, e.g. the
    # columns of a matrix), values reduce straight into one slot per key and the present
    # slots are picked after: one scatter pass, no per-element group id. The group ids
    # (``gid``) are built only when a second pass needs them (``expand``, ``select``).
    # The present slots depend on the index only: they are cached per index tensor
    # (``owner``). A bool ``any`` (a sum's result mask) is a uint8 ``amax`` scatter, about
    # twice as fast as counting, unless the mask was counted already (a mean).
    _present: torch.Tensor | None = None
    _slot_keys: torch.Tensor | None = None

    @property
    def _keys(self) -> torch.Tensor | None:
        """The key slot of every stored element (slot groupings only), built when a pass
        needs it: the kernels read the cached narrowed copy instead (Note [Narrow group
        indices]; for an int32 index the keys are an int64 copy)."""
        if self._slot_keys is None and self._present is not None:
            self._slot_keys = linearize([self.coords[d] for d in self._kept],
                                        self._kept_shape)
        return self._slot_keys
    _out_index: torch.Tensor | None = None  # the output's COO index, when known
    _gid: torch.Tensor | None = None
    #: where each group's run of consecutive elements starts (and the last one ends), when
    #: the groups are such runs (a coalesced index reduced over its trailing sparse dims)
    run_offsets: torch.Tensor | None = None

    @property
    def gid(self) -> torch.Tensor | None:
        """The group of every stored element, or None when each is its own group."""
        if self._gid is None and self._present is not None:
            self._gid = (self._present.cumsum(0) - 1)[self._keys] if self._owner is None \
                else cached(self._owner, ("gid", self.dims, _key(self.source.shape)),
                            lambda: (self._present.cumsum(0) - 1)[self._keys])
        return self._gid

    @gid.setter
    def gid(self, value: torch.Tensor | None) -> None:
        self._gid = value

    _counted: tuple[torch.Tensor, torch.Tensor] | None = None

    def _count(self, mask: torch.Tensor) -> torch.Tensor:
        """Per group, the number of True elements of a bool ``mask`` (int64); computed once
        per mask object, so sum, mean, var and their result masks share one pass."""
        if self._counted is None or self._counted[0] is not mask:
            self._counted = (mask, self._of_mask("count", mask, self._count_pass))
        return self._counted[1]

    def _specified(self, mask: torch.Tensor) -> torch.Tensor:
        """Per group, whether ``mask`` holds a True element (a reduction's result mask): from
        the counts, cached per index and mask object like them (Note [Facts of a mask])."""
        if self._owner is None:
            return self._any_pass(mask)
        return cached(self._owner, ("any", self.dims, _key(self.source.shape)),  # (_of_mask)
                      partial(self._any_pass, mask), data=mask)

    def _any_pass(self, mask: torch.Tensor) -> torch.Tensor:
        return self._count(mask) > 0

    _owner: torch.Tensor | None = None

    def _of_mask(self, what: str, mask: torch.Tensor, compute) -> torch.Tensor:
        """``compute(mask)``, cached per index and mask object (Note [Facts of a mask])."""
        if self._owner is None:
            return compute(mask)
        return cached(self._owner, (what, self.dims, _key(self.source.shape)),
                      partial(compute, mask), data=mask)

    def _count_pass(self, mask: torch.Tensor) -> torch.Tensor:
        return count(self, mask)  # (one native pass on CPU)

    # -- the description the kernel families read (Note [Groups as a record]) -----------
    @property
    def n(self) -> int:
        return self.ngroups

    @property
    def ids(self) -> torch.Tensor | None:
        return self.gid

    def narrowed_ids(self, values: torch.Tensor) -> torch.Tensor | None:
        return self._group_ids(values)

    @property
    def slots(self) -> tuple | None:
        if self._present is None:
            return None
        return self._keys, self._present.numel(), self._uniq

    def count(self, mask: torch.Tensor) -> torch.Tensor:
        return self._count(mask)

    def column_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Note [Column order]: an index fact, cached per index tensor."""
        if self._owner is None or not eager(self.source.values):
            return column_order(self.gid, self.ngroups)
        return cached(self._owner, ("column order", self.dims, _key(self.source.shape)),
                      lambda: column_order(self.gid, self.ngroups))

    def _group_ids(self, values: torch.Tensor) -> torch.Tensor | None:
        """The cached narrowed group id of every stored element (:meth:`_narrowed`), or None
        (no owner to cache it on, a transform, no native kernels)."""
        if self._owner is None or not eager(values) or _native._library() is None:
            return None  # (none kept while the kernels are off: Note [Narrow group indices])
        # Note [Narrow group indices]: kept with the index facts they derive from (cached
        # per owner and version, the same key but keepdim), built on first use
        facts = self.__dict__.get("_facts")
        if facts is None:  # (a line grouping: no scatter facts)
            return cached(self._owner, ("narrow", self.dims, _key(self.source.shape)),
                          self._narrowed)
        narrowed = facts.get("_narrow_ids", _MISSING)
        if narrowed is _MISSING:
            narrowed = facts["_narrow_ids"] = self._narrowed()
        return narrowed

    def _narrowed(self) -> torch.Tensor | None:
        """Every stored element's group id, narrowed (Note [Narrow group indices]): from
        the key slots and their groups in one pass when the groups are slots."""
        if self._present is None:
            return _native.narrow(self.gid, self.ngroups)
        slots = self._present.numel()
        return _native.narrow(self._keys, slots, remap=self._present.cumsum(0) - 1)

    # -- primitives --------------------------------------------------------------------
    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        if values.dtype == torch.bool and op in ("sum", "any") and not self.value_dims:
            return self._count(values) if op == "sum" else self._specified(values)
        return raw_reduce(self, values, op)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        return raw_expand(self, out)

    def positions(self) -> torch.Tensor:
        shape = self.source.shape
        vdim = self.source.values.dim()
        nsparse = len(self.coords)
        if vdim == 1 and len(self.dims) == 1 and self.dims[0] < nsparse:
            # one sparse dim: its coordinates as they are (what linearize returns for one)
            return self.coords[self.dims[0]].long()
        device = self.source.values.device
        coords = []
        for d in self.dims:
            if d < nsparse:
                coords.append(self.coords[d].view((-1,) + (1,) * (vdim - 1)))
            else:
                view = [1] * vdim
                view[d - nsparse + 1] = shape[d]
                coords.append(torch.arange(shape[d], device=device).view(view))
        return linearize(coords, [shape[d] for d in self.dims], device)

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
        inner = math.prod(self._dense_keepdim)
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
        # By value (NaN last, ties by position), then by group with the specified elements
        # first: one stable sort of a narrow (group, tier) key, not one per level.
        order = torch.argsort(ev.detach(), stable=True)
        key = sort_key((eg * 2).add_(~em), 2 * nout).index_select(0, order)
        order = order.index_select(0, torch.argsort(key, stable=True))
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
        coo = self.coo
        if not self.sparse_dims and self.source.layout is coo:
            indices = self.source.index[0]  # the very same index tensor
        else:
            indices = self._out_index
            if indices is None:
                indices = _index_of(self.out_coords, out_values.shape[0], out_values.device)
        return coo.build((indices,), out_values, out_mask, self.out_shape)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.source.with_values(values)


class CompressedGrouping(CooGrouping):
    """A CSR (``axis=0``) or CSC (``axis=1``) storage grouped by its (row, col) coordinates;
    values in their own order.

    A reduction along the lines' inner axis (``dims == (1,)`` for CSR, ``(0,)`` for CSC)
    is of kind ``"lines"`` (Note [Groups as a record]): the line pointers as int64 offsets
    and the non-empty lines, from the pointers alone (cached per pointer tensor); no
    per-element index is built unless a pass needs one. Other reductions group the (row,
    col) coordinates. The result is of the input's layout when it is 2-D
    (``keepdim=True``), else COO / strided. ``index`` overrides the storage's ``(ptr,
    idx)`` (a row-sorted 2-D COO storage reduced along its rows; ``idx`` None: its index's
    second row).
    """

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool,
                 axis: int = 0, index: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        ptr, idx = storage.index if index is None else index
        self.by_lines = dims == (1 - axis,)
        if idx is None and not self.by_lines:  # (a row-sorted COO: its columns)
            idx = storage.index[0][1]
        if not self.by_lines:
            # Every element's outer coordinate (its row, for CSR) is O(nnz) to expand; a
            # reduction over the outer dim groups by the inner one and needs it only for
            # positions (argmax).
            self._ptr, self._axis = ptr, axis
            outer = None if axis in dims else rows_from_crow(ptr, idx.numel())
            coords = [outer, idx] if axis == 0 else [idx, outer]
            super().__init__(storage, dims, keepdim, coords, row_major=axis == 0, owner=idx)
            return
        self.coo = get_layout("sparse_coo")
        self.source = storage
        self.dims = dims
        self.keepdim = keepdim
        self.ptr, self.inner = ptr, storage.shape[1 - axis]
        self._owner = ptr
        # per-element coordinates are built only if needed (``idx`` None: a row-sorted
        # 2-D COO storage, whose ``coords`` reads its index's columns on first use)
        self._coords = None if idx is None else [idx, None] if axis == 1 else [None, idx]
        # Note [Index facts of a grouping]
        self.__dict__.update(cached(ptr, ("line grouping", keepdim, _key(storage.shape), axis),
                                    partial(self._line_facts, ptr, axis)))

    @property
    def coords(self) -> list[torch.Tensor | None]:
        if self._coords is None:  # (only a row-sorted COO storage along its rows: axis 0)
            self._coords = [None, self.source.index[0][1]]
        return self._coords

    @coords.setter
    def coords(self, value: list[torch.Tensor | None]) -> None:
        self._coords = value

    def _line_facts(self, ptr: torch.Tensor, axis: int) -> dict[str, Any]:
        # Note [Lines while tracing]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # Eagerly the groups are the non-empty lines (the output stores no empty line) and
        # the present key slots (Note [Reducing into key slots]); their number depends on
        # the data, and torch.compile would have to guard on it (``Could not guard on
        # data-dependent expression``). While torch.compile traces, every line (every key
        # slot) is a group, an empty one an unspecified element of the output (its mask,
        # whether a specified element is there, is False): the same masked result, of a
        # size known from the shape alone, so a reduction along the lines, a softmax and
        # a broadcast operand's gradient compile in one graph. Only a key space too large
        # to list (a hypersparse COO reduced to its kept coordinates) stays data-dependent:
        # a NotImplementedError naming the way out, which Dynamo turns into a graph break
        # (or, under ``fullgraph=True``, reports).
        offsets, lines, lengths = _all_lines(ptr) if _compiling() else _lines(ptr)
        out_coords = [lines]
        if self.keepdim:
            zeros = torch.zeros(lines.shape[0], dtype=torch.long, device=ptr.device)
            out_coords = [lines, zeros] if axis == 0 else [zeros, lines]
        return {"out_shape": reduced_shape(self.source.shape, self.dims, self.keepdim),
                "sparse_dims": self.dims, "value_dims": (), "_dense_keepdim": torch.Size(),
                "out_sparse_dim": 2 if self.keepdim else 1, "single": False, "_gid": None,
                "kind": "lines", "offsets": offsets, "lines": lines, "lengths": lengths,
                "ngroups": lines.shape[0], "out_coords": out_coords,
                "_out_index": _index_of(out_coords, lines.shape[0], ptr.device),
                # every line is a group (no empty line): the kernels need no line list
                "which": None if lines.shape[0] == offsets.shape[0] - 1 else lines}

    @property
    def gid(self) -> torch.Tensor | None:
        """Along the lines, the line of every element (an index fact, cached per pointer
        tensor); else the grouping's group ids."""
        if not self.by_lines:
            return super().gid
        if self._gid is None:
            nnz = self.source.values.shape[0]

            def make() -> torch.Tensor:
                return line_ids(self.offsets, self.which, nnz)

            self._gid = cached(self.ptr, ("line of each element", nnz), make) \
                if eager(self.source.values) else make()
        return self._gid

    @gid.setter
    def gid(self, value: torch.Tensor | None) -> None:
        self._gid = value

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        if self.by_lines and values.dtype == torch.bool and op in ("sum", "any", "all"):
            if op == "any":
                return self._specified(values)
            counts = self._count(values)
            return counts if op == "sum" else counts == self.lengths
        return super().reduce(values, op)

    def positions(self) -> torch.Tensor:
        if not self.by_lines:
            if self.coords[self._axis] is None:
                inner = self.coords[1 - self._axis]
                self.coords[self._axis] = rows_from_crow(self._ptr, inner.numel())
            return super().positions()
        return self.coords[self.dims[0]].long()

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        out = super().build(out_values, out_mask)
        if self.keepdim and len(self.out_shape) == 2 and self.source.layout is not self.coo:
            return self.source.layout.from_coo(out)
        return out


_MISSING = object()


def _key(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a cache key: a ``torch.Size`` as it is (it hashes and compares as its
    tuple), anything else as a tuple."""
    return shape if type(shape) is torch.Size else tuple(shape)


def _index_of(coords: list[torch.Tensor], n: int, device: torch.device) -> torch.Tensor:
    """A COO index tensor ``(ndim, n)`` from per-dim coordinates (a view for one dim: index
    tensors are never written in place)."""
    if len(coords) == 1:
        return coords[0].long().unsqueeze(0)
    if coords:
        return torch.stack([c.long() for c in coords])
    return torch.zeros((0, n), dtype=torch.long, device=device)


def _lines(ptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offsets, lines, lengths)`` of a pointer tensor: int64 pointers (a copy: a fact
    cached per ``ptr`` must not hold ``ptr`` itself), the non-empty lines and their
    lengths."""
    offsets = ptr.to(torch.long, copy=True)
    counts = offsets.diff()
    nonempty = counts > 0
    return offsets, nonempty.nonzero().squeeze(1), counts[nonempty]


def _data_dependent(storage: Storage, dims: tuple[int, ...]) -> str:
    """Why a traced reduction of ``storage`` over ``dims`` cannot be compiled, and what
    works (Note [Lines while tracing])."""
    return (f"reducing a {storage.layout.name} MaskedTensor of shape {tuple(storage.shape)} "
            f"over dims {dims} inside torch.compile: the kept coordinates are too many to "
            f"list every one, and the number that hold an element depends on the data; "
            f"compile without fullgraph=True (the reduction runs eagerly, one graph break), "
            f"or reduce a matrix along its rows (CSR / COO, dim 1) or columns (CSC, dim 0)")


def _all_lines(ptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offsets, lines, lengths)`` of a pointer tensor with every line listed, the empty
    ones included (Note [Lines while tracing])."""
    offsets = ptr.to(torch.long, copy=True)
    return offsets, torch.arange(offsets.shape[0] - 1, device=ptr.device), offsets.diff()


def coo_grouping(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> Grouping:
    """The COO layout's grouping kernel: a 2-D COO matrix reduced along its rows
    (``dims == (1,)``) is grouped by row pointers, as CSR (its coalesced order is row-major;
    the pointers are cached per index tensor) unless it has many more rows than stored
    elements (pointers are O(rows)); anything else by :class:`CooGrouping`."""
    indices = storage.index[0]
    nnz = indices.shape[1]
    if (dims == (1,) and indices.shape[0] == 2 and storage.values.dim() == 1
            and storage.shape[0] <= _SLOTS_PER_NNZ * nnz + 4096):
        crow = cached(indices, "crow", lambda: crow_from_rows(indices[0], storage.shape[0]))
        # (the columns: the COO index's second row, unbound only when a pass reads them)
        return CompressedGrouping(storage, dims, keepdim, axis=0, index=(crow, None))
    return CooGrouping(storage, dims, keepdim)


class ViaCooGrouping(CooGrouping):
    """Any layout without a grouping kernel, reduced through its COO form (O(nnz))."""

    def __init__(self, storage: Storage, dims: tuple[int, ...], keepdim: bool) -> None:
        self.original = storage
        super().__init__(storage.layout.to_coo(storage), dims, keepdim)

    def restore(self, values: torch.Tensor) -> Storage:
        return self.original.layout.from_coo_like(self.source.with_values(values), self.original)


def group_by(storage: Storage, dims: tuple[int, ...], keepdim: bool) -> Grouping:
    """The :class:`Grouping` of ``storage`` for a reduction over ``dims``.

    Uses the layout's ``group`` builder, else its COO form (O(nnz)).

    >>> import torch, layouts
    >>> s = layouts.get_layout("strided").from_torch(torch.ones(2, 3), torch.ones(2, 3).bool())
    >>> group_by(s, (1,), keepdim=False).reduce(s.values, "sum").tolist()
    [3.0, 3.0]
    """
    builder = storage.layout.group
    if builder is not None:
        return builder(storage, dims, keepdim)
    return ViaCooGrouping(storage, dims, keepdim)
