"""One optimizer step on a sparse embedding gradient: ms.optim against torch.optim.

A (1_000_000 x 64) float32 embedding whose gradient holds 1% of its rows (10_000 rows,
640_000 values), in three forms:

- ``hybrid COO``: what ``nn.Embedding(sparse=True)`` produces -- an uncoalesced COO tensor
  with indices ``(1, n)`` and values ``(n, 64)`` (12_000 lookups of the 10_000 rows);
- ``2-D COO``: the same gradient as a coalesced COO tensor with one index per element;
- ``CSR``: the same gradient as a CSR MaskedTensor (torch optimizers cannot take a CSR
  gradient, so their baseline is given the 2-D COO form).

Baselines (ratio = ms.optim / baseline; below 1 means ms.optim is faster): ``torch`` is
``torch.optim.Adagrad`` (its sparse path) or ``torch.optim.SparseAdam`` on the same
gradient; ``floor`` is one ``index_add_`` of the gradient values into the weight, the
least a sparse step must do. Targets: <= 1.0x torch on hybrid COO, <= 0.5x torch on 2-D
COO and CSR. Every step mutates the shared weight and the optimizers' states; the work
per step does not depend on their values.

Run by hand: ``python benchmarks/bench_optim.py [--quick] [--only TEXT]`` (or through
``benchmarks/run.py``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # ``python benchmarks/bench_optim.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import masked_sparse as ms  # noqa: E402

TITLE = "Optimizer step on a 1M x 64 embedding, 1% of rows in the gradient"
ROWS, DIM, TOUCHED, LOOKUPS = 1_000_000, 64, 10_000, 12_000
TARGETS = {"hybrid COO": 1.0, "2-D COO": 0.5, "CSR": 0.5}


def gradients(seed: int = 0) -> dict[str, Any]:
    """The gradient forms of one embedding gradient, and the floor's index/values."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(ROWS, generator=g)[:TOUCHED]
    lookups = torch.cat([rows, rows[torch.randint(TOUCHED, (LOOKUPS - TOUCHED,), generator=g)]])
    lookups = lookups[torch.randperm(LOOKUPS, generator=g)]
    values = torch.randn(LOOKUPS, DIM, generator=g)
    hybrid = torch.sparse_coo_tensor(lookups[None], values, (ROWS, DIM), check_invariants=False)
    coalesced = hybrid.coalesce()
    r, v = coalesced.indices()[0], coalesced.values()
    index = torch.stack([r.repeat_interleave(DIM), torch.arange(DIM).repeat(r.numel())])
    coo2d = torch.sparse_coo_tensor(index, v.reshape(-1), (ROWS, DIM), is_coalesced=True,
                                    check_invariants=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CSR is "beta" in torch
        csr = coo2d.to_sparse_csr()
    csr_mask = torch.sparse_csr_tensor(csr.crow_indices(), csr.col_indices(),
                                       torch.ones(csr.values().shape, dtype=torch.bool),
                                       csr.shape)
    return {"hybrid COO": hybrid, "2-D COO": coo2d,
            "CSR": ms.masked_tensor(csr, csr_mask), "flat": (index[0] * DIM + index[1],
                                                            v.reshape(-1))}


def _stepper(opt: torch.optim.Optimizer, weight: torch.Tensor, grad: Any) -> Callable[[], Any]:
    def step() -> None:
        weight.grad = grad
        opt.step()

    return step


def cases(quick: bool = False) -> list[tuple]:
    """``(name, ms_fn, {baseline: fn}, {baseline: target})`` for each optimizer x form."""
    weight = torch.nn.Parameter(torch.randn(ROWS, DIM))
    grads = gradients()
    lin, vals = grads["flat"]

    def floor() -> None:
        with torch.no_grad():
            weight.view(-1).index_add_(0, lin, vals)

    pairs = {
        "Adagrad": (ms.optim.Adagrad([weight], lr=0.01),
                    torch.optim.Adagrad([weight], lr=0.01)),
        "Adam": (ms.optim.Adam([weight], lr=0.001),
                 torch.optim.SparseAdam([weight], lr=0.001)),
    }
    out = []
    for opt_name, (mine, theirs) in pairs.items():
        for form in ("hybrid COO", "2-D COO", "CSR"):
            torch_grad = grads["2-D COO"] if form == "CSR" else grads[form]
            out.append((f"{opt_name} step, {form}", _stepper(mine, weight, grads[form]),
                        {"torch": _stepper(theirs, weight, torch_grad), "floor": floor},
                        {"torch": TARGETS[form]}))
    return out


def _median(fn: Callable[[], Any], min_run_time: float) -> float:
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def main() -> None:
    """Print one line per case: medians and ratios (ms.optim / baseline)."""
    torch.set_num_threads(1)
    quick = "--quick" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    min_run_time = 0.2 if quick else 1.0
    print(f"### {TITLE}\n")
    print("| case | ms.optim | torch | ratio | target | floor (index_add_) | ratio |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for name, fn, baselines, targets in cases(quick):
        if only not in name:
            continue
        fn()  # warm up (state allocation)
        for b in baselines.values():
            b()
        t = _median(fn, min_run_time)
        tt = _median(baselines["torch"], min_run_time)
        tf = _median(baselines["floor"], min_run_time)
        ok = "met" if t / tt <= targets["torch"] else "MISSED"
        print(f"| {name} | {t * 1e3:.2f} ms | {tt * 1e3:.2f} ms | {t / tt:.2f}x | "
              f"<= {targets['torch']}x {ok} | {tf * 1e3:.2f} ms | {t / tf:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
