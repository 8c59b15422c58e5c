"""Time against nnz, 1e3 to 1e7, for a few ops on COO and CSR: the scaling chart.

``python -m benchmarks --plot benchmarks/scaling.png`` (or ``python -m benchmarks.scaling
PATH``) times ``sum(dim=1)``, ``amax(dim=1)``, ``softmax(dim=1)``, ``a + b`` and
``mt @ dense`` (16 dense columns) on COO and CSR masked matrices with ``nnz`` stored entries,
20 per row on average (``nnz / 20`` square rows: the row length stays fixed as the matrix
grows), 90% of them specified, float32; and draws one log-log panel per op and layout with
four lines:

- ``masked_sparse``;
- ``raw``: the best plain-torch computation on the stored values, no mask
  (:mod:`benchmarks.raw_reductions`; ``va + vb``; ``plain @ dense``);
- ``scipy``: the same op on a ``csr_matrix`` of the specified entries (Note [A fair scipy
  baseline] in :mod:`benchmarks.bench_scipy`; scipy has no softmax: absent);
- ``torch.masked``: the op on ``torch.masked.masked_tensor`` of the same sparse data and
  mask, where it runs (it supports few sparse ops; the others are listed as absent in the
  panel, with the reason of the harness's crash-safe probe).

Timing: the harness's paired rounds (Note [Paired rounds]), one thread; a 1e7 point costs a
few calls of each line. Memory at 1e7: about 1 GiB for the operands of every line.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import numpy as np
import torch

import masked_sparse as ms
from benchmarks import harness
from benchmarks.bench_core import _quiet
from benchmarks.raw_reductions import groups_of, raw_reduction

SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)
ROW_LENGTH = 20
SPECIFIED = 0.9
DENSE_COLUMNS = 16
OPS = ("sum(dim=1)", "amax(dim=1)", "softmax(dim=1)", "a + b", "mt @ dense")
SERIES = ("masked_sparse", "raw", "scipy", "torch.masked")
LAYOUTS = ("coo", "csr")
LARGE_POINT = 10**6
SAFE = {"raw": ("ok", ""), "scipy": ("ok", "")}


def pattern(nnz: int, gen: torch.Generator) -> tuple[torch.Tensor, tuple[int, int]]:
    """Row-major ``(2, ~nnz)`` coordinates of distinct positions of an ``nnz/20``-square
    matrix (from 1e4 up, the ~200 colliding draws are dropped: nnz is nominal)."""
    n = max(math.isqrt(2 * nnz) + 1, nnz // ROW_LENGTH)  # tiny sizes: at most half full
    if n * n < 10 * nnz:
        keys = torch.randperm(n * n, generator=gen)[:nnz].sort().values
    else:  # sorted distinct keys; about nnz**2 / (2 n**2) = 200 collisions fewer than nnz
        keys = torch.randint(0, n * n, (nnz,), generator=gen).unique()
    return torch.stack([keys // n, keys % n]), (n, n)


def point_cases(nnz: int, gen: torch.Generator) -> list[tuple[str, str, harness.Case]]:
    """``(op, layout, case)`` for every op and layout at one size; baselines: the lines."""
    import scipy.sparse as sp
    from torch.masked import masked_tensor as tm_masked

    idx, shape = pattern(nnz, gen)
    rows, cols = idx[0], idx[1]
    nnz = idx.shape[1]
    v = torch.randn(nnz, generator=gen)
    keep = torch.rand(nnz, generator=gen) < SPECIFIED
    dense = torch.rand(shape[1], DENSE_COLUMNS, generator=gen)
    k = keep.numpy()
    sm = sp.csr_matrix((v.numpy()[k], (rows.numpy()[k], cols.numpy()[k])), shape=shape)
    sm2, dense_np = sm * np.float32(0.5), dense.numpy()
    scipy_ops = {"sum(dim=1)": lambda: sm.sum(1), "amax(dim=1)": lambda: sm.max(1),
                 "softmax(dim=1)": "scipy.sparse has no softmax",
                 "a + b": lambda: sm + sm2, "mt @ dense": lambda: sm @ dense_np}
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = torch.sparse_coo_tensor(idx, v, shape, is_coalesced=True)
        mask = torch.sparse_coo_tensor(idx, keep, shape, is_coalesced=True)
        for layout in LAYOUTS:
            if layout == "csr":
                data, mask = data.to_sparse_csr(), mask.to_sparse_csr()
            a = ms.masked_tensor(data, mask)
            b = a * 0.5
            va, vb = a._storage.values, b._storage.values
            t = tm_masked(data, mask)
            t2 = tm_masked(data * 0.5, mask)
            row_groups = groups_of(layout, rows, cols, shape, 1)
            plain = data
            ours = {"sum(dim=1)": lambda a=a: a.sum(1), "amax(dim=1)": lambda a=a: a.amax(1),
                    "softmax(dim=1)": lambda a=a: torch.softmax(a, 1),
                    "a + b": lambda a=a, b=b: a + b, "mt @ dense": lambda a=a: a @ dense}
            raw = {name: (lambda name=name, g=row_groups: raw_reduction(name, v, g))
                   for name in ("sum", "amax", "softmax")}
            raws = {"sum(dim=1)": raw["sum"], "amax(dim=1)": raw["amax"],
                    "softmax(dim=1)": raw["softmax"], "a + b": lambda va=va, vb=vb: va + vb,
                    "mt @ dense": lambda p=plain: p @ dense}
            masked = {"sum(dim=1)": lambda t=t: t.sum(1), "amax(dim=1)": lambda t=t: t.amax(1),
                      "softmax(dim=1)": lambda t=t: torch.softmax(t, 1),
                      "a + b": lambda t=t, t2=t2: t + t2, "mt @ dense": lambda t=t: t @ dense}
            for op in OPS:
                baselines = {"raw": raws[op], "scipy": scipy_ops[op],
                             "torch.masked": masked[op] if isinstance(masked[op], str)
                             else _quiet(masked[op])}
                out.append((op, layout, harness.Case(f"{layout} nnz=1e{round(math.log10(nnz))} "
                                                     f"{op}", ours[op], baselines)))
    return out


def measure(sizes: tuple[int, ...] = SIZES, min_run_time: float = 0.05,
            verbose: bool = True) -> list[dict[str, Any]]:
    """Every point: ``{"op", "layout", "nnz", "result"}`` (``result``: ``run_case``'s)."""
    gen = torch.Generator().manual_seed(7)
    points = []
    for nnz in sizes:
        # Large points: three rounds, two at 1e7 (a call takes up to seconds); raw and scipy need no
        # crash probe (Note [Crash-safe baselines]), torch.masked does.
        rounds = None if nnz < LARGE_POINT else 3 if nnz < 10 * LARGE_POINT else 2
        for op, layout, case in point_cases(nnz, gen):
            result = harness.run_case(case, min_run_time, rounds=rounds, probed=SAFE)
            points.append({"op": op, "layout": layout, "nnz": nnz, "result": result})
            if verbose:
                cells = ", ".join(f"{b} {harness.fmt_time(e.get('median_s'))}"
                                  for b, e in result["baselines"].items())
                print(f"  scaling {case.name}: {harness.fmt_time(result['median_s'])} "
                      f"({cells})", file=sys.stderr, flush=True)
    return points


def series(points: list[dict[str, Any]], op: str, layout: str
           ) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    """One panel's lines ``{name: [(nnz, seconds)]}`` and ``{absent name: why}``."""
    lines: dict[str, list[tuple[int, float]]] = {s: [] for s in SERIES}
    why: dict[str, str] = {}
    for p in points:
        if (p["op"], p["layout"]) != (op, layout):
            continue
        r = p["result"]
        entries = {"masked_sparse": r, **r["baselines"]}
        for name in SERIES:
            e = entries.get(name, {})
            if e.get("median_s") is not None:
                lines[name].append((p["nnz"], e["median_s"]))
            elif e.get("status") not in (None, "ok"):
                why.setdefault(name, e["status"] + (f" ({e['why'][:60]})" if e.get("why")
                                                    else ""))
    absent = {name: why.get(name, "no data") for name, pts in lines.items() if not pts}
    return {k: v for k, v in lines.items() if v}, absent


def plot(points: list[dict[str, Any]], path: str) -> None:
    """Log-log panels of time against nnz: one per layout (rows) and op (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"masked_sparse": ("C0", "o", "-"), "raw": ("black", ".", "--"),
              "scipy": ("C2", "s", "-."), "torch.masked": ("C3", "^", ":")}
    fig, axes = plt.subplots(len(LAYOUTS), len(OPS), figsize=(3.4 * len(OPS), 6.4),
                             sharex=True, squeeze=False)
    for i, layout in enumerate(LAYOUTS):
        for j, op in enumerate(OPS):
            ax = axes[i][j]
            lines, absent = series(points, op, layout)
            for name, pts in lines.items():
                colour, marker, dash = styles[name]
                xs, ys = zip(*pts)
                ax.plot(xs, ys, color=colour, marker=marker, linestyle=dash, label=name,
                        markersize=4)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{layout.upper()} {op}", fontsize=9)
            ax.grid(which="both", alpha=0.25)
            if absent:
                ax.text(0.03, 0.97, "\n".join(f"{n}: {w.split(' (')[0]}"
                                              for n, w in absent.items()),
                        transform=ax.transAxes, va="top", fontsize=7, color="0.35")
            if i == len(LAYOUTS) - 1:
                ax.set_xlabel("stored entries (nnz)")
            if j == 0:
                ax.set_ylabel("seconds per call")
    handles = [plt.Line2D([], [], color=c, marker=m, linestyle=d, label=n)
               for n, (c, m, d) in styles.items()]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="the PNG to write")
    parser.add_argument("--max-nnz", type=float, default=1e7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plot(measure(tuple(s for s in SIZES if s <= args.max_nnz)), args.path)
    print(f"wrote {args.path}")


if __name__ == "__main__":
    main()
