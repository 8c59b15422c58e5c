"""The goals for sparse reductions and per-op overhead, each case with its target.

Operands: COO and CSR masked matrices at 1% density (``bench_core.sparse_pattern``: square,
10000 x 10000 at 1M entries, 316 x 316 at 1000), half of the stored entries masked out.

- **1M entries ÷ raw**: every sparse reduction (``sum``, ``mean``, ``amax``, ``amin``,
  ``argmax``, ``prod``, ``logsumexp``, ``var``, ``norm``, ``softmax``) along each dim and
  full, against ``raw``, the best plain-torch computation on the stored values
  (:mod:`benchmarks.raw_reductions`). Target ≤ 1.5×; the full ``sum`` ≤ 2× ``values.sum()``.
- **Fixed cost at 1000 entries**: the same reductions, absolute target ≤ 15 µs (the ``raw``
  column is for information).
- ``get_data()``: ≤ 1 µs strided, ≤ 2 µs sparse (absolute; sparse: a first call, which
  builds the torch tensor; a repeated one is shown without a target).
- ``to_tensor(0)`` at 1M: ≤ 1.1× raw (``masked_fill`` of the values + the sparse tensor).
- ``sqrt`` on CSR ÷ ``sqrt`` on the COO form of the same tensor, 1000 entries: ≤ 1.1× ("as
  cheap as COO", with 10% for the noise of a 10 µs measurement).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

import masked_sparse as ms
from benchmarks.bench_core import sparse_pattern
from benchmarks.harness import TIME, Case
from benchmarks.raw_reductions import FULL, REDUCTIONS, groups_of, masked_reduction, raw_reduction

TITLE = "Goals: sparse reductions ÷ raw, fixed costs, get_data, to_tensor"
LARGE, SMALL = 10**6, 10**3
DENSITY = 0.01
RAW_TARGET, FULL_SUM_TARGET, FIXED_COST = 1.5, 2.0, 15e-6


def sparse_operands(nnz: int, gen: torch.Generator, specified: float = 0.5
                    ) -> dict[str, Any]:
    """COO and CSR masked matrices with ``nnz`` stored entries, and their raw parts."""
    idx, shape = sparse_pattern(nnz, DENSITY, gen)
    values = torch.randn(nnz, generator=gen)
    mask = torch.rand(nnz, generator=gen) < specified
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coo = ms.masked_tensor(
            torch.sparse_coo_tensor(idx, values, shape, is_coalesced=True),
            torch.sparse_coo_tensor(idx, mask, shape, is_coalesced=True))
        csr = coo.to_sparse_csr()
    return {"coo": coo, "csr": csr, "rows": idx[0], "cols": idx[1], "shape": shape,
            "values": values, "mask": mask, "index": idx}


def plain_sparse(a: Any, values: torch.Tensor) -> torch.Tensor:
    """The plain torch sparse tensor with the indices of ``a`` (2-D COO / CSR) and ``values``."""
    index = a._storage.index
    if a.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(index[0], values, a.shape, is_coalesced=True,
                                       check_invariants=False)
    return torch.sparse_csr_tensor(*index, values, a.shape, check_invariants=False)


def _bound(f: Any, a: Any) -> Any:
    return lambda: f(a)


def _size(nnz: int) -> str:
    return f"nnz=1e{round(math.log10(nnz))}"


def reduction_cases(ops: dict[str, Any], large: bool) -> list[Case]:
    """Every reduction along each dim and full, COO and CSR, with its target."""
    v, shape = ops["values"], ops["shape"]
    out = []
    for layout in ("coo", "csr"):
        a = ops[layout]
        groups = {d: groups_of(layout, ops["rows"], ops["cols"], shape, d) for d in (0, 1)}
        for name in REDUCTIONS:
            for dim in (1, 0, None):
                if dim is None and name == "softmax":
                    continue
                call = f"{name}(dim={dim})" if dim is not None else f"{name}()"
                if dim is None:
                    raw: Any = lambda f=FULL[name]: f(v)  # noqa: E731
                else:
                    raw = lambda name=name, g=groups[dim]: raw_reduction(name, v, g)  # noqa: E731
                if not large:
                    target = {TIME: FIXED_COST}
                else:
                    target = {"raw": FULL_SUM_TARGET if (name, dim) == ("sum", None)
                              else RAW_TARGET}
                out.append(Case(f"{layout} {_size(v.numel())} {call}",
                                _bound(masked_reduction(name, dim), a), {"raw": raw}, target))
    return out


def conversion_cases(small: dict[str, Any], large: dict[str, Any],
                     gen: torch.Generator) -> list[Case]:
    """``get_data()`` (absolute), ``to_tensor(0)`` ÷ raw, ``sqrt`` on CSR ÷ on COO."""
    strided = ms.masked_tensor(torch.randn(100, 100, generator=gen),
                               torch.rand(100, 100, generator=gen) < 0.5)
    out = [Case("strided 100x100 get_data()", strided.get_data, {}, {TIME: 1e-6})]
    # The target is judged on a first call, which builds the torch tensor (a MaskedTensor
    # met once: an optimizer's new gradient each step); a repeated call on the same one
    # returns the tensor it kept (Note [The data tensor is built once]), for information.
    for layout in ("coo", "csr"):
        mt = small[layout]
        out.append(Case(f"{layout} {_size(small['values'].numel())} first get_data()",
                        lambda mt=mt: (mt.__dict__.pop("_data_of", None), mt.get_data()), {},
                        {TIME: 2e-6}))
    for layout in ("coo", "csr"):
        out.append(Case(f"{layout} {_size(small['values'].numel())} repeated get_data()",
                        small[layout].get_data, {}, {}))
    for layout in ("coo", "csr"):
        a = large[layout]
        va, ma = a._storage.values, a._storage.mask
        out.append(Case(f"{layout} {_size(va.numel())} to_tensor(0)", lambda a=a: a.to_tensor(0),
                        {"raw": lambda a=a, va=va, ma=ma: plain_sparse(a, va.masked_fill(~ma, 0))},
                        {"raw": 1.1}))
    coo, csr = small["coo"], small["csr"]
    values = csr._storage.values
    out.append(Case(f"csr {_size(values.numel())} sqrt ÷ coo sqrt", lambda: torch.sqrt(csr),
                    {"coo": lambda: torch.sqrt(coo), "raw": lambda: torch.sqrt(values)},
                    {"coo": 1.1}))
    return out


def case_groups(large: int = LARGE, small: int = SMALL) -> dict[str, list[Case]]:
    """The cases by goal: ``"large"`` (÷ raw), ``"small"`` (fixed cost), ``"other"``."""
    gen = torch.Generator().manual_seed(19)
    small_ops, large_ops = sparse_operands(small, gen), sparse_operands(large, gen)
    return {"large": reduction_cases(large_ops, large=True),
            "small": reduction_cases(small_ops, large=False),
            "other": conversion_cases(small_ops, large_ops, gen)}


def cases(quick: bool = False) -> list[Case]:
    """Every case of this module (``quick`` changes nothing: the harness shortens timing)."""
    return [c for group in case_groups().values() for c in group]


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
