"""The sparse CSC layout: one (ccol, row) pair shared by data and mask; 2-D only.

Written against the layout protocol only (see :mod:`layouts.registry`): the core has no
line about CSC. It is CSR with the axes swapped -- the same code, :mod:`layouts._compressed`
-- so its reductions along both dims, softmax and shape ops are native, as CSR's are.

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

from ._compressed import CSC
from .registry import register_layout

register_layout(CSC.layout("sparse_csc", doc=__doc__ or ""))
