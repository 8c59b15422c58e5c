"""One optimizer step: ms.optim against torch.optim -- sparse embedding, masked weights, MLP.

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
Targets: <= 1.2x torch on hybrid COO, <= 0.5x torch on 2-D COO and CSR for the
stateful optimizers; SGD <= 1.0x torch on both COO forms (on the CPU it is torch's own
``add_``, Note [SGD without state]). Every step mutates the shared weight and the
optimizers' states; the work per step does not depend on their values.

**Masked weights.** The 784-512-512-10 MLP of ``bench_training.py`` with its three weights
masked (90% of each weight unspecified, a fixed random mask) and plain biases, gradients of
one backward, against the ``torch.optim`` class with ``foreach=True`` on the dense weights
and biases (Target <= 1.2x):

- ``strided, equal mask``: each weight's gradient has a mask equal to the weight's but
  another tensor, kept from step to step (a gradient set by hand, or rebuilt over the
  same mask): compared once (Note [Equal masks without a host sync]);
- ``strided, equal mask, new tensor``: new gradient tensors every step, values and an
  equal mask (after a collective): compared at every step (the copies are timed on both
  sides);
- ``strided, autograd``: the gradient shares the weight's mask (the reference point);
- ``COO`` / ``CSR``: sparse masked weights with autograd's gradients, and (``equal
  pattern``) over equal index and mask tensors that are other objects.

**Dense.** A 40-parameter MLP (20 ``Linear(64, 64)`` layers) with dense gradients, every
optimizer at its defaults against the torch.optim class with the same arguments (which
on CPU loops over the parameters; ms.optim hands them to torch's multi-tensor path,
Note [Dense gradients]). Target: <= 1.2x torch.

Run by hand: ``python -m benchmarks.bench_optim [--quick] [--only TEXT] [--device cuda]``
(or through ``benchmarks/run.py``); one thread on the CPU.
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

TITLE = ("Optimizer step: 1M x 64 embedding (1% of rows in the gradient), masked MLP weights, "
         "40-parameter MLP")
ROWS, DIM, TOUCHED, LOOKUPS = 1_000_000, 64, 10_000, 12_000
TARGETS = {"hybrid COO": 1.2, "2-D COO": 0.5, "CSR": 0.5}
SGD_TARGETS = {"hybrid COO": 1.0, "2-D COO": 1.0}
LAYERS, WIDTH, DENSE_TARGET = 20, 64, 1.2
SIZES, MASKED, MASKED_TARGET = (784, 512, 512, 10), 0.9, 1.2
MASKED_OPTIMIZERS = {"Adam": dict(lr=1e-3), "AdamW": dict(lr=1e-3),
                     "SGD": dict(lr=1e-3, momentum=0.9), "Adagrad": dict(lr=1e-3)}
DEVICE = torch.device("cpu")  # ``--device``


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
        masked_csr = ms.masked_tensor(csr.to(DEVICE), csr_mask.to(DEVICE))
    return {"hybrid COO": hybrid.to(DEVICE), "2-D COO": coo2d.to(DEVICE), "CSR": masked_csr,
            "flat": ((index[0] * DIM + index[1]).to(DEVICE), v.reshape(-1).to(DEVICE))}


def _stepper(opt: torch.optim.Optimizer, weight: torch.Tensor, grad: Any) -> Callable[[], Any]:
    def step() -> None:
        weight.grad = grad
        opt.step()

    return step


def sparse_cases() -> list[tuple]:
    """``(name, ms_fn, {baseline: fn}, {baseline: target})`` for each optimizer x form."""
    weight = torch.nn.Parameter(torch.randn(ROWS, DIM, device=DEVICE))
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


# -- masked weights --------------------------------------------------------------------------
def _mlp(seed: int = 1) -> tuple[list, list, list, torch.Tensor, torch.Tensor]:
    """Dense weights, keep-masks (``MASKED`` of each is False), zero biases, a batch."""
    g = torch.Generator().manual_seed(seed)
    weights, masks, biases = [], [], []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        weights.append((torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(DEVICE))
        masks.append((torch.rand(n_out, n_in, generator=g) >= MASKED).to(DEVICE))
        biases.append(torch.zeros(n_out, device=DEVICE))
    x = torch.randn(256, SIZES[0], generator=g).to(DEVICE)
    y = torch.randint(SIZES[-1], (256,), generator=g).to(DEVICE)
    return weights, masks, biases, x, y


def _backward(weights: list, biases: list, x: torch.Tensor, y: torch.Tensor,
              masks: list | None = None) -> None:
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = torch.nn.functional.linear(h, w if masks is None else w * masks[i], b)
        h = torch.relu(h) if i < len(weights) - 1 else h
    h = h.to_tensor(0) if ms.is_masked_tensor(h) else h
    torch.nn.functional.cross_entropy(h, y).backward()


def _other_pattern(grad: ms.MaskedTensor) -> ms.MaskedTensor:
    """``grad`` over index and mask tensors equal to its own but other objects."""
    s = grad._storage
    copy = s.layout.build(tuple(t.clone() for t in s.index), s.values, s.mask.clone(), s.shape)
    return ms.masked_tensor(s.layout.to_torch(copy, copy.values),
                            s.layout.to_torch(copy, copy.mask))


def _masked_params(layout: torch.layout, pattern: str) -> list:
    """The MLP's masked weights and plain biases holding one backward's gradients;
    ``pattern`` says how the weights' gradients relate to their patterns."""
    weights, masks, biases, x, y = _mlp()
    w = [torch.nn.Parameter(ms.to_layout(ms.masked_tensor(t.clone(), m), layout))
         for t, m in zip(weights, masks)]
    b = [torch.nn.Parameter(t.clone()) for t in biases]
    _backward(w, b, x, y)
    if pattern != "autograd":
        for p in w:
            p.grad = _other_pattern(p.grad)
    return w + b


