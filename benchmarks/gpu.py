"""``python -m benchmarks.gpu --device cuda``: masked_sparse on one device against the dense
workaround, torch's own sparse ops and the raw torch kernels.

Sections (ratio = masked_sparse's time / the baseline's; below 1 means masked_sparse is
faster; each time is the median of rounds, every round between two
``torch.cuda.synchronize()`` calls on CUDA):

- reductions of 1M and 10M stored entries (5% dense matrices, half of the stored entries
  specified): ``sum`` / ``mean`` / ``amax`` / ``var`` / ``logsumexp`` / ``argmax`` along
  each dim, CSR and COO, against the dense ``torch.where`` workaround, torch's sparse op
  where torch has one, and the fastest raw kernel over the specified values --
  ``segment_reduce`` (over the row pointers; along dim 0 over the column order, its gather
  timed), ``scatter_reduce``, ``index_add`` (``index_reduce`` for extremes) -- each
  composed into the op the way the library composes it (target <= 1.5x);
- full reductions (every dim) against the raw op on the values (<= 1.2x);
- softmax / log_softmax along each dim (1M entries) against the ``-inf`` dense recipe
  (<= 2x) and ``torch.sparse.softmax`` / ``log_softmax`` (<= 1x);
- the table of raw kernels the library should take on this device, in the form of
  ``layouts/kernels/_device_table.py`` (Note [The device table]): the fastest of the
  kernels the library implements per (op, kind of groups) and size, to paste there;
- a pruned MLP train step (784-512-512-10, 90% of each weight masked, CSR weights) against
  the dense ``W * M`` step;
- attention with a key padding mask against ``scaled_dot_product_attention`` and the
  ``-inf`` recipe (forward + backward), the masked recipe and ``ms.attention``;
- a strided masked 4096 x 4096 linear (90% masked, batch 512) against ``W * M``;
- the density sweep of ``benchmarks.bench_products``: a CSR weight through the sparse
  kernels and through a dense buffer, 0.5% to 50% stored -- the crossover is the device's
  value of ``layouts.PRODUCT_DENSITY_THRESHOLDS``;
- an Adagrad / SparseAdam step on a 1M x 64 embedding against torch.optim's.

``--device cpu --quick`` runs every case on tiny operands (the smoke test does). ``--out``
writes the Markdown report (``benchmarks/RESULTS-cuda.md`` by default with ``--device
cuda``); ``--tests JUNIT_XML`` puts the counts of a ``pytest --device ... --junitxml`` run
into it.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # ``python benchmarks/gpu.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import masked_sparse as ms  # noqa: E402

Fn = Callable[[], Any]
RAW = ("segment_reduce", "scatter_reduce", "index_add")
OPS = ("sum", "mean", "amax", "var", "logsumexp", "argmax")
#: the raw kernels the library implements per table op (Note [The device table]): the
#: benchmark's name -> the table's
LIBRARY_KERNELS = {"sum": {"segment_reduce": "segment", "index_add": "index_add",
                           "scatter_reduce": "scatter"},
                   "amax": {"segment_reduce": "segment", "scatter_reduce": "scatter"}}
DENSITY, SPECIFIED = 0.05, 0.5
warnings.filterwarnings("ignore", r"index_reduce\(\) is in beta")


# -- timing ---------------------------------------------------------------------------------
class Timer:
    """Median seconds per call of a function on ``device``, synchronized around each round."""

    def __init__(self, device: torch.device, min_time: float, rounds: int = 5) -> None:
        self.device, self.min_time, self.rounds = device, min_time, rounds

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Fn) -> float:
        first = self._round(fn, 1)  # warm up (caches, allocator, kernels' first launch)
        if first > 10 * self.min_time:  # a slow path: three calls say enough, and fast
            return statistics.median(self._round(fn, 1) for _ in range(3))
        n = 1
        while True:
            elapsed = self._round(fn, n)
            if elapsed >= self.min_time / self.rounds or n >= 1 << 14:
                break
            n *= 4
        return statistics.median(self._round(fn, n) / n for _ in range(self.rounds))

    def _round(self, fn: Fn, n: int) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        self.sync()
        return time.perf_counter() - start


def timed(timer: Timer, fn: Fn | str) -> dict[str, Any]:
    """``{"s": seconds}``, or ``{"why": reason}`` where ``fn`` is a reason or raises."""
    if isinstance(fn, str):
        return {"why": fn}
    try:
        return {"s": timer(fn)}
    except Exception as exc:  # an op torch (or masked_sparse) lacks on this device
        return {"why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"}


def fmt_s(r: dict[str, Any]) -> str:
    if "s" not in r:
        return "unsupported"
    s = r["s"]
    return f"{s * 1e3:.3f} ms" if s >= 1e-4 else f"{s * 1e6:.1f} us"


def ratio(mine: dict[str, Any], base: dict[str, Any]) -> str:
    if "s" not in mine or "s" not in base:
        return "n/a"
    return f"{mine['s'] / base['s']:.2f}"


# -- operands -------------------------------------------------------------------------------
def matrix(nnz: int, device: torch.device, seed: int = 0) -> dict[str, Any]:
    """A 5% dense matrix with ``nnz`` stored entries, half of them specified: masked COO and
    CSR, the dense workaround's (data, mask) and the raw parts."""
    cols = max(10, int(math.sqrt(nnz / DENSITY / 20)))  # 20x more rows than columns
    rows = max(10, int(nnz / DENSITY / cols))
    g = torch.Generator().manual_seed(seed)
    lin = torch.randint(rows * cols, (int(nnz * 1.1) + 16,), generator=g).to(device)
    lin = torch.unique(lin)
    lin = lin[torch.randperm(lin.numel(), generator=g)[:nnz].to(device)].sort().values
    r, c = lin // cols, lin % cols
    n = lin.numel()
    values = torch.randn(n, generator=g).to(device)
    mask = (torch.rand(n, generator=g) < SPECIFIED).to(device)
    idx = torch.stack([r, c])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coo = ms.masked_tensor(
            torch.sparse_coo_tensor(idx, values, (rows, cols), is_coalesced=True),
            torch.sparse_coo_tensor(idx, mask, (rows, cols), is_coalesced=True))
        csr = coo.to_sparse_csr()
        spec = torch.sparse_coo_tensor(idx[:, mask], values[mask], (rows, cols),
                                       is_coalesced=True)
        spec_csr = spec.to_sparse_csr()
    dense = torch.zeros(rows, cols, device=device).index_put_((r, c), values)
    dmask = torch.zeros(rows, cols, dtype=torch.bool, device=device).index_put_((r, c), mask)
    return {"coo": coo, "csr": csr, "spec_coo": spec, "spec_csr": spec_csr, "dense": dense,
            "dmask": dmask, "rows": r, "cols": c, "values": values, "mask": mask,
            "shape": (rows, cols), "nnz": n}


