"""Where a small GAT step's time goes: ``python -m benchmarks.profile_graph_glue``.

At 300 nodes a step of ``benchmarks/bench_graph.py`` is mostly fixed cost per op, not
kernels. This profile measures that cost per masked op of the GAT layer: each op is swapped,
one at a time, for a *minimal* autograd Function that calls the very kernels the library
calls (the native softmax, the per-head product's ``mm`` / ``dot``, ``index_select`` /
``index_add``), over the same MaskedTensors, with no dispatch, no argument binding and no
route checks. The step time saved by a swap is that op's glue: dispatch, checks and the
layers between the op and its kernel. Swapping all of them gives the design's floor (the
same wrappers, nodes and kernels). The minimal forms agree with the library to float
rounding (checked first); they are a measuring device, not a second implementation: they
take no other input than this layer's (one head, float32, a coalesced COO adjacency with
every node's self-loop, the CPU with the native kernels).

``--in-step`` times the step's phases (zero_grad, forward, backward, Adam) for both recipes
and each op of the masked layer in place, layer by layer (:func:`in_step`): judged alone, a
trim of a few microseconds can vanish in the step, and an op's cost in place is the one that
counts.

Options: ``--nodes`` (300), ``--min-run-time`` (seconds per case, 0.5); one thread, medians of
paired rounds (``benchmarks/harness.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import layouts  # noqa: E402
from benchmarks import bench_graph  # noqa: E402
from benchmarks.harness import paired_rounds  # noqa: E402
from layouts import _native, _per_head  # noqa: E402
from masked_sparse._tensor import MaskedTensor, _wrap  # noqa: E402

OPS = ("sums with a plain operand", "leaky_relu", "softmax", "einsum", "to_tensor")
_STRIDED = layouts.get_layout(torch.strided)


class _Sum(torch.autograd.Function):
    """``mt + plain`` read at the flat positions ``flat`` (the plain operand's)."""

    @staticmethod
    def forward(ctx, mt, plain, flat):  # type: ignore[override]
        s = mt._storage
        ctx.flat, ctx.shape = flat, plain.shape
        read = plain.detach().reshape(-1).index_select(0, flat).view_as(s.values)
        return _wrap(s.with_values(s.values + read))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        g = grad._storage.values.reshape(-1)
        return grad, g.new_zeros(ctx.shape.numel()).index_add_(0, ctx.flat, g).view(ctx.shape), None


class _Unary(torch.autograd.Function):
    """A unary op whose values torch computed and recorded (``out``)."""

    @staticmethod
    def forward(ctx, mt, out):  # type: ignore[override]
        s = mt._storage
        ctx.storage, ctx.node = s, out.grad_fn
        return _wrap(s.with_values(out.detach()))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _wrap(ctx.storage.with_values(ctx.node(grad._storage.values))), None


class _Softmax(torch.autograd.Function):
    """The native softmax over each row's entries (``rows``: each entry's row)."""

    @staticmethod
    def forward(ctx, mt, rows, n):  # type: ignore[override]
        s = mt._storage
        out = _native.softmax(s.values.reshape(-1), s.mask.reshape(-1), False, index=rows, n=n)
        ctx.storage, ctx.rows, ctx.n, ctx.out = s, rows, n, out
        return _wrap(s.with_values(out.view_as(s.values)))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        s, out, rows, n = ctx.storage, ctx.out, ctx.rows, ctx.n
        g, m = grad._storage.values.reshape(-1), s.mask.reshape(-1)
        total = _native.scatter(g * out, m, "sum", rows, n)
        values = _native.backward("softmax", m, total, x=out, y=g, index=rows, n=n)
        return _wrap(s.with_values(values.view_as(s.values))), None, None


class _Product(torch.autograd.Function):
    """``einsum("ijh,jhf->ihf")`` by the per-head kernels over ``index`` (the edges); every
    row holds an entry."""

    @staticmethod
    def forward(ctx, mt, dense, index, mask):  # type: ignore[override]
        s = mt._storage
        out = _per_head._mm(index, 1, s.shape[0], s.values, dense, None)
        ctx.storage, ctx.index, ctx.dense = s, index, dense.detach()
        return _wrap(_STRIDED.build((), out, mask, out.shape))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        s, index, dense = ctx.storage, ctx.index, ctx.dense
        g = grad._storage.values
        to_values = _per_head._dot(index, 1, g, dense, 1)
        to_dense = _per_head._mm(index, 0, dense.shape[0], s.values, g, None)
        return _wrap(s.with_values(to_values)), to_dense, None, None


class _ToTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mt):  # type: ignore[override]
        s = ctx.storage = mt._storage
        return torch.where(s.mask, s.values, 0.0)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _wrap(ctx.storage.with_values(grad))


