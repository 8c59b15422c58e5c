"""Scans and sorts on sparse masked tensors: ``cumsum``, ``sort``, ``topk`` along a dim of
a COO / CSR matrix against the same torch op on its values tensor. Run by hand:
``python -m benchmarks.bench_order`` (or through the suite, ``python -m benchmarks``).

Cases (``cases()`` returns ``(name, masked_sparse_fn, {baseline: fn}, {baseline: target})``;
ratio = masked_sparse median / baseline median):

- COO and CSR 10000 x 10000, float32, nnz = 1e6 (a quarter of the stored entries masked
  out): ``cumsum(dim=1)``, ``sort(dim=1)`` and ``topk(10, dim=1)`` against ``floor``, the
  same op on the 1-D values tensor (``torch.cumsum(values, 0)``, ``torch.sort(values)``,
  ``torch.topk(values, 10)``) -- what the op costs with neither rows nor masks (target
  <= 2); ``cumsum(dim=0)`` / ``sort(dim=0)`` (lines across the storage order) for
  information.

Timing: ``torch.utils.benchmark`` medians, one thread.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

import masked_sparse as ms

TITLE = "Scans and sorts (sparse)"
N, NNZ = 10_000, 10**6
Case = tuple[str, Callable[[], Any], dict[str, Any], dict[str, float]]


def matrix(n: int, nnz: int, gen: torch.Generator) -> ms.MaskedTensor:
    """A COO masked matrix with ``nnz`` random stored entries, a quarter masked out."""
    keys = torch.randint(0, n * n, (2 * nnz,), generator=gen).unique()
    keys = keys[torch.randperm(keys.numel(), generator=gen)[:nnz]].sort().values
    idx = torch.stack([keys // n, keys % n])
    values = torch.randn(nnz, generator=gen)
    mask = torch.rand(nnz, generator=gen) < 0.75
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = torch.sparse_coo_tensor(idx, values, (n, n), is_coalesced=True)
        mvals = torch.sparse_coo_tensor(idx, mask, (n, n), is_coalesced=True)
    return ms.masked_tensor(data, mvals)


def sparse_cases(n: int, nnz: int, gen: torch.Generator) -> list[Case]:
    """The cases on one ``n x n`` matrix with ``nnz`` stored entries, COO and CSR."""
    coo = matrix(n, nnz, gen)
    csr = coo.to_sparse_csr()
    v = coo._storage.values
    goal = {"floor": 2.0}
    out: list[Case] = []
    for name, mt in (("coo", coo), ("csr", csr)):
        label = f"{name} nnz=1e{len(str(nnz)) - 1}"
        out += [
            (f"{label} cumsum(dim=1)", lambda mt=mt: torch.cumsum(mt, 1),
             {"floor": lambda: torch.cumsum(v, 0)}, goal),
            (f"{label} sort(dim=1)", lambda mt=mt: torch.sort(mt, 1),
             {"floor": lambda: torch.sort(v)}, goal),
            (f"{label} topk(10, dim=1)", lambda mt=mt: torch.topk(mt, 10, 1),
             {"floor": lambda: torch.topk(v, 10)}, goal),
            (f"{label} cumsum(dim=0)", lambda mt=mt: torch.cumsum(mt, 0),
             {"floor": lambda: torch.cumsum(v, 0)}, {}),
            (f"{label} sort(dim=0)", lambda mt=mt: torch.sort(mt, 0),
             {"floor": lambda: torch.sort(v)}, {}),
        ]
    return out


def cases(quick: bool = False) -> list[Case]:
    """Every case of this module (``quick`` changes nothing: the sizes are the targets')."""
    return sparse_cases(N, NNZ, torch.Generator().manual_seed(0))


def main() -> None:
    from benchmarks import bench_order, harness

    harness.module_main(bench_order)


if __name__ == "__main__":
    main()
