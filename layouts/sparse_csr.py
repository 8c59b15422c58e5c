"""The sparse CSR layout: one (crow, col) pair shared by data and mask; 2-D only.

Invariants
----------
- ``shape`` is 2-D; ``index == (crow, col)`` with ``crow`` of length ``nrows + 1``
  (``crow[0] == 0``, non-decreasing, ``crow[-1] == nnz``) and ``col`` of length ``nnz``,
  sorted and distinct within each row; both int64 or both int32.
- ``values`` and ``mask`` are 1-D of length ``nnz`` (no batch or dense dims).
- A position is specified iff it is stored and its mask value is True.
"""

from __future__ import annotations

import torch

from ._compressed import check_pattern, check_plain_2d, silence_beta_warning, values_at_mask
from ._index import crow_from_rows, rows_from_crow
from ._segment import csr_group as _reduction_group
from ._shape_csr import SHAPE_OPS as _SHAPE_OPS
from .registry import Layout, Storage, register_layout


def _pattern(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.crow_indices(), t.col_indices()


def _from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    check_plain_2d(data, "data", "sparse_csr")
    check_plain_2d(mask, "mask", "sparse_csr")
    values = values_at_mask(data, mask, _pattern, mask.shape[1])
    return SPARSE_CSR.build(_pattern(mask), values, mask.values(), mask.shape)


def _from_strided(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    if data.dim() != 2:
        raise ValueError(f"to_sparse_csr: a CSR masked tensor must be 2-D, got shape "
                         f"{tuple(data.shape)}; use .to_sparse_coo() instead")
    from .sparse_coo import SPARSE_COO

    return _from_coo(SPARSE_COO.from_strided(data, mask))


def _rows(storage: Storage) -> torch.Tensor:
    crow, col = storage.index
    return rows_from_crow(crow, col.numel())


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    return out.index_put((_rows(storage), storage.index[1]), values)


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    crow, col = storage.index
    return torch.sparse_csr_tensor(crow, col, values, storage.shape, check_invariants=False)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    if dense.dim() == 0:
        return dense
    return dense.expand(storage.shape)[_rows(storage), storage.index[1]]


def _to_coo(storage: Storage) -> Storage:
    from .sparse_coo import SPARSE_COO

    indices = torch.stack([_rows(storage).long(), storage.index[1].long()])
    return SPARSE_COO.build((indices,), storage.values, storage.mask, storage.shape)


def _from_coo(storage: Storage) -> Storage:
    (indices,) = storage.index
    if len(storage.shape) != 2 or indices.shape[0] != 2:
        raise ValueError(f"to_sparse_csr: a CSR masked tensor must be 2-D without dense dims, "
                         f"got shape {tuple(storage.shape)} with sparse_dim {indices.shape[0]}; "
                         f"keep it as sparse_coo")
    crow = crow_from_rows(indices[0], storage.shape[0])
    return SPARSE_CSR.build((crow, indices[1]), storage.values, storage.mask, storage.shape)


def _validate(storage: Storage, full: bool = False) -> None:
    crow, col = storage.index
    shape, values, mask = storage.shape, storage.values, storage.mask
    if len(shape) != 2:
        raise ValueError(f"sparse_csr masked tensor must be 2-D, got shape {tuple(shape)}; "
                         f"use sparse_coo for other shapes")
    if values.shape != col.shape or mask.shape != col.shape:
        raise ValueError(f"sparse_csr masked tensor: values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have shape {tuple(col.shape)}")
    check_pattern(crow, col, tuple(shape), full, "sparse_csr", ("crow_indices", "col_indices"),
                  shape)


silence_beta_warning(torch.sparse_csr_tensor, torch.tensor([]))

#: Ops this layout declines (op -> (reason, fix)); the core builds the error from them.
REFUSES = {
    **dict.fromkeys(("expand", "expand_as", "broadcast_to", "repeat", "tile", "unfold",
                     "gather", "take"), ("no sparse kernel", "use .to_dense() first")),
    "setitem": ("indexing a sparse storage builds new tensors, so a write into them would be "
                "lost", "assign into mt.to_dense() (or build a new masked tensor) instead"),
}

SPARSE_CSR = register_layout(Layout(
    name="sparse_csr",
    torch_layout=torch.sparse_csr,
    index_names=("crow_indices", "col_indices"),
    from_torch=_from_torch,
    from_strided=_from_strided,
    densify=_densify,
    to_torch=_to_torch,
    gather=_gather,
    to_coo=_to_coo,
    from_coo=_from_coo,
    validate=_validate,
    group=_reduction_group,
    shape_ops=_SHAPE_OPS,
    refuses=REFUSES,
    doc=__doc__ or "",
))
