"""``sync_grads`` and data-parallel training on gloo, against single-process references.

One group of 2 processes runs every gradient form through ``sync_grads`` (both exchange
methods) and then trains a small recommender three ways -- ``msd.DistributedDataParallel``,
torch's DDP with the ``split_for_ddp`` recipe, and ``sync_grads`` alone -- returning the
parameters; one group of 4 processes runs the gradient table once more. The references are
computed here: the dense mean of all ranks' gradients, and one process trained on the whole
batch.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, make_masked
from dist_harness import run_ranks
from torch import nn

import masked_sparse as ms

ROWS, DIM = 12, 3
MASKED_LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
                  "csc": torch.sparse_csc, "bsr": torch.sparse_bsr}
GRAD_CASES = ["dense", "embedding", "embedding_bag", "hybrid_coo"] + [
    f"masked_{lay}" for lay in MASKED_LAYOUTS]


def rank_grads(rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Each case's parameter and this rank's gradient; rank 1 has None or nothing stored."""
    g = torch.Generator().manual_seed(10 + rank)
    torch.manual_seed(10 + rank)                # the embeddings' initial weights
    out = {}
    p = nn.Parameter(torch.zeros(ROWS, DIM, dtype=torch.float64))
    out["dense"] = (p, None if rank == 1 else torch.randn(ROWS, DIM, generator=g,
                                                         dtype=torch.float64))
    for name, mod in (("embedding", nn.Embedding(ROWS, DIM, sparse=True)),
                      ("embedding_bag", nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True))):
        ids = torch.randint(0, ROWS, (0 if rank == 1 else 5 + 3 * rank,), generator=g)
        if name == "embedding":
            mod(ids).pow(2).sum().backward()      # uncoalesced, hybrid; empty on rank 1
        else:
            mod(ids, torch.tensor([0])).pow(2).sum().backward()
        out[name] = (mod.weight, mod.weight.grad)
    rows = torch.randint(0, ROWS, (4 + rank,), generator=g)
    coo = torch.sparse_coo_tensor(rows[None], torch.randn(rows.numel(), DIM, generator=g),
                                  (ROWS, DIM))   # uncoalesced (repeated rows), hybrid
    out["hybrid_coo"] = (nn.Parameter(torch.zeros(ROWS, DIM)), None if rank == 1 else coo)
    for lay, layout in MASKED_LAYOUTS.items():
        param = make_masked((ROWS, DIM), torch.strided, seed=1, density=1.0)[0]
        grad = make_masked((ROWS, DIM), torch.sparse_coo if lay != "strided" else torch.strided,
                           seed=20 + rank, density=0.0 if rank == 1 else 0.4)[0]
        grad = ms.to_layout(grad, layout, **({"blocksize": (3, 3)} if lay == "bsr" else {}))
        out[f"masked_{lay}"] = (param.requires_grad_(), None if rank == 1 and lay == "coo"
                                else grad)
    return out


def _set_grads(cases):
    params = []
    for p, grad in cases.values():
        p.grad = grad
        params.append(p)
    return params


# -- the recommender -------------------------------------------------------------------------
ITEMS, BATCH, STEPS = 40, 16, 3


class Recommender(nn.Module):
    """Sparse item embeddings, a masked (pruned) gate, and an MLP."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.items = nn.EmbeddingBag(ITEMS, 8, mode="mean", sparse=True)
        keep = torch.arange(8) % 3 != 0
        self.gate = nn.Parameter(ms.masked_tensor(torch.rand(8) + 0.5, keep))
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.items(ids, offsets) * self.gate.to_tensor(0)).squeeze(1)


def batch(step: int, lo: int = 0, hi: int = BATCH):
    """Samples ``lo:hi`` of step ``step``'s batch: 3 item ids per sample and a rating."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, ITEMS, (BATCH, 3), generator=g)[lo:hi]
    y = torch.rand(BATCH, generator=g)[lo:hi]
    return ids.reshape(-1), torch.arange(0, ids.numel(), 3), y


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.to_tensor(0) if isinstance(p, ms.MaskedTensor) else p).detach().clone()
            for n, p in model.named_parameters()}