# -- reductions -----------------------------------------------------------------------------
def masked_op(op: str, mt: Any, dim: int | None) -> Fn:
    """The masked op as a user writes it (``dim=None``: over every dim)."""
    if op == "logsumexp":
        return lambda: torch.logsumexp(mt, (0, 1) if dim is None else dim)
    if dim is None:
        return lambda: getattr(torch, op)(mt)
    return lambda: getattr(torch, op)(mt, dim)


def dense_op(op: str, m: dict[str, Any], dim: int) -> Fn:
    """The dense workaround: the masked op through ``torch.where`` on the dense matrix."""
    d, k = m["dense"], m["dmask"]
    if op == "sum":
        return lambda: torch.where(k, d, 0).sum(dim)
    if op == "amax":
        return lambda: torch.where(k, d, -math.inf).amax(dim)
    if op == "argmax":
        return lambda: torch.where(k, d, -math.inf).argmax(dim)
    if op == "logsumexp":
        return lambda: torch.where(k, d, -math.inf).logsumexp(dim)
    if op == "var":
        def var() -> torch.Tensor:
            count = k.sum(dim)
            mean = torch.where(k, d, 0).sum(dim) / count
            dev = torch.where(k, d - mean.unsqueeze(dim), 0)
            return (dev * dev).sum(dim) / (count - 1)
        return var
    return lambda: torch.where(k, d, 0).sum(dim) / k.sum(dim)


