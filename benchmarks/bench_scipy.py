"""Sparse reductions against scipy.sparse on the same 100000 x 20000 matrix.

The matrix: 100000 x 20000 with 2M stored entries (random positions, duplicates summed),
1% of them explicit zeros, 90% of the stored entries specified. masked_sparse holds it as a
CSR and as a COO masked tensor: every stored entry with its mask bit.

Note [A fair scipy baseline]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
scipy has no mask, so it gets the matrix it can represent: the *specified* entries only
(a ``csr_matrix`` built from them; the masked-out stored entries are removed, the specified
explicit zeros stay stored). Each side holds what it needs for the same masked matrix and
times scipy's own reduction (``m.sum(1)``, ``m.max(0)``, ...). Where the semantics differ,
results are compared where they agree, converted, and checked before any timing
(``check``):

- sums, ``count_nonzero`` (both count nonzero values among the specified entries) and the
  full sum agree everywhere (a group with nothing specified: unspecified for us, 0 for
  scipy; compared as 0);
- ``max`` / ``min``: scipy takes the implicit zeros of a group with unstored positions into
  account, so its row max is ``max(ours, 0)``; compared on the groups we specify;
- ``mean``: scipy divides by the row (column) length, we by the number of specified
  elements; ``ours × count == scipy × length`` is compared on the groups we specify.

Target: masked_sparse at or below scipy (ratio ≤ 1), one thread.

>>> m = reduction_matrix(rows=50, cols=20, nnz=100)
>>> check(m)  # raises if any reduction disagrees with scipy
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

import masked_sparse as ms
from benchmarks.harness import Case

TITLE = "Sparse reductions vs scipy.sparse (100000 x 20000, 2M stored, 90% specified)"
SHAPE, NNZ, SPECIFIED, EXPLICIT_ZEROS = (100_000, 20_000), 2_000_000, 0.9, 0.01
TARGET = {"scipy": 1.0}


class ReductionMatrix(NamedTuple):
    """One masked matrix as masked_sparse CSR and COO, and scipy's ``csr_matrix``."""

    csr: Any  # MaskedTensor, sparse_csr
    coo: Any  # MaskedTensor, sparse_coo
    scipy: Any  # scipy.sparse.csr_matrix of the specified entries


def reduction_matrix(rows: int = SHAPE[0], cols: int = SHAPE[1], nnz: int = NNZ,
                     seed: int = 0) -> ReductionMatrix:
    """The benchmark's matrix (see Note [A fair scipy baseline])."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    m = sp.csr_matrix((rng.standard_normal(nnz), (rng.integers(0, rows, nnz),
                                                   rng.integers(0, cols, nnz))),
                      shape=(rows, cols))
    m.sum_duplicates()
    m.data[rng.random(m.nnz) < EXPLICIT_ZEROS] = 0.0  # stored zeros, kept on both sides
    keep = rng.random(m.nnz) < SPECIFIED
    crow = torch.from_numpy(m.indptr).long()
    col = torch.from_numpy(m.indices).long()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        csr = ms.masked_tensor(
            torch.sparse_csr_tensor(crow, col, torch.from_numpy(m.data), m.shape),
            torch.sparse_csr_tensor(crow, col, torch.from_numpy(keep), m.shape))
    row_of = np.repeat(np.arange(rows), np.diff(m.indptr))
    specified = sp.csr_matrix((m.data[keep], (row_of[keep], m.indices[keep])), shape=m.shape)
    specified.has_canonical_format = True
    return ReductionMatrix(csr, csr.to_sparse_coo(), specified)


def _ours(t: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A reduction result as dense ``(values with 0 where unspecified, mask)``."""
    return t.to_tensor(0).to_dense().reshape(-1), t.get_mask().to_dense().reshape(-1)


def _scipy(x: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x.todense() if hasattr(x, "todense") else x)
                            .reshape(-1)).to(torch.float64)


# name -> (masked_sparse call, scipy call, axis or None)
OPS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], int | None]] = {
    "row sums": (lambda t: t.sum(1), lambda m: m.sum(1), 1),
    "column sums": (lambda t: t.sum(0), lambda m: m.sum(0), 0),
    "row means": (lambda t: t.mean(1), lambda m: m.mean(1), 1),
    "column means": (lambda t: t.mean(0), lambda m: m.mean(0), 0),
    "row max": (lambda t: t.amax(1), lambda m: m.max(1), 1),
    "column max": (lambda t: t.amax(0), lambda m: m.max(0), 0),
    "row min": (lambda t: t.amin(1), lambda m: m.min(1), 1),
    "column min": (lambda t: t.amin(0), lambda m: m.min(0), 0),
    "row count_nonzero": (lambda t: torch.count_nonzero(t, 1),
                          lambda m: m.count_nonzero(axis=1), 1),
    "column count_nonzero": (lambda t: torch.count_nonzero(t, 0),
                             lambda m: m.count_nonzero(axis=0), 0),
    "full sum": (lambda t: t.sum(), lambda m: m.sum(), None),
}


