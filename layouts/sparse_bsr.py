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

from ._compressed import BSR
from .registry import register_layout

register_layout(BSR.layout("sparse_bsr", doc=__doc__ or ""))