def torch_sparse_op(op: str, m: dict[str, Any], layout: str, dim: int) -> Fn | str:
    """torch's own sparse op on the specified entries (what torch has of it), else why
    not."""
    t = m["spec_csr"] if layout == "csr" else m["spec_coo"]
    if op == "sum":
        if layout == "csr":  # torch reduces a CSR tensor along a dim only with keepdim
            return lambda: t.sum(dim, keepdim=True)
        return lambda: torch.sparse.sum(t, dim)
    if op == "amax":
        return lambda: torch.amax(t, dim)
    if op == "mean":
        return lambda: torch.mean(t, dim)
    return f"torch has no sparse {op}"


def _grouped(kernel: str, x: torch.Tensor, how: str, group: torch.Tensor, n: int,
             order: torch.Tensor | None, offsets: torch.Tensor) -> torch.Tensor:
    """``x`` reduced per group (``how`` "sum", "amax", "amin") by one raw kernel."""
    if kernel == "segment_reduce":
        x = x if order is None else x[order]  # (the column order's gather is timed)
        return torch.segment_reduce(x, {"sum": "sum", "amax": "max", "amin": "min"}[how],
                                    offsets=offsets, unsafe=True)
    start = 0.0 if how == "sum" else -math.inf if how == "amax" else math.inf
    out = x.new_full((n,), start)
    if kernel == "scatter_reduce":
        return out.scatter_reduce_(0, group, x, how)
    if how == "sum":
        return out.index_add_(0, group, x)
    return out.index_reduce_(0, group, x, how)


def raw_ops(op: str, m: dict[str, Any], dim: int) -> dict[str, Fn]:
    """The raw kernels over the stored values, each composed into ``op`` the way the library
    composes it (unspecified values filled with the op's identity inside the timed call, as
    masked_sparse must); the group index, pointers and the column order for
    ``segment_reduce`` along dim 0 are computed once outside (as masked_sparse keeps them
    per index)."""
    v, k = m["values"], m["mask"]
    rows, cols = m["shape"]
    group = m["rows"] if dim == 1 else m["cols"]
    coord = m["cols"] if dim == 1 else m["rows"]  # the position along the reduced dim
    n = rows if dim == 1 else cols
    order = None if dim == 1 else torch.argsort(m["cols"], stable=True)
    counts = torch.zeros(n, dtype=torch.long, device=v.device).index_add_(
        0, group, torch.ones_like(group))
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    kf = k.to(v.dtype)

    def composed(kernel: str) -> Fn:
        def red(x: torch.Tensor, how: str = "sum") -> torch.Tensor:
            return _grouped(kernel, x, how, group, n, order, offsets)

        def run() -> torch.Tensor:
            if op == "sum":
                return red(torch.where(k, v, 0))
            if op == "mean":
                return red(torch.where(k, v, 0)) / red(kf)
            if op == "amax":
                return red(torch.where(k, v, -math.inf), "amax")
            if op == "var":
                count = red(kf)
                mean = red(torch.where(k, v, 0)) / count
                dev = torch.where(k, v - mean[group], 0)
                return red(dev * dev) / (count - 1)
            top = red(torch.where(k, v, -math.inf), "amax")
            if op == "logsumexp":
                shifted = torch.where(k, v - top[group], -math.inf)
                return red(shifted.exp()).log() + top
            hit = k & (v == top[group])  # argmax: the first position of the maximum
            return red(torch.where(hit, coord.to(v.dtype), math.inf), "amin").long()
        return run

    return {name: composed(name) for name in RAW}


