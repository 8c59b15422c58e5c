"""Index helpers shared by the sparse layouts: linear keys, lookups, coalescing.

All functions are vectorized (no Python loop over elements) and O(nnz log nnz) at worst.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch


def all_true(like: torch.Tensor) -> torch.Tensor:
    """A True mask shaped like ``like``, broadcast from one element (no memory per
    element): a mask for values that are all specified.

    >>> all_true(torch.zeros(2, 3)).shape, all_true(torch.zeros(2, 3)).stride()
    (torch.Size([2, 3]), (0, 0))
    """
    return torch.ones((), dtype=torch.bool, device=like.device).expand(like.shape)


def linearize(coords: torch.Tensor | Sequence[torch.Tensor],
              shape: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """Row-major linear position of each element, from its coordinates along ``shape``.

    ``coords`` is a ``(ndim, nnz)`` index tensor or a sequence of ``ndim`` broadcastable
    coordinate tensors (``device``: the device of the 0-d result of an empty sequence,
    where there is no coordinate to take it from). The one row-major key of the package:
    every sort, lookup and grouping by position goes through it.

    >>> linearize(torch.tensor([[0, 1], [2, 0]]), (2, 4)).tolist()
    [2, 4]
    """
    if len(coords) == 0:  # no dim: every element is at position 0
        if isinstance(coords, torch.Tensor):
            return torch.zeros(coords.shape[1], dtype=torch.long, device=coords.device)
        return torch.zeros((), dtype=torch.long, device=device)
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


def cached(owner: torch.Tensor, tag: object, compute: Callable[[], Any],
           data: torch.Tensor | None = None) -> Any:
    """``compute()``, cached per ``(owner, tag)`` while the ``owner`` tensor lives and its
    version counter is unchanged.

    For facts derived from index tensors: a matrix's expanded rows, row pointers, present
    columns or narrowed group index are computed once, not by every op that needs them.
    Index tensors are not written in place by this package; one written by a user (an
    edited or corrupt index) bumps its version counter, and its facts are computed again
    from what it holds now, never served stale (Note [Narrow group indices]). A fact that
    also reads a ``data`` tensor (a mask: how many specified elements each group has) is
    cached per ``data`` object too, and only while its version counter (and the cached
    tensor's own) is unchanged (Note [Facts of a mask]). Nothing is cached while compiling
    or in inference mode; an inference tensor ``owner`` (it has no version counter) keeps
    its facts unchecked.
    """
    if data is not None and _compiling():
        return compute()
    key = (id(owner), tag) if data is None else (id(owner), tag, id(data))
    try:
        version = owner._version
    except RuntimeError:  # an inference tensor: no version counter
        version = None
    entry = _CACHE.get(key)
    if entry is not None and entry[0]() is owner and entry[2] == version and (
            data is None or (entry[3]() is data and entry[4] == data._version
                             and entry[5] == entry[1]._version)):
        return entry[1]
    out = compute()
    if not (_compiling() or torch.is_inference_mode_enabled()
            or (data is not None and data.is_inference())):
        forget = partial(_forget, key)
        if data is None:
            _CACHE[key] = (weakref.ref(owner, forget), out, version)
        else:
            _CACHE[key] = (weakref.ref(owner, forget), out, version, weakref.ref(data, forget),
                           data._version, out._version)
    return out


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter
        return None


# Note [Facts of a mask]
# A reduction's result mask (which groups hold a specified element) and a mean's counts
# read the mask and the index only. Masks are shared objects: every elementwise result keeps
# its input's mask tensor, so ``(a * w).sum(1)``, ``a.mean(1)``, ``a.amax(1)`` group the
# same mask by the same index; the count is computed once and reused while the mask object
# lives and its version counter -- bumped by every in-place write -- is unchanged (the
# same rule as Note [Known zero fill] in masked_sparse). A mask written behind autograd's
# back (``.data``, numpy views) is not seen: masks are never written that way here.


_CACHE: dict[tuple, tuple] = {}
_compiling = torch.compiler.is_compiling  # (bound once: ``cached`` runs on every reduction)


def _forget(key: tuple, _: object, cache: dict = _CACHE) -> None:
    cache.pop(key, None)  # ``cache`` bound early: the module may be torn down first


def rows_from_crow(crow: torch.Tensor, nnz: int | None = None) -> torch.Tensor:
    """The row of every stored element of a CSR matrix, from its ``crow_indices``
    (cached per ``crow`` object, see :func:`cached`)."""
    def compute() -> torch.Tensor:
        counts = crow[1:] - crow[:-1]
        rows = torch.arange(counts.numel(), device=crow.device, dtype=crow.dtype)
        return torch.repeat_interleave(rows, counts, output_size=nnz)

    return cached(crow, "rows", compute)


def sort_key(keys: torch.Tensor, bound: int) -> torch.Tensor:
    """``keys`` (integers in ``[0, bound)``) in the narrowest signed type that holds them:
    a narrower key is fewer bytes to move and compare in every pass of the sort
    (``python -m benchmarks.bench_order`` times the sorts that use it).

    >>> sort_key(torch.tensor([3, 1]), 20000).dtype
    torch.int16
    """
    if bound <= 1 << 15:
        return keys.to(torch.int16)
    if bound <= 1 << 31:
        return keys.to(torch.int32)
    return keys


def crow_from_rows(rows: torch.Tensor, nrows: int) -> torch.Tensor:
    """``crow_indices`` of a CSR matrix whose (sorted) element rows are ``rows``."""
    return torch._convert_indices_from_coo_to_csr(rows, nrows, out_int32=rows.dtype == torch.int32)
