"""Training ops against their dense workarounds: attention, broadcasting, embeddings, data.

Each op is timed against the workaround a practitioner would write, in the same
run (ratio = masked_sparse / workaround; below 1 means masked_sparse is faster):

- **attention** over padded sequences (B=8, H=8, T=128, d=64, lengths T/2..T), forward
  and backward: ``softmax(as_masked_tensor(q @ k.mT / sqrt(d), mask), -1) @ v`` against
  ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` (``SDPA``) and the dense
  ``-inf`` recipe; then all three compiled (``torch.compile``, the masked one
  ``fullgraph=True``).
  Targets: <= 1.3x SDPA eager, <= 1.1x compiled. The same through ``ms.attention`` (SDPA
  on the mask, fully masked queries zeroed: Note [Attention through the fused kernel]),
  eager and compiled (``fullgraph=True``). Target: <= 1.3x SDPA.
- **broadcasting a reduction back**: ``mt / mt.sum(1, keepdim=True)`` on a 1M-entry CSR
  matrix against ``mt / mt.sum(1).to_tensor(0).to_dense().unsqueeze(1)`` (the same result
  through a dense divisor), and ``mt - mt.mean(0, keepdim=True)``. Target: <= 1.2x.
- **masked mean-pool of embedding rows**: ``F.embedding_bag(masked_ids, weight,
  mode="mean")`` ((256, 64) ids, 60% specified, a 100k x 64 table) against
  ``F.embedding_bag(flat_ids, weight, offsets, mode="mean")`` with the flat ids and offsets
  given (``flat ids``), and computed from the padded batch in the timed call (``flat ids +
  compaction``: what masked ids do); the gather-then-masked-mean recipe is timed too.
  Target: <= 1.2x ``flat ids + compaction``, the training issue's "selecting the specified
  ids and building offsets counts": the workaround a user writes for a padded batch selects
  and counts in the step. ``flat ids`` (torch's bag alone, the ids compacted beforehand) is
  timed for information.
- **DataLoader** over 2048 MaskedTensor samples (batches of 64) against the same over
  plain ``(data, mask)`` pairs. Target: <= 1.5x.

Run by hand: ``python -m benchmarks.bench_training_ops [--quick]`` (one thread, medians of
paired rounds, Note [Paired rounds] in ``harness.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import masked_sparse as ms
from benchmarks.harness import Case

TITLE = "Training ops: attention, broadcast reductions, embedding bags, DataLoader"
ATTENTION_TARGETS = {"SDPA": 1.3}
COMPILED_TARGETS = {"SDPA compiled": 1.1}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- attention ---------------------------------------------------------------------------------
def attention_inputs(b: int, h: int, t: int, d: int, seed: int = 0) -> tuple[Any, ...]:
    """q, k, v (requiring grad), a padding mask (b, h, t, t) and output weights."""
    g = _gen(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g).requires_grad_() for _ in range(3))
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    real = torch.arange(t)[None, :] < lengths[:, None]
    mask = (real[:, None, :, None] & real[:, None, None, :]).expand(b, h, t, t)
    return q, k, v, mask, torch.randn(b, h, t, d, generator=g)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """The tutorial's attention, as a plain tensor (0 for queries that attend to nothing)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return (torch.softmax(ms.as_masked_tensor(scores, mask), -1) @ v).to_tensor(0)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """The same through ``ms.attention`` (SDPA underneath), as a plain tensor."""
    return ms.attention(q, k, v, mask).to_tensor(0)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def dense_inf(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v


def _train_step(fn: Callable[..., torch.Tensor], inputs: tuple[Any, ...]) -> Callable[[], Any]:
    q, k, v, mask, w = inputs

    def step() -> None:
        out = fn(q, k, v, mask)
        torch.autograd.grad((out * w).sum(), (q, k, v))

    return step


def attention_cases(quick: bool) -> list[Case]:
    shape = (2, 8, 64, 64) if quick else (8, 8, 128, 64)
    inputs = attention_inputs(*shape)
    name = "attention B={} H={} T={} d={} fwd+bwd".format(*shape)
    out = [Case(f"{name}, eager", _train_step(masked_attention, inputs),
                {"SDPA": _train_step(sdpa, inputs), "dense -inf": _train_step(dense_inf, inputs)},
                ATTENTION_TARGETS),
           Case(f"{name}, ms.attention, eager", _train_step(fused_attention, inputs),
                {"SDPA": _train_step(sdpa, inputs), "dense -inf": _train_step(dense_inf, inputs)},
                ATTENTION_TARGETS)]
    try:
        masked_c = torch.compile(masked_attention, fullgraph=True, dynamic=False)
        fused_c = torch.compile(fused_attention, fullgraph=True, dynamic=False)
        sdpa_c = torch.compile(sdpa, dynamic=False)
        dense_c = torch.compile(dense_inf, dynamic=False)
        steps = {"masked": _train_step(masked_c, inputs),
                 "fused": _train_step(fused_c, inputs), "SDPA": _train_step(sdpa_c, inputs),
                 "dense": _train_step(dense_c, inputs)}
        for step in steps.values():  # compile outside the timed region
            step()
        out.append(Case(f"{name}, compiled", steps["masked"],
                        {"SDPA compiled": steps["SDPA"], "dense -inf compiled": steps["dense"]},
                        COMPILED_TARGETS))
        out.append(Case(f"{name}, ms.attention, compiled", steps["fused"],
                        {"SDPA compiled": steps["SDPA"], "dense -inf compiled": steps["dense"]},
                        {"SDPA compiled": ATTENTION_TARGETS["SDPA"]}))
    except Exception as exc:  # noqa: BLE001 -- no compiler here: report, do not end the run
        out.append(Case(f"{name}, compiled", lambda: None,
                        {"SDPA compiled": f"torch.compile failed: {type(exc).__name__}"}))
    return out


# -- broadcasting a reduction back -----------------------------------------------------------
def csr_matrix(rows: int, cols: int, density: float, seed: int = 1) -> ms.MaskedTensor:
    g = _gen(seed)
    data = torch.randn(rows, cols, generator=g) + 3
    mask = torch.rand(rows, cols, generator=g) < density
    return ms.masked_tensor(data, mask).to_sparse_csr()


def broadcast_cases(quick: bool) -> list[Case]:
    rows, cols = (1_000, 1_000) if quick else (10_000, 1_000)
    mt = csr_matrix(rows, cols, 0.1)
    nnz = mt._storage.values.numel()

    def dense_sum(dim: int) -> torch.Tensor:
        return mt.sum(dim).to_tensor(0).to_dense().unsqueeze(dim)

    def dense_mean(dim: int) -> torch.Tensor:
        return mt.mean(dim).to_tensor(0).to_dense().unsqueeze(dim)

    return [
        Case(f"mt / mt.sum(1, keepdim=True), CSR {nnz:,} entries",
             lambda: mt / mt.sum(1, keepdim=True),
             {"dense divisor": lambda: mt / dense_sum(1)}, {"dense divisor": 1.2}),
        Case(f"mt - mt.mean(0, keepdim=True), CSR {nnz:,} entries",
             lambda: mt - mt.mean(0, keepdim=True),
             {"dense divisor": lambda: mt - dense_mean(0)}, {"dense divisor": 1.2}),
    ]


# -- embedding bags ----------------------------------------------------------------------------
def embedding_cases(quick: bool) -> list[Case]:
    bags, length, rows, dim = (64, 32, 10_000, 64) if quick else (256, 64, 100_000, 64)
    g = _gen(2)
    weight = torch.randn(rows, dim, generator=g)
    ids = torch.randint(rows, (bags, length), generator=g)
    mask = torch.rand(bags, length, generator=g) < 0.6
    masked_ids = ms.masked_tensor(torch.where(mask, ids, -1), mask)
    csr_ids = masked_ids.to_sparse_csr()
    flat = ids[mask]
    counts = mask.sum(1)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])

    def flat_bag() -> torch.Tensor:
        return F.embedding_bag(flat, weight, offsets, mode="mean")

    def flat_bag_from_padded() -> torch.Tensor:  # the workaround, compaction included
        c = mask.sum(1)
        off = torch.zeros(bags, dtype=torch.long)
        torch.cumsum(c[:-1], 0, out=off[1:])
        return F.embedding_bag(torch.masked_select(ids, mask), weight, off, mode="mean")

    def gather_mean() -> torch.Tensor:  # the recipe before masked ids: gather, masked mean
        rows_ = F.embedding(torch.where(mask, ids, 0), weight)
        return ms.masked_tensor(rows_, mask[..., None].expand_as(rows_)).mean(1).to_tensor(0)

    name = f"embedding_bag mean, ({bags}, {length}) ids, {rows:,} x {dim} table"
    return [
        Case(f"{name}, strided ids", lambda: F.embedding_bag(masked_ids, weight, mode="mean"),
             {"flat ids": flat_bag, "flat ids + compaction": flat_bag_from_padded,
              "gather + masked mean": gather_mean}, {"flat ids + compaction": 1.2}),
        Case(f"{name}, CSR ids", lambda: F.embedding_bag(csr_ids, weight, mode="mean"),
             {"flat ids": flat_bag, "flat ids + compaction": flat_bag_from_padded},
             {"flat ids + compaction": 1.2}),
    ]