def full_ops(op: str, m: dict[str, Any]) -> Fn:
    """The raw op on the stored values (a full reduction's floor)."""
    v, k = m["values"], m["mask"]
    if op == "sum":
        return lambda: torch.where(k, v, 0).sum()
    if op == "mean":
        return lambda: torch.where(k, v, 0).sum() / k.sum()
    if op == "amax":
        return lambda: torch.where(k, v, -math.inf).amax()
    if op == "argmax":
        return lambda: torch.where(k, v, -math.inf).argmax()
    if op == "logsumexp":
        return lambda: torch.logsumexp(torch.where(k, v, -math.inf), 0)

    def var() -> torch.Tensor:
        x = torch.where(k, v, 0)
        count = k.sum()
        dev = torch.where(k, v - x.sum() / count, 0)
        return (dev * dev).sum() / (count - 1)
    return var


def reductions(timer: Timer, device: torch.device, sizes: tuple[int, ...]) -> list[dict]:
    out = []
    for nnz in sizes:
        m = matrix(nnz, device)
        for layout in ("csr", "coo"):
            for op in OPS:
                for dim in (0, 1):
                    mine = timed(timer, masked_op(op, m[layout], dim))
                    raw = {name: timed(timer, fn) for name, fn in raw_ops(op, m, dim).items()}
                    ok = {name: r for name, r in raw.items() if "s" in r}
                    winner = min(ok, key=lambda name: ok[name]["s"]) if ok else None
                    out.append({
                        "case": f"{layout} nnz={_size(m['nnz'])} {op}(dim={dim})",
                        "op": op, "dim": dim, "nnz": m["nnz"],
                        "masked": mine, "dense": timed(timer, dense_op(op, m, dim)),
                        "torch.sparse": timed(timer, torch_sparse_op(op, m, layout, dim)),
                        "raw": raw, "winner": winner,
                        "best raw": ok[winner] if winner else {"why": "none ran"}})
        del m
    return out


def full_reductions(timer: Timer, device: torch.device, nnz: int) -> list[dict]:
    m = matrix(nnz, device, seed=2)
    out = []
    for layout in ("csr", "coo"):
        for op in OPS:
            out.append({"case": f"{layout} nnz={_size(m['nnz'])} {op}()",
                        "masked": timed(timer, masked_op(op, m[layout], None)),
                        "raw op": timed(timer, full_ops(op, m))})
    return out


def device_table(rows: list[dict], device: torch.device) -> list[str]:
    """The ``TABLE`` rows of ``layouts/kernels/_device_table.py`` these measurements give:
    per table op (sum; amax, which amin and prod follow) and kind of groups (dim 1: the
    stored lines, ``"lines"``; dim 0: across them, ``"scatter"``), the fastest kernel the
    library implements at each size (votes over the layouts), switching at the geometric
    mean of two measured sizes."""
    lines = []
    for op, kernels in LIBRARY_KERNELS.items():
        for dim, kind in ((1, "lines"), (0, "scatter")):
            by_size: dict[int, dict[str, float]] = {}
            for r in rows:
                if r["op"] != op or r["dim"] != dim:
                    continue
                for name, table_name in kernels.items():
                    if "s" in r["raw"][name]:
                        totals = by_size.setdefault(r["nnz"], {})
                        totals[table_name] = totals.get(table_name, 0.0) + r["raw"][name]["s"]
            entries: list[tuple[int, str]] = []
            previous = None
            for size in sorted(by_size):
                best = min(by_size[size], key=by_size[size].get)
                if not entries or best != entries[-1][1]:
                    at = 0 if previous is None else int(math.sqrt(previous * size))
                    entries.append((at, best))
                previous = size
            if not entries:
                continue
            for name in (op,) if op == "sum" else ("amax", "amin", "prod"):
                cells = ", ".join(f'({at}, "{best}")' for at, best in entries)
                lines.append(f'    ("{name}", "{kind}"): {{"{device.type}": ({cells},)}},')
    return lines


