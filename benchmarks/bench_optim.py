"""One optimizer step: ms.optim against torch.optim, sparse embedding and dense MLP.

**Sparse.** A (1_000_000 x 64) float32 embedding whose gradient holds 1% of its rows
(10_000 rows, 640_000 values), in three forms:

- ``hybrid COO``: what ``nn.Embedding(sparse=True)`` produces -- an uncoalesced COO tensor
  with indices ``(1, n)`` and values ``(n, 64)`` (12_000 lookups of the 10_000 rows);
- ``2-D COO``: the same gradient as a coalesced COO tensor with one index per element;
- ``CSR``: the same gradient as a CSR MaskedTensor (torch optimizers cannot take a CSR
  gradient, so their baseline is given the 2-D COO form).

Baselines (ratio = ms.optim / baseline; below 1 means ms.optim is faster): ``torch`` is
``torch.optim.Adagrad`` (its sparse path), ``torch.optim.SparseAdam`` (for ``Adam`` and
``SparseAdam``) or ``torch.optim.SGD`` (no momentum: the one sparse SGD torch has) on the
same gradient; ``floor`` is one ``index_add_`` of the gradient values into the weight.
Targets: <= 1.0x torch on hybrid COO, <= 0.5x torch on 2-D COO and CSR for the stateful
optimizers; SGD <= 1.0x torch on both COO forms (it is torch's own ``add_``, Note [SGD
without state]). Every step mutates the shared weight and the optimizers' states; the work
per step does not depend on their values.

**Dense.** A 40-parameter MLP (20 ``Linear(64, 64)`` layers) with dense gradients, every
optimizer at its defaults against the torch.optim class with the same arguments (which
on CPU loops over the parameters; ms.optim hands them to torch's multi-tensor path,
Note [Dense gradients]). Target: <= 1.2x torch.

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
from benchmarks import harness  # noqa: E402

TITLE = "Optimizer step: 1M x 64 embedding (1% of rows in the gradient), 40-parameter MLP"
ROWS, DIM, TOUCHED, LOOKUPS = 1_000_000, 64, 10_000, 12_000
TARGETS = {"hybrid COO": 1.0, "2-D COO": 0.5, "CSR": 0.5}
SGD_TARGETS = {"hybrid COO": 1.0, "2-D COO": 1.0}
LAYERS, WIDTH, DENSE_TARGET = 20, 64, 1.2


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


def sparse_cases() -> list[tuple]:
    """``(name, ms_fn, {baseline: fn}, {baseline: target})`` for each optimizer x form."""
    weight = torch.nn.Parameter(torch.randn(ROWS, DIM))
    grads = gradients()
    lin, vals = grads["flat"]

    def floor() -> None:
        with torch.no_grad():
            weight.view(-1).index_add_(0, lin, vals)

    torch_sparse_adam = torch.optim.SparseAdam([weight], lr=0.001)  # one baseline for two
    pairs = {
        "Adagrad": (ms.optim.Adagrad([weight], lr=0.01),
                    torch.optim.Adagrad([weight], lr=0.01), TARGETS),
        "Adam": (ms.optim.Adam([weight], lr=0.001), torch_sparse_adam, TARGETS),
        "SparseAdam": (ms.optim.SparseAdam([weight], lr=0.001), torch_sparse_adam, TARGETS),
        "SGD": (ms.optim.SGD([weight], lr=0.001), torch.optim.SGD([weight], lr=0.001),
                SGD_TARGETS),
    }
    out = []
    for opt_name, (mine, theirs, targets) in pairs.items():
        for form in ("hybrid COO", "2-D COO", "CSR"):
            torch_grad = grads["2-D COO"] if form == "CSR" else grads[form]
            out.append((f"{opt_name} step, {form}", _stepper(mine, weight, grads[form]),
                        {"torch": _stepper(theirs, weight, torch_grad), "floor": floor},
                        {"torch": targets[form]} if form in targets else {}))
    return out


def dense_cases() -> list[tuple]:
    """ms.optim against torch.optim on a 40-parameter MLP's dense gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    configs = {"SGD": dict(lr=1e-3), "SGD momentum": dict(lr=1e-3, momentum=0.9),
               "Adagrad": dict(lr=1e-3), "Adam": dict(lr=1e-3), "AdamW": dict(lr=1e-3)}
    out = []
    for name, kwargs in configs.items():
        cls = name.split()[0]
        mine = getattr(ms.optim, cls)(params, **kwargs)
        theirs = getattr(torch.optim, cls)(params, **kwargs)
        out.append((f"{name} step, MLP {len(params)} dense params", mine.step,
                    {"torch": theirs.step}, {"torch": DENSE_TARGET}))
    return out


def cases(quick: bool = False) -> list[tuple]:
    """The sparse embedding cases, then the dense MLP cases."""
    return sparse_cases() + dense_cases()


def main() -> None:
    """Print the table: medians and ratios, paired rounds (``--quick``, ``--only TEXT``)."""
    harness.module_main(sys.modules[__name__])


if __name__ == "__main__":
    main()
