"""The compressed formats -- CSR, CSC, BSR (and BSC) -- from one implementation.

The layout modules ``sparse_csr``, ``sparse_csc`` and ``sparse_bsr`` register a
:class:`Layout` built here (:meth:`Compressed.layout`) and document their invariants.

A compressed matrix stores a grid of ``n_outer`` *lines* -- rows for CSR/BSR, columns for
CSC -- with a pointer tensor ``ptr`` of length ``n_outer + 1`` and, per stored element (or
block), its position ``idx`` on the other axis, sorted and distinct within each line. Two
parameters tell the formats apart (a :class:`Compressed` record):

- ``axis``: the compressed axis, 0 for rows (CSR, BSR), 1 for columns (CSC). Every
  primitive works on ``(outer, inner)`` coordinates and swaps them into ``(row, col)``
  with :meth:`Compressed.swap` -- scipy.sparse's ``_swap`` idea: CSC is CSR of the
  transposed matrix, sharing every line of code.
- ``blocked``: the stored units are ``(bs0, bs1)`` blocks (``values`` is
  ``(nnzb, bs0, bs1)``, the blocksize a conversion option, Note [Default blocksize] in
  :mod:`layouts.sparse_bsr`) or single elements (``values`` is ``(nnz,)``).

BSC is ``Compressed(axis=1, blocked=True)`` and comes for free; it is not registered (a
user-visible addition outside this change: ``to_sparse_bsc`` still says it has no layout).

>>> import torch, layouts
>>> bsr = layouts.get_layout(torch.sparse_bsr)
>>> s = bsr.from_strided(torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[True, False],
...                                                                       [True, True]]))
>>> b = bsr.from_coo(layouts.convert(s, "sparse_coo"), blocksize=(1, 2))
>>> b.values.shape, b.index[1].tolist()
(torch.Size([2, 1, 2]), [0, 0])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ._index import crow_from_rows, linearize, lookup, rows_from_crow
from ._linalg import compressed_mask_any, compressed_mm
from ._lines import compressed_lines
from ._reduce_sparse import CompressedGrouping
from ._shape_compressed import shape_ops
from ._validate import first_unsorted_in_lines
from .kernels.arg_extreme import masked_arg
from .registry import Layout, Storage, get_layout, takes_layout


@dataclass(frozen=True)
class Compressed:
    """One compressed format: its compressed axis and whether it stores blocks."""

    axis: int
    blocked: bool
    torch_layout: torch.layout
    index_names: tuple[str, str]
    short: str  # "CSR", for messages

    def swap(self, pair: tuple[Any, Any]) -> tuple[Any, Any]:
        """``(outer, inner)`` <-> ``(row, col)``: the identity for row-compressed formats."""
        return pair if self.axis == 0 else (pair[1], pair[0])

    @property
    def line(self) -> str:
        return ("block " if self.blocked else "") + ("row" if self.axis == 0 else "column")

    # -- geometry ------------------------------------------------------------------------
    def blocksize(self, storage: Storage) -> tuple[int, int]:
        return tuple(storage.values.shape[1:3]) if self.blocked else (1, 1)  # type: ignore

    def grid(self, shape: tuple[int, ...], blocksize: tuple[int, int]) -> tuple[int, int]:
        """``(n_outer, n_inner)``: the number of lines and of units per line."""
        return self.swap((shape[0] // blocksize[0], shape[1] // blocksize[1]))

    def elements(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of every stored element, broadcastable to the values' shape."""
        ptr, idx = storage.index
        outer = rows_from_crow(ptr, idx.numel()).long()
        row, col = self.swap((outer, idx.long()))
        if not self.blocked:
            return row, col
        bs0, bs1 = self.blocksize(storage)
        r = row[:, None, None] * bs0 + torch.arange(bs0, device=row.device)[None, :, None]
        c = col[:, None, None] * bs1 + torch.arange(bs1, device=col.device)[None, None, :]
        return r, c

    # -- the layout primitives -----------------------------------------------------------
    def check_2d(self, shape: tuple[int, ...], layout: Layout) -> None:
        if len(shape) != 2:
            raise ValueError(f"to_{layout.name}: a {self.short} masked tensor must be 2-D, got "
                             f"shape {tuple(shape)}; use .to_sparse_coo() instead")

    @torch.compiler.disable  # Note [Torch sparse tensors stay outside graphs]
    def from_torch(self, layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
        ndim = 3 if self.blocked else 1
        for t, what in ((data, "data"), (mask, "mask")):
            if t.dim() != 2 or t.values().dim() != ndim:
                raise ValueError(f"masked_tensor({layout.name}): the {what} must be a 2-D "
                                 f"matrix without batch or dense dims, got shape "
                                 f"{tuple(t.shape)} with values {tuple(t.values().shape)}; use "
                                 f".to_sparse_coo() for other shapes")
        pattern = _pattern(mask)
        # (detached unless differentiated: a view of a torch sparse tensor, which Dynamo
        # cannot wrap -- Note [Torch sparse tensors stay outside graphs])
        mvals = mask.values().detach()
        dvals = data.values() if data.requires_grad else data.values().detach()
        dpattern = _pattern(data)
        if (dvals.shape[1:] == mvals.shape[1:] and dpattern[1].shape == pattern[1].shape
                and all(torch.equal(a, b) for a, b in zip(dpattern, pattern))):
            values = dvals
        else:
            # The mask's pattern (and blocksize) is authoritative: read the data, whatever its
            # blocksize, at every element of the mask's units (absent units read as 0).
            like = layout.build(pattern, mvals, mvals, mask.shape)
            r, c = (t.expand(mvals.shape).reshape(-1) for t in self.elements(like))
            dbs = tuple(dvals.shape[1:3]) if self.blocked else (1, 1)
            grid = self.grid(mask.shape, dbs)
            keys = linearize((rows_from_crow(dpattern[0], dpattern[1].numel()), dpattern[1]),
                             grid)
            found, _ = lookup(keys, dvals.reshape(len(dvals), dbs[0] * dbs[1]),
                              linearize(self.swap((r // dbs[0], c // dbs[1])), grid))
            inner = linearize((r % dbs[0], c % dbs[1]), dbs).unsqueeze(1)
            values = found.gather(1, inner).reshape(mvals.shape)
        return layout.build(pattern, values, mvals, mask.shape)

    def from_strided(self, layout: Layout, data: torch.Tensor, mask: torch.Tensor,
                     **options: Any) -> Storage:
        self.check_2d(data.shape, layout)
        if self.blocked:
            return self.from_coo(layout, get_layout("sparse_coo").from_strided(data, mask),
                                 **options)
        # Line-major positions of the specified elements: nonzero() of the (transposed) mask.
        outer, inner = (mask if self.axis == 0 else mask.t()).nonzero().unbind(1)
        ptr = crow_from_rows(outer, self.grid(data.shape, (1, 1))[0])
        return layout.build((ptr, inner), data[self.swap((outer, inner))],
                            mask.new_ones(inner.shape), data.shape)

    def from_coo(self, layout: Layout, coo: Storage, blocksize: Any = None) -> Storage:
        (indices,) = coo.index
        self.check_2d(coo.shape, layout)
        if indices.shape[0] != 2:
            raise ValueError(f"to_{layout.name}: a {self.short} masked tensor has no dense "
                             f"dims, got a COO tensor of shape {tuple(coo.shape)} with "
                             f"sparse_dim {indices.shape[0]}; keep it as sparse_coo")
        bs = self.check_blocksize(blocksize, coo.shape) if self.blocked else (1, 1)
        n_outer, n_inner = self.grid(coo.shape, bs)
        r, c = indices
        if not self.blocked:
            if self.axis == 0:  # the hub's row-major order is CSR's order
                return layout.build((crow_from_rows(r, n_outer), c), coo.values, coo.mask,
                                    coo.shape)
            outer, order = torch.sort(c, stable=True)  # rows stay ascending within a column
            return layout.build((crow_from_rows(outer, n_outer), r[order]), coo.values[order],
                                coo.mask[order], coo.shape)
        units, inverse = torch.unique(linearize(self.swap((r // bs[0], c // bs[1])),
                                                (n_outer, n_inner)),
                                      sorted=True, return_inverse=True)
        at = (inverse, r % bs[0], c % bs[1])
        shape = (units.numel(),) + bs
        values = coo.values.new_zeros(shape).index_put(at, coo.values)
        mask = torch.zeros(shape, dtype=torch.bool, device=r.device).index_put(at, coo.mask)
        return layout.build((crow_from_rows(units // n_inner, n_outer), units % n_inner),
                            values, mask, coo.shape)

    def check_blocksize(self, blocksize: Any, shape: tuple[int, ...]) -> tuple[int, int]:
        if blocksize is None:
            blocksize = (1, 1)  # Note [Default blocksize]
        if isinstance(blocksize, int) or len(blocksize) != 2 or not all(
                isinstance(b, int) and b > 0 for b in blocksize):
            raise TypeError(f"to_sparse_{self.short.lower()}: blocksize must be a pair of "
                            f"positive ints, got {blocksize!r}")
        if shape[0] % blocksize[0] or shape[1] % blocksize[1]:
            raise ValueError(f"to_sparse_{self.short.lower()}: shape {tuple(shape)} is not "
                             f"divisible by blocksize {tuple(blocksize)}")
        return int(blocksize[0]), int(blocksize[1])

    def to_coo(self, storage: Storage) -> Storage:
        r, c = (t.expand(storage.values.shape).reshape(-1) for t in self.elements(storage))
        values, mask = storage.values.reshape(-1), storage.mask.reshape(-1)
        if self.blocked or self.axis != 0:  # not in row-major order yet
            if self.blocked:
                order = torch.argsort(linearize((r, c), storage.shape), stable=True)
            else:  # columns stay ascending within a row
                order = torch.sort(r, stable=True)[1]
            r, c, values, mask = r[order], c[order], values[order], mask[order]
        return get_layout("sparse_coo").build((torch.stack([r, c]),), values, mask,
                                              storage.shape)

    def densify(self, storage: Storage, values: torch.Tensor, fill: Any) -> torch.Tensor:
        out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
        row, col = self.elements(storage)
        if self.blocked or values.dim() != 1:
            return out.index_put((row, col), values)
        # One scatter by the flat position: torch's CPU index_put with two index tensors
        # takes a slower general path (a keepdim reduction densified to be read back,
        # ``python -m benchmarks.bench_training_ops``). Differentiable in ``values``.
        flat = row * storage.shape[1] + col
        return out.view(-1).scatter(0, flat, values).view(storage.shape)

    def to_torch(self, storage: Storage, values: torch.Tensor) -> torch.Tensor:
        # Over a copy of the pointers and aliases of the other members, not the storage's
        # tensors: torch's ``zero_()`` on a compressed tensor zeroes its pointers and
        # resizes its other members in place, which would empty the index that every
        # MaskedTensor of this storage shares. Writes to the elements still show through.
        ptr, idx = storage.index
        return torch.sparse_compressed_tensor(ptr.clone(), idx.detach(), values.view_as(values),
                                              storage.shape, layout=self.torch_layout,
                                              check_invariants=False)

    def gather(self, storage: Storage, dense: torch.Tensor) -> torch.Tensor:
        if dense.dim() == 0:
            return dense
        row, col = self.elements(storage)
        if not self.blocked and dense.dim() <= 2:
            # One value per row or per column (a keepdim reduction read back): one
            # index_select by the coordinate the storage already has.
            dense = dense.reshape((1,) * (2 - dense.dim()) + tuple(dense.shape))
            if dense.shape[1] == 1 and dense.shape[0] == storage.shape[0]:
                return dense[:, 0].index_select(0, row)
            if dense.shape[0] == 1 and dense.shape[1] == storage.shape[1]:
                return dense[0].index_select(0, col)
        # Advanced indexing on the broadcast view: a small operand is never materialized.
        return dense.expand(storage.shape)[row, col]

    def format_options(self, storage: Storage) -> dict[str, Any]:
        return {"blocksize": self.blocksize(storage)}

    def validate(self, storage: Storage, full: bool = False) -> None:
        ptr, idx = storage.index
        shape, values, mask = storage.shape, storage.values, storage.mask
        name = storage.layout.name
        if len(shape) != 2 or values.dim() != (3 if self.blocked else 1):
            raise ValueError(f"{name} masked tensor must be 2-D with "
                             f"{'(nnzb, bs0, bs1)' if self.blocked else '(nnz,)'} values, got "
                             f"shape {tuple(shape)} and values {tuple(values.shape)}; use "
                             f"sparse_coo for other shapes")
        bs = self.blocksize(storage)
        if 0 in bs or shape[0] % bs[0] or shape[1] % bs[1]:
            raise ValueError(f"{name} masked tensor: shape {tuple(shape)} is not divisible by "
                             f"blocksize {bs}")
        expected = (idx.numel(),) + (bs if self.blocked else ())
        if values.shape != expected or mask.shape != expected:
            raise ValueError(f"{name} masked tensor: values {tuple(values.shape)} and mask "
                             f"{tuple(mask.shape)} must have shape {expected}")
        grid = self.grid(shape, bs)
        ptr_name, idx_name = self.index_names
        unit = f" in blocks of {bs}" if self.blocked else ""
        if ptr.shape != (grid[0] + 1,) or idx.dim() != 1 or ptr.dtype != idx.dtype:
            raise ValueError(f"{name} masked tensor: {ptr_name} {tuple(ptr.shape)} {ptr.dtype} "
                             f"/ {idx_name} {tuple(idx.shape)} {idx.dtype} do not fit shape "
                             f"{tuple(shape)}{unit}")
        if not full:
            return
        if ptr[0] != 0 or ptr[-1] != idx.numel() or bool((ptr[1:] < ptr[:-1]).any()):
            raise ValueError(f"{name} masked tensor: {ptr_name} must start at 0, be "
                             f"non-decreasing and end at nnz")
        if idx.numel():
            low, high = torch.aminmax(idx)
            if int(low) < 0 or int(high) >= grid[1]:
                raise ValueError(f"{name} masked tensor: {idx_name} out of bounds for shape "
                                 f"{tuple(shape)}{unit}")
        if first_unsorted_in_lines(ptr, idx) is not None:
            raise ValueError(f"{name} masked tensor: {idx_name} must be sorted and distinct "
                             f"within each {self.line}")

    def reduction_table(self) -> dict[Any, Any]:
        """The ``reduction`` kernels: argmax / argmin over every dim where the storage
        order is row-major (CSR)."""
        aten = torch.ops.aten
        table: dict[Any, Any] = {}
        if self.axis == 0:
            arg = partial(masked_arg, coords=self.coords_of)
            table.update({aten.argmax.default: arg, aten.argmin.default: arg})
        return table

    def coords_of(self, storage: Storage, i: int) -> list[int]:
        """``[row, col]`` of stored element ``i`` (not blocked)."""
        ptr, idx = storage.index
        outer = int(torch.searchsorted(ptr, i, right=True)) - 1
        return list(self.swap((outer, int(idx[i]))))

    def layout(self, name: str, doc: str = "") -> Layout:
        """A :class:`Layout` record of this format (registered by the caller)."""
        fmt = self

        @takes_layout
        def from_torch(layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
            return fmt.from_torch(layout, data, mask)

        if self.blocked:
            @takes_layout
            def from_strided(layout: Layout, data: torch.Tensor, mask: torch.Tensor,
                             blocksize: Any = None) -> Storage:
                return fmt.from_strided(layout, data, mask, blocksize=blocksize)

            @takes_layout
            def from_coo(layout: Layout, coo: Storage, blocksize: Any = None) -> Storage:
                return fmt.from_coo(layout, coo, blocksize)
        else:  # no conversion option: ``to_layout`` refuses a ``blocksize``
            @takes_layout
            def from_strided(layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
                return fmt.from_strided(layout, data, mask)

            @takes_layout
            def from_coo(layout: Layout, coo: Storage) -> Storage:
                return fmt.from_coo(layout, coo)

        # Build one empty tensor so torch's once-per-process "beta" warning is spent here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.sparse_compressed_tensor(
                torch.tensor([0, 0]), torch.zeros(0, dtype=torch.long),
                torch.zeros((0, 1, 1) if self.blocked else 0), (1, 1), layout=self.torch_layout,
                check_invariants=False)
        return Layout(
            name=name, torch_layout=self.torch_layout, index_names=self.index_names,
            from_torch=from_torch, from_strided=from_strided, densify=self.densify,
            to_torch=self.to_torch, gather=self.gather, to_coo=self.to_coo, from_coo=from_coo,
            validate=self.validate, format_options=self.format_options if self.blocked else None,
            group=None if self.blocked else partial(CompressedGrouping, axis=self.axis),
            reduction={} if self.blocked else self.reduction_table(),
            lines=None if self.blocked else partial(compressed_lines, axis=self.axis),
            shape_ops={} if self.blocked else shape_ops(self.axis),
            linalg={} if self.blocked else {
                torch.ops.aten.any.dim: partial(compressed_mask_any, axis=self.axis),
                torch.ops.aten.mm.default: partial(compressed_mm, axis=self.axis)},
            doc=doc)


def _pattern(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ptr, idx)`` of a torch tensor of any compressed layout."""
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices()
    return t.ccol_indices(), t.row_indices()


CSR = Compressed(0, False, torch.sparse_csr, ("crow_indices", "col_indices"), "CSR")
CSC = Compressed(1, False, torch.sparse_csc, ("ccol_indices", "row_indices"), "CSC")
BSR = Compressed(0, True, torch.sparse_bsr, ("crow_indices", "col_indices"), "BSR")
BSC = Compressed(1, True, torch.sparse_bsc, ("ccol_indices", "row_indices"), "BSC")