def _size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else str(n)


# -- softmax --------------------------------------------------------------------------------
def softmaxes(timer: Timer, device: torch.device, nnz: int) -> list[dict]:
    m = matrix(nnz, device, seed=1)
    out = []
    for name in ("softmax", "log_softmax"):
        fn, sparse_fn = getattr(torch, name), getattr(torch.sparse, name)
        for layout in ("csr", "coo"):
            for dim in (0, 1):
                d = m["dense"].masked_fill(~m["dmask"], -math.inf)
                out.append({
                    "case": f"{layout} nnz={_size(m['nnz'])} {name}(dim={dim})",
                    "masked": timed(timer, lambda mt=m[layout], dim=dim, fn=fn: fn(mt, dim)),
                    "dense": timed(timer, lambda d=d, dim=dim, fn=fn: fn(d, dim)),
                    "torch.sparse": timed(timer, lambda dim=dim, f=sparse_fn: f(
                        m["spec_coo"], dim))})
    return out


# -- training -------------------------------------------------------------------------------
def mlp_step(timer: Timer, device: torch.device, batch: int, sizes=(784, 512, 512, 10),
             masked_fraction: float = 0.9) -> dict:
    """One SGD train step of a pruned MLP: CSR masked weights against dense ``W * M``."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) / math.sqrt(i) for i, o in zip(sizes, sizes[1:])]
    masks = [torch.rand(w.shape, generator=g) >= masked_fraction for w in weights]
    x = torch.randn(batch, sizes[0], generator=g).to(device)
    y = torch.randint(sizes[-1], (batch,), generator=g).to(device)

    layers = []
    for w, k in zip(weights, masks):
        lin = torch.nn.Linear(w.shape[1], w.shape[0]).to(device)
        lin.weight = torch.nn.Parameter(ms.to_layout(
            ms.masked_tensor(w.to(device), k.to(device)), torch.sparse_csr))
        layers += [lin, torch.nn.ReLU()]
    masked_net = torch.nn.Sequential(*layers[:-1])
    masked_opt = ms.optim.SGD(masked_net.parameters(), lr=0.01)

    dense_w = [torch.nn.Parameter(w.to(device)) for w in weights]
    dense_b = [torch.nn.Parameter(torch.zeros(w.shape[0], device=device)) for w in weights]
    dense_m = [k.to(device) for k in masks]
    dense_opt = torch.optim.SGD(dense_w + dense_b, lr=0.01)

    def masked() -> None:
        masked_opt.zero_grad()
        out = masked_net(x)
        out = out.to_tensor(0) if isinstance(out, ms.MaskedTensor) else out
        F.cross_entropy(out, y).backward()
        masked_opt.step()

    def dense() -> None:
        dense_opt.zero_grad()
        h = x
        for i, (w, b, k) in enumerate(zip(dense_w, dense_b, dense_m)):
            h = F.linear(h, w * k, b)
            h = F.relu(h) if i < len(dense_w) - 1 else h
        F.cross_entropy(h, y).backward()
        dense_opt.step()

    name = "-".join(map(str, sizes))
    return {"case": f"MLP {name} train step, batch {batch}, {masked_fraction:.0%} masked",
            "masked": timed(timer, masked), "dense": timed(timer, dense)}


def attention(timer: Timer, device: torch.device, b: int, h: int, t: int, d: int) -> dict:
    """Forward + backward of attention with a key padding mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=g).to(device).requires_grad_()
               for _ in range(3))
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g).to(device)
    keys = torch.arange(t, device=device)[None, :] < lengths[:, None]  # (B, T)
    mask = keys[:, None, None, :].expand(b, h, t, t)
    scale = 1 / math.sqrt(d)

    def masked() -> None:
        scores = q @ k.transpose(-2, -1) * scale
        out = torch.softmax(ms.as_masked_tensor(scores, mask), -1) @ v
        out = out.to_tensor(0) if isinstance(out, ms.MaskedTensor) else out
        out.sum().backward()

    def recipe() -> None:
        scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, -math.inf)
        (torch.softmax(scores, -1) @ v).sum().backward()

    def sdpa() -> None:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

    def fused() -> None:
        ms.attention(q, k, v, mask, scale=scale).to_tensor(0).sum().backward()

    name = f"attention B={b} H={h} T={t} D={d}, key padding, fwd+bwd"
    dense, fast = timed(timer, recipe), timed(timer, sdpa)
    return [{"case": name, "masked": timed(timer, masked), "dense": dense, "sdpa": fast},
            {"case": f"{name}, ms.attention", "masked": timed(timer, fused), "dense": dense,
             "sdpa": fast}]


