"""All-reduce of a sparse embedding gradient across gloo processes: bytes and time.

A ``ROWS x 64`` float32 embedding gradient (default 1,000,000 rows) stores a fraction of
its rows on each of W processes (0.1%, 1%, 10%, 50%; different random rows per process, as
``nn.Embedding(sparse=True)`` gives after coalescing). Compared, per process:

- ``msd``: ``masked_sparse.distributed.all_reduce`` of the gradient as a MaskedTensor
  (``ms.optim.as_masked_grad``), method chosen by the byte rule; ``msd gather`` and
  ``msd dense`` force either method;
- ``torch sparse``: ``torch.distributed.all_reduce`` of the torch sparse COO gradient
  (gloo's sparse all-reduce: all-gathers of metadata, indices and values);
- ``dense``: ``torch.distributed.all_reduce`` of the dense gradient (Horovod's
  ``sparse_as_dense``), which loses the sparsity (every row is then "in" the gradient).

*Bytes* are the bytes each process receives under the textbook cost of each collective
(what the byte rule uses): an all-gather brings ``(W - 1)`` peer buffers, a ring all-reduce
``2 (W - 1) / W`` of the buffer; ours are counted from the buffers actually passed to the
collectives, torch's sparse all-reduce from its gathers (int64 indices + values + 2 int64
metadata per process). *Time* is the median over repeats of the slowest process.

Run by hand: ``python -m benchmarks.bench_distributed [--world 2 4] [--rows 1000000]
[--repeat 3] [--densities 0.001 0.01]``. The machine of the published table has 2 cores:
with 4 processes, two share each core, so times there include contention (bytes do not).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if __package__ in (None, ""):  # ``python benchmarks/bench_distributed.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DIM = 64
DENSITIES = (0.001, 0.01, 0.1, 0.5)
METHODS = ("msd", "msd gather", "msd dense", "torch sparse", "dense")


class ByteCounter:
    """Counts the bytes a process receives, by patching the dense collectives we call."""

    def __init__(self, world: int) -> None:
        self.world, self.bytes, self._saved = world, 0, {}

    def __enter__(self) -> ByteCounter:
        w = self.world

        def wrap(name, cost):
            original = getattr(dist, name)

            def counted(*args, **kwargs):
                self.bytes += cost(*args)
                return original(*args, **kwargs)

            self._saved[name] = original
            setattr(dist, name, counted)

        size = lambda t: t.numel() * t.element_size()  # noqa: E731
        wrap("all_reduce", lambda t, *a: 2 * (w - 1) * size(t) // w)
        for name in ("all_gather_single", "all_gather_into_tensor"):
            if hasattr(dist, name):
                wrap(name, lambda out, inp, *a: (w - 1) * size(inp))
        wrap("broadcast", lambda t, *a: size(t))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)


def gradient(rank: int, rows: int, density: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    n = max(1, int(rows * density))
    idx = torch.randperm(rows, generator=g)[:n].sort().values
    values = torch.randn(n, DIM, generator=g)
    return torch.sparse_coo_tensor(idx[None], values, (rows, DIM), is_coalesced=True)


def _worker(rank: int, world: int, port: int, rows: int, repeat: int, densities, out) -> None:
    import masked_sparse as ms
    import masked_sparse.distributed as msd
    from masked_sparse.distributed._entries import entries_of, make_plan

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = []
    for density in densities:
        grad = gradient(rank, rows, density)
        nnzs = [0] * world
        dist.all_gather_object(nnzs, grad._nnz())
        dense = grad.to_dense()
        calls = {
            "msd": lambda g=grad: msd.all_reduce(ms.optim.as_masked_grad(g)),
            "msd gather": lambda g=grad: msd.all_reduce(ms.optim.as_masked_grad(g),
                                                        method="gather"),
            "msd dense": lambda g=grad: msd.all_reduce(ms.optim.as_masked_grad(g),
                                                       method="dense"),
            "torch sparse": lambda g=grad: dist.all_reduce(g.clone()),
            "dense": lambda d=dense: dist.all_reduce(d),
        }
        row = {"world": world, "density": density}
        e = entries_of(ms.optim.as_masked_grad(grad)._storage)
        meta = torch.tensor([[n, 1] for n in nnzs])
        row["msd method"] = make_plan(e, meta, "auto", world).method
        for name, call in calls.items():
            with ByteCounter(world) as counter:
                call()
            if name == "torch sparse":   # gloo's sparse all-reduce gathers these per peer
                counter.bytes = sum(n * (8 + DIM * 4) + 16 for n in nnzs) - \
                    (nnzs[rank] * (8 + DIM * 4) + 16)
            times = []
            for _ in range(repeat):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                t = torch.tensor(time.perf_counter() - t0, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(float(t))
            row[name] = (counter.bytes, statistics.median(times))
        results.append(row)
        del dense
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def run(world: int, rows: int, repeat: int, densities=DENSITIES) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, rows, repeat, densities, out))
             for r in range(world)]
    for p in procs:
        p.start()
    results = out.get(timeout=3600)
    for p in procs:
        p.join()
    return results


def table(rows: list[dict]) -> str:
    """A markdown table: MB received per process and ms per all-reduce, ratios to baselines."""
    head = ("| W | rows | msd (method) MB / ms | torch sparse MB / ms | dense MB / ms | "
            "msd MB ÷ best baseline | msd time ÷ torch sparse |")
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        mb = {k: r[k][0] / 1e6 for k in METHODS}
        ms_ = {k: r[k][1] * 1e3 for k in METHODS}
        best = min(mb["torch sparse"], mb["dense"])
        lines.append(
            f"| {r['world']} | {r['density']:.1%} | {mb['msd']:.1f} ({r['msd method']}) / "
            f"{ms_['msd']:.0f} | {mb['torch sparse']:.1f} / {ms_['torch sparse']:.0f} | "
            f"{mb['dense']:.1f} / {ms_['dense']:.0f} | {mb['msd'] / best:.3f} | "
            f"{ms_['msd'] / ms_['torch sparse']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    args = parser.parse_args(argv)
    rows = []
    for world in args.world:
        rows += run(world, args.rows, args.repeat, args.densities)
        print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
