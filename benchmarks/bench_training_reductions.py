"""Reductions in a training step: ``python -m benchmarks.bench_training_reductions``.

One thread, the kept entries of a 20000 x 100 float32 matrix, each kept
with probability 0.9 (about 1.8M), stored in CSR and in COO as a pruned weight is: only the
kept entries, all specified, in ragged lines of about 90 (the kernels read values and mask
either way). The input is a leaf MaskedTensor that requires grad, as a parameter is. Per
op, three timings in interleaved rounds (Note [Paired rounds] in ``harness``):

- ``no grad``: the forward under ``torch.no_grad()`` (the inference route);
- ``fwd (rg)``: the same forward on the leaf that requires grad (builds the graph);
- ``fwd+bwd``: that forward, then ``backward`` with a gradient of ones.

It prints ``fwd (rg) / no grad`` (target <= 1.3) and ``fwd+bwd / no grad`` (target <= 3),
each the median of the per-round ratios. ``--quick`` times less; ``--size`` scales the
matrix (rows; 100 columns).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils.benchmark import Timer  # noqa: E402

import masked_sparse as ms  # noqa: E402
from benchmarks import harness  # noqa: E402, F401  (Note [Allocator noise])

OPS: dict[str, Any] = {
    "sum": lambda x, d: x.sum(d),
    "mean": lambda x, d: x.mean(d),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d),
    "var": lambda x, d: x.var(d),
    "std": lambda x, d: x.std(d),
    "logsumexp": lambda x, d: torch.logsumexp(x, d),
    "softmax": lambda x, d: torch.softmax(x, d),
    "log_softmax": lambda x, d: torch.log_softmax(x, d),
}


def operand(layout: str, rows: int, cols: int = 100, seed: int = 0) -> ms.MaskedTensor:
    """A ``rows x cols`` float32 MaskedTensor storing the entries of a random 90% keep-mask
    (the mask's sparse pattern: every stored entry specified)."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randn(rows, cols, generator=gen)
    mask = torch.rand(rows, cols, generator=gen) < 0.9
    sparse = data.to_sparse_csr() if layout == "csr" else data.to_sparse()
    smask = mask.to_sparse_csr() if layout == "csr" else mask.to_sparse()
    return ms.masked_tensor(sparse, smask)


def _timed(fns: dict[str, Any], min_run_time: float, rounds: int) -> dict[str, list[float]]:
    timers, numbers = {}, {}
    block = min_run_time / rounds
    for key, fn in fns.items():
        timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
        once = max(timer.timeit(1).mean, 1e-9)
        timers[key], numbers[key] = timer, max(1, round(block / once))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for key in (list(timers) if r % 2 == 0 else list(reversed(timers))):
            times[key].append(timers[key].timeit(numbers[key]).mean)
    return times


def case(layout: str, op: str, dim: int, rows: int, min_run_time: float,
         rounds: int) -> dict[str, float]:
    """Median timings and per-round ratios of one (layout, op, dim)."""
    no_grad, forward, both = _fns(layout, op, dim, rows)
    times = _timed({"no grad": no_grad, "fwd (rg)": forward, "fwd+bwd": both},
                   min_run_time, rounds)
    base = times["no grad"]
    return {"no grad": statistics.median(base),
            "fwd": statistics.median(a / b for a, b in zip(times["fwd (rg)"], base)),
            "both": statistics.median(a / b for a, b in zip(times["fwd+bwd"], base))}


TITLE = "Reductions in a training step (forward with requires_grad / forward+backward vs no grad)"


def _fns(layout: str, op: str, dim: int, rows: int) -> tuple[Any, Any, Any]:
    """``(no grad, forward with requires_grad, forward + backward)`` callables."""
    leaf = operand(layout, rows).requires_grad_()
    fn = OPS[op]

    def no_grad() -> Any:
        with torch.no_grad():
            return fn(leaf, dim)

    def forward() -> Any:
        return fn(leaf, dim)

    def both() -> None:
        out = fn(leaf, dim)
        out.backward(torch.ones_like(out))
        leaf.grad = None

    return no_grad, forward, both


def cases(quick: bool = False) -> list[tuple]:
    """The suite's cases (``python -m benchmarks``): per layout, op and dim, the forward
    with requires_grad (target 1.3x) and forward + backward (target 3x), each against the
    no-grad forward; ``quick``: 2000 x 100 instead of 20000 x 100."""
    rows = 2000 if quick else 20000
    out = []
    for layout in ("csr", "coo"):
        for op in OPS:
            for dim in (0, 1):
                no_grad, forward, both = _fns(layout, op, dim, rows)
                name = f"{layout} {op}({dim}) {rows}x100"
                out.append((f"{name} fwd(rg)", forward, {"no grad": no_grad},
                            {"no grad": 1.3}))
                out.append((f"{name} fwd+bwd", both, {"no grad": no_grad}, {"no grad": 3.0}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing")
    parser.add_argument("--size", type=int, default=20000, help="rows (100 columns)")
    parser.add_argument("--layouts", default="csr,coo")
    parser.add_argument("--ops", default=",".join(OPS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    min_run_time, rounds = (0.3, 3) if args.quick else (1.0, 5)
    print(f"one thread, {args.size} x 100 float32, the ~90% kept entries stored (all "
          f"specified, ragged lines); "
          f"ratios: median of {rounds} paired rounds")
    print(f"{'layout':6} {'op':12} {'dim':>3} {'no grad':>10} {'fwd(rg)/ng':>11} "
          f"{'fwd+bwd/ng':>11}")
    worst = [0.0, 0.0]
    for layout in args.layouts.split(","):
        for op in args.ops.split(","):
            for dim in (0, 1):
                r = case(layout, op, dim, args.size, min_run_time, rounds)
                worst = [max(worst[0], r["fwd"]), max(worst[1], r["both"])]
                flag = "" if r["fwd"] <= 1.3 and r["both"] <= 3 else "  (over target)"
                print(f"{layout:6} {op:12} {dim:>3} {r['no grad'] * 1e3:>8.2f}ms "
                      f"{r['fwd']:>10.2f}x {r['both']:>10.2f}x{flag}", flush=True)
    print(f"worst: forward {worst[0]:.2f}x (target 1.3), forward+backward {worst[1]:.2f}x "
          f"(target 3)")


if __name__ == "__main__":
    main()
