"""The sparse CSR layout: one (crow, col) pair shared by data and mask; 2-D only.

Invariants
----------
- ``shape`` is 2-D; ``index == (crow, col)`` with ``crow`` of length ``nrows + 1``
  (``crow[0] == 0``, non-decreasing, ``crow[-1] == nnz``) and ``col`` of length ``nnz``,
  sorted and distinct within each row; both int64 or both int32.
- ``values`` and ``mask`` are 1-D of length ``nnz`` (no batch or dense dims).
- A position is specified iff it is stored and its mask value is True.
"""

import dataclasses

from ._compressed import CSR
from .registry import register_layout

#: Ops this layout declines (op -> (reason, fix)); the core builds the error from them.
REFUSES = {
    **dict.fromkeys(("expand", "expand_as", "broadcast_to", "repeat", "tile", "unfold",
                     "gather", "take"), ("no sparse kernel", "use .to_dense() first")),
    "setitem": ("indexing a sparse storage builds new tensors, so a write into them would be "
                "lost", "assign into mt.to_dense() (or build a new masked tensor) instead"),
}

register_layout(dataclasses.replace(CSR.layout("sparse_csr", doc=__doc__ or ""), refuses=REFUSES))
