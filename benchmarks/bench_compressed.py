"""CSC against CSR: one compressed family, so every CSC op costs what CSR's does.

Each case times an op on a CSC masked tensor; its baseline ``CSR swapped`` is the same op on
CSR along the swapped dim, over the same numbers (the CSR matrix is the transpose: CSC's
columns are its rows), so the ratio compares the code paths, not the data. Targets: every
ratio <= 1.5. ``from_scipy`` reads a ``csc_matrix`` as CSC and a ``csr_matrix`` of the same
size as CSR. Sizes: a 3000 x 3000 matrix with 5% stored (reductions) and the 100000 x 20000
scipy matrix with 2M entries of ``bench_scipy`` (``from_scipy``).
"""

from __future__ import annotations

from typing import Any

import torch

import masked_sparse as ms
from benchmarks.harness import Case

TITLE = "CSC vs CSR along the swapped dim (ratio = CSC / CSR)"
TARGET = {"CSR swapped": 1.5}


def _pair(n: int, density: float, gen: torch.Generator) -> tuple[Any, Any]:
    """A CSC masked tensor and the CSR masked tensor of its transpose (same values)."""
    stored = torch.rand(n, n, generator=gen) < density
    data = torch.randn(n, n, generator=gen)
    mask = stored & (torch.rand(n, n, generator=gen) < 0.8)
    idx = stored.nonzero().t()
    coo = ms.masked_tensor(torch.sparse_coo_tensor(idx, data[stored], (n, n)).coalesce(),
                           torch.sparse_coo_tensor(idx, mask[stored], (n, n)).coalesce())
    csc = ms.to_layout(coo, torch.sparse_csc)
    csr = ms.to_layout(ms.to_layout(coo.t(), torch.sparse_coo), torch.sparse_csr)
    return csc, csr


def reduction_cases(gen: torch.Generator) -> list[Case]:
    csc, csr = _pair(3000, 0.05, gen)
    name = "3000x3000 5%"
    ops = {
        "sum(dim=0)": (lambda t, d: t.sum(d), 0),
        "sum(dim=1)": (lambda t, d: t.sum(d), 1),
        "amax(dim=0)": (lambda t, d: t.amax(d), 0),
        "amax(dim=1)": (lambda t, d: t.amax(d), 1),
        "mean(dim=0)": (lambda t, d: t.mean(d), 0),
        "softmax(dim=0)": (lambda t, d: torch.softmax(t, d), 0),
        "softmax(dim=1)": (lambda t, d: torch.softmax(t, d), 1),
        "select(1, 7)": (lambda t, d: t.select(d, 7), 1),
        "[:, 100:2000]": (lambda t, d: t.narrow(d, 100, 1900), 1),
    }
    return [Case(f"csc {name} {op}", lambda f=f, d=d: f(csc, d),
                 {"CSR swapped": lambda f=f, d=d: f(csr, 1 - d)}, TARGET)
            for op, (f, d) in ops.items()]


def scipy_cases(gen: torch.Generator) -> list[Case]:
    try:
        import numpy as np
        import scipy.sparse as sp
    except ImportError:
        return [Case("from_scipy(csc_matrix)", lambda: None,
                     {"CSR swapped": "scipy is not installed"})]
    rng = np.random.default_rng(0)
    rows, cols, nnz = 100_000, 20_000, 2_000_000
    r, c = rng.integers(0, rows, nnz), rng.integers(0, cols, nnz)
    v = rng.standard_normal(nnz)
    csc = sp.csc_matrix((v, (r, c)), shape=(rows, cols))
    csr = sp.csr_matrix((v, (c, r)), shape=(cols, rows))  # its transpose, as CSR
    return [Case("from_scipy(100000x20000 csc_matrix, 2M)",
                 lambda: ms.from_scipy(csc, layout=torch.sparse_csc),
                 {"CSR swapped": lambda: ms.from_scipy(csr)}, TARGET)]


def cases(quick: bool = False) -> list[Case]:
    """All cases of this module (``quick`` changes nothing: the harness shortens timing)."""
    gen = torch.Generator().manual_seed(0)
    return reduction_cases(gen) + scipy_cases(gen)


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