_SUM, _UNARY, _SOFTMAX, _PRODUCT, _TO_TENSOR = (
    super(torch.autograd.Function, f).apply
    for f in (_Sum, _Unary, _Softmax, _Product, _ToTensor))


def _no_lap(name: str) -> None:
    pass


def layer(minimal: tuple[str, ...], rows: torch.Tensor, cols: torch.Tensor,
          lap: Callable[[str], None] = _no_lap) -> Callable:
    """``bench_graph``'s masked layer with the ops named in ``minimal`` in their minimal
    form (one head); ``lap(name)`` is called after each step of it (:func:`in_step`)."""
    index = torch.stack([rows, cols])  # (the edges: a coalesced COO index)

    def run(a0: MaskedTensor, x, w, a_dst, a_src, bias, heads: int) -> torch.Tensor:
        n = x.shape[0]
        lap("")
        wh = (x @ w).view(n, heads, -1)
        e_dst, e_src = (wh * a_dst).sum(-1), (wh * a_src).sum(-1)
        lap("node scores (plain)")
        if OPS[0] in minimal:
            scores = _SUM(a0, e_dst[:, None, :], rows)
            lap("first sum")
            scores = _SUM(scores, e_src[None, :, :], cols)
        else:
            scores = a0 + e_dst[:, None, :]
            lap("first sum")
            scores = scores + e_src[None, :, :]
        lap("second sum")
        if OPS[1] in minimal:
            leaf = scores._storage.values.detach().requires_grad_()
            scores = _UNARY(scores, F.leaky_relu(leaf, bench_graph.SLOPE))
        else:
            scores = F.leaky_relu(scores, bench_graph.SLOPE)
        lap("leaky_relu")
        p = _SOFTMAX(scores, rows, n) if OPS[2] in minimal else scores.softmax(1)
        lap("softmax")
        if OPS[3] in minimal:
            every = torch.ones(n, heads, wh.shape[-1], dtype=torch.bool)
            out = _PRODUCT(p, wh, index, every)
        else:
            out = torch.einsum("ijh,jhf->ihf", p, wh)
        lap("einsum")
        plain = _TO_TENSOR(out) if OPS[4] in minimal else out.to_tensor(0)
        lap("to_tensor")
        out = plain.reshape(n, -1) + bias
        lap("reshape, bias")
        return out

    return run


def measure(nodes: int = 300, min_run_time: float = 0.5, rounds: int | None = None
            ) -> dict[str, Any]:
    """``{"agree": largest difference of outputs and gradients, minimal vs library,
    "library" / "gather" / each op / "all": median seconds per step}``."""
    if not _native.available():
        raise RuntimeError(f"profile_graph_glue needs the native kernels: {_native.status()}")
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(nodes, bench_graph.FEATURES, generator=g)
    labels = torch.randint(0, bench_graph.CLASSES, (nodes,), generator=g)
    edges, graph = bench_graph.graphs(nodes, 1, dev)
    rows, cols = edges[0].contiguous(), edges[1].contiguous()
    weights = bench_graph.Weights(1, dev)
    variants = {"library": (), **{op: (op,) for op in OPS}, "all": OPS}

    def outputs(run: Callable) -> list[torch.Tensor]:
        params = weights.copy()
        out = bench_graph.model(run, graph, x, params, 1)
        F.cross_entropy(out, labels).backward()
        return [out.detach()] + [p.grad for p in params]

    reference = outputs(layer((), rows, cols))
    agree = max((a - b).abs().max().item()
                for a, b in zip(outputs(layer(OPS, rows, cols)), reference))
    steps = {name: bench_graph.step(layer(ops, rows, cols), graph, x, labels, weights, 1, dev)
             for name, ops in variants.items()}
    steps["gather"] = bench_graph.step(bench_graph._gather_layer, (edges, edges), x, labels,
                                       weights, 1, dev)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = paired_rounds(steps, min_run_time, rounds, {}, {k: {} for k in steps})
    finally:
        torch.set_num_threads(threads)
    return {"agree": agree, **{k: statistics.median(v) for k, v in times.items()}}


