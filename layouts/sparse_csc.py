"""The sparse CSC layout: one (ccol, row) pair shared by data and mask; 2-D only.

Written against the layout protocol only (see :mod:`layouts.registry`): the core has no
line about CSC. Every op that is not a pure values op goes through the COO hub.

Invariants
----------
- ``shape`` is 2-D; ``index == (ccol, row)`` with ``ccol`` of length ``ncols + 1``
  (``ccol[0] == 0``, non-decreasing, ``ccol[-1] == nnz``) and ``row`` of length ``nnz``,
  sorted and distinct within each column; both int64 or both int32.
- ``values`` and ``mask`` are 1-D of length ``nnz`` (no batch or dense dims), in
  column-major order.
- A position is specified iff it is stored and its mask value is True.

>>> import torch, layouts
>>> csc = layouts.get_layout(torch.sparse_csc)
>>> s = csc.from_strided(torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[True, False],
...                                                                       [True, True]]))
>>> s.values.tolist()   # column by column
[1.0, 3.0, 4.0]
"""

from __future__ import annotations

import warnings

import torch

from ._index import crow_from_rows, linearize, lookup, rows_from_crow
from .registry import Layout, Storage, register_layout


def _check_2d(t: torch.Tensor, what: str) -> None:
    if t.dim() != 2 or t.values().dim() != 1:
        raise ValueError(f"masked_tensor(sparse_csc): the {what} must be a 2-D CSC matrix "
                         f"without batch or dense dims, got shape {tuple(t.shape)} with values "
                         f"{tuple(t.values().shape)}; use .to_sparse_coo() for other shapes")


def _cols(storage: Storage) -> torch.Tensor:
    ccol, row = storage.index
    return rows_from_crow(ccol, row.numel())


def _keys(ccol: torch.Tensor, row: torch.Tensor, nrows: int) -> torch.Tensor:
    """Column-major linear keys: sorted for a valid CSC matrix."""
    return rows_from_crow(ccol, row.numel()).long() * nrows + row.long()


def _from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    _check_2d(data, "data")
    _check_2d(mask, "mask")
    ccol, row = mask.ccol_indices(), mask.row_indices()
    dccol, drow = data.ccol_indices(), data.row_indices()
    if drow.shape == row.shape and torch.equal(dccol, ccol) and torch.equal(drow, row):
        values = data.values()
    else:
        # The mask's pattern is authoritative: read the data at the mask's indices.
        nrows = mask.shape[0]
        values, _ = lookup(_keys(dccol, drow, nrows), data.values(), _keys(ccol, row, nrows))
    return SPARSE_CSC.build((ccol, row), values, mask.values(), mask.shape)


def _from_strided(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    if data.dim() != 2:
        raise ValueError(f"to_sparse_csc: a CSC masked tensor must be 2-D, got shape "
                         f"{tuple(data.shape)}; use .to_sparse_coo() instead")
    # Column-major positions of the specified elements: nonzero() of the transpose.
    col, row = mask.t().nonzero().unbind(1)
    ccol = crow_from_rows(col, data.shape[1])
    return SPARSE_CSC.build((ccol, row), data[row, col], mask.new_ones(row.shape), data.shape)


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    return out.index_put((storage.index[1], _cols(storage)), values)


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    ccol, row = storage.index
    return torch.sparse_csc_tensor(ccol, row, values, storage.shape, check_invariants=False)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    if dense.dim() == 0:
        return dense
    return dense.expand(storage.shape)[storage.index[1], _cols(storage)]


def _to_coo(storage: Storage) -> Storage:
    from .sparse_coo import SPARSE_COO

    row, col = storage.index[1].long(), _cols(storage).long()
    order = torch.argsort(row * storage.shape[1] + col, stable=True)
    indices = torch.stack([row[order], col[order]])
    return SPARSE_COO.build((indices,), storage.values[order], storage.mask[order],
                            storage.shape)


def _from_coo(storage: Storage) -> Storage:
    (indices,) = storage.index
    if len(storage.shape) != 2 or indices.shape[0] != 2:
        raise ValueError(f"to_sparse_csc: a CSC masked tensor must be 2-D without dense dims, "
                         f"got shape {tuple(storage.shape)} with sparse_dim {indices.shape[0]}; "
                         f"keep it as sparse_coo")
    row, col = indices
    order = torch.argsort(col * storage.shape[0] + row, stable=True)
    ccol = crow_from_rows(col[order], storage.shape[1])
    return SPARSE_CSC.build((ccol, row[order]), storage.values[order], storage.mask[order],
                            storage.shape)


def _validate(storage: Storage, full: bool = False) -> None:
    ccol, row = storage.index
    shape, values, mask = storage.shape, storage.values, storage.mask
    if len(shape) != 2:
        raise ValueError(f"sparse_csc masked tensor must be 2-D, got shape {tuple(shape)}; "
                         f"use sparse_coo for other shapes")
    if ccol.shape != (shape[1] + 1,) or row.dim() != 1 or ccol.dtype != row.dtype:
        raise ValueError(f"sparse_csc masked tensor: ccol {tuple(ccol.shape)} {ccol.dtype} / row "
                         f"{tuple(row.shape)} {row.dtype} do not fit shape {tuple(shape)}")
    if values.shape != row.shape or mask.shape != row.shape:
        raise ValueError(f"sparse_csc masked tensor: values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have shape {tuple(row.shape)}")
    if full:
        if ccol[0] != 0 or ccol[-1] != row.numel() or bool((ccol[1:] < ccol[:-1]).any()):
            raise ValueError("sparse_csc masked tensor: ccol_indices must start at 0, be "
                             "non-decreasing and end at nnz")
        if row.numel() and (bool((row < 0).any()) or bool((row >= shape[0]).any())):
            raise ValueError(f"sparse_csc masked tensor: row_indices out of bounds for "
                             f"{tuple(shape)}")
        keys = linearize(torch.stack([_cols(storage).long(), row.long()]),
                         (shape[1], shape[0]))
        if bool((keys[1:] <= keys[:-1]).any()):
            raise ValueError("sparse_csc masked tensor: row_indices must be sorted and distinct "
                             "within each column")


with warnings.catch_warnings():
    # torch warns once per process that CSC is in beta; say it here, silently, not to users.
    warnings.simplefilter("ignore")
    torch.sparse_csc_tensor(torch.tensor([0, 0]), torch.tensor([], dtype=torch.long),
                            torch.tensor([]), (1, 1), check_invariants=False)

SPARSE_CSC = register_layout(Layout(
    name="sparse_csc",
    torch_layout=torch.sparse_csc,
    index_names=("ccol_indices", "row_indices"),
    from_torch=_from_torch,
    from_strided=_from_strided,
    densify=_densify,
    to_torch=_to_torch,
    gather=_gather,
    to_coo=_to_coo,
    from_coo=_from_coo,
    validate=_validate,
    doc=__doc__ or "",
))
