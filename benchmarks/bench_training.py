"""Training with pruned weights against the dense workaround.

**Train step.** A 784-512-512-10 MLP (ReLU), each weight a MaskedTensor parameter with 90%
or 99% of its entries masked out (a fixed random mask), biases plain: zero the gradients,
forward, cross-entropy, backward -- no optimizer. The workaround, ``W*M``, is the same MLP
over dense weights written as ``F.linear(x, W * M, b)`` (what ``torch.nn.utils.prune``
computes). Batch 256 and 64, weights in CSR and strided. Targets (ratio = masked_sparse /
``W*M``, below 1 is faster): CSR <= 1.0x at 90% masked, <= 0.5x at 99%; strided <= 1.1x.

**Optimizer step.** ``ms.optim`` over the same MLP's strided masked weights (90% masked) and
plain biases, with the gradients of one backward, against the ``torch.optim`` class with
``foreach=True`` on the dense weights and biases. Target: <= 1.2x. A second row per
optimizer gives each weight's gradient a mask equal to the weight's but another tensor (as
after a collective, or a gradient set by hand; Note [Equal masks without a host sync]).
Every step mutates the weights and the states; the work per step does not depend on their
values.

**The training issue's other rows.** A 4096 x 4096 linear with a 90%-masked weight,
strided and CSR, batch 512, forward + backward, against ``F.linear(x, W * M)`` (<= 1.1x);
a matrix-factorisation step on a 6040 x 3706 rating matrix (about 4.5% specified, rank 64),
``((R_masked - U @ V.T) ** 2).mean()`` with backward, against the plain recipe
``(((R - U @ V.T) ** 2 * M).sum() / M.sum())`` (<= 1.1x); a strided ``add`` of two 4000 x
4000 masked tensors (half specified, one mask) against ``add`` on the values (<= 1.3x).

Run by hand: ``python -m benchmarks.bench_training [--quick] [--device cuda]`` (one
thread, medians of paired rounds), or as part of ``python -m benchmarks``. On CUDA the same
rows (``scripts/gpu_check.sh`` runs them); a CSR weight there multiplies as a dense buffer
above the device's density threshold (``layouts.PRODUCT_DENSITY_THRESHOLDS``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # ``python benchmarks/bench_training.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import masked_sparse as ms  # noqa: E402
from benchmarks import harness  # noqa: E402

TITLE = "Training: 784-512-512-10 MLP with masked weights against F.linear(x, W * M)"
SIZES = (784, 512, 512, 10)
LAYOUTS = {"CSR": torch.sparse_csr, "strided": torch.strided}
STEP_TARGETS = {("CSR", 0.9): 1.0, ("CSR", 0.99): 0.5, ("strided", 0.9): 1.1,
                ("strided", 0.99): 1.1}
OPTIMIZERS = {"Adam": dict(lr=1e-3), "SGD": dict(lr=1e-3, momentum=0.9),
              "AdamW": dict(lr=1e-3), "Adagrad": dict(lr=1e-3)}
OPT_TARGET = 1.2
#: where the cases run: ``--device`` (the CPU unless given; CUDA timings synchronize, as
#: ``torch.utils.benchmark`` does)
DEVICE = torch.device("cpu")


def mlp(masked: float, seed: int = 0) -> tuple[list, list, list]:
    """Dense weights, their keep-masks (``masked`` of each is False) and zero biases."""
    g = torch.Generator().manual_seed(seed)
    weights, masks, biases = [], [], []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        weights.append((torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(DEVICE))
        masks.append((torch.rand(n_out, n_in, generator=g) >= masked).to(DEVICE))
        biases.append(torch.zeros(n_out, device=DEVICE))
    return weights, masks, biases


def masked_params(weights: list, masks: list, layout: torch.layout) -> list:
    out = []
    for w, m in zip(weights, masks):
        mt = ms.masked_tensor(w.clone(), m)
        out.append(torch.nn.Parameter(mt if layout == torch.strided else ms.to_layout(mt, layout)))
    return out


def forward(x: torch.Tensor, weights: list, biases: list, masks: list | None = None) -> Any:
    """The MLP's logits; with ``masks`` the workaround ``F.linear(h, W * M, b)``."""
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w if masks is None else w * masks[i], b)
        if i < len(weights) - 1:
            h = torch.relu(h)
    return h if masks is not None else h.to_tensor(0)


def _train_step(x: torch.Tensor, y: torch.Tensor, params: list, weights: list, biases: list,
                masks: list | None) -> Callable[[], None]:
    def step() -> None:
        for p in params:
            p.grad = None
        F.cross_entropy(forward(x, weights, biases, masks), y).backward()

    return step


def step_cases(quick: bool = False) -> list[tuple]:
    out = []
    torch.manual_seed(0)
    for masked in (0.9, 0.99):
        weights, masks, biases = mlp(masked)
        dense_w = [torch.nn.Parameter(w.clone()) for w in weights]
        dense_b = [torch.nn.Parameter(b.clone()) for b in biases]
        for batch in (256, 64):
            x = torch.randn(batch, SIZES[0]).to(DEVICE)
            y = torch.randint(SIZES[-1], (batch,)).to(DEVICE)
            workaround = _train_step(x, y, dense_w + dense_b, dense_w, dense_b, masks)
            for name, layout in LAYOUTS.items():
                w = masked_params(weights, masks, layout)
                b = [torch.nn.Parameter(t.clone()) for t in biases]
                mine = _train_step(x, y, w + b, w, b, None)
                out.append((f"train step, {name}, {masked:.0%} masked, batch {batch}", mine,
                            {"W*M": workaround}, {"W*M": STEP_TARGETS[(name, masked)]}))
    return out


