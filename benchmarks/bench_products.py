"""Where a sparse weight should multiply as dense: the density sweep behind
``layouts._dense_operand.THRESHOLDS`` (Note [Products chosen per device and density]).

For each stored fraction of a CSR weight (0.5% to 50%), one forward + backward of

- the 784-512-512-10 MLP train step (batch 256, ReLU, cross-entropy, plain biases) and
- a 4096 x 4096 linear at batch 512 (``F.linear(x, W).sum().backward()``),

three ways: the sparse kernels (threshold forced above 1), the dense buffer (threshold 0),
and the workaround ``F.linear(x, W * M, b)`` on a dense weight. The crossover -- the lowest
fraction from which the dense buffer is faster than the sparse kernels -- is the device's
threshold; the table prints it per workload.

Run: ``python -m benchmarks.bench_products [--device cuda] [--quick]`` (CPU: one thread,
medians of paired rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import layouts  # noqa: E402
import masked_sparse as ms  # noqa: E402

DENSITIES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
MLP = (784, 512, 512, 10)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _layers(sizes: tuple[int, ...], density: float, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(device)
        m = (torch.rand(n_out, n_in, generator=g) < density).to(device)
        out.append((w, m, torch.zeros(n_out, device=device)))
    return out


def workloads(density: float, device: torch.device, quick: bool) -> dict[str, tuple]:
    """name -> (masked step, workaround step): each a forward + backward."""
    out = {}
    n, mlp_batch, lin_batch = (256, 32, 32) if quick else (4096, 256, 512)
    for name, sizes, batch in ((f"MLP 784-512-512-10, batch {mlp_batch}", MLP, mlp_batch),
                               (f"linear {n}x{n}, batch {lin_batch}", (n, n), lin_batch)):
        layers = _layers(sizes, density, device)
        x = torch.randn(batch, sizes[0], device=device)
        y = torch.randint(sizes[-1], (batch,), device=device)
        mw = [torch.nn.Parameter(ms.to_layout(ms.masked_tensor(w.clone(), m), torch.sparse_csr))
              for w, m, _ in layers]
        dw = [torch.nn.Parameter(w.clone()) for w, _, _ in layers]
        bs = [torch.nn.Parameter(b.clone()) for _, _, b in layers]
        masks = [m for _, m, _ in layers]
        mlp = len(layers) > 1

        def masked(mw=mw, bs=bs, x=x, y=y, mlp=mlp) -> None:
            h = x
            for i, (w, b) in enumerate(zip(mw, bs)):
                h = F.linear(h, w, b if mlp else None)
                if i < len(mw) - 1:
                    h = torch.relu(h)
            loss = F.cross_entropy(h.to_tensor(0), y) if mlp else h.to_tensor(0).sum()
            for p in mw + bs:
                p.grad = None
            loss.backward()

        def dense(dw=dw, bs=bs, masks=masks, x=x, y=y, mlp=mlp) -> None:
            h = x
            for i, (w, b, m) in enumerate(zip(dw, bs, masks)):
                h = F.linear(h, w * m, b if mlp else None)
                if i < len(dw) - 1:
                    h = torch.relu(h)
            loss = F.cross_entropy(h, y) if mlp else h.sum()
            for p in dw + bs:
                p.grad = None
            loss.backward()

        out[name] = (masked, dense)
    return out


def _with_threshold(fn: Callable[[], None], device: torch.device,
                    value: float) -> Callable[[], None]:
    kind = device.type if device.type in layouts.PRODUCT_DENSITY_THRESHOLDS else "other"

    def run() -> None:
        old = layouts.PRODUCT_DENSITY_THRESHOLDS[kind]
        layouts.set_product_density_threshold(kind, value)
        try:
            fn()
        finally:
            layouts.set_product_density_threshold(kind, old)
        _sync(device)

    return run


def paired(fns: dict[str, Callable[[], None]], rounds: int, block: float) -> dict[str, float]:
    """Median seconds per call of each callable over interleaved rounds."""
    timers = {k: Timer("f()", globals={"f": f}, num_threads=1) for k, f in fns.items()}
    numbers = {}
    for k, t in timers.items():
        once = max(t.timeit(1).mean, 1e-9)
        numbers[k] = max(1, round(block / once))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for k in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            times[k].append(timers[k].timeit(numbers[k]).mean)
    return {k: statistics.median(v) for k, v in times.items()}


def sweep(device: torch.device, quick: bool = False, progress: bool = False) -> list[dict]:
    """One row per (workload, density): seconds of the sparse kernels, the dense buffer
    and ``W * M``."""
    rows = []
    for density in (0.01, 0.1, 0.5) if quick else DENSITIES:
        for name, (masked, dense) in workloads(density, device, quick).items():
            fns = {"sparse": _with_threshold(masked, device, 2.0),
                   "dense buffer": _with_threshold(masked, device, 0.0),
                   "W*M": _with_threshold(dense, device, 0.0)}
            t = paired(fns, 3 if quick else 5, 0.005 if quick else 0.1)
            rows.append({"workload": name, "density": density, **t})
            if progress:
                print(f"{name}, {density:.1%}: " + ", ".join(
                    f"{k} {v * 1e3:.3f} ms" for k, v in t.items()), flush=True)
    return rows


def crossover(rows: list[dict], workload: str) -> float | None:
    """The lowest density from which the dense buffer beats the sparse kernels at every
    measured density."""
    mine = sorted((r for r in rows if r["workload"] == workload), key=lambda r: r["density"])
    best = None
    for r in reversed(mine):
        if r["dense buffer"] <= r["sparse"]:
            best = r["density"]
        else:
            break
    return best


def report(rows: list[dict], device: torch.device) -> str:
    lines = [f"## Sparse kernels or a dense buffer ({device.type})", "",
             "| workload | stored | sparse | dense buffer | W*M | sparse / W*M | "
             "dense buffer / W*M |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['density']:.1%} | {r['sparse'] * 1e3:.3f} ms | "
                     f"{r['dense buffer'] * 1e3:.3f} ms | {r['W*M'] * 1e3:.3f} ms | "
                     f"{r['sparse'] / r['W*M']:.2f} | {r['dense buffer'] / r['W*M']:.2f} |")
    lines.append("")
    for name in dict.fromkeys(r["workload"] for r in rows):
        c = crossover(rows, name)
        lines.append(f"- crossover, {name}: "
                     + ("dense never won" if c is None else f"dense from {c:.1%} stored"))
    kind = device.type if device.type in layouts.PRODUCT_DENSITY_THRESHOLDS else "other"
    lines.append(f"- current threshold ({kind}): "
                 f"{layouts.PRODUCT_DENSITY_THRESHOLDS[kind]:.1%} stored")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    print(report(sweep(device, args.quick, progress=True), device))


if __name__ == "__main__":
    main()