# -- DataLoader --------------------------------------------------------------------------------
class Samples(Dataset):
    """``n`` samples: MaskedTensors (``masked=True``) or plain ``(data, mask)`` pairs."""

    def __init__(self, n: int, shape: tuple[int, ...], masked: bool, sparse: bool = False,
                 seed: int = 3) -> None:
        g = _gen(seed)
        self.items: list[Any] = []
        for _ in range(n):
            data = torch.randn(shape, generator=g)
            mask = torch.rand(shape, generator=g) < 0.7
            if not masked:
                self.items.append((data, mask))
                continue
            mt = ms.masked_tensor(data, mask)
            self.items.append(mt.to_sparse_coo() if sparse else mt)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def _epoch(loader: DataLoader) -> Callable[[], None]:
    def run() -> None:
        for _ in loader:
            pass

    return run


def loader_cases(quick: bool) -> list[Case]:
    n, batch = (256, 64) if quick else (2048, 64)
    out = []
    for shape in ((128,), (32, 16)):
        plain = _epoch(DataLoader(Samples(n, shape, masked=False), batch_size=batch))
        masked = _epoch(DataLoader(Samples(n, shape, masked=True), batch_size=batch))
        coo = _epoch(DataLoader(Samples(n, shape, masked=True, sparse=True), batch_size=batch))
        label = f"DataLoader epoch, {n} samples {shape}, batch {batch}"
        out.append(Case(f"{label}, strided", masked, {"(data, mask) pairs": plain},
                        {"(data, mask) pairs": 1.5}))
        out.append(Case(f"{label}, sparse COO", coo, {"(data, mask) pairs": plain}))
    return out


def cases(quick: bool = False) -> list[Case]:
    """Every row: attention, broadcasting, embedding bags, DataLoader."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's CSR "beta" warnings
        return (broadcast_cases(quick) + embedding_cases(quick) + loader_cases(quick)
                + attention_cases(quick))


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