def _stepper(opt: torch.optim.Optimizer) -> Callable[[], None]:
    return opt.step


def _with_grads(weights: list, masks: list, biases: list, x: torch.Tensor, y: torch.Tensor,
                masked: bool, equal_mask: bool = False) -> list:
    """Fresh parameters of the MLP (its own per optimizer) holding one backward's gradients;
    with ``equal_mask`` each weight's gradient is over a copy of the weight's mask."""
    w = (masked_params(weights, masks, torch.strided) if masked
         else [torch.nn.Parameter(t.clone()) for t in weights])
    b = [torch.nn.Parameter(t.clone()) for t in biases]
    F.cross_entropy(forward(x, w, b, None if masked else masks), y).backward()
    if equal_mask:
        for p in w:
            s = p.grad._storage
            p.grad = ms.masked_tensor(s.values, s.mask.clone())
    return w + b


def optimizer_cases(quick: bool = False) -> list[tuple]:
    weights, masks, biases = mlp(0.9, seed=1)
    x = torch.randn(256, SIZES[0]).to(DEVICE)
    y = torch.randint(SIZES[-1], (256,)).to(DEVICE)
    out = []
    for name, kwargs in OPTIMIZERS.items():
        for equal_mask in (False, True):
            mine = getattr(ms.optim, name)(
                _with_grads(weights, masks, biases, x, y, True, equal_mask), **kwargs)
            theirs = getattr(torch.optim, name)(
                _with_grads(weights, masks, biases, x, y, False), foreach=True, **kwargs)
            label = ", gradient mask equal but another tensor" if equal_mask else ""
            out.append((f"{name} step, strided 90% masked MLP weights{label}", _stepper(mine),
                        {"torch foreach": _stepper(theirs)}, {"torch foreach": OPT_TARGET}))
    return out


def issue_cases(quick: bool = False) -> list[tuple]:
    """The large linear, the masked MSE step and the strided add (module docstring)."""
    g = torch.Generator().manual_seed(0)
    n, batch = (256, 16) if quick else (4096, 512)
    w = (torch.randn(n, n, generator=g) / n ** 0.5).to(DEVICE)
    m = (torch.rand(n, n, generator=g) >= 0.9).to(DEVICE)
    x = torch.randn(batch, n, generator=g).to(DEVICE)
    dense = torch.nn.Parameter(w.clone())

    def workaround() -> None:
        dense.grad = None
        F.linear(x, dense * m).sum().backward()

    out = []
    for name, layout in LAYOUTS.items():
        weight_mt = ms.masked_tensor(w.clone(), m)
        weight = torch.nn.Parameter(weight_mt.to_sparse_csr() if layout is torch.sparse_csr
                                    else weight_mt)

        def masked(weight: torch.nn.Parameter = weight) -> None:
            weight.grad = None
            F.linear(x, weight).to_tensor(0).sum().backward()

        out.append((f"linear {n}x{n}, {name}, 90% masked, batch {batch}, fwd+bwd", masked,
                    {"W*M": workaround}, {"W*M": 1.1}))
    users, items, rank = (604, 370, 16) if quick else (6040, 3706, 64)
    ratings = torch.randint(1, 6, (users, items), generator=g).float().to(DEVICE)
    rated = (torch.rand(users, items, generator=g) < 0.045).to(DEVICE)
    r_masked, rated_f = ms.masked_tensor(ratings, rated), rated.float()
    u = torch.randn(users, rank, generator=g).to(DEVICE).requires_grad_()
    v = torch.randn(items, rank, generator=g).to(DEVICE).requires_grad_()

    def mse() -> None:
        u.grad = v.grad = None
        ((r_masked - u @ v.T) ** 2).mean().backward()

    def plain_mse() -> None:
        u.grad = v.grad = None
        (((ratings - u @ v.T) ** 2 * rated_f).sum() / rated_f.sum()).backward()

    out.append((f"masked MSE step {users}x{items}, rank {rank}", mse,
                {"plain recipe": plain_mse}, {"plain recipe": 1.1}))
    side = 400 if quick else 4000
    a, b = (torch.randn(side, side, generator=g).to(DEVICE) for _ in range(2))
    half = (torch.rand(side, side, generator=g) < 0.5).to(DEVICE)
    ma, mb = ms.masked_tensor(a, half), ms.masked_tensor(b, half)
    out.append((f"strided add {side}x{side}", lambda: ma + mb, {"raw op": lambda: a + b},
                {"raw op": 1.3}))
    return out


def cases(quick: bool = False) -> list[tuple]:
    """The train-step cases, the optimizer cases, then the issue's other rows."""
    return step_cases(quick) + optimizer_cases(quick) + issue_cases(quick)


MIN_RUN_TIME = 0.5  # seconds a case (harness.module_main)
SAFE = ("W*M", "torch foreach", "plain recipe", "raw op")  # plain torch: no crash probe


def main() -> None:
    """Print the table: medians and ratios, paired rounds (``--quick``, ``--only TEXT``,
    ``--device DEVICE``)."""
    global DEVICE
    if "--device" in sys.argv:
        at = sys.argv.index("--device")
        DEVICE = torch.device(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    harness.module_main(sys.modules[__name__])


if __name__ == "__main__":
    main()
