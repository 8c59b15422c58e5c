"""What the compressed layouts (CSR, CSC, BSR) share, written once.

A compressed matrix stores a grid of ``n_outer`` compressed lines (rows for CSR/BSR,
columns for CSC) with a pointer tensor ``ptr`` of length ``n_outer + 1`` and, per stored
element (or block), its position ``idx`` on the other axis, sorted and distinct within each
line. CSC is CSR with the two axes swapped, so every helper takes the grid size and the
index names instead of knowing the format (scipy's ``_swap`` idea).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ._index import linearize, lookup, rows_from_crow


def line_keys(ptr: torch.Tensor, idx: torch.Tensor, n_inner: int) -> torch.Tensor:
    """Linear keys ``line * n_inner + idx``: strictly increasing for a valid matrix."""
    return rows_from_crow(ptr, idx.numel()).long() * n_inner + idx.long()


def check_plain_2d(t: torch.Tensor, what: str, name: str) -> None:
    """A user's torch tensor of a compressed layout must be 2-D without dense dims."""
    if t.dim() != 2 or t.values().dim() != 1:
        raise ValueError(f"masked_tensor({name}): the {what} must be a 2-D matrix without batch "
                         f"or dense dims, got shape {tuple(t.shape)} with values "
                         f"{tuple(t.values().shape)}; use .to_sparse_coo() for other shapes")


def values_at_mask(data: torch.Tensor, mask: torch.Tensor,
                   pattern: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                   n_inner: int) -> torch.Tensor:
    """The data's values at the mask's stored elements (the mask's pattern is authoritative).

    ``pattern(t)`` returns ``(ptr, idx)`` of a torch tensor; absent elements read as 0.
    """
    ptr, idx = pattern(mask)
    dptr, didx = pattern(data)
    if didx.shape == idx.shape and torch.equal(dptr, ptr) and torch.equal(didx, idx):
        return data.values()
    values, _ = lookup(line_keys(dptr, didx, n_inner), data.values(),
                       line_keys(ptr, idx, n_inner))
    return values


def check_pattern(ptr: torch.Tensor, idx: torch.Tensor, grid: tuple[int, int], full: bool,
                  name: str, names: tuple[str, str], shape: tuple[int, ...],
                  line: str = "row", unit: str = "") -> None:
    """Check a ``(ptr, idx)`` pair over a ``(n_outer, n_inner)`` grid; ValueError if broken.

    ``shape`` (the matrix's) and ``line`` ("row", "column", ...) only word the messages.
    """
    n_outer, n_inner = grid
    if ptr.shape != (n_outer + 1,) or idx.dim() != 1 or ptr.dtype != idx.dtype:
        raise ValueError(f"{name} masked tensor: {names[0]} {tuple(ptr.shape)} {ptr.dtype} / "
                         f"{names[1]} {tuple(idx.shape)} {idx.dtype} do not fit shape "
                         f"{tuple(shape)}{unit}")
    if not full:
        return
    if ptr[0] != 0 or ptr[-1] != idx.numel() or bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError(f"{name} masked tensor: {names[0]} must start at 0, be non-decreasing "
                         f"and end at nnz")
    if idx.numel() and (bool((idx < 0).any()) or bool((idx >= n_inner).any())):
        raise ValueError(f"{name} masked tensor: {names[1]} out of bounds for shape "
                         f"{tuple(shape)}{unit}")
    keys = linearize(torch.stack([rows_from_crow(ptr, idx.numel()).long(), idx.long()]), grid)
    if bool((keys[1:] <= keys[:-1]).any()):
        raise ValueError(f"{name} masked tensor: {names[1]} must be sorted and distinct within "
                         f"each {line}")


def silence_beta_warning(constructor: Callable[..., torch.Tensor],
                         values: torch.Tensor) -> None:
    """Build one empty tensor so torch's once-per-process "beta" warning is spent here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        constructor(torch.tensor([0, 0]), torch.tensor([], dtype=torch.long), values, (1, 1),
                    check_invariants=False)
