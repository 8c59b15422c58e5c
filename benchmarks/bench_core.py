"""Core cases: a unary op, binary ops, to_tensor(0), get_data() and construction.

Sizes: strided 1000² and 4000² (50% masked); sparse COO and CSR with nnz 1e3, 1e5, 1e6 at
1% density (square matrices, half of the stored entries masked out).

Baselines (ratio = masked_sparse / baseline; below 1 means masked_sparse is faster):

================  =========================================  ============================
case              ``floor`` (strided)                        ``floor`` (COO / CSR)
================  =========================================  ============================
sqrt              ``torch.sqrt(data)``                       ``torch.sqrt(values)``
mt + mt (shared)  ``data_a + data_b``                        ``values_a + values_b``
mt + mt (equal)   ``data_a + data_c`` (mask equal, distinct)  ``values_a + values_c``
mt * dense        ``data * dense``                           ``values * dense[rows, cols]``
to_tensor(0)      ``data.masked_fill(~mask, 0)``             the same + sparse tensor
get_data()        --                                         ``sparse_*_tensor(index, values)``
masked_tensor()   ``data.clone(), mask.clone()``             ``values.clone(), mask.clone()``
as_masked_tensor  --                                         --
================  =========================================  ============================

``torch.masked`` runs the same expression on ``torch.masked.masked_tensor`` operands,
``numpy.ma`` on ``numpy.ma.masked_array`` operands (strided only) and ``torch.sparse`` the
op on the plain torch sparse tensor, without masks (sparse only, where torch has it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

import masked_sparse as ms
from benchmarks.harness import Case, sized_cases

TITLE = "Pointwise ops, conversions and construction"
STRIDED_SIZES = (1000, 4000)
SPARSE_NNZ = (10**3, 10**5, 10**6)
DENSITY = 0.01


def _torch_masked() -> tuple[Any, Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.masked import as_masked_tensor, masked_tensor
    return masked_tensor, as_masked_tensor


def _quiet(fn: Any) -> Any:
    """``fn`` with torch.masked's warnings silenced (they cost time on every call)."""
    import warnings

    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()

    return run


def strided_cases(n: int, gen: torch.Generator, smallest: bool) -> list[Case]:
    """Cases for an ``n × n`` strided masked tensor, half of it masked out."""
    tm_masked, tm_as_masked = _torch_masked()
    data = torch.rand(n, n, generator=gen) + 0.1
    mask = torch.rand(n, n, generator=gen) < 0.5
    dense = torch.rand(n, n, generator=gen)
    a = ms.masked_tensor(data, mask)
    b = a * 0.5                                     # shares a's mask object
    c = ms.masked_tensor(data * 0.25, mask.clone())  # an equal but distinct mask
    da, db, dc = a._storage.values, b._storage.values, c._storage.values
    ta, tb, tc = (_quiet(lambda x=x: tm_masked(x, mask))() for x in (da, db, dc))
    nmask = ~mask.numpy()
    na, nb, nc = (np.ma.masked_array(x.numpy(), mask=nmask) for x in (da, db, dc))
    ndense = dense.numpy()
    size = f"strided {n}x{n}"
    speed = {"torch.masked": 0.2} if smallest else {}
    floor = {"floor": 1.3} if n == max(STRIDED_SIZES) else {}
    return [
        Case(f"{size} sqrt", lambda: torch.sqrt(a), {
            "floor": lambda: torch.sqrt(da), "torch.masked": _quiet(lambda: torch.sqrt(ta)),
            "numpy.ma": lambda: np.ma.sqrt(na)}, {**floor, **speed}),
        Case(f"{size} mt + mt (shared mask)", lambda: a + b, {
            "floor": lambda: da + db, "torch.masked": _quiet(lambda: ta + tb),
            "numpy.ma": lambda: na + nb}, {**floor, **speed}),
        Case(f"{size} mt + mt (equal masks)", lambda: a + c, {
            "floor": lambda: da + dc, "torch.masked": _quiet(lambda: ta + tc),
            "numpy.ma": lambda: na + nc}, speed),
        Case(f"{size} mt * dense", lambda: a * dense, {
            "floor": lambda: da * dense, "torch.masked": _quiet(lambda: ta * dense),
            "numpy.ma": lambda: na * ndense}, {**floor, **speed}),
        Case(f"{size} to_tensor(0)", lambda: a.to_tensor(0), {
            "floor": lambda: da.masked_fill(~mask, 0),
            "torch.masked": _quiet(lambda: ta.to_tensor(0)), "numpy.ma": lambda: na.filled(0)},
            speed),
        Case(f"{size} get_data()", lambda: a.get_data(), {
            "torch.masked": _quiet(lambda: ta.get_data()),
            "numpy.ma": lambda: np.ma.getdata(na)}, speed),
        Case(f"{size} masked_tensor()", lambda: ms.masked_tensor(data, mask), {
            "floor": lambda: (data.clone(), mask.clone()),
            "torch.masked": _quiet(lambda: tm_masked(data, mask)),
            "numpy.ma": lambda: np.ma.masked_array(na.data, mask=nmask, copy=True)}, speed),
        Case(f"{size} as_masked_tensor()", lambda: ms.as_masked_tensor(data, mask), {
            "torch.masked": _quiet(lambda: tm_as_masked(data, mask)),
            "numpy.ma": lambda: np.ma.masked_array(na.data, mask=nmask)}, speed),
    ]