def _dense_params() -> list:
    weights, masks, biases, x, y = _mlp()
    params = [torch.nn.Parameter(t.clone()) for t in weights + biases]
    _backward(params[:len(weights)], params[len(weights):], x, y, masks)
    return params


def _fresh_masks(opt: torch.optim.Optimizer, params: list) -> Callable[[], None]:
    """A step whose masked gradients are new tensors first (values and an equal mask), as
    a collective returns them."""
    grads = [(p, p.grad._storage) for p in params if ms.is_masked_tensor(p)]

    def step() -> None:
        with torch.no_grad():
            for p, s in grads:
                p.grad = ms.as_masked_tensor(s.values.clone(), s.mask.clone())
        opt.step()

    return step


def _with_copies(opt: torch.optim.Optimizer, params: list, masks: list) -> Callable[[], None]:
    """torch's step after the copies the masked side makes: new gradients, new masks."""
    weights = params[:len(masks)]

    def step() -> None:
        for w, m in zip(weights, masks):
            w.grad = w.grad.clone()
            m.clone()
        opt.step()

    return step


def masked_cases() -> list[tuple]:
    """ms.optim over the MLP's masked weights against torch.optim on the dense ones."""
    out = []
    masks = _mlp()[1]
    rows = [("strided, equal mask", torch.strided, "equal", MASKED_OPTIMIZERS),
            ("strided, equal mask, new tensor", torch.strided, "new",
             {"Adam": dict(lr=1e-3), "SGD": dict(lr=1e-3, momentum=0.9)}),
            ("strided, autograd", torch.strided, "autograd", {"Adam": dict(lr=1e-3)}),
            ("COO", torch.sparse_coo, "autograd", MASKED_OPTIMIZERS),
            ("COO, equal pattern", torch.sparse_coo, "equal", {"Adam": dict(lr=1e-3)}),
            ("CSR", torch.sparse_csr, "autograd", MASKED_OPTIMIZERS),
            ("CSR, equal pattern", torch.sparse_csr, "equal", {"Adam": dict(lr=1e-3)})]
    for label, layout, pattern, optimizers in rows:
        for name, kwargs in optimizers.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                params = _masked_params(layout, pattern)
            dense = _dense_params()
            mine = getattr(ms.optim, name)(params, **kwargs)
            theirs = getattr(torch.optim, name)(dense, foreach=True, **kwargs)
            fn, base = mine.step, theirs.step
            if pattern == "new":
                fn, base = _fresh_masks(mine, params), _with_copies(theirs, dense, masks)
            out.append((f"{name} step, {label}, {MASKED:.0%} masked MLP weights", fn,
                        {"torch foreach": base}, {"torch foreach": MASKED_TARGET}))
    return out


def dense_cases() -> list[tuple]:
    """ms.optim against torch.optim on a 40-parameter MLP's dense gradients."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    params = [p.to(DEVICE).detach().requires_grad_() for p in model.parameters()]
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
    """The sparse embedding cases, the masked weights, then the dense MLP cases."""
    return sparse_cases() + masked_cases() + dense_cases()


SAFE = ("torch", "torch foreach", "floor")  # plain torch baselines: no crash probe


def main() -> None:
    """Print the table: medians and ratios, paired rounds (``--quick``, ``--only TEXT``,
    ``--device cuda``)."""
    import argparse

    global DEVICE
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing (0.05 s a case)")
    parser.add_argument("--only", help="the cases whose name contains this text")
    parser.add_argument("--device", default="cpu", help="where the tensors live (cpu, cuda)")
    args = parser.parse_args()
    DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    title = TITLE + ("" if DEVICE.type == "cpu" else f", on {DEVICE}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        harness.run_cases(cases(args.quick), title, min_run_time=0.05 if args.quick else 0.3,
                          only=args.only, safe=SAFE, use_probe=DEVICE.type == "cpu")


if __name__ == "__main__":
    main()
