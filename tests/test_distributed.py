"""``masked_sparse.distributed`` on 2 and 4 gloo processes, against single-process references.

Each spawned group (``dist_harness.run_ranks``) runs a whole table of cases -- every function
x layout x op x dtype, uneven numbers of stored elements, one rank with nothing stored -- and
returns every rank's results; the tests below assert on them against references computed
here from all ranks' inputs (dense ``torch.where`` arithmetic). Inputs are rebuilt from
``(case, rank)`` seeds on both sides, so nothing but results crosses the process boundary.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FLOAT_DTYPES, assert_masked_equal, check_invariants, make_masked
from dist_harness import run_ranks

import masked_sparse as ms

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
WORLDS = {2: FLOAT_DTYPES, 4: [torch.float32]}   # 4 processes on 2 cores: one dtype
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
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2proc", "4proc"])
def collectives(request):
    world = request.param
    return world, run_ranks(collectives_worker, world)


def _results(collectives, dt):
    world, results = collectives
    if dt not in WORLDS[world]:
        pytest.skip(f"{world} processes run {WORLDS[world]} only (2 cores in CI)")
    return world, results


def _inputs(lay, dt, world, seed=0):
    return [rank_input(lay, dt, r, seed) for r in range(world)]


def _check(mt, data, mask, lay):
    check_invariants(mt, LAYOUTS[lay])
    assert_masked_equal(mt, data, mask, rtol=1e-6 if mt.dtype == torch.float64 else 1e-5,
                        atol=1e-6)


@pytest.mark.parametrize("op,method", [(op, m) for op in OPS for m in METHODS
                                       if op == "sum" or m != "auto"])
@pytest.mark.parametrize("lay,dt", CASES, ids=[f"{lay}-{str(dt)[6:]}" for lay, dt in CASES])
def test_all_reduce(collectives, lay, dt, op, method):
    world, results = _results(collectives, dt)
    ref = reference(op, _inputs(lay, dt, world))
    for r in range(world):
        _check(results[r]["all_reduce", lay, dt, op, method], *ref, lay)
    if lay != "strided":   # coalesced: the result stores exactly the specified union
        s = results[0]["all_reduce", lay, dt, op, method]._storage
        assert s.layout.to_coo(s).values.shape[0] == int(ref[1].sum()) or lay == "bsr"


@pytest.mark.parametrize("lay,dt", CASES, ids=[f"{lay}-{str(dt)[6:]}" for lay, dt in CASES])
def test_gather_broadcast_scatter(collectives, lay, dt):
    world, results = _results(collectives, dt)
    inputs = _inputs(lay, dt, world)
    for r in range(world):
        res = results[r]
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


@pytest.mark.parametrize("lay,dt", CASES, ids=[f"{lay}-{str(dt)[6:]}" for lay, dt in CASES])
def test_torch_distributed_calls(collectives, lay, dt):
    world, results = _results(collectives, dt)
    inputs = _inputs(lay, dt, world)
    amax = reference("amax", inputs)
    for r in range(world):
        res = results[r]
        _check(res["dist.all_reduce", lay, dt], *amax, lay)
        _check(res["dist.broadcast", lay, dt], inputs[0][1], inputs[0][2], lay)
        for g, (_, data, mask) in zip(res["dist.all_gather", lay, dt], inputs):
            _check(g, data, mask, lay)
