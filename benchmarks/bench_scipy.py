"""Sparse reductions against scipy.sparse on the same matrix (issue 19's 100000 x 20000 case).

The masked tensors store 2M entries of a 100000 x 20000 matrix, 90% of them specified; the
scipy baseline is a ``csr_matrix`` of the specified entries only (what scipy can represent),
so both reduce the same numbers. Sums are checked equal when the cases are built. scipy's
``max`` and ``mean`` count the implicit zeros (``mean`` divides by the row length), ours
only the specified elements: those rows time the same amount of work, not the same result.
Target: masked_sparse at or below scipy (ratio <= 1).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import masked_sparse as ms
from benchmarks.harness import Case

TITLE = "sparse reductions vs scipy.sparse (100000 x 20000, 2M stored, 90% specified)"
TARGET = {"scipy": 1.0}


def _matrices() -> tuple[Any, Any, Any]:
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    rows, cols, nnz = 100_000, 20_000, 2_000_000
    m = sp.csr_matrix((rng.standard_normal(nnz), (rng.integers(0, rows, nnz),
                                                   rng.integers(0, cols, nnz))),
                      shape=(rows, cols))
    m.sum_duplicates()
    keep = rng.random(m.nnz) < 0.9
    data = ms.from_scipy(m)._storage
    crow, col = data.index
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        csr = ms.masked_tensor(
            torch.sparse_csr_tensor(crow, col, data.values, data.shape),
            torch.sparse_csr_tensor(crow, col, torch.from_numpy(keep), data.shape))
    specified = m.copy()
    specified.data = np.where(keep, specified.data, 0)
    specified.eliminate_zeros()
    return csr, csr.to_sparse_coo(), specified


def cases(quick: bool = False) -> list[Case]:
    """All cases of this module (``quick`` changes nothing: the harness shortens timing)."""
    try:
        csr, coo, sm = _matrices()
    except ImportError:
        return [Case("scipy reductions", lambda: None, {"scipy": "scipy is not installed"})]
    for a in (csr, coo):  # the same numbers: sums agree with scipy's
        for dim in (0, 1):
            ours = a.sum(dim).to_tensor(0).to_dense()
            ref = torch.from_numpy(sm.sum(dim).A.reshape(-1))
            torch.testing.assert_close(ours, ref)
    ops = {
        "row sums": (lambda t: t.sum(1), lambda: sm.sum(1)),
        "column sums": (lambda t: t.sum(0), lambda: sm.sum(0)),
        "row max": (lambda t: t.amax(1), lambda: sm.max(1)),
        "column max": (lambda t: t.amax(0), lambda: sm.max(0)),
        "row means": (lambda t: t.mean(1), lambda: sm.mean(1)),
        "column means": (lambda t: t.mean(0), lambda: sm.mean(0)),
        "full sum": (lambda t: t.sum(), lambda: sm.sum()),
    }
    out = []
    for kind, a in (("csr", csr), ("coo", coo)):
        out += [Case(f"{kind} {name}", lambda f=f, a=a: f(a), {"scipy": g}, TARGET)
                for name, (f, g) in ops.items()]
    return out


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