PHASES = ("zero_grad", "forward", "backward", "Adam step")


def in_step(nodes: int = 300, rounds: int = 40, steps: int = 10) -> dict[str, Any]:
    """Where the library's step differs from the gather recipe's, timed inside the step:
    ``{"phases": {phase: (library, gather)}, "ops": {op: (layer 1, layer 2)}}``, median
    seconds of ``rounds`` x ``steps`` steps, the two recipes interleaved. ``ops`` are the
    library's masked layer step by step (:func:`layer`'s laps), as the step meets them: in
    place, with the rest of the step around them, an op costs more than alone (its code and
    data are evicted between uses), the first masked op of a layer most of all."""
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(nodes, bench_graph.FEATURES, generator=g)
    labels = torch.randint(0, bench_graph.CLASSES, (nodes,), generator=g)
    edges, graph = bench_graph.graphs(nodes, 1, dev)
    weights = bench_graph.Weights(1, dev)
    clock = time.perf_counter
    laps: dict[tuple[int, str], list[float]] = {}
    last = [0.0, -1]  # the previous lap's time, the number of layers begun

    def lap(name: str) -> None:
        now = clock()
        if not name:  # a layer begins
            last[1] += 1
        else:
            laps.setdefault((last[1] % 2, name), []).append(now - last[0])
        last[0] = now

    phases: dict[tuple[str, str], list[float]] = {}

    def phased(name: str, run_layer: Callable, layer_graph: Any) -> Callable[[], None]:
        params = weights.copy()
        opt = torch.optim.Adam(params, lr=1e-2)

        def run() -> None:
            t0 = clock()
            opt.zero_grad(set_to_none=True)
            t1 = clock()
            loss = F.cross_entropy(bench_graph.model(run_layer, layer_graph, x, params, 1),
                                   labels)
            t2 = clock()
            loss.backward()
            t3 = clock()
            opt.step()
            t4 = clock()
            for phase, a, b in zip(PHASES, (t0, t1, t2, t3), (t1, t2, t3, t4)):
                phases.setdefault((name, phase), []).append(b - a)

        return run

    recipes = [phased("library", layer((), edges[0], edges[1], lap), graph),
               phased("gather", bench_graph._gather_layer, (edges, edges))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in range(rounds + 1):
            if r == 1:  # the first round warms up
                laps.clear()
                phases.clear()
            for run in recipes:
                for _ in range(steps):
                    run()
    finally:
        torch.set_num_threads(threads)
    med = statistics.median
    names = list(dict.fromkeys(name for _, name in laps))
    return {"phases": {p: (med(phases["library", p]), med(phases["gather", p]))
                       for p in PHASES},
            "ops": {name: (med(laps[0, name]), med(laps[1, name])) for name in names}}


def in_step_report(m: dict[str, Any]) -> str:
    lines = ["| phase of the step | masked_sparse | gather | difference |",
             "| --- | ---: | ---: | ---: |"]
    for phase, (mine, theirs) in m["phases"].items():
        lines.append(f"| {phase} | {mine * 1e6:.0f} µs | {theirs * 1e6:.0f} µs | "
                     f"{(mine - theirs) * 1e6:+.0f} µs |")
    lines += ["", "| masked layer, in the step | layer 1 | layer 2 |", "| --- | ---: | ---: |"]
    for name, (first, second) in m["ops"].items():
        lines.append(f"| {name} | {first * 1e6:.0f} µs | {second * 1e6:.0f} µs |")
    return "\n".join(lines)


def report(m: dict[str, Any]) -> str:
    lines = [f"minimal forms agree with the library to {m['agree']:.2e}", "",
             "| ops in their minimal form | step | ÷ gather | saved |",
             "| --- | ---: | ---: | ---: |"]
    for name in ("library", *OPS, "all"):
        lines.append(f"| {name} | {m[name] * 1e3:.2f} ms | {m[name] / m['gather']:.3f}× | "
                     f"{(m['library'] - m[name]) * 1e3:.2f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--in-step", action="store_true",
                        help="time each phase and each masked op inside the step instead")
    args = parser.parse_args()
    if args.in_step:
        print(in_step_report(in_step(args.nodes)))
    else:
        print(report(measure(args.nodes, args.min_run_time)))


if __name__ == "__main__":
    main()