def strided_linear(timer: Timer, device: torch.device, n: int, batch: int,
                   masked_fraction: float = 0.9) -> dict:
    """Forward + backward of ``F.linear(x, W)`` with a strided masked ``n x n`` weight
    against the dense ``F.linear(x, W * M)``."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, n, generator=g) / math.sqrt(n)).to(device)
    m = (torch.rand(n, n, generator=g) >= masked_fraction).to(device)
    x = torch.randn(batch, n, generator=g).to(device)
    mw = torch.nn.Parameter(ms.masked_tensor(w.clone(), m))
    dw = torch.nn.Parameter(w.clone())

    def masked() -> None:
        mw.grad = None
        F.linear(x, mw).to_tensor(0).sum().backward()

    def dense() -> None:
        dw.grad = None
        F.linear(x, dw * m).sum().backward()

    return {"case": f"linear {n}x{n}, strided, {masked_fraction:.0%} masked, batch {batch}, "
                    f"fwd+bwd", "masked": timed(timer, masked), "dense": timed(timer, dense)}


def products(device: torch.device, quick: bool) -> list[str]:
    """The density sweep of ``benchmarks.bench_products`` on this device: where a CSR
    weight should multiply as dense (``layouts.PRODUCT_DENSITY_THRESHOLDS``)."""
    from benchmarks import bench_products

    return bench_products.report(bench_products.sweep(device, quick), device).splitlines()[2:]


def embedding_steps(timer: Timer, device: torch.device, rows: int, dim: int = 64,
                    touched: int = 10_000) -> list[dict]:
    """An optimizer step on a ``rows x dim`` embedding whose gradient holds ``touched`` rows
    (hybrid COO, as ``nn.Embedding(sparse=True)`` makes it)."""
    g = torch.Generator().manual_seed(0)
    touched = min(touched, rows // 2)
    lookups = torch.randperm(rows, generator=g)[:touched].to(device)
    grad = torch.sparse_coo_tensor(lookups[None], torch.randn(touched, dim, generator=g)
                                   .to(device), (rows, dim))
    out = []
    for name, mine_cls, torch_cls, kwargs in (
            ("Adagrad", ms.optim.Adagrad, torch.optim.Adagrad, {"lr": 0.01}),
            ("SparseAdam", ms.optim.SparseAdam, torch.optim.SparseAdam, {"lr": 0.001})):
        w = torch.nn.Parameter(torch.randn(rows, dim, device=device))
        mine, theirs = mine_cls([w], **kwargs), torch_cls([w], **kwargs)

        def step(opt: Any, w: torch.Tensor = w) -> Fn:
            def run() -> None:
                w.grad = grad
                opt.step()
            return run

        out.append({"case": f"{name} step, {_size(rows)} x {dim} embedding, {touched} rows",
                    "masked": timed(timer, step(mine)), "torch": timed(timer, step(theirs))})
    return out


# -- report ---------------------------------------------------------------------------------
def tests_summary(junit: str | None) -> str:
    if not junit or not Path(junit).exists():
        return "not run (no --tests JUnit XML)"
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    a = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    passed = a["tests"] - a["failures"] - a["errors"] - a["skipped"]
    return (f"{passed} passed, {a['failures']} failed, {a['errors']} errors, "
            f"{a['skipped']} skipped (of {a['tests']}, {float(suite.get('time', 0)):.0f} s)")


def failed_tests(junit: str | None, limit: int = 60) -> list[str]:
    """``- test id: first line of the failure`` for each failed or erroring test."""
    if not junit or not Path(junit).exists():
        return []
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure")
        bad = case.find("error") if bad is None else bad
        if bad is not None:
            why = (bad.get("message") or "").splitlines()[:1] or [""]
            out.append(f"- `{case.get('classname')}::{case.get('name')}`: {why[0][:150]}")
    return out[:limit] + ([f"- ... and {len(out) - limit} more"] if len(out) > limit else [])


def environment(device: torch.device) -> list[str]:
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine())
    return [f"- device: {device} ({name})",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}, Python "
            f"{platform.python_version()}",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]


def table(rows: list[dict], baselines: tuple[str, ...]) -> list[str]:
    head = ["case", "masked_sparse"] + [f"÷ {b}" for b in baselines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], fmt_s(r["masked"])]
        for b in baselines:
            cells.append(ratio(r["masked"], r[b]) if "s" in r[b]
                         else f"unsupported ({r[b]['why']})" if "why" in r[b] else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def raw_table(rows: list[dict]) -> list[str]:
    lines = ["| case | " + " | ".join(RAW) + " | fastest |", "|" + "---|" * (len(RAW) + 2)]
    for r in rows:
        cells = [r["case"]] + [fmt_s(r["raw"][name]) for name in RAW]
        lines.append("| " + " | ".join(cells + [r["winner"] or "none"]) + " |")
    return lines


def winners(rows: list[dict]) -> list[str]:
    """The fastest raw kernel per op and dim, over sizes and layouts (a vote)."""
    votes: dict[str, dict[str, int]] = {}
    for r in rows:
        key = r["case"].split(" ", 2)[2]  # "sum(dim=0)"
        if r["winner"]:
            votes.setdefault(key, {}).setdefault(r["winner"], 0)
            votes[key][r["winner"]] += 1
    return [f"- {key}: {max(v, key=v.get)} ({', '.join(f'{n}: {c}' for n, c in v.items())})"
            for key, v in sorted(votes.items())]


def report(device: torch.device, tests: str | None, sections: dict[str, Any]) -> str:
    """The Markdown report; a section not (yet) run reads "not run"."""
    missing = ["not run (the run stopped before it)"]
    sections = {"reductions": [], "softmax": [], "full": [], "errors": {}, **sections}
    out = [f"# masked_sparse on {device.type.upper()}", "",
           "Written by `python -m benchmarks.gpu` (see its docstring). Ratio = masked_sparse's "
           "time / the baseline's: below 1 means masked_sparse is faster. Medians of 5 "
           "synchronized rounds.", "", *environment(device), f"- tests: {tests_summary(tests)}",
           ""]
    if sections["errors"]:
        out += ["## Sections that failed on the device", "",
                *(f"- {name}: {why}" for name, why in sections["errors"].items()), ""]
    failed = failed_tests(tests)
    if failed:
        out += ["## Tests that failed on the device", "", *failed, ""]
    red = sections["reductions"]
    table_rows = device_table(red, device) if red else []
    out += ["## Reductions", "",
            *(table(red, ("dense", "torch.sparse", "best raw")) if red else missing), "",
            "### Raw kernels over the specified values", "",
            *(raw_table(red) if red else missing), "",
            "Fastest per op (votes over sizes and layouts):", "", *winners(red), "",
            "### Table for layouts/kernels/_device_table.py", "",
            "The fastest kernel the library implements per (op, kind) and size (Note [The "
            "device table]); these rows go into `TABLE` for this device:", "",
            *(["```python", *table_rows, "```"] if table_rows else missing), "",
            "## Full reductions", "",
            *(table(sections["full"], ("raw op",)) if sections.get("full") else missing), "",
            "## Softmax", "",
            *(table(sections["softmax"], ("dense", "torch.sparse")) if sections["softmax"]
              else missing), "",
            "## Pruned MLP train step", "",
            *(table([sections["mlp"]], ("dense",)) if "mlp" in sections else missing), "",
            "## Attention with a padding mask", "",
            *(table(sections["attention"], ("dense", "sdpa")) if "attention" in sections
              else missing), "",
            "## Strided masked linear", "",
            *(table([sections["linear"]], ("dense",)) if "linear" in sections else missing),
            "",
            "## Sparse kernels or a dense buffer (the density threshold)", "",
            "A CSR weight's train step through the sparse kernels and through a dense buffer "
            "(`python -m benchmarks.bench_products`); the crossover is this device's value "
            "of `layouts.PRODUCT_DENSITY_THRESHOLDS`.", "",
            *(sections["products"] if "products" in sections else missing), "",
            "## Optimizer step on an embedding", "",
            *(table(sections["optim"], ("torch",)) if "optim" in sections else missing), ""]
    return "\n".join(out)


def run(device: torch.device, quick: bool, tests: str | None = None,
        min_time: float | None = None, out: Path | None = None) -> str:
    """Every section; the report is rewritten to ``out`` after each one, so a run stopped
    by its time limit still leaves what it measured."""
    timer = Timer(device, min_time if min_time is not None else (0.01 if quick else 0.1))
    if quick:
        sizes, soft, batch, att, emb = (2_000,), 2_000, 16, (2, 2, 16, 8), 2_000
    else:
        sizes, soft, batch, att, emb = (1_000_000, 10_000_000), 1_000_000, 256, \
            (16, 8, 512, 64), 1_000_000
    sections: dict[str, Any] = {}
    errors: dict[str, str] = {}
    sections["errors"] = errors
    steps = [("reductions", lambda: reductions(timer, device, sizes)),
             ("full", lambda: full_reductions(timer, device, soft)),
             ("softmax", lambda: softmaxes(timer, device, soft)),
             ("mlp", lambda: mlp_step(timer, device, batch)),
             ("attention", lambda: attention(timer, device, *att)),
             ("linear", lambda: strided_linear(timer, device, 256 if quick else 4096,
                                               16 if quick else 512)),
             ("products", lambda: products(device, quick)),
             ("optim", lambda: embedding_steps(timer, device, emb))]
    for name, fn in steps:
        start = time.perf_counter()
        try:
            sections[name] = fn()
        except Exception as exc:  # a setup step failed on this device: report it, go on
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc()
        print(f"[benchmarks.gpu] {name}: {time.perf_counter() - start:.1f} s", flush=True)
        if out is not None:
            out.write_text(report(device, tests, sections))
    for r in sections.get("reductions", []):
        print(f"[benchmarks.gpu] {r['case']}: fastest raw kernel {r['winner']}", flush=True)
    return report(device, tests, sections)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny operands (a smoke run)")
    p.add_argument("--out", default=None,
                   help="Markdown report (default: benchmarks/RESULTS-<device>.md)")
    p.add_argument("--tests", default=None, help="JUnit XML of the pytest --device run")
    p.add_argument("--min-time", type=float, default=None, help="seconds per measurement")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {device}: torch.cuda.is_available() is False (torch "
              f"{torch.__version__}); nothing run", file=sys.stderr)
        return 2
    out = Path(args.out or Path(__file__).parent / f"RESULTS-{device.type}.md")
    text = run(device, args.quick, args.tests, args.min_time, out)
    print(text)
    print(f"[benchmarks.gpu] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
