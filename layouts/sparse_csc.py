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

import torch

from ._compressed import check_pattern, check_plain_2d, silence_beta_warning, values_at_mask
from ._index import crow_from_rows, rows_from_crow
from .registry import Layout, Storage, register_layout


def _cols(storage: Storage) -> torch.Tensor:
    ccol, row = storage.index
    return rows_from_crow(ccol, row.numel())


def _pattern(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.ccol_indices(), t.row_indices()


def _from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    check_plain_2d(data, "data", "sparse_csc")
    check_plain_2d(mask, "mask", "sparse_csc")
    values = values_at_mask(data, mask, _pattern, mask.shape[0])
    return SPARSE_CSC.build(_pattern(mask), values, mask.values(), mask.shape)


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
    if values.shape != row.shape or mask.shape != row.shape:
        raise ValueError(f"sparse_csc masked tensor: values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have shape {tuple(row.shape)}")
    check_pattern(ccol, row, (shape[1], shape[0]), full, "sparse_csc",
                  ("ccol_indices", "row_indices"), shape, line="column")


silence_beta_warning(torch.sparse_csc_tensor, torch.tensor([]))

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
