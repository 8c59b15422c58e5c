"""Which raw torch kernel reduces the groups on the torch-op path, per op, kind and device.

Note [The device table]
~~~~~~~~~~~~~~~~~~~~~~~
A masked sum, extreme or product of stored values over groups has three raw torch kernels
(the values filled with the op's identity first):

- ``"segment"``: ``torch.segment_reduce`` over segment offsets -- the line pointers along
  the stored lines; across them, over the column order kept per index (the values gathered
  by a permutation sorting them by group, then the group offsets: Note [Column order]);
- ``"index_add"``: ``index_add`` over the group id of every element (sums only);
- ``"scatter"``: ``scatter_reduce`` over the group ids.

Which is fastest depends on the device (atomics on a GPU, threads on a CPU), the op, the
kind of groups (``"lines"``: runs of consecutive elements; ``"scatter"``: anywhere) and the
size. :data:`TABLE` holds the measured winners as data, read by :func:`kernel`; anything
it does not list takes ``"index_add"`` / ``"scatter"`` (every device has them). Integer
and bool values (counts) always take ``index_add`` (``segment_reduce`` is for floats), and
so does everything under a torch.func transform (``segment_reduce`` has no batching rule).

Where the rows come from:

- ``cuda``: ``python -m benchmarks.gpu --device cuda`` (its "Raw kernels over the
  specified values" table, one run on an NVIDIA H200, torch 2.11 + CUDA 13.0, 1M and 10M
  stored entries: sum, mean and amax per dim, CSR and COO). Along the stored lines
  ``index_add`` won sums at 1M entries and ``segment_reduce`` at 10M, by far more: the
  switch is placed between the two sizes. Across them the column order's
  ``segment_reduce`` won every op at both sizes. ``prod`` was not measured: it follows
  ``amax``.
- ``cpu``: the same benchmark with ``--device cpu`` (the torch-op path the CPU takes
  without its native kernels: ``MASKED_SPARSE_NATIVE=0``, or dtypes they lack), one
  thread, 1M entries: ``segment_reduce`` along the lines, the scatters across them (the
  column order's gather costs more than a CPU's scatter).

``python -m benchmarks.gpu`` prints a table of this form for the device it runs on (the
section "Table for layouts/kernels/_device_table.py"), to paste here after a run.

>>> kernel("sum", "scatter", torch.device("cuda"), 1000)
'segment'
>>> kernel("sum", "lines", torch.device("cpu"), 1000)
'segment'
"""

from __future__ import annotations

import torch

#: (op, kind) -> {device type: ((at least this many elements, kernel), ...)}: the last
#: entry whose size the values reach wins (Note [The device table]).
TABLE: dict[tuple[str, str], dict[str, tuple[tuple[int, str], ...]]] = {
    ("sum", "lines"): {"cuda": ((0, "index_add"), (1 << 22, "segment")),
                       "cpu": ((0, "segment"),)},
    ("amax", "lines"): {"cuda": ((0, "segment"),), "cpu": ((0, "segment"),)},
    ("amin", "lines"): {"cuda": ((0, "segment"),), "cpu": ((0, "segment"),)},
    ("prod", "lines"): {"cuda": ((0, "segment"),), "cpu": ((0, "segment"),)},
    ("sum", "scatter"): {"cuda": ((0, "segment"),), "cpu": ((0, "index_add"),)},
    ("amax", "scatter"): {"cuda": ((0, "segment"),), "cpu": ((0, "scatter"),)},
    ("amin", "scatter"): {"cuda": ((0, "segment"),), "cpu": ((0, "scatter"),)},
    ("prod", "scatter"): {"cuda": ((0, "segment"),), "cpu": ((0, "scatter"),)},
}
KERNELS = ("segment", "index_add", "scatter")


def kernel(op: str, kind: str, device: torch.device, size: int) -> str:
    """The raw kernel of ``op`` ("sum", "amax", "amin", "prod") over groups of ``kind``
    ("lines", "scatter") of ``size`` elements on ``device``: :data:`TABLE`'s entry, else
    ``"index_add"`` for sums and ``"scatter"`` for the others."""
    rows = TABLE.get((op, kind), {}).get(device.type)
    if rows is None:
        return "index_add" if op == "sum" else "scatter"
    choice = rows[0][1]
    for at_least, name in rows:
        if size >= at_least:
            choice = name
    return choice
