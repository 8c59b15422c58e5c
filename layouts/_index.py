"""Index helpers shared by the sparse layouts: linear keys, lookups, coalescing.

All functions are vectorized (no Python loop over elements) and O(nnz log nnz) at worst.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch


def linearize(coords: torch.Tensor | Sequence[torch.Tensor],
              shape: Sequence[int]) -> torch.Tensor:
    """Row-major linear position of each element, from its coordinates along ``shape``.

    ``coords`` is a ``(ndim, nnz)`` index tensor or a sequence of ``ndim`` broadcastable
    coordinate tensors. The one row-major key of the package: every sort, lookup and
    grouping by position goes through it.

    >>> linearize(torch.tensor([[0, 1], [2, 0]]), (2, 4)).tolist()
    [2, 4]
    """
    if len(coords) == 0:  # no dim: every element is at position 0
        if isinstance(coords, torch.Tensor):
            return torch.zeros(coords.shape[1], dtype=torch.long, device=coords.device)
        return torch.zeros((), dtype=torch.long)
    key = coords[0].long()
    for c, n in zip(coords[1:], shape[1:]):
        key = key * n + c
    return key


def lookup(keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
           fill: float | bool = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``values`` (one row per sorted, unique ``keys``) at ``queries``.

    Returns ``(found_values, found)``; rows whose key is absent read as ``fill``.
    """
    out_shape = (queries.numel(),) + tuple(values.shape[1:])
    if keys.numel() == 0:
        return (torch.full(out_shape, fill, dtype=values.dtype, device=values.device),
                torch.zeros(queries.numel(), dtype=torch.bool, device=queries.device))
    pos = torch.searchsorted(keys, queries).clamp_(max=keys.numel() - 1)
    found = keys[pos] == queries
    picked = values[pos]
    fill_t = torch.full((), fill, dtype=values.dtype, device=values.device)
    shape = (-1,) + (1,) * (values.dim() - 1)
    return torch.where(found.view(shape), picked, fill_t), found


def coalesce_coo(tensor: torch.Tensor) -> torch.Tensor:
    """Coalesce a torch COO tensor (duplicates summed; bool: or-ed); no copy if already so."""
    return tensor if tensor.is_coalesced() else tensor.coalesce()


def rows_from_crow(crow: torch.Tensor, nnz: int | None = None) -> torch.Tensor:
    """The row of every stored element of a CSR matrix, from its ``crow_indices``.

    Cached per ``crow`` object while it lives (index tensors are never written in place):
    a matrix's rows are expanded once, not by every op that needs them.
    """
    entry = _ROWS.get(id(crow))
    if entry is not None and entry[0]() is crow:
        return entry[1]
    counts = crow[1:] - crow[:-1]
    rows = torch.arange(counts.numel(), device=crow.device, dtype=crow.dtype)
    rows = torch.repeat_interleave(rows, counts, output_size=nnz)
    if not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()):
        key = id(crow)
        _ROWS[key] = (weakref.ref(crow, lambda _, key=key: _ROWS.pop(key, None)), rows)
    return rows


_ROWS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def crow_from_rows(rows: torch.Tensor, nrows: int) -> torch.Tensor:
    """``crow_indices`` of a CSR matrix whose (sorted) element rows are ``rows``."""
    return torch._convert_indices_from_coo_to_csr(rows, nrows, out_int32=rows.dtype == torch.int32)
