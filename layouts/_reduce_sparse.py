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
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from . import _kernels, _native
from ._grouping import (
    _BITS,
    Grouping,
    fill_unspecified,
    identity,
    plain_eager,
    reduce_dense,
    reduced_shape,
)
from ._index import cached, crow_from_rows, linearize, rows_from_crow, sort_key
from .registry import Storage, get_layout

_SLOTS_PER_NNZ = 4  # bincount grouping while the kept key space is <= 4 * nnz + 4096
_FEW = 4096  # line sums by segment_reduce below this many stored elements
_FUSED = ("sum", "sumsq", "prod", "amax", "amin", "count")  # ops of ``_fused``


class SparseSums(Grouping):
    """The torch-op sums of a sparse grouping in double (Note [Sparse sums in double]),
    and the deviation passes through :meth:`_fused_dev` where a kernel serves them."""

    # Note [Sparse sums in double]
    # The native kernels accumulate every float sum in double. The torch ops that stand in
    # for them on other devices (``index_add`` / ``segment_reduce``) add float32 values one
    # after the other in float32, which drifts from the exact sum by many ulps on long
    # groups (3000 values near 3000: 2e-6 relative). So the sparse groupings' torch-op sums
    # (and sums of squares, and the squared deviations of a variance) of float32 values run
    # in float64 and round once: the same value class on every device, for one cast pass.
    # Dense (strided) sums keep torch's own accumulation, which is pairwise already.
    def _torch_reduce(self, values: torch.Tensor, mask: torch.Tensor, op: str) -> torch.Tensor:
        if op in ("sum", "sumsq") and values.dtype == torch.float32:
            return super()._torch_reduce(values.double(), mask, op).float()
        return super()._torch_reduce(values, mask, op)

    def masked_sqdev(self, values: torch.Tensor, mask: torch.Tensor,
                     center: torch.Tensor) -> torch.Tensor:
        out = self._fused_dev("sqdev", values, mask, center)
        if out is not None:
            return out
        if values.dtype == torch.float32:  # Note [Sparse sums in double]
            return super().masked_sqdev(values.double(), mask, center.double()).float()
        return super().masked_sqdev(values, mask, center)

    def masked_sumexp(self, values: torch.Tensor, mask: torch.Tensor,
                      center: torch.Tensor) -> torch.Tensor:
        out = self._fused_dev("sumexp", values, mask, center)
        return out if out is not None else super().masked_sumexp(values, mask, center)

    def _fused_dev(self, dev: str, values: torch.Tensor, mask: torch.Tensor,
                   center: torch.Tensor) -> torch.Tensor | None:
        """``masked_sqdev`` (``dev`` "sqdev") or ``masked_sumexp`` ("sumexp") in one native
        pass, or None: the torch ops run."""
        return None


