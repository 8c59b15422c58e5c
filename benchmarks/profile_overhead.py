"""Where the fixed per-op cost of masked_sparse goes: ``python -m benchmarks.profile_overhead``.

Two views on a tiny operand (so that the computation itself is negligible):

1. A *ladder* of timings (the fastest of 15 interleaved blocks each: on a shared machine
   the least disturbed one), each rung adding one layer on top of the previous one:
   the raw op on the values, the same aten overload called from Python (what the kernel
   calls), the core's kernel (``apply_to_values``: align, read plain operands, the op,
   ``_wrap``), the C++ dispatcher down to ``__torch_dispatch__`` (entered with torch
   functions disabled), and the full call with ``__torch_function__``. The differences are
   each layer's cost.
2. ``--cprofile``: cProfile of a loop over the same calls, grouped into those layers by
   function (cProfile inflates small Python functions, so trust the ladder for sizes and
   the profile for where to look).

Also prints, for COO/CSR at nnz = 1e6, the ratio to the raw values op.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch._C import DisableTorchFunctionSubclass  # noqa: E402

import masked_sparse as ms  # noqa: E402
from benchmarks.harness import fmt_time, paired_rounds  # noqa: E402
from masked_sparse._tensor import _wrap  # noqa: E402

aten = torch.ops.aten


def _operands(layout: str, nnz: int) -> tuple[ms.MaskedTensor, ms.MaskedTensor, torch.Tensor]:
    from benchmarks.bench_core import sparse_pattern

    gen = torch.Generator().manual_seed(0)
    if layout == "strided":
        n = max(1, round(nnz ** 0.5))
        data = torch.rand(n, n, generator=gen)
        a = ms.masked_tensor(data, torch.rand(n, n, generator=gen) < 0.5)
        return a, a * 0.5, torch.rand(n, n, generator=gen)
    idx, shape = sparse_pattern(nnz, 0.01, gen)
    values = torch.rand(nnz, generator=gen)
    mvals = torch.rand(nnz, generator=gen) < 0.5
    data = torch.sparse_coo_tensor(idx, values, shape, is_coalesced=True)
    mask = torch.sparse_coo_tensor(idx, mvals, shape, is_coalesced=True)
    a = ms.masked_tensor(data, mask)
    if layout == "csr":
        a = a.to_sparse_csr()
    return a, a * 0.5, torch.rand(shape, generator=gen)


def ladder(op: str, a: ms.MaskedTensor, b: ms.MaskedTensor, min_run_time: float
           ) -> list[tuple[str, float]]:
    """Cumulative timings of one op, layer by layer (see the module docstring)."""
    from masked_sparse.ops.pointwise import apply_to_values

    va, vb = a._storage.values, b._storage.values
    if op == "sqrt":
        func, torch_fn, ms_args, raw_args = aten.sqrt.default, torch.sqrt, (a,), (va,)
    else:
        func, torch_fn, ms_args, raw_args = aten.add.Tensor, torch.add, (a, b), (va, vb)

    def below_torch_function() -> Any:
        with DisableTorchFunctionSubclass():
            return torch_fn(*ms_args)

    s = a._storage
    rungs = [
        ("raw op on the values (torch.*)", lambda: torch_fn(*raw_args)),
        ("aten overload called from Python", lambda: func(*raw_args)),
        ("+ Storage + _wrap (_make_wrapper_subclass)",
         lambda: _wrap(s.with_values(func(*raw_args)))),
        ("+ kernel: align, unwrap (apply_to_values)",
         lambda: apply_to_values(func, ms_args, {}, False)),
        ("+ C++ dispatch to __torch_dispatch__", below_torch_function),
        ("+ __torch_function__ (the full call)", lambda: torch_fn(*ms_args)),
    ]
    times = paired_rounds(dict(rungs), min_run_time, 15, {}, {})
    return [(name, min(times[name])) for name, _ in rungs]


def print_ladder(title: str, rows: list[tuple[str, float]]) -> None:
    total = rows[-1][1]
    print(f"\n#### {title}: {fmt_time(total)} per call\n")
    print("| layer | cumulative | this layer | share of the call |")
    print("| --- | ---: | ---: | ---: |")
    prev = 0.0
    for name, t in rows:
        step = t - prev if prev else t
        print(f"| {name} | {fmt_time(t)} | {fmt_time(step) if step > 0 else '~0'} | "
              f"{max(step, 0) / total:.0%} |")
        prev = t


_GROUPS = (
    ("__torch_function__", ("_tensor.py", "__torch_function__")),
    ("__torch_dispatch__ (+ kernel closure)", ("_tensor.py", "__torch_dispatch__")),
    ("apply_to_values (self)", ("pointwise.py", "apply_to_values")),
    ("align / read_plain / unwrap", ("pointwise.py", "align")),
    ("_wrap (Python part)", ("_tensor.py", "_wrap")),
    ("_make_wrapper_subclass", ("~", "_make_wrapper_subclass")),
    ("Storage.with_values", ("registry.py", "with_values")),
)


def cprofile_groups(fn: Any, n: int = 20000) -> None:
    """cProfile ``fn`` ``n`` times; print the self time of each layer and the top entries."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    rows: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        group = "other (aten op call, torch internals, builtins)"
        for label, (f_part, n_part) in _GROUPS:
            if f_part in file and (n_part in name or (label.startswith("align") and name in (
                    "align", "read_plain", "unwrap", "<genexpr>", "<listcomp>",
                    "<dictcomp>", "same_index"))):
                group = label
                break
        rows[group] = rows.get(group, 0.0) + tt
    print(f"\ncProfile self time, {n} calls ({fmt_time(total / n)} per call under the "
          f"profiler):\n")
    for label, tt in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"- {label}: {tt / total:.0%}")