def train(model, forward, rank: int = 0, world: int = 1, after_backward=lambda: None):
    opt = ms.optim.Adagrad(model.parameters(), lr=0.5)
    per = BATCH // world
    for step in range(STEPS):
        ids, offsets, y = batch(step, rank * per, (rank + 1) * per)
        opt.zero_grad()
        nn.functional.mse_loss(forward(ids, offsets), y).backward()
        after_backward()
        opt.step()


def training_worker(rank: int, world: int) -> dict:
    import masked_sparse.distributed as msd

    out = {}
    for method in ("gather", "dense"):
        cases = rank_grads(rank)
        msd.sync_grads(_set_grads(cases), method=method)
        out["sync", method] = {name: p.grad for name, (p, _) in cases.items()}
    if world > 2:
        return out
    model = Recommender()
    ddp = msd.DistributedDataParallel(model)
    train(model, ddp, rank, world)
    out["train", "msd.DistributedDataParallel"] = state(model)

    model = Recommender()
    sparse = msd.split_for_ddp(model)
    msd.broadcast_parameters(sparse)
    ddp = nn.parallel.DistributedDataParallel(model)
    train(model, ddp, rank, world, lambda: msd.sync_grads(sparse))
    out["train", "split_for_ddp"] = state(model)

    model = Recommender()
    train(model, model, rank, world, lambda: msd.sync_grads(model.parameters()))
    out["train", "sync_grads"] = state(model)
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2proc", "4proc"])
def trained(request):
    world = request.param
    return world, run_ranks(training_worker, world)


def _reference_grad(name: str, world: int):
    """The dense mean over ranks (None / unstored = 0) and the union of stored positions."""
    total, union = None, None
    for r in range(world):
        grad = rank_grads(r)[name][1]
        if grad is None:
            continue
        if isinstance(grad, ms.MaskedTensor):
            s = grad._storage
            mask = s.densify(s.mask, False)
            data = torch.where(mask, s.densify(s.values, 0), 0)
        elif grad.layout == torch.strided:
            data, mask = grad, torch.ones_like(grad, dtype=torch.bool)
        else:
            data = grad.to_dense()
            c = grad.coalesce()
            ones = torch.ones_like(c.values(), dtype=torch.bool)
            mask = torch.sparse_coo_tensor(c.indices(), ones, c.shape).to_dense()
        total = data if total is None else total + data
        union = mask if union is None else union | mask
    return total / world, union


@pytest.mark.parametrize("method", ["gather", "dense"])
@pytest.mark.parametrize("name", GRAD_CASES)
def test_sync_grads(trained, name, method):
    world, results = trained
    ref, union = _reference_grad(name, world)
    for r in range(world):
        grad = results[r]["sync", method][name]
        if name.startswith("masked_"):
            check_invariants(grad, MASKED_LAYOUTS[name[7:]])
            assert_masked_equal(grad, ref, union)
        elif name == "dense":
            torch.testing.assert_close(grad, ref)
        else:   # torch sparse stays sparse, coalesced, storing the union of the ranks' rows
            assert grad.layout == torch.sparse_coo and grad.is_coalesced()
            assert grad.sparse_dim() == 1
            stored = torch.zeros(ROWS, dtype=torch.bool)
            stored[grad.indices()[0]] = True
            assert torch.equal(stored, union.any(1))
            torch.testing.assert_close(grad.to_dense(), ref)


@pytest.fixture(scope="module")
def single_process() -> dict[str, torch.Tensor]:
    model = Recommender()
    train(model, model)
    return state(model)


@pytest.mark.parametrize("how", ["msd.DistributedDataParallel", "split_for_ddp", "sync_grads"])
def test_data_parallel_training_equals_one_process(trained, single_process, how):
    world, results = trained
    if world != 2:
        pytest.skip("training runs on the 2-process group only")
    for r in range(world):
        got = results[r]["train", how]
        assert got.keys() == single_process.keys()
        for name, ref in single_process.items():
            torch.testing.assert_close(got[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(single_process["items.weight"], Recommender().items.weight)
