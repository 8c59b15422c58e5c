"""``masked_sparse.distributed`` on 2 and 4 gloo processes, against single-process references.

Process start-up costs seconds, so one group of processes per world size (2 and 4) runs
everything -- every collective x layout x op x dtype (uneven numbers of stored elements, one
rank with nothing stored), every gradient form through ``sync_grads``, and (on 2 processes)
a recommender trained three data-parallel ways -- and returns every rank's results; the tests
assert on them against references computed here from all ranks' inputs (dense
``torch.where`` arithmetic, one process trained on the whole batch). Inputs are rebuilt from
``(case, rank)`` seeds on both sides, so only results cross the process boundary.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import FLOAT_DTYPES, assert_masked_equal, check_invariants, make_masked
from dist_harness import run_ranks
from torch import nn

import masked_sparse as ms

WORLDS = {2: FLOAT_DTYPES, 4: [torch.float32]}   # 4 processes on 2 cores: one dtype


LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
           "csc": torch.sparse_csc, "bsr": torch.sparse_bsr}
OPS = ["sum", "mean", "prod", "amax", "amin"]
SHAPE = (6, 4)
DENSITY = [0.5, 0.0, 0.15, 0.9]   # rank 1 specifies nothing (and stores nothing)


def rank_input(layout: str, dtype: torch.dtype, rank: int, seed: int = 0):
    """Rank ``rank``'s MaskedTensor and its dense (data, mask): uneven nnz, rank 1 empty."""
    density = DENSITY[rank % len(DENSITY)]
    mt, data, mask = make_masked(SHAPE, torch.sparse_coo if layout != "strided" else torch.strided,
                                 dtype, density=density, seed=100 * seed + rank,
                                 stored_masked=0.2 if density else 0.0)
    if layout in ("csr", "csc"):
        mt = ms.to_layout(mt, LAYOUTS[layout])
    elif layout == "bsr":
        mt = ms.to_layout(mt, torch.sparse_bsr, blocksize=(2, 2))
    return mt, data, mask