def sparse_pattern(nnz: int, density: float, gen: torch.Generator
                   ) -> tuple[torch.Tensor, tuple[int, int]]:
    """Coalesced ``(2, nnz)`` indices of a random square matrix with ``density``."""
    n = max(1, round(math.sqrt(nnz / density)))
    keys = torch.randint(0, n * n, (int(nnz * 1.2) + 16,), generator=gen).unique()
    keys = keys[torch.randperm(keys.numel(), generator=gen)[:nnz]].sort().values
    return torch.stack([keys // n, keys % n]), (n, n)


def _rows(crow: torch.Tensor, nnz: int) -> torch.Tensor:
    counts = crow[1:] - crow[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=nnz)


def sparse_cases(nnz: int, gen: torch.Generator, smallest: bool) -> list[Case]:
    """Cases for COO and CSR masked tensors with ``nnz`` stored entries at 1% density."""
    tm_masked, tm_as_masked = _torch_masked()
    idx, shape = sparse_pattern(nnz, DENSITY, gen)
    values = torch.rand(nnz, generator=gen) + 0.1
    mvalues = torch.rand(nnz, generator=gen) < 0.5
    dense = torch.rand(shape, generator=gen)
    crow = torch._convert_indices_from_coo_to_csr(idx[0], shape[0])
    col = idx[1]
    out: list[Case] = []
    for name in ("coo", "csr"):
        if name == "coo":
            def build(v: torch.Tensor, index: torch.Tensor = idx) -> torch.Tensor:
                return torch.sparse_coo_tensor(index, v, shape, is_coalesced=True,
                                               check_invariants=False)

            def gathered(d: torch.Tensor) -> torch.Tensor:
                return d[idx[0], idx[1]]
        else:
            def build(v: torch.Tensor, index: torch.Tensor = idx) -> torch.Tensor:
                c = crow if index is idx else crow.clone()
                return torch.sparse_csr_tensor(c, index[1], v, shape, check_invariants=False)

            def gathered(d: torch.Tensor) -> torch.Tensor:
                return d[_rows(crow, nnz), col]
        data, mask = build(values), build(mvalues)
        a = ms.masked_tensor(data, mask)
        b = a * 0.5                                  # shares a's index and mask objects
        copy = idx.clone()                           # equal but distinct index tensors
        c = ms.masked_tensor(build(values * 0.25, copy), build(mvalues.clone(), copy))
        va, vb, vc, ma = a._storage.values, b._storage.values, c._storage.values, a._storage.mask
        pa, pb, pc = build(va), build(vb), build(vc, copy)
        ta, tb, tc = (_quiet(lambda p=p, m=m: tm_masked(p, m))()
                      for p, m in ((pa, mask), (pb, mask), (pc, build(mvalues.clone(), copy))))
        size = f"{name} nnz=1e{round(math.log10(nnz))}"
        speed = {"torch.masked": 0.2} if smallest else {}
        floor = {"floor": 1.2} if nnz == max(SPARSE_NNZ) else {}
        out += [
            Case(f"{size} sqrt", lambda a=a: torch.sqrt(a), {
                "floor": lambda va=va: torch.sqrt(va),
                "torch.masked": _quiet(lambda ta=ta: torch.sqrt(ta)),
                "torch.sparse": lambda pa=pa: torch.sqrt(pa)}, {**floor, **speed}),
            Case(f"{size} mt + mt (shared index)", lambda a=a, b=b: a + b, {
                "floor": lambda va=va, vb=vb: va + vb,
                "torch.masked": _quiet(lambda ta=ta, tb=tb: ta + tb),
                "torch.sparse": lambda pa=pa, pb=pb: pa + pb}, {**floor, **speed}),
            Case(f"{size} mt + mt (equal index)", lambda a=a, c=c: a + c, {
                "floor": lambda va=va, vc=vc: va + vc,
                "torch.masked": _quiet(lambda ta=ta, tc=tc: ta + tc),
                "torch.sparse": lambda pa=pa, pc=pc: pa + pc}, speed),
            Case(f"{size} mt * dense", lambda a=a: a * dense, {
                "floor": lambda va=va, g=gathered: va * g(dense),
                "torch.masked": _quiet(lambda ta=ta: ta * dense),
                "torch.sparse": lambda pa=pa: pa * dense}, speed),
            Case(f"{size} to_tensor(0)", lambda a=a: a.to_tensor(0), {
                "floor": lambda va=va, ma=ma, build=build: build(va.masked_fill(~ma, 0)),
                "torch.masked": _quiet(lambda ta=ta: ta.to_tensor(0))}, speed),
            Case(f"{size} get_data()", lambda a=a: a.get_data(), {
                "floor": lambda va=va, build=build: build(va),
                "torch.masked": _quiet(lambda ta=ta: ta.get_data())}, speed),
            Case(f"{size} masked_tensor()", lambda d=data, m=mask: ms.masked_tensor(d, m), {
                "floor": lambda: (values.clone(), mvalues.clone()),
                "torch.masked": _quiet(lambda d=data, m=mask: tm_masked(d, m))}, speed),
            Case(f"{size} as_masked_tensor()",
                 lambda d=data, m=mask: ms.as_masked_tensor(d, m), {
                     "torch.masked": _quiet(lambda d=data, m=mask: tm_as_masked(d, m))}, speed),
        ]
    return out


def cases(quick: bool = False) -> list[Case]:
    """All cases of this module (``quick`` changes nothing: the harness shortens timing)."""
    return sized_cases(strided_cases, sparse_cases, STRIDED_SIZES, SPARSE_NNZ, seed=0)


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
