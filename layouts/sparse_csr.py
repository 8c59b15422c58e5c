"""The sparse CSR layout: one (crow, col) pair shared by data and mask; 2-D only.

Invariants
----------
- ``shape`` is 2-D; ``index == (crow, col)`` with ``crow`` of length ``nrows + 1``
  (``crow[0] == 0``, non-decreasing, ``crow[-1] == nnz``) and ``col`` of length ``nnz``,
  sorted and distinct within each row; both int64 or both int32.
- ``values`` and ``mask`` are 1-D of length ``nnz`` (no batch or dense dims).
- A position is specified iff it is stored and its mask value is True.
"""

from ._compressed import CSR
from .registry import register_layout

register_layout(CSR.layout("sparse_csr", doc=__doc__ or ""))