class CooGrouping(SparseSums):
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
        if owner is None or not _kernels.eager(storage.values):
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
            if row_major and kept == list(range(len(kept))):  # sorted by the leading dims
                uniq, facts["_gid"] = torch.unique_consecutive(keys, return_inverse=True)
            elif space <= _SLOTS_PER_NNZ * nnz + 4096:
                # Note [Reducing into key slots]
                if plain_eager(keys):  # a count: faster than a bool index_put
                    present = torch.bincount(keys, minlength=space) > 0
                else:  # compiled: an output size that does not depend on the data
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
        counts = self._fused("count", mask, mask)
        if counts is not None:
            return counts
        small = mask.shape[0] < 2**31  # int32 counts cannot overflow
        return self.reduce(mask.to(torch.int32 if small else torch.long), "sum").long()

    def _native_reduce(self, op: str, values: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor | None:
        return self._fused(op, values, mask)

    def _fused(self, op: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """Per group, ``masked_reduce(values, mask, op)`` or the count of ``mask``
        (``op="count"``) in one pass over the stored elements: the native kernels (Note
        [Native reductions]); None where they do not apply (dense dims, other dtypes or
        devices, no library): the torch-op implementation."""
        if (op not in _FUSED or self.value_dims
                or not self.sparse_dims or (self.single and not mask.shape[0])):
            return None
        if self.single:
            return _native.count_all(mask) if op == "count" else \
                _native.reduce_all(values, mask, op)
        narrowed = self._group_ids(values)
        if narrowed is not None:  # group ids: the kernels write the groups themselves
            out = _native.count_scatter(mask, narrowed, self.ngroups) if op == "count" else \
                _native.scatter(values, mask, op, narrowed, self.ngroups)
            if out is not None:
                return out
        present = self._present is not None
        n = self._present.numel() if present else self.ngroups
        index = self._keys if present else self.gid
        if op == "count":
            out = _native.count_scatter(mask, index, n)
        else:
            out = _native.scatter(values, mask, op, index, n)
        if out is None or not present or self._uniq.shape[0] == n:  # every slot a group
            return out
        return out.index_select(0, self._uniq)

    def _group_ids(self, values: torch.Tensor) -> torch.Tensor | None:
        """The cached narrowed group id of every stored element (:meth:`_narrowed`), or None
        (no owner to cache it on, a transform, no native kernels)."""
        if self._owner is None or not _kernels.eager(values):
            return None
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

    def _native_moments(self, values: torch.Tensor, mask: torch.Tensor,
                       correction: float | None) -> tuple | None:
        """``masked_mean`` (``correction`` None) or ``masked_var`` in one native call
        (``_native.moments``, over the group ids with the counts cached per mask; the line
        grouping's: along its lines), or None (:meth:`_one_call`)."""
        def per_group(index: torch.Tensor) -> tuple | None:
            counts = self._count(mask)
            if counts.shape != (self.ngroups,):
                return None
            return _native.moments(values, mask, correction, index=index, counts=counts)

        return self._one_call(values, mask, lambda: _native.moments(values, mask, correction),
                              per_group)

    def _native_logsumexp(self, values: torch.Tensor, mask: torch.Tensor,
                         specified: torch.Tensor) -> torch.Tensor | None:
        """``masked_logsumexp`` in one native call (``_native.logsumexp_all`` /
        ``logsumexp_scatter``; the line grouping's: ``logsumexp_lines``), or None
        (:meth:`_one_call`)."""
        return self._one_call(
            values, mask, lambda: _native.logsumexp_all(values, mask),
            lambda index: _native.logsumexp_scatter(values, mask, index, specified,
                                                    self.ngroups))

    def _native_softmax(self, values: torch.Tensor, mask: torch.Tensor,
                       log: bool) -> torch.Tensor | None:
        """``softmax`` in one native call: of a single group, over the group ids (the
        line grouping's: along its lines), or None (:meth:`_one_call`)."""
        return self._one_call(
            values, mask, lambda: _native.softmax(values, mask, log),
            lambda index: _native.softmax(values, mask, log, index=index, n=self.ngroups))

    def _fused_dev(self, dev: str, values: torch.Tensor, mask: torch.Tensor,
                   center: torch.Tensor) -> torch.Tensor | None:
        """``masked_sqdev`` (``dev`` "sqdev") or ``masked_sumexp`` ("sumexp") in one native
        pass (``_native.deviations_all`` / ``deviations_scatter``), or None
        (:meth:`_one_call`)."""
        return self._one_call(
            values, mask, lambda: _native.deviations_all(dev, values, mask, center),
            lambda index: _native.deviations_scatter(dev, values, mask, center, index,
                                                     self.ngroups))

    def _one_call(self, values: torch.Tensor, mask: torch.Tensor, whole: Callable[[], Any],
                  per_group: Callable[[torch.Tensor], Any] | None) -> Any:
        """A native kernel's result for this grouping: ``whole()`` for a single group,
        ``per_group(ids)`` over the group ids (their narrowed copy where one exists: Note
        [Narrow group indices]); None where no kernel applies (dense dims, an empty single
        group, several groups without ``per_group``, other dtypes or devices): the
        family's torch-op implementation runs."""
        if self.value_dims or not self.sparse_dims or (self.single and not mask.shape[0]):
            return None
        if self.single:
            return whole()
        if per_group is None or not _native._applies(values, mask):
            return None
        narrowed = self._group_ids(values)
        return per_group(narrowed if narrowed is not None else self.gid)

    def kernel_groups(self, values: torch.Tensor) -> tuple | None:
        if self.value_dims or not self.sparse_dims or values.dim() != 1:
            return None
        if self.single:
            return None, None, None, 1
        return None if self.gid is None else (None, None, self.gid, self.ngroups)

    def _native_backward(self, op: str, mask: torch.Tensor, a: torch.Tensor,
                         **operands: Any) -> torch.Tensor | None:
        """One native pass per element over the group ids (their narrowed copy where one
        exists), or one line of every element for a single group; None where no kernel
        applies (dense dims, an empty single group)."""
        if self.value_dims or not self.sparse_dims or not mask.shape[0]:
            return None
        if self.single:
            offsets = torch.tensor([0, mask.shape[0]])
            return _native.backward(op, mask, a, offsets=offsets, **operands)
        ids = self._group_ids(a)
        if ids is None:
            ids = self.gid  # the slot groupings build their group ids
        if ids is None:
            return None
        return _native.backward(op, mask, a, index=ids, n=self.ngroups, **operands)

    def _native_arg(self, values: torch.Tensor, mask: torch.Tensor,
                    op: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        if (self.value_dims or not self.sparse_dims or not mask.shape[0]
                or not _native.arg_applies(values, mask, op)):  # dtype, device, 1-D
            return None
        return self._fused_arg(values, mask, op)

    def _fused_arg(self, values: torch.Tensor, mask: torch.Tensor,
                   op: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``masked_arg_extreme`` by the native kernels (Note [Native arg-extremes]): one
        line of every element for a single group, else a scatter pass over the group ids;
        None where they do not apply. Called by :meth:`_native_arg` only, once
        ``arg_applies`` holds (the kernels check the positions and groups alone)."""
        if self.single:
            offsets = torch.tensor([0, mask.shape[0]])
            return _native.arg_lines(values, mask, op, offsets, None, self.positions(), True)
        ids = self._group_ids(values)
        if ids is None:
            ids = self.gid  # the slot groupings build their group ids
        return _native.arg_scatter(values, mask, op, ids, self.ngroups, self.positions(), True)

    # -- primitives --------------------------------------------------------------------
    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        v = values
        if v.dtype == torch.bool and op in ("sum", "any") and not self.value_dims:
            return self._count(v) if op == "sum" else self._specified(v)
        if op == "sum" and v.dtype == torch.bool:
            v = v.long()
        if self.value_dims:
            v = reduce_dense(v, self.value_dims, True, op)
        if self.single:
            v = reduce_dense(v, (0,), True, op) if v.shape[0] else v
        elif self._present is not None:
            slots = self._scatter(v, op, self._keys, self._present.numel())
            v = slots.index_select(0, self._uniq)
        elif self.gid is not None:
            v = self._scatter(v, op, self.gid, self.ngroups)
        if self.value_dims and not self.keepdim:
            v = v.squeeze(self.value_dims)
        return v

    def _scatter(self, v: torch.Tensor, op: str, index: torch.Tensor, n: int) -> torch.Tensor:
        shape = (n,) + tuple(v.shape[1:])
        if op == "sum":
            return v.new_zeros(shape).index_add(0, index, v)
        if op in ("any", "all"):  # counting is faster than a bool scatter
            hits = (v if op == "any" else ~v.bool()).to(torch.int32)
            counts = torch.zeros(shape, dtype=torch.int32, device=v.device).index_add_(
                0, index, hits)
            return counts > 0 if op == "any" else counts == 0
        index = index.view((-1,) + (1,) * (v.dim() - 1)).expand_as(v)
        if op in ("amax", "amin", "prod") and plain_eager(v):
            # Every slot has an element: starting from the identity gives the same result,
            # and include_self=True saves the initialization pass of False.
            init = 1 if op == "prod" else identity(op, v.dtype)
            return v.new_full(shape, init).scatter_reduce_(0, index, v, op)
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
        return linearize(coords, [shape[d] for d in self.dims])

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
    runs over the line pointers (Note [Reducing along lines]): no per-element index is
    built. Other reductions group the (row, col) coordinates. The result is of the input's
    layout when it is 2-D (``keepdim=True``), else COO / strided. ``index`` overrides the
    storage's ``(ptr, idx)`` (a row-sorted 2-D COO storage reduced along its rows; ``idx``
    None: its index's second row).
    """

    _SEGMENT_OPS = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}

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
        offsets, lines, lengths = _lines(ptr)
        out_coords = [lines]
        if self.keepdim:
            zeros = torch.zeros(lines.shape[0], dtype=torch.long, device=ptr.device)
            out_coords = [lines, zeros] if axis == 0 else [zeros, lines]
        return {"out_shape": reduced_shape(self.source.shape, self.dims, self.keepdim),
                "sparse_dims": self.dims, "value_dims": (), "_dense_keepdim": torch.Size(),
                "out_sparse_dim": 2 if self.keepdim else 1, "single": False, "_gid": None,
                "offsets": offsets, "lines": lines, "lengths": lengths,
                "ngroups": lines.shape[0], "out_coords": out_coords,
                "_out_index": _index_of(out_coords, lines.shape[0], ptr.device),
                # every line is a group (no empty line): the kernels need no line list
                "_which": None if lines.shape[0] == offsets.shape[0] - 1 else lines}

    # Note [Reducing along lines]
    # Along the lines, a float sum is torch's own CSR ``sum(1)`` over the values (no
    # autograd needed; its output holds exactly the non-empty lines, in order), faster
    # than ``segment_reduce``, which serves the other ops and autograd. Masks are
    # counted the same way, as uint8 (torch sums it into int64: exact, no float pass, and
    # faster than an int32 ``cumsum`` read at the pointers). Below ``_FEW`` stored
    # elements, building the torch CSR tensor costs more than the sum itself: one
    # ``segment_reduce`` does both (masks as float32 0/1, exact below 2**24).

    def _fused(self, op: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        if not self.by_lines or op not in _FUSED:
            return super()._fused(op, values, mask)
        if op == "count":
            return _native.count_lines(mask, self.offsets, self._which)
        return _native.lines(values, mask, op, self.offsets, self._which)

    def kernel_groups(self, values: torch.Tensor) -> tuple | None:
        if not self.by_lines:
            return super().kernel_groups(values)
        return self.offsets, self._which, None, self.ngroups

    def _fused_dev(self, dev: str, values: torch.Tensor, mask: torch.Tensor,
                   center: torch.Tensor) -> torch.Tensor | None:
        if not self.by_lines:
            return super()._fused_dev(dev, values, mask, center)
        return _native.deviations_lines(dev, values, mask, center, self.offsets, self._which)

    def _native_moments(self, values: torch.Tensor, mask: torch.Tensor,
                       correction: float | None) -> tuple | None:
        if not self.by_lines:
            return super()._native_moments(values, mask, correction)
        return _native.moments(values, mask, correction, self.offsets, self._which)

    def _native_logsumexp(self, values: torch.Tensor, mask: torch.Tensor,
                         specified: torch.Tensor) -> torch.Tensor | None:
        if not self.by_lines:
            return super()._native_logsumexp(values, mask, specified)
        return _native.logsumexp_lines(values, mask, self.offsets, self._which)

    def _native_softmax(self, values: torch.Tensor, mask: torch.Tensor,
                       log: bool) -> torch.Tensor | None:
        if not self.by_lines:
            return super()._native_softmax(values, mask, log)
        return _native.softmax(values, mask, log, self.offsets, self._which)

    def _native_backward(self, op: str, mask: torch.Tensor, a: torch.Tensor,
                         **operands: Any) -> torch.Tensor | None:
        if not self.by_lines:
            return super()._native_backward(op, mask, a, **operands)
        return _native.backward(op, mask, a, offsets=self.offsets, which=self._which,
                                **operands)

    def _fused_arg(self, values: torch.Tensor, mask: torch.Tensor,
                   op: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.by_lines:
            return super()._fused_arg(values, mask, op)
        return _native.arg_lines(values, mask, op, self.offsets, self._which, self.positions(),
                                 True)  # (_native_arg asked arg_applies)

    def _with_gid(self) -> None:
        if self.by_lines and self.gid is None:  # an index fact (the line of each element)
            nnz = self.source.values.shape[0]
            self.gid = cached(self.ptr, ("line of each element", nnz), lambda: (
                torch.repeat_interleave(torch.arange(self.ngroups, device=self.lines.device),
                                        self.lengths, output_size=nnz)))

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        if not self.by_lines:
            return super().reduce(values, op)
        # Note [segment_reduce under torch.func]: torch has no batching rule, forward AD or
        # double backward for segment_reduce; inside a transform the lines take the
        # generic per-element route below (scatter / index_add over the group ids).
        if (values.is_floating_point() and op in self._SEGMENT_OPS
                and not torch._C._are_functorch_transforms_active()):
            if (op == "sum" and values.dim() == 1
                    and not (values.requires_grad and torch.is_grad_enabled())):
                return self._line_sums(values)
            seg = torch.segment_reduce(values, self._SEGMENT_OPS[op], offsets=self.offsets)
            return seg if seg.shape[0] == self.ngroups else seg.index_select(0, self.lines)
        if values.dtype == torch.bool and op in ("sum", "any", "all"):
            if op == "any":
                return self._specified(values)
            counts = self._count(values)
            return counts if op == "sum" else counts == self.lengths
        self._with_gid()
        return super().reduce(values, op)

    def _line_sums(self, values: torch.Tensor) -> torch.Tensor:
        """Per non-empty line, the sum of 1-D ``values`` (no autograd): torch's CSR sum, or
        a ``segment_reduce`` for few elements (Note [Reducing along lines])."""
        if values.shape[0] < _FEW:
            floating = values.is_floating_point()
            seg = torch.segment_reduce(values if floating else values.to(torch.float32),
                                       "sum", offsets=self.offsets)
            seg = seg if seg.shape[0] == self.ngroups else seg.index_select(0, self.lines)
            return seg if floating else seg.long()
        lines = torch.sparse_csr_tensor(self.ptr, self.coords[self.dims[0]], values,
                                        (self.ptr.numel() - 1, self.inner),
                                        check_invariants=False)
        # A copy, not the sparse result's values view: a view whose base is a sparse
        # tensor cannot be wrapped by torch.compile (graph breaks re-wrap op outputs).
        return lines.sum(1, keepdim=True).values().clone()

    def _count_pass(self, mask: torch.Tensor) -> torch.Tensor:
        if not self.by_lines:
            return super()._count_pass(mask)
        counts = self._fused("count", mask, mask)
        if counts is None:  # int64 counts (values are 1-D)
            counts = self._line_sums(mask.view(torch.uint8))
        return counts

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if not self.by_lines:
            return super().expand(out)
        if self.keepdim:
            out = out.squeeze(1) if out.dim() > 1 else out
        if torch.compiler.is_compiling():
            return torch.repeat_interleave(out, self.lengths, dim=0,
                                           output_size=self.source.values.shape[0])
        self._with_gid()  # the line of each element, cached per pointer tensor: one gather
        return out.index_select(0, self.gid)

    def positions(self) -> torch.Tensor:
        if not self.by_lines:
            if self.coords[self._axis] is None:
                inner = self.coords[1 - self._axis]
                self.coords[self._axis] = rows_from_crow(self._ptr, inner.numel())
            return super().positions()
        return self.coords[self.dims[0]].long()

    def _element_groups(self) -> tuple[torch.Tensor, int]:
        self._with_gid()
        return super()._element_groups()

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


def masked_arg(storage: Storage, dims: tuple[int, ...], keepdim: bool, op: str,
               with_values: bool, coords: Callable[[Storage, int], list[int]]) -> Storage:
    """The ``reduction`` kernel of ``argmax`` / ``argmin`` (``op`` "amax" / "amin") over
    every dim of a row-major sparse storage (COO, CSR): the first extreme in storage order,
    which is the first in row-major order (NaN first, as the generic kernel) -- the native
    masked extreme, then the first specified element equal to it (``_native.first``), else
    torch's own ``argmax`` of the values filled with the identity; ``coords(storage, i)``
    gives the coordinates of stored element ``i``. ``NotImplemented`` (the generic route)
    along some dims, with ``keepdim``, or when the extreme found is not specified (no
    element specified, or every specified one equal to the identity).

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> s = coo.from_strided(torch.tensor([[1., 5.], [7., 2.]]),
    ...                      torch.tensor([[True, True], [False, True]]))
    >>> masked_arg(s, (0, 1), False, "amax", False, lambda s, i: s.index[0][:, i].tolist()
    ...            ).values.item()
    1
    """
    values, mask = storage.values, storage.mask
    if (with_values or keepdim or len(dims) != len(storage.shape) or values.dim() != 1
            or values.numel() == 0 or values.dtype not in _BITS or _kernels.traced(values)):
        return NotImplemented
    if values.requires_grad:
        values = values.detach()  # an index: nothing to differentiate
    top = _native.reduce_all(values, mask, op)  # (not None: the kernels read both, first too)
    at = None if top is None else _native.first(values, mask, top, True)
    if at is None:  # without native kernels: torch's arg-extreme of the filled values
        filled = fill_unspecified(values, mask, identity(op, values.dtype))
        at = int(filled.argmax() if op == "amax" else filled.argmin())
        if not bool(mask[at]):
            return NotImplemented
    elif at < 0:  # no element specified
        return NotImplemented
    key = 0  # the row-major position (``linearize``'s key), of Python ints: one tensor
    for c, n in zip(coords(storage, at), storage.shape):
        key = key * n + c
    # (scalar_tensor: the 0-d tensors torch.tensor(key) and torch.tensor(True) build, without
    # torch.tensor's parsing of a Python object)
    return get_layout("strided").build((), torch.scalar_tensor(key, dtype=torch.long),
                                       torch.scalar_tensor(True, dtype=torch.bool), ())


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