def _stored_per_group(sm: Any, axis: int) -> torch.Tensor:
    """Stored entries per row (``axis=1``) or per column (``axis=0``) of a csr_matrix."""
    counts = (np.diff(sm.indptr) if axis == 1
              else np.bincount(sm.indices, minlength=sm.shape[1]))
    return torch.from_numpy(counts).to(torch.float64)


def check(m: ReductionMatrix) -> None:
    """Compare every reduction of both layouts with scipy's (Note [A fair scipy baseline])."""
    sm = m.scipy
    for name, (ours_of, scipy_of, axis) in OPS.items():
        expected = _scipy(scipy_of(sm))
        for layout, t in (("csr", m.csr), ("coo", m.coo)):
            got, specified = _ours(ours_of(t))
            got = got.to(torch.float64)
            if "max" in name or "min" in name:
                length = sm.shape[axis]
                unstored = _stored_per_group(sm, axis) < length
                bound = torch.clamp(got, min=0) if "max" in name else torch.clamp(got, max=0)
                got = torch.where(unstored, bound, got)[specified]
                expected_here = expected[specified]
            elif "means" in name:
                got = (got * _stored_per_group(sm, axis))[specified]
                expected_here = (expected * sm.shape[axis])[specified]
            else:
                expected_here = expected
            torch.testing.assert_close(got, expected_here, msg=lambda s, name=name,
                                       layout=layout: f"{layout} {name} vs scipy: {s}")


def cases(quick: bool = False, matrix: ReductionMatrix | None = None) -> list[Case]:
    """Every reduction of scipy's on CSR and COO (``quick`` changes nothing: the harness
    shortens timing); the results are checked against scipy first."""
    try:
        m = matrix or reduction_matrix()
    except ImportError:
        return [Case("scipy reductions", lambda: None, {"scipy": "scipy is not installed"})]
    check(m)
    out = []
    for layout, t in (("csr", m.csr), ("coo", m.coo)):
        for name, (ours_of, scipy_of, _axis) in OPS.items():
            out.append(Case(f"{layout} {name}", lambda f=ours_of, t=t: f(t),
                            {"scipy": lambda g=scipy_of: g(m.scipy)}, TARGET))
    return out


def _rebuilt(t: Any) -> Any:
    """A new MaskedTensor equal to ``t``, built from its parts (new index and mask tensors:
    nothing cached for it yet)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ms.masked_tensor(t.get_data(), t.get_mask())


def cold_ratios(m: ReductionMatrix, rounds: int = 15) -> dict[str, float]:
    """The first reduction of a newly built masked tensor ÷ a repeated one (the cases'
    times), per CSR reduction: median seconds of ``rounds`` calls each, the cold call on a
    tensor rebuilt before it (outside the timing)."""
    import time

    out = {}
    for name, (ours_of, _scipy_of, _axis) in OPS.items():
        cold, warm = [], []
        for _ in range(rounds):
            fresh = _rebuilt(m.csr)
            start = time.perf_counter()
            ours_of(fresh)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            ours_of(fresh)
            warm.append(time.perf_counter() - start)
        out[name] = float(np.median(cold) / np.median(warm))
    return out


def numpy_compaction(mt: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The baseline of ``to_scipy`` for a CSR masked tensor: its specified entries compacted
    in numpy -- the row pointers by one cumsum of the mask read at the old ones, the columns
    and values by two gathers."""
    s = mt._storage
    crow, col = (t.numpy() for t in s.index)
    mask = s.mask.numpy()
    count = np.concatenate([[0], np.cumsum(mask)])
    kept = np.flatnonzero(mask)
    return s.values.numpy()[kept], col[kept], count[crow]


def to_scipy_ratio(m: ReductionMatrix, rounds: int = 9) -> float:
    """``ms.to_scipy(csr)`` ÷ :func:`numpy_compaction` of the same entries, medians of
    ``rounds`` alternating calls in one run (target ≤ 1.5); checks both agree first."""
    import time

    a, (data, indices, indptr) = ms.to_scipy(m.csr), numpy_compaction(m.csr)
    assert (np.array_equal(a.data, data) and np.array_equal(a.indices, indices)
            and np.array_equal(a.indptr, indptr))
    ours, base = [], []
    for _ in range(rounds):
        for fn, out in ((lambda: ms.to_scipy(m.csr), ours), (lambda: numpy_compaction(m.csr),
                                                               base)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return float(np.median(ours) / np.median(base))


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
