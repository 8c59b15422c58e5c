"""The size of a storage before it is built, for the built-in layouts.

Used to refuse conversions that cannot fit before they allocate (see Note [Memory rule] in
``masked_sparse/_memory.py``): a strided storage grows with the shape, a compressed one with
its number of lines (the pointer tensor), COO only with the stored elements.

>>> import torch
>>> storage_nbytes("sparse_csr", (2**40, 4), 3, torch.float32)   # the row pointers
8796093022255
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .registry import Layout, get_layout

_INDEX_BYTES = 8
_COMPRESSED_OUTER = {torch.sparse_csr: 0, torch.sparse_bsr: 0, torch.sparse_csc: 1,
                     torch.sparse_bsc: 1}


def storage_nbytes(layout: Layout | torch.layout | str, shape: tuple[int, ...], nnz: int,
                   dtype: torch.dtype, options: dict[str, Any] | None = None) -> int | None:
    """Bytes of values, mask and index tensors of a masked storage of ``layout`` holding
    ``nnz`` stored elements, or None for a layout whose size is not known here.

    The estimate is a lower bound for compressed layouts (int64 indices assumed).
    """
    lay = get_layout(layout)
    item = torch.empty((), dtype=dtype).element_size() + 1  # a value and its mask byte
    if lay.torch_layout is torch.strided:
        return math.prod(shape) * item
    if lay.torch_layout is torch.sparse_coo:
        return nnz * (len(shape) * _INDEX_BYTES + item)
    outer = _COMPRESSED_OUTER.get(lay.torch_layout)
    if outer is None or len(shape) != 2:
        return None
    block = tuple((options or {}).get("blocksize") or (1, 1))
    lines = shape[outer] // max(int(block[outer]), 1)
    return (lines + 1) * _INDEX_BYTES + nnz * (_INDEX_BYTES + item)
