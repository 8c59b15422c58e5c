"""Reductions and softmax, per layout: the harness's own cases.

These stand in while ``benchmarks/bench_reductions.py`` is absent. When it is present,
``run.py`` runs it and then those of these cases whose names it does not have (every layout
at the smallest size, with the ``torch.masked`` column, and the CSR cases), so the suite
covers every layout either way.

Cases: full ``sum()``, ``sum(dim=1)``, ``amax(dim=1)``, ``mean(dim=0)`` and
``softmax(dim=1)`` on strided 1000² / 4000² (50% masked) and COO / CSR with nnz 1e3 / 1e6
(1% density, half of the stored entries masked out). Baselines:

- ``floor``: strided, the plain masked dense torch expression with its result mask
  (``torch.where(mask, data, 0).sum(1), mask.any(1)``, ``-inf`` fill for ``amax`` and
  ``softmax``, ``sum / count`` for ``mean``); sparse, the raw op on the values
  (``index_add_`` / ``scatter_reduce_`` over COO rows or columns, ``segment_reduce`` over
  CSR rows);
- ``torch.sparse``: the op on the plain torch sparse tensor, masked-out values zeroed
  beforehand (``torch.sparse.sum``, ``csr.sum(1, keepdim=True)``, ``torch.sparse.softmax``
  with ``-inf``) -- what "≤ 1.5× torch.sparse.sum" is measured against;
- ``torch.masked`` and ``numpy.ma`` (strided) on the same data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

import masked_sparse as ms
from benchmarks.bench_core import _quiet, _torch_masked, sparse_pattern
from benchmarks.harness import Case, sized_cases

TITLE = "Reductions and softmax"
STRIDED_SIZES = (1000, 4000)
SPARSE_NNZ = (10**3, 10**6)
INF = float("inf")


def _np_softmax(a: np.ma.MaskedArray) -> Any:
    e = np.ma.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def strided_cases(n: int, gen: torch.Generator, smallest: bool) -> list[Case]:
    tm_masked, _ = _torch_masked()
    d = torch.randn(n, n, generator=gen)
    m = torch.rand(n, n, generator=gen) < 0.5
    a = ms.masked_tensor(d, m)
    t = _quiet(lambda: tm_masked(d, m))()
    na = np.ma.masked_array(d.numpy(), mask=~m.numpy())
    size = f"strided {n}x{n}"
    speed = {"torch.masked": 0.2} if smallest else {}
    vs_numpy = {"numpy.ma": 0.1}
    vs_floor = {"floor": 1.3} if n == max(STRIDED_SIZES) else {}
    return [
        Case(f"{size} sum()", lambda: a.sum(), {
            "floor": lambda: (torch.where(m, d, 0).sum(), m.any()),
            "torch.masked": _quiet(lambda: t.sum()), "numpy.ma": lambda: na.sum()}, speed),
        Case(f"{size} sum(dim=1)", lambda: a.sum(dim=1), {
            "floor": lambda: (torch.where(m, d, 0).sum(1), m.any(1)),
            "torch.masked": _quiet(lambda: t.sum(dim=1)), "numpy.ma": lambda: na.sum(1)},
            {**vs_floor, **vs_numpy, **speed}),
        Case(f"{size} amax(dim=1)", lambda: a.amax(dim=1), {
            "floor": lambda: (torch.where(m, d, -INF).amax(1), m.any(1)),
            "torch.masked": _quiet(lambda: t.amax(dim=1)), "numpy.ma": lambda: na.max(1)},
            {**vs_numpy, **speed}),
        Case(f"{size} mean(dim=0)", lambda: a.mean(dim=0), {
            "floor": lambda: (torch.where(m, d, 0).sum(0) / m.sum(0), m.any(0)),
            "torch.masked": _quiet(lambda: t.mean(dim=0)), "numpy.ma": lambda: na.mean(0)},
            {**vs_floor, **vs_numpy, **speed}),
        Case(f"{size} softmax(dim=1)", lambda: torch.softmax(a, 1), {
            "floor": lambda: torch.where(m, d, -INF).softmax(1),
            "torch.masked": _quiet(lambda: torch.softmax(t, 1)),
            "numpy.ma": lambda: _np_softmax(na)}, {**vs_numpy, **speed}),
    ]


def sparse_cases(nnz: int, gen: torch.Generator, smallest: bool) -> list[Case]:
    tm_masked, _ = _torch_masked()
    idx, shape = sparse_pattern(nnz, 0.01, gen)
    n = shape[0]
    v = torch.randn(nnz, generator=gen)
    mv = torch.rand(nnz, generator=gen) < 0.5
    rows, cols = idx[0], idx[1]
    crow = torch._convert_indices_from_coo_to_csr(rows, n)
    zeroed, neg_inf = torch.where(mv, v, 0), torch.where(mv, v, -INF)
    out: list[Case] = []
    for name in ("coo", "csr"):
        if name == "coo":
            def build(values: torch.Tensor) -> torch.Tensor:
                return torch.sparse_coo_tensor(idx, values, shape, is_coalesced=True,
                                               check_invariants=False)

            def row_sum(values: torch.Tensor) -> torch.Tensor:
                return torch.zeros(n).index_add_(0, rows, values)

            def row_max(values: torch.Tensor) -> torch.Tensor:
                return torch.full((n,), -INF).scatter_reduce_(0, rows, values, "amax")

            plain_sum = build(zeroed)
            sparse_sum: Any = lambda p=plain_sum: torch.sparse.sum(p, 1)  # noqa: E731
            plain_inf = build(neg_inf)
            sparse_softmax: Any = lambda p=plain_inf: torch.sparse.softmax(p, 1)  # noqa: E731
        else:
            def build(values: torch.Tensor) -> torch.Tensor:
                return torch.sparse_csr_tensor(crow, cols, values, shape,
                                               check_invariants=False)

            def row_sum(values: torch.Tensor) -> torch.Tensor:
                return torch.segment_reduce(values, "sum", offsets=crow)

            def row_max(values: torch.Tensor) -> torch.Tensor:
                return torch.segment_reduce(values, "max", offsets=crow)

            plain_sum = build(zeroed)
            sparse_sum = lambda p=plain_sum: p.sum(1, keepdim=True)  # noqa: E731
            plain_inf = build(neg_inf)
            sparse_softmax = lambda p=plain_inf: torch.sparse.softmax(p, 1)  # noqa: E731
        a = ms.masked_tensor(build(v), build(mv))
        t = _quiet(lambda a=a: tm_masked(build(v), build(mv)))()
        size = f"{name} nnz=1e{round(math.log10(nnz))}"
        speed = {"torch.masked": 0.2} if smallest else {}
        vs_sparse = {"torch.sparse": 1.5} if nnz == max(SPARSE_NNZ) else {}
        out += [
            Case(f"{size} sum()", lambda a=a: a.sum(), {
                "floor": lambda: (zeroed.sum(), mv.any()),
                "torch.masked": _quiet(lambda t=t: t.sum()),
                "torch.sparse": lambda p=plain_sum: torch.sparse.sum(p)}, speed),
            Case(f"{size} sum(dim=1)", lambda a=a: a.sum(dim=1), {
                "floor": lambda f=row_sum: f(torch.where(mv, v, 0)),
                "torch.masked": _quiet(lambda t=t: t.sum(dim=1)),
                "torch.sparse": sparse_sum}, {**vs_sparse, **speed}),
            Case(f"{size} amax(dim=1)", lambda a=a: a.amax(dim=1), {
                "floor": lambda f=row_max: f(torch.where(mv, v, -INF)),
                "torch.masked": _quiet(lambda t=t: t.amax(dim=1))}, speed),
            Case(f"{size} mean(dim=0)", lambda a=a: a.mean(dim=0), {
                "floor": lambda: (torch.zeros(n).index_add_(0, cols, torch.where(mv, v, 0))
                                  / torch.zeros(n).index_add_(0, cols, mv.float())),
                "torch.masked": _quiet(lambda t=t: t.mean(dim=0))}, speed),
            Case(f"{size} softmax(dim=1)", lambda a=a: torch.softmax(a, 1), {
                "torch.masked": _quiet(lambda t=t: torch.softmax(t, 1)),
                "torch.sparse": sparse_softmax}, speed),
        ]
    return out


def cases(quick: bool = False) -> list[Case]:
    """All cases of this module (``quick`` changes nothing: the harness shortens timing)."""
    return sized_cases(strided_cases, sparse_cases, STRIDED_SIZES, SPARSE_NNZ, seed=1)


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
