"""The sparse BSR layout: blocks of a 2-D matrix, one (crow, col) pair of *block* indices
shared by data and mask; the blocksize is chosen at conversion.

Written against the layout protocol only (see :mod:`layouts.registry`): the core has no
line about BSR. The blocksize reaches the layout as a conversion option,
``ms.to_layout(mt, torch.sparse_bsr, blocksize=(2, 3))`` or ``mt.to_sparse_bsr((2, 3))``,
and is read back from the values' shape (``format_options``).

Note [Default blocksize]
~~~~~~~~~~~~~~~~~~~~~~~~
torch's ``to_sparse_bsr(blocksize)`` requires the blocksize, and so does
``mt.to_sparse_bsr``. A conversion that names no blocksize -- ``ms.to_layout(mt,
torch.sparse_bsr)``, or layout-agnostic code that loops over every registered layout --
gets 1 x 1 blocks: always valid for any 2-D shape, exact, and O(nnz). Conversions that
rebuild an existing BSR storage (``drop_unspecified``, reductions through COO) keep its
blocksize through ``format_options``.

Invariants
----------
- ``shape`` is 2-D and divisible by the blocksize ``(bs0, bs1)``; ``index == (crow, col)``
  is a CSR structure over the ``(shape[0] // bs0, shape[1] // bs1)`` grid of blocks
  (``crow[0] == 0``, non-decreasing, ``crow[-1] == nnzb``; ``col`` sorted and distinct
  within each block row); both int64 or both int32.
- ``values`` is ``(nnzb, bs0, bs1)`` and ``mask`` has the same shape (an element mask per
  stored block element, not one per block).
- A position is specified iff its block is stored and its mask value is True; every
  element of a stored block is stored.

>>> import torch, layouts
>>> bsr = layouts.get_layout(torch.sparse_bsr)
>>> coo = layouts.get_layout("sparse_coo").from_strided(torch.eye(4), torch.eye(4).bool())
>>> s = bsr.from_coo(coo, blocksize=(2, 2))
>>> s.values.shape, s.index[1].tolist()
(torch.Size([2, 2, 2]), [0, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._compressed import check_pattern, silence_beta_warning
from ._index import crow_from_rows, lookup, rows_from_crow
from .registry import Layout, Storage, register_layout


def _blocksize(storage: Storage) -> tuple[int, int]:
    return tuple(storage.values.shape[1:3])  # type: ignore[return-value]


def _check_blocksize(blocksize: Any, shape: Sequence[int]) -> tuple[int, int]:
    if blocksize is None:
        blocksize = (1, 1)  # Note [Default blocksize]
    if isinstance(blocksize, int) or len(blocksize) != 2 or not all(
            isinstance(b, int) and b > 0 for b in blocksize):
        raise TypeError(f"to_sparse_bsr: blocksize must be a pair of positive ints, got "
                        f"{blocksize!r}")
    if len(shape) != 2:
        raise ValueError(f"to_sparse_bsr: a BSR masked tensor must be 2-D, got shape "
                         f"{tuple(shape)}; use .to_sparse_coo() instead")
    if shape[0] % blocksize[0] or shape[1] % blocksize[1]:
        raise ValueError(f"to_sparse_bsr: shape {tuple(shape)} is not divisible by blocksize "
                         f"{tuple(blocksize)}")
    return int(blocksize[0]), int(blocksize[1])


def _check_torch(t: torch.Tensor, what: str) -> None:
    if t.dim() != 2 or t.values().dim() != 3:
        raise ValueError(f"masked_tensor(sparse_bsr): the {what} must be a 2-D BSR matrix "
                         f"without batch or dense dims, got shape {tuple(t.shape)} with values "
                         f"{tuple(t.values().shape)}; use .to_sparse_coo() for other shapes")


def _elements(crow: torch.Tensor, col: torch.Tensor,
              blocksize: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of every stored element, shaped ``(nnzb, bs0, 1)`` / ``(nnzb, 1, bs1)``
    (they broadcast to the values' shape)."""
    bs0, bs1 = blocksize
    brow = rows_from_crow(crow, col.numel()).long()
    r = brow[:, None, None] * bs0 + torch.arange(bs0, device=col.device)[None, :, None]
    c = col.long()[:, None, None] * bs1 + torch.arange(bs1, device=col.device)[None, None, :]
    return r, c