#: The per-op fixed-cost table: ``(label, masked call, raw call on the values)``.
def _fixed_cost_ops(a: ms.MaskedTensor) -> list[tuple[str, Any, Any]]:
    v = a._storage.values
    return [
        ("sum(1)", lambda: a.sum(1), lambda: v.sum()),
        ("sum()", lambda: a.sum(), lambda: v.sum()),
        ("amax(1)", lambda: a.amax(1), lambda: v.amax()),
        ("amax()", lambda: a.amax(), lambda: v.amax()),
        ("mean(1)", lambda: a.mean(1), lambda: v.mean()),
        ("mean()", lambda: a.mean(), lambda: v.mean()),
        ("argmax(1)", lambda: a.argmax(1), lambda: v.argmax()),
        ("argmax()", lambda: a.argmax(), lambda: v.argmax()),
        ("var(1)", lambda: a.var(1), lambda: v.var()),
        ("var()", lambda: a.var(), lambda: v.var()),
        ("softmax(1)", lambda: a.softmax(1), lambda: v.softmax(0)),
        ("get_data()", a.get_data, None),
        ("to_tensor(0)", lambda: a.to_tensor(0), None),
        ("sqrt", lambda: torch.sqrt(a), lambda: torch.sqrt(v)),
    ]


def fixed_costs(min_run_time: float) -> None:
    """Median time per call of each op on ~1000 elements per layout, paired rounds; the raw
    column is the op on the values alone (strided: the 32 x 32 values)."""
    layouts_ = ("coo", "csr", "strided")
    ops = {lay: _fixed_cost_ops(_operands(lay, 1024 if lay == "strided" else 1000)[0])
           for lay in layouts_}
    print("\n## Fixed cost per op, ~1000 elements (median over paired rounds, 1 thread)\n")
    print("| op | " + " | ".join(layouts_) + " | raw op on the values (coo) |")
    print("| --- |" + " ---: |" * (len(layouts_) + 1))
    for i, (label, _, raw) in enumerate(ops["coo"]):
        calls = {lay: ops[lay][i][1] for lay in layouts_}
        if raw is not None:
            calls["raw"] = raw
        times = paired_rounds(calls, min_run_time, 9, {}, {})
        cells = [fmt_time(statistics.median(times[k])) for k in calls]
        print(f"| {label} | " + " | ".join(cells + ([] if raw else ["--"])) + " |")


def to_tensor_at_scale(min_run_time: float, nnz: int = 10**6) -> None:
    """``to_tensor(0)`` against the raw fill (``masked_fill`` + the torch sparse tensor)."""
    print(f"\n## to_tensor(0) at nnz = {nnz:.0e} (median of per-round ratios)\n")
    print("| layout | to_tensor(0) | raw | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for layout in ("coo", "csr"):
        a = _operands(layout, nnz)[0]
        s = a._storage
        times = paired_rounds({
            "ms": lambda a=a: a.to_tensor(0),
            "raw": lambda s=s: s.layout.to_torch(s, s.values.masked_fill(~s.mask, 0))},
            min_run_time, 9, {}, {})
        ratio = statistics.median(m / r for m, r in zip(times["ms"], times["raw"]))
        print(f"| {layout} | {fmt_time(statistics.median(times['ms']))} | "
              f"{fmt_time(statistics.median(times['raw']))} | {ratio:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cprofile", action="store_true", help="add a cProfile breakdown")
    parser.add_argument("--quick", action="store_true", help="shorter timing")
    parser.add_argument("--fixed", action="store_true",
                        help="only the fixed-cost table of reductions and accessors")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    mrt = 0.1 if args.quick else 0.5
    if args.fixed:
        fixed_costs(mrt)
        to_tensor_at_scale(mrt)
        return
    print("## Per-op overhead of masked_sparse (1 thread)")
    for layout, nnz in (("strided", 100), ("coo", 1000), ("csr", 1000)):
        a, b, _ = _operands(layout, nnz)
        for op in ("sqrt", "add"):
            print_ladder(f"{layout} (~{nnz} elements) {op}", ladder(op, a, b, mrt))
            if args.cprofile:
                cprofile_groups((lambda a=a: torch.sqrt(a)) if op == "sqrt"
                                else (lambda a=a, b=b: a + b))
    print("\n## At nnz = 1e6 (ratio to the raw op on the values, fastest blocks)\n")
    print("| case | masked_sparse | raw values op | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for layout in ("coo", "csr"):
        a, b, _ = _operands(layout, 10**6)
        va, vb = a._storage.values, b._storage.values
        for name, fn, raw in (
                ("sqrt", lambda a=a: torch.sqrt(a), lambda va=va: torch.sqrt(va)),
                ("mt + mt (shared index)", lambda a=a, b=b: a + b, lambda va=va, vb=vb: va + vb)):
            times = paired_rounds({"ms": fn, "raw": raw}, mrt, 15, {}, {})
            t_ms, t_raw = min(times["ms"]), min(times["raw"])
            print(f"| {layout} {name} | {fmt_time(t_ms)} | {fmt_time(t_raw)} | "
                  f"{t_ms / t_raw:.3g}× |")


if __name__ == "__main__":
    main()
