"""Peak memory per op on sparse masked tensors: does any op allocate more than its output
plus O(nnz) temporaries?  ``python -m benchmarks.memory [--nnz N]`` (Linux).

Operands: the 1M-entry COO and CSR masked matrices of :mod:`benchmarks.bench_goals`
(10000 x 10000, float32 values, half of the stored entries masked out).

Note [Measuring peak memory]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each layout's ops run in a fresh child process (``--child``) whose glibc allocator has a
fixed 64 KiB mmap threshold (``MALLOC_MMAP_THRESHOLD_``): every tensor buffer is then a
mapping of its own, handed back to the system when freed, so the resident set follows the
live tensors instead of a heap that only grows. Per op: fresh operands (cloned, so that no
cache of an earlier op is reused), ``gc.collect()``, write ``5`` to ``/proc/self/clear_refs``
(resets the peak resident set, VmHWM), read the baseline VmRSS, run the op once, read VmHWM.
**Peak extra** = VmHWM − baseline: everything the op had alive at its worst moment, its
output included. The ``noop`` row is the measurement's own noise (a few pages of Python).

**Bound**: the output's bytes (the tensors of the result that the input does not share:
values, mask, new index tensors) plus ``BOUND_FACTOR`` × the input's bytes (values + mask +
index tensors, i.e. O(nnz)); an op above it is flagged. ``mt @ dense`` counts the dense
operand as input.

>>> rows = measure(nnz=1000, layouts=("coo",), ops=("noop", "sum(dim=1)"))  # doctest: +SKIP
>>> rows[1]["peak"] >= 0
True
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
NNZ = 10**6
BOUND_FACTOR = 4
DENSE_COLUMNS = 16
MiB = 2.0**20

# name -> op(a, b, dense); b is a * 0.5 (it shares a's index tensors), dense is (cols, 16)
OPS: dict[str, Callable[[Any, Any, torch.Tensor], Any]] = {
    "noop": lambda a, b, d: None,
    "sum(dim=1)": lambda a, b, d: a.sum(1),
    "sum(dim=0)": lambda a, b, d: a.sum(0),
    "sum()": lambda a, b, d: a.sum(),
    "mean(dim=1)": lambda a, b, d: a.mean(1),
    "amax(dim=1)": lambda a, b, d: a.amax(1),
    "amax(dim=0)": lambda a, b, d: a.amax(0),
    "argmax(dim=1)": lambda a, b, d: a.argmax(1),
    "prod(dim=1)": lambda a, b, d: a.prod(1),
    "logsumexp(dim=1)": lambda a, b, d: torch.logsumexp(a, 1),
    "var(dim=1)": lambda a, b, d: a.var(1),
    "norm(dim=1)": lambda a, b, d: torch.linalg.vector_norm(a, dim=1),
    "softmax(dim=1)": lambda a, b, d: torch.softmax(a, 1),
    "softmax(dim=0)": lambda a, b, d: torch.softmax(a, 0),
    "sqrt": lambda a, b, d: torch.sqrt(a),
    "a + b": lambda a, b, d: a + b,
    "to_tensor(0)": lambda a, b, d: a.to_tensor(0),
    "mt @ dense": lambda a, b, d: a @ d,
    "to the other layout": lambda a, b, d: (a.to_sparse_csr() if a.layout == torch.sparse_coo
                                            else a.to_sparse_coo()),
}
# Ops that are not measured by default; ``to_dense`` densifies by contract, and shows that the
# bound catches a densification (tests/benchmarks/test_benchmarks_smoke.py).
KNOWN_OPS = {**OPS, "to_dense": lambda a, b, d: a.to_dense()}


def _status(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"memory: no {field} in /proc/self/status (Linux only)")


def tensors_of(x: Any) -> list[torch.Tensor]:
    """The plain tensors holding ``x`` (a MaskedTensor, a tensor of any layout, a tuple)."""
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in tensors_of(item)]
    storage = getattr(x, "_storage", None)
    if storage is not None:
        return [storage.values, storage.mask, *storage.index]
    if x.layout == torch.sparse_coo:
        return [x._indices(), x._values()]
    if x.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        compressed = x.crow_indices() if x.layout in (torch.sparse_csr, torch.sparse_bsr) \
            else x.ccol_indices()
        plain = x.col_indices() if x.layout in (torch.sparse_csr, torch.sparse_bsr) \
            else x.row_indices()
        return [compressed, plain, x.values()]
    return [x]


def nbytes(tensors: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct buffers of ``tensors`` that ``exclude`` does not hold."""
    shared = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in shared:
            seen[ptr] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _operands(layout: str, base: dict[str, Any]) -> tuple[Any, Any, torch.Tensor]:
    import masked_sparse as ms

    idx, shape = base["index"].clone(), base["shape"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ms.masked_tensor(
            torch.sparse_coo_tensor(idx, base["values"].clone(), shape, is_coalesced=True),
            torch.sparse_coo_tensor(idx, base["mask"].clone(), shape, is_coalesced=True))
        if layout == "csr":
            a = a.to_sparse_csr()
    return a, a * 0.5, base["dense"].clone()


def child(layout: str, nnz: int, ops: Iterable[str]) -> None:
    """Measure ``ops`` on one layout in this process; print one JSON line per op."""
    from benchmarks.bench_goals import sparse_operands

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(19)
    ops_ = sparse_operands(nnz, gen)
    base = {**{k: ops_[k] for k in ("index", "shape", "values", "mask")},
            "dense": torch.rand(ops_["shape"][1], DENSE_COLUMNS, generator=gen)}
    del ops_
    clear_refs = Path("/proc/self/clear_refs")
    for name in ops:
        with warnings.catch_warnings():  # warm-up: a first call imports and caches code
            warnings.simplefilter("ignore")
            KNOWN_OPS[name](*_operands(layout, base))
        a, b, dense = _operands(layout, base)
        inputs = tensors_of(a) + ([dense] if name == "mt @ dense" else [])
        gc.collect()
        clear_refs.write_text("5")
        before = _status("VmRSS")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = KNOWN_OPS[name](a, b, dense)
        peak = _status("VmHWM") - before
        row = {"op": name, "layout": layout, "nnz": nnz, "peak": peak,
               "output": nbytes(tensors_of(out), exclude=inputs),
               "input": nbytes(inputs)}
        print(json.dumps(row), flush=True)
        del out, a, b, dense, inputs


def measure(nnz: int = NNZ, layouts: Iterable[str] = ("coo", "csr"),
            ops: Iterable[str] = tuple(OPS)) -> list[dict[str, Any]]:
    """Peak extra memory of every op, one child process per layout (Note [Measuring peak
    memory]); each row: op, layout, nnz, peak, output and input bytes, bound, flagged."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for layout in layouts:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.memory", "--child", layout, "--nnz", str(nnz),
             "--ops", ",".join(ops)], env=env, cwd=ROOT, capture_output=True, text=True,
            check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"memory: the {layout} child failed:\n{proc.stderr[-2000:]}")
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        row["bound"] = row["output"] + BOUND_FACTOR * row["input"]
        row["flagged"] = row["peak"] > row["bound"]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: per op and layout, the peak extra MiB and its multiple of the input."""
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    by = {(r["op"], r["layout"]): r for r in rows}
    head = ["op"] + [f"{lay.upper()} peak extra (÷ input, output)" for lay in layouts]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(layouts) + "|"]
    for op in dict.fromkeys(r["op"] for r in rows):
        cells = []
        for lay in layouts:
            r = by.get((op, lay))
            if r is None:
                cells.append("")
                continue
            flag = " ✗ over bound" if r["flagged"] else ""
            cells.append(f"{r['peak'] / MiB:.1f} MiB ({r['peak'] / r['input']:.2f}×, "
                         f"out {r['output'] / MiB:.1f} MiB){flag}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nnz", type=int, default=NNZ)
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated op names")
    parser.add_argument("--child", metavar="LAYOUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    if args.child:
        child(args.child, args.nnz, ops)
        return
    rows = measure(args.nnz, ops=ops)
    print(f"Peak extra memory per op, nnz={args.nnz} (bound: output + {BOUND_FACTOR} × input)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
