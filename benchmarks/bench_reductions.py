"""Reductions and softmax: masked_sparse against torch.sparse, numpy.ma and the plain
masked dense torch expression. Run by hand: ``python -m benchmarks.bench_reductions``
(or through the suite, ``python -m benchmarks``).

Cases (``cases()`` returns ``(name, masked_sparse_fn, {baseline: fn}, {baseline: target})``;
every callable takes no argument; ratio = masked_sparse median / baseline median):

- strided 4000 x 4000 float32, half masked: ``sum(dim)`` / ``mean(dim)`` for dims 0 and 1
  against ``numpy.ma`` (target <= 0.1, i.e. >= 10x faster) and ``floor``, the plain masked
  dense torch expression with its result mask, ``(torch.where(m, d, 0).sum(dim),
  m.any(dim))`` (mean: ``/ m.sum(dim)``; target <= 1.3); ``amax``, ``var``, ``softmax``
  and the full ``sum()`` for information;
- COO and CSR 10000 x 10000 with nnz = 1e6 (half of the stored entries masked out):
  ``sum(dim)`` against ``torch.sparse.sum(coo, dim)`` on the plain tensor whose masked
  values are zeroed (target <= 1.5), and ``floor``, the bare ``index_add`` of the values;
  ``mean``, ``amax``, ``softmax`` against their torch.sparse / raw counterparts.

Timing: ``torch.utils.benchmark`` medians, one thread.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import masked_sparse as ms

TITLE = "Reductions and softmax"
STRIDED_N = 4000
SPARSE_N, SPARSE_NNZ = 10_000, 10**6
INF = float("inf")
Case = tuple[str, Callable[[], Any], dict[str, Any], dict[str, float]]


def strided_cases(gen: torch.Generator) -> list[Case]:
    n = STRIDED_N
    d = torch.randn(n, n, generator=gen)
    m = torch.rand(n, n, generator=gen) < 0.5
    a = ms.masked_tensor(d, m)
    na = np.ma.masked_array(d.numpy(), mask=~m.numpy())
    name = f"strided {n}x{n}"
    targets = {"numpy.ma": 0.1, "floor": 1.3}
    out: list[Case] = []
    for dim in (1, 0):
        out.append((f"{name} sum(dim={dim})", lambda dim=dim: a.sum(dim), {
            "floor": lambda dim=dim: (torch.where(m, d, 0).sum(dim), m.any(dim)),
            "numpy.ma": lambda dim=dim: na.sum(dim)}, targets))
        out.append((f"{name} mean(dim={dim})", lambda dim=dim: a.mean(dim), {
            "floor": lambda dim=dim: (torch.where(m, d, 0).sum(dim) / m.sum(dim), m.any(dim)),
            "numpy.ma": lambda dim=dim: na.mean(dim)}, targets))
    out += [
        (f"{name} sum()", lambda: a.sum(), {
            "floor": lambda: (torch.where(m, d, 0).sum(), m.any()),
            "numpy.ma": lambda: na.sum()}, {}),
        (f"{name} amax(dim=1)", lambda: a.amax(1), {
            "floor": lambda: (torch.where(m, d, -INF).amax(1), m.any(1)),
            "numpy.ma": lambda: na.max(1)}, {}),
        (f"{name} var(dim=1)", lambda: a.var(1), {
            "numpy.ma": lambda: na.var(1, ddof=1)}, {}),
        (f"{name} softmax(dim=1)", lambda: torch.softmax(a, 1), {
            "floor": lambda: torch.where(m, d, -INF).softmax(1)}, {}),
    ]
    return out


def sparse_cases(gen: torch.Generator) -> list[Case]:
    n, nnz = SPARSE_N, SPARSE_NNZ
    keys = torch.randint(0, n * n, (2 * nnz,), generator=gen).unique()
    keys = keys[torch.randperm(keys.numel(), generator=gen)[:nnz]].sort().values
    idx = torch.stack([keys // n, keys % n])
    v = torch.randn(nnz, generator=gen)
    mv = torch.rand(nnz, generator=gen) < 0.5
    zeroed, neg_inf = torch.where(mv, v, 0), torch.where(mv, v, -INF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coo = torch.sparse_coo_tensor(idx, v, (n, n), is_coalesced=True)
        mcoo = torch.sparse_coo_tensor(idx, mv, (n, n), is_coalesced=True)
        plain = torch.sparse_coo_tensor(idx, zeroed, (n, n), is_coalesced=True)
        plain_inf = torch.sparse_coo_tensor(idx, neg_inf, (n, n), is_coalesced=True)
    a = ms.masked_tensor(coo, mcoo)
    c = a.to_sparse_csr()
    plain_csr = plain.to_sparse_csr()
    rows, cols = idx[0], idx[1]
    name = f"coo nnz=1e{len(str(nnz)) - 1}"
    vs_sparse = {"torch.sparse": 1.5}
    return [
        (f"{name} sum(dim=1)", lambda: a.sum(1), {
            "torch.sparse": lambda: torch.sparse.sum(plain, 1),
            "floor": lambda: torch.zeros(n).index_add_(0, rows, zeroed)}, vs_sparse),
        (f"{name} sum(dim=0)", lambda: a.sum(0), {
            "torch.sparse": lambda: torch.sparse.sum(plain, 0),
            "floor": lambda: torch.zeros(n).index_add_(0, cols, zeroed)}, vs_sparse),
        (f"{name} sum()", lambda: a.sum(), {
            "torch.sparse": lambda: torch.sparse.sum(plain)}, {}),
        (f"{name} mean(dim=0)", lambda: a.mean(0), {
            "floor": lambda: (torch.zeros(n).index_add_(0, cols, zeroed)
                              / torch.zeros(n).index_add_(0, cols, mv.float()))}, {}),
        (f"{name} amax(dim=1)", lambda: a.amax(1), {
            "floor": lambda: torch.full((n,), -INF).scatter_reduce_(0, rows, neg_inf,
                                                                    "amax")}, {}),
        (f"{name} softmax(dim=1)", lambda: torch.softmax(a, 1), {
            "torch.sparse": lambda: torch.sparse.softmax(plain_inf, 1)}, {}),
        (f"csr nnz=1e{len(str(nnz)) - 1} sum(dim=1)", lambda: c.sum(1), {
            "torch.sparse": lambda: plain_csr.sum(1, keepdim=True)}, {}),
    ]


def cases(quick: bool = False) -> list[Case]:
    """Every case of this module (``quick`` changes nothing: the sizes are the targets')."""
    gen = torch.Generator().manual_seed(0)
    return strided_cases(gen) + sparse_cases(gen)


def median(fn: Callable[[], Any], min_run_time: float = 1.0) -> float:
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def main() -> None:
    torch.set_num_threads(1)
    print(f"{TITLE} (torch {torch.__version__}, one thread; ratio = masked_sparse / baseline)")
    for name, fn, baselines, targets in cases():
        ours = median(fn)
        cells = []
        for base, other in baselines.items():
            ratio = ours / median(other)
            target = targets.get(base)
            verdict = "" if target is None else (" ok" if ratio <= target else
                                                 f" MISSES target {target}")
            cells.append(f"{base} {ratio:.2f}x{verdict}")
        print(f"{name:32s} {ours * 1e3:9.2f} ms   " + ";  ".join(cells))


if __name__ == "__main__":
    main()
