"""A matrix-factorisation training step: the masked sampled product against the usual recipes.

The data is MovieLens-like: 6040 users x 3706 items, about a million ratings (1 to 5) held as
a ``scipy.sparse.csr_array``, users' activity and items' popularity both power laws; rank 64.
One step = forward, a masked MSE over the specified ratings, backward, one optimizer step:

- **masked_sparse**: ``R = ms.from_scipy(A)`` (CSR, or COO), ``pred =
  torch.sparse.sampled_addmm(R, U, V.T, beta=0.0)``, ``F.mse_loss(pred, R)``; ``U`` and ``V``
  are plain parameters with plain gradients, stepped by ``torch.optim``;
- **gather** (the usual PyTorch recipe): ``nn.Embedding(sparse=True)`` for users and items,
  ``(P(u) * Q(i)).sum(-1)`` over the rating pairs, ``F.mse_loss``, ``SparseAdam`` (with
  Adam) or sparse ``Adagrad``;
- **dense**: the whole ``U @ V.T``, the squared error where a rating exists, its mean, Adam
  or Adagrad on the dense gradients;
- **workaround**: what a user wrote before the masked sampled product existed,
  ``ms.as_masked_tensor(torch.sparse.sampled_addmm(R.get_data(), U, V.T, beta=0.0),
  R.get_mask())``.

Target: the masked step <= 0.5x the gather recipe's time. Run by hand:
``python -m benchmarks.bench_recommender [--device cuda] [--quick]`` (``--quick``: a
1/10-scale matrix); one thread, medians of paired rounds (benchmarks/harness.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # ``python benchmarks/bench_recommender.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import masked_sparse as ms  # noqa: E402
from benchmarks import harness  # noqa: E402

TITLE = "Matrix factorisation step (1M ratings, rank 64): sampled product vs gather / dense"
USERS, ITEMS, RATINGS, RANK = 6040, 3706, 1_000_000, 64
TARGET = 0.5  # masked step / gather recipe
MIN_RUN_TIME = 0.5
SAFE = ("gather", "dense", "workaround")  # plain torch baselines: no crash probe


def ratings(scale: float = 1.0, seed: int = 0):
    """A MovieLens-like ``scipy.sparse.csr_array`` of ratings 1..5 (power-law users and
    items)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    users, items = max(2, int(USERS * scale)), max(2, int(ITEMS * scale))
    activity = 1.0 / np.arange(1, users + 1) ** 0.8
    counts = np.clip(np.round(activity / activity.sum() * RATINGS * scale * scale), 1, items)
    popularity = 1.0 / np.arange(1, items + 1) ** 0.7
    popularity /= popularity.sum()
    cols = [rng.choice(items, int(c), replace=False, p=popularity) for c in counts]
    rows = np.repeat(np.arange(users), counts.astype(int))
    values = rng.integers(1, 6, rows.size).astype(np.float32)
    return sp.csr_array((values, (rows, np.concatenate(cols))), shape=(users, items))


def _factors(shape: tuple[int, int], device: torch.device, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(shape[0], RANK, generator=g) * 0.1
    v = torch.randn(shape[1], RANK, generator=g) * 0.1
    return torch.nn.Parameter(u.to(device)), torch.nn.Parameter(v.to(device))


def _optimizer(name: str, params: list, sparse: bool = False) -> torch.optim.Optimizer:
    if name == "Adam":
        return (torch.optim.SparseAdam if sparse else torch.optim.Adam)(params, lr=0.01)
    return torch.optim.Adagrad(params, lr=0.05)


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cpu":
        return lambda: None
    module = getattr(torch, device.type)
    return module.synchronize


def masked_step(r: ms.MaskedTensor, optimizer: str, device: torch.device) -> Callable[[], None]:
    u, v = _factors(tuple(r.shape), device)
    opt = _optimizer(optimizer, [u, v])
    sync = _sync(device)

    def step() -> None:
        pred = torch.sparse.sampled_addmm(r, u, v.T, beta=0.0)
        F.mse_loss(pred, r).backward()
        opt.step()
        opt.zero_grad()
        sync()

    return step


def workaround_step(r: ms.MaskedTensor, optimizer: str,
                    device: torch.device) -> Callable[[], None]:
    u, v = _factors(tuple(r.shape), device)
    opt = _optimizer(optimizer, [u, v])
    data, mask = r.get_data(), r.get_mask()
    sync = _sync(device)

    def step() -> None:
        pred = ms.as_masked_tensor(torch.sparse.sampled_addmm(data, u, v.T, beta=0.0), mask)
        F.mse_loss(pred, r).backward()
        opt.step()
        opt.zero_grad()
        sync()

    return step


def gather_step(a, optimizer: str, device: torch.device) -> Callable[[], None]:
    coo = a.tocoo()
    users = torch.from_numpy(coo.row.astype(np.int64)).to(device)
    items = torch.from_numpy(coo.col.astype(np.int64)).to(device)
    target = torch.from_numpy(coo.data).to(device)
    u, v = _factors(a.shape, device)
    p = torch.nn.Embedding.from_pretrained(u.detach(), freeze=False, sparse=True)
    q = torch.nn.Embedding.from_pretrained(v.detach(), freeze=False, sparse=True)
    opt = _optimizer(optimizer, list(p.parameters()) + list(q.parameters()), sparse=True)
    sync = _sync(device)

    def step() -> None:
        pred = (p(users) * q(items)).sum(-1)
        F.mse_loss(pred, target).backward()
        opt.step()
        opt.zero_grad()
        sync()

    return step


def dense_step(a, optimizer: str, device: torch.device) -> Callable[[], None]:
    dense = torch.from_numpy(a.toarray()).to(device)
    mask = torch.from_numpy(a.toarray() != 0).to(device)  # (ratings are 1..5)
    count = mask.sum()
    u, v = _factors(a.shape, device)
    opt = _optimizer(optimizer, [u, v])
    sync = _sync(device)

    def step() -> None:
        err = torch.where(mask, u @ v.T - dense, 0)
        ((err * err).sum() / count).backward()
        opt.step()
        opt.zero_grad()
        sync()

    return step


def cases(quick: bool = False, device: str = "cpu") -> list[tuple]:
    dev = torch.device(device)
    a = ratings(0.1 if quick else 1.0)
    out = []
    for layout in ("csr", "coo"):
        r = ms.from_scipy(a, layout=layout)
        r = ms.masked_tensor(r.get_data().to(dev), r.get_mask().to(dev)) if dev.type != "cpu" \
            else r
        for optimizer in ("Adam", "Adagrad"):
            baselines = {"gather": gather_step(a, optimizer, dev),
                         "dense": dense_step(a, optimizer, dev)}
            if layout == "csr":
                baselines["workaround"] = workaround_step(r, optimizer, dev)
            out.append((f"MF step, {layout.upper()}, {optimizer}, {a.nnz} ratings, {dev.type}",
                        masked_step(r, optimizer, dev), baselines, {"gather": TARGET}))
    return out


def main() -> None:
    harness.module_main(sys.modules[__name__])


if __name__ == "__main__":
    main()