def reference(op: str, inputs: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked reduction over ranks, densely: specified iff some rank specifies."""
    data = torch.stack([d for _, d, _ in inputs])
    mask = torch.stack([m for _, _, m in inputs])
    fill = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -math.inf, "amin": math.inf}[op]
    x = torch.where(mask, data, torch.tensor(fill, dtype=data.dtype))
    count = mask.sum(0)
    if op == "sum":
        out = x.sum(0)
    elif op == "mean":
        out = x.sum(0) / count.clamp(min=1)
    elif op == "prod":
        out = x.prod(0)
    else:
        out = getattr(x, op)(0)
    return out, count > 0


CASES = [(lay, dt) for lay in LAYOUTS for dt in FLOAT_DTYPES]
WIRE_CASES = [(lay, dt) for lay in ("strided", "coo") for dt in (torch.bool, torch.complex64)]
METHODS = ["gather", "dense", "auto"]


def collectives_worker(rank: int, world: int) -> dict:
    """Every collective on every (layout, dtype): results keyed by case."""
    import torch.distributed as dist

    import masked_sparse.distributed as msd

    out = {}
    for lay, dt in CASES:
        if dt not in WORLDS[world]:
            continue
        mt = rank_input(lay, dt, rank)[0]
        for op in OPS:
            for method in METHODS if op == "sum" else METHODS[:2]:
                out["all_reduce", lay, dt, op, method] = msd.all_reduce(mt, op, method=method)
        out["all_gather", lay, dt] = msd.all_gather(mt)
        out["gather", lay, dt] = msd.gather(mt, dst=world - 1)
        out["broadcast", lay, dt] = [msd.broadcast(mt, src) for src in range(world)]
        sent = [rank_input(lay, dt, r, seed=1)[0] for r in range(world)] if rank == 0 else None
        out["scatter", lay, dt] = msd.scatter(sent, mt, src=0)
        # torch.distributed's own calls, in place
        mine = rank_input(lay, dt, rank)[0]     # a fresh copy: written in place
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        out["dist.all_reduce", lay, dt] = mine
        mine = rank_input(lay, dt, rank)[0]
        work = dist.broadcast(mine, src=0, async_op=True)
        work.wait()
        out["dist.broadcast", lay, dt] = mine
        outs = [rank_input(lay, dt, 0)[0] for _ in range(world)]
        dist.all_gather(outs, mt)
        out["dist.all_gather", lay, dt] = outs
        outs = [rank_input(lay, dt, 0)[0] for _ in range(world)] if rank == 0 else None
        dist.gather(rank_input(lay, dt, rank)[0], outs, dst=0)
        out["dist.gather", lay, dt] = outs
        mine = rank_input(lay, dt, rank)[0]
        dist.scatter(mine, sent, src=0)
        out["dist.scatter", lay, dt] = mine
    # parameters that differ by rank, overwritten in place by rank world // 2's (each rank's
    # are the inputs of rank + 2: the source's specify something in every world)
    params = [nn.Parameter(rank_input(lay, torch.float32, rank + 2, seed=2)[0])
              for lay in LAYOUTS]
    params.append(nn.Parameter(torch.full((3,), float(rank))))
    msd.broadcast_parameters(params, src=world // 2)
    out["broadcast_parameters"] = [(p, isinstance(p, nn.Parameter) and p.requires_grad)
                                   for p in params]
    for lay, dt in WIRE_CASES:   # values that travel as uint8 / real pairs
        mt = rank_input(lay, dt, rank)[0]
        out["broadcast", lay, dt] = [msd.broadcast(mt, src) for src in range(world)]
        sent = [rank_input(lay, dt, r, seed=1)[0] for r in range(world)] if rank == 0 else None
        out["scatter", lay, dt] = msd.scatter(sent, mt, src=0)
    return out


@functools.cache
def results(world: int) -> list[dict]:
    """Every rank's results of :func:`worker` on ``world`` gloo processes (spawned once)."""
    return run_ranks(worker, world)


def worker(rank: int, world: int) -> dict:
    return {**collectives_worker(rank, world), **training_worker(rank, world)}


COLLECTIVE_CASES = [(w, lay, dt) for w, dts in WORLDS.items() for lay in LAYOUTS for dt in dts]
COLLECTIVE_IDS = [f"{w}proc-{lay}-{str(dt)[6:]}" for w, lay, dt in COLLECTIVE_CASES]


def _inputs(lay, dt, world, seed=0):
    return [rank_input(lay, dt, r, seed) for r in range(world)]


def _check(mt, data, mask, lay):
    check_invariants(mt, LAYOUTS[lay])
    assert_masked_equal(mt, data, mask, rtol=1e-6 if mt.dtype == torch.float64 else 1e-5,
                        atol=1e-6)


@pytest.mark.parametrize("op,method", [(op, m) for op in OPS for m in METHODS
                                       if op == "sum" or m != "auto"])
@pytest.mark.parametrize("world,lay,dt", COLLECTIVE_CASES, ids=COLLECTIVE_IDS)
def test_all_reduce(world, lay, dt, op, method):
    results_ = results(world)
    ref = reference(op, _inputs(lay, dt, world))
    for r in range(world):
        _check(results_[r]["all_reduce", lay, dt, op, method], *ref, lay)
    if lay != "strided":   # coalesced: the result stores exactly the specified union
        s = results_[0]["all_reduce", lay, dt, op, method]._storage
        assert s.layout.to_coo(s).values.shape[0] == int(ref[1].sum()) or lay == "bsr"


@pytest.mark.parametrize("world,lay,dt", COLLECTIVE_CASES, ids=COLLECTIVE_IDS)
def test_gather_broadcast_scatter(world, lay, dt):
    results_ = results(world)
    inputs = _inputs(lay, dt, world)
    for r in range(world):
        res = results_[r]
        gathered = res["all_gather", lay, dt]
        assert len(gathered) == world
        for g, (mt, data, mask) in zip(gathered, inputs):
            _check(g, data, mask, lay)
            # each rank's own entries, stored-but-unspecified ones included
            assert g._storage.values.shape == mt._storage.values.shape
        on_dst = res["gather", lay, dt]
        if r == world - 1:
            for g, (_, data, mask) in zip(on_dst, inputs):
                _check(g, data, mask, lay)
        else:
            assert on_dst is None
        for src, b in enumerate(res["broadcast", lay, dt]):
            _check(b, inputs[src][1], inputs[src][2], lay)
        _, data, mask = rank_input(lay, dt, r, seed=1)
        _check(res["scatter", lay, dt], data, mask, lay)


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("lay,dt", WIRE_CASES, ids=[f"{lay}-{str(dt)[6:]}"
                                                    for lay, dt in WIRE_CASES])
def test_broadcast_scatter_of_bool_and_complex_values(world, lay, dt):
    results_ = results(world)
    inputs = _inputs(lay, dt, world)
    for r in range(world):
        for src, b in enumerate(results_[r]["broadcast", lay, dt]):
            assert b.dtype == dt
            _check(b, inputs[src][1], inputs[src][2], lay)
        _check(results_[r]["scatter", lay, dt], *rank_input(lay, dt, r, seed=1)[1:], lay)


@pytest.mark.parametrize("world", list(WORLDS))
def test_broadcast_parameters(world):
    src = world // 2
    for r in range(world):
        *masked, (dense, dense_ok) = results(world)[r]["broadcast_parameters"]
        for lay, (p, ok) in zip(LAYOUTS, masked):
            assert ok, lay                      # still a Parameter that requires grad
            _check(p, *rank_input(lay, torch.float32, src + 2, seed=2)[1:], lay)
            assert p.get_mask().to_dense().any(), lay  # values were compared
        assert dense_ok
        torch.testing.assert_close(dense, torch.full((3,), float(src)))


@pytest.mark.parametrize("world,lay,dt", COLLECTIVE_CASES, ids=COLLECTIVE_IDS)
def test_torch_distributed_calls(world, lay, dt):
    results_ = results(world)
    inputs = _inputs(lay, dt, world)
    amax = reference("amax", inputs)
    for r in range(world):
        res = results_[r]
        _check(res["dist.all_reduce", lay, dt], *amax, lay)
        _check(res["dist.broadcast", lay, dt], inputs[0][1], inputs[0][2], lay)
        for g, (_, data, mask) in zip(res["dist.all_gather", lay, dt], inputs):
            _check(g, data, mask, lay)
        if r == 0:
            for g, (_, data, mask) in zip(res["dist.gather", lay, dt], inputs):
                _check(g, data, mask, lay)
        _check(res["dist.scatter", lay, dt], *rank_input(lay, dt, r, seed=1)[1:], lay)


# -- gradients and training --------------------------------------------------------------------
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
    # A C++ caller (coalesced collectives, DDP's buckets) reaching a c10d op
    import torch.distributed as dist

    try:
        dist.all_reduce_coalesced([rank_input("coo", torch.float32, rank)[0]])
    except NotImplementedError as e:
        out["c10d error"] = str(e)
    return out


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
@pytest.mark.parametrize("world", list(WORLDS), ids=[f"{w}proc" for w in WORLDS])
def test_sync_grads(world, name, method):
    results_ = results(world)
    ref, union = _reference_grad(name, world)
    for r in range(world):
        grad = results_[r]["sync", method][name]
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
def test_data_parallel_training_equals_one_process(single_process, how):
    world, results_ = 2, results(2)        # training runs on the 2-process group only
    for r in range(world):
        got = results_[r]["train", how]
        assert got.keys() == single_process.keys()
        for name, ref in single_process.items():
            torch.testing.assert_close(got[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(single_process["items.weight"], Recommender().items.weight)


def test_c10d_ops_on_masked_tensors_name_the_way_out():
    message = results(2)[0]["c10d error"]
    assert "allreduce_coalesced_" in message and "split_for_ddp" in message, message