def _storage_elements(storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    crow, col = storage.index
    return _elements(crow, col, _blocksize(storage))


def _from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    _check_torch(data, "data")
    _check_torch(mask, "mask")
    crow, col, mvals = mask.crow_indices(), mask.col_indices(), mask.values()
    dcrow, dcol, dvals = data.crow_indices(), data.col_indices(), data.values()
    if (dvals.shape[1:] == mvals.shape[1:] and dcol.shape == col.shape
            and torch.equal(dcrow, crow) and torch.equal(dcol, col)):
        values = dvals
    else:
        # The mask's pattern (and blocksize) is authoritative: read the data, whatever its
        # blocksize, at every element of the mask's blocks (absent blocks read as 0).
        r, c = _elements(crow, col, tuple(mvals.shape[1:]))
        r, c = r.expand(mvals.shape), c.expand(mvals.shape)
        dbs0, dbs1 = dvals.shape[1:]
        nbc = mask.shape[1] // dbs1
        keys = rows_from_crow(dcrow, dcol.numel()).long() * nbc + dcol.long()
        found, _ = lookup(keys, dvals.flatten(1), ((r // dbs0) * nbc + c // dbs1).reshape(-1))
        inner = ((r % dbs0) * dbs1 + c % dbs1).reshape(-1, 1)
        values = found.gather(1, inner).reshape(mvals.shape)
    return SPARSE_BSR.build((crow, col), values, mvals, mask.shape)


def _from_coo(storage: Storage, blocksize: Any = None) -> Storage:
    (indices,) = storage.index
    bs0, bs1 = _check_blocksize(blocksize, storage.shape)
    if indices.shape[0] != 2:
        raise ValueError(f"to_sparse_bsr: a BSR masked tensor has no dense dims, got a COO "
                         f"tensor of shape {tuple(storage.shape)} with sparse_dim "
                         f"{indices.shape[0]}; keep it as sparse_coo")
    nbr, nbc = storage.shape[0] // bs0, storage.shape[1] // bs1
    r, c = indices
    blocks, inverse = torch.unique((r // bs0) * nbc + c // bs1, sorted=True,
                                   return_inverse=True)
    crow = crow_from_rows(blocks // nbc, nbr)
    at = (inverse, r % bs0, c % bs1)
    shape = (blocks.numel(), bs0, bs1)
    values = storage.values.new_zeros(shape).index_put(at, storage.values)
    mask = torch.zeros(shape, dtype=torch.bool, device=indices.device).index_put(at,
                                                                                 storage.mask)
    return SPARSE_BSR.build((crow, blocks % nbc), values, mask, storage.shape)


def _from_strided(data: torch.Tensor, mask: torch.Tensor, blocksize: Any = None) -> Storage:
    from .sparse_coo import SPARSE_COO

    return _from_coo(SPARSE_COO.from_strided(data, mask), blocksize)


def _to_coo(storage: Storage) -> Storage:
    from .sparse_coo import SPARSE_COO

    r, c = _storage_elements(storage)
    r, c = r.expand(storage.values.shape).reshape(-1), c.expand(storage.values.shape).reshape(-1)
    order = torch.argsort(r * storage.shape[1] + c, stable=True)
    return SPARSE_COO.build((torch.stack([r[order], c[order]]),),
                            storage.values.reshape(-1)[order], storage.mask.reshape(-1)[order],
                            storage.shape)


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    r, c = _storage_elements(storage)
    return out.index_put((r, c), values)


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    crow, col = storage.index
    return torch.sparse_bsr_tensor(crow, col, values, storage.shape, check_invariants=False)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    if dense.dim() == 0:
        return dense
    # Advanced indexing on the broadcast view: a small operand is never materialized.
    r, c = _storage_elements(storage)
    return dense.expand(storage.shape)[r, c]


def _format_options(storage: Storage) -> dict[str, Any]:
    return {"blocksize": _blocksize(storage)}


def _validate(storage: Storage, full: bool = False) -> None:
    crow, col = storage.index
    shape, values, mask = storage.shape, storage.values, storage.mask
    if len(shape) != 2 or values.dim() != 3:
        raise ValueError(f"sparse_bsr masked tensor must be 2-D with (nnzb, bs0, bs1) values, "
                         f"got shape {tuple(shape)} and values {tuple(values.shape)}")
    bs0, bs1 = _blocksize(storage)
    if bs0 == 0 or bs1 == 0 or shape[0] % bs0 or shape[1] % bs1:
        raise ValueError(f"sparse_bsr masked tensor: shape {tuple(shape)} is not divisible by "
                         f"blocksize {(bs0, bs1)}")
    if values.shape[0] != col.numel() or mask.shape != values.shape:
        raise ValueError(f"sparse_bsr masked tensor: values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have shape {(col.numel(), bs0, bs1)}")
    check_pattern(crow, col, (shape[0] // bs0, shape[1] // bs1), full, "sparse_bsr",
                  ("crow_indices", "col_indices"), shape, line="block row",
                  unit=f" in blocks of {(bs0, bs1)}")


silence_beta_warning(torch.sparse_bsr_tensor, torch.zeros(0, 1, 1))

SPARSE_BSR = register_layout(Layout(
    name="sparse_bsr",
    torch_layout=torch.sparse_bsr,
    index_names=("crow_indices", "col_indices"),
    from_torch=_from_torch,
    from_strided=_from_strided,
    densify=_densify,
    to_torch=_to_torch,
    gather=_gather,
    to_coo=_to_coo,
    from_coo=_from_coo,
    validate=_validate,
    format_options=_format_options,
    doc=__doc__ or "",
))
