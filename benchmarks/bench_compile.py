"""torch.compile on MaskedTensors: compiled vs eager, per op family and layout.

Each case times the *compiled* masked function (Inductor, ``dynamic=False``); its baselines
are the same masked function run eagerly (``eager``) and the compiled dense equivalent
written with ``torch.where`` / ``-inf`` (``floor``). A ratio below 1 against ``eager``
means compiling pays; the ratio against ``floor`` is the price of the MaskedTensor over
hand-written dense code. Compilation happens once, when the cases are built.

``python -m benchmarks.bench_compile --breaks`` prints the graph breaks per layout and op
family instead (the README's compile table).

>>> names = [c[0] for c in cases(quick=True)]  # doctest: +SKIP
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

import masked_sparse as ms

Fn = Callable[..., Any]


def _compiled(fn: Fn, *args: Any) -> Callable[[], Any]:
    """``fn`` compiled with Inductor and warmed up on ``args``; a no-argument callable."""
    c = torch.compile(fn, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c(*args)
    return lambda: c(*args)


def _strided(n: int, gen: torch.Generator) -> list[tuple]:
    data = torch.randn(n, n, generator=gen)
    mask = torch.rand(n, n, generator=gen) > 0.3
    mt = ms.masked_tensor(data, mask)
    inf = -math.inf
    families: dict[str, tuple[Fn, Fn]] = {
        "sum(1)": (lambda x: x.sum(1), lambda d, m: torch.where(m, d, 0).sum(1)),
        "amax(1)": (lambda x: x.amax(1), lambda d, m: torch.where(m, d, inf).amax(1)),
        "(mt > 0).any(1)": (lambda x: (x > 0).any(1), lambda d, m: ((d > 0) & m).any(1)),
        "mean(0)": (lambda x: x.mean(0),
                    lambda d, m: torch.where(m, d, 0).sum(0) / m.sum(0).clamp(min=1)),
        "softmax(1)": (lambda x: x.softmax(1), lambda d, m: torch.where(m, d, inf).softmax(1)),
        "exp() * 2 + 1": (lambda x: x.exp() * 2 + 1, lambda d, m: d.exp() * 2 + 1),
    }
    out = []
    for name, (masked_fn, dense_fn) in families.items():
        out.append((f"strided {n}x{n} {name}", _compiled(masked_fn, mt),
                    {"eager": lambda f=masked_fn: f(mt), "floor": _compiled(dense_fn, data, mask)}))
    return out


def _attention(n: int, d: int, gen: torch.Generator) -> tuple:
    """A masked softmax attention block against the dense ``-inf`` formulation."""
    q, k, v = (torch.randn(n, d, generator=gen) for _ in range(3))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scale = 1 / math.sqrt(d)

    def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
        p = ms.as_masked_tensor(q @ k.T * scale, m).softmax(-1)
        return p.to_tensor(0) @ v

    def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
        return torch.where(m, q @ k.T * scale, -math.inf).softmax(-1) @ v

    return (f"strided attention n={n} d={d}", _compiled(masked, q, k, v, causal),
            {"eager": lambda: masked(q, k, v, causal), "floor": _compiled(dense, q, k, v, causal)})


def _sparse(layout: str, n: int, gen: torch.Generator) -> list[tuple]:
    data = torch.randn(n, n, generator=gen)
    mask = torch.rand(n, n, generator=gen) < 0.01
    mt = ms.to_layout(ms.masked_tensor(data, mask), layout)
    vals = mt._storage.values

    def pointwise(x: Any) -> Any:
        return x.exp() * 2 + 1

    return [(f"{layout} {n}x{n} nnz=1% exp() * 2 + 1", _compiled(pointwise, mt),
             {"eager": lambda: pointwise(mt), "floor": _compiled(pointwise, vals)}),
            (f"{layout} {n}x{n} nnz=1% sum(1) (graph breaks)", _compiled(lambda x: x.sum(1), mt),
             {"eager": lambda: mt.sum(1)})]


def cases(quick: bool = False) -> list[tuple]:
    """Compiled vs eager cases; ``quick`` uses smaller operands (same families)."""
    gen = torch.Generator().manual_seed(0)
    n = 512 if quick else 2048
    out = _strided(n, gen)
    out.append(_attention(256 if quick else 1024, 64, gen))
    for layout in ("sparse_coo", "sparse_csr"):
        out += _sparse(layout, 512 if quick else 2048, gen)
    return out


# -- graph breaks per layout and op family (the README table) ------------------------------
FAMILIES: dict[str, Fn] = {
    "unary / binary pointwise, where": lambda x: torch.where(x > 0, x.exp() * x, -x),
    "full reduction": lambda x: x.sum(),
    "reduction along a dim": lambda x: x.sum(1),
    "softmax / log_softmax": lambda x: x.softmax(1),
    "to_tensor(0) / get_data / get_mask": lambda x: x.to_tensor(0),
}


def _between_pointwise(fn: Fn) -> Fn:
    def wrapped(x: Any) -> Any:
        out = fn(x * 2)
        return out * 3 if isinstance(out, ms.MaskedTensor) else out

    return wrapped


def graph_breaks() -> dict[str, dict[str, int]]:
    """``{layout: {family: graph breaks}}`` for one small MaskedTensor per layout.

    Each op runs between two pointwise ops (``op(x * 2)`` and a ``* 3`` after it, where
    the result is a MaskedTensor), so a break shows as the op running outside the graph.
    """
    gen = torch.Generator().manual_seed(0)
    base = ms.masked_tensor(torch.randn(4, 6, generator=gen), torch.rand(4, 6, generator=gen) > 0.4)
    table: dict[str, dict[str, int]] = {}
    for layout in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"):
        mt = base.to_sparse_bsr((2, 2)) if layout == "sparse_bsr" else ms.to_layout(base, layout)
        row = table.setdefault(layout, {})
        for family, fn in FAMILIES.items():
            torch._dynamo.reset()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrapped = _between_pointwise(fn)
                row[family] = torch._dynamo.explain(wrapped)(mt).graph_break_count
    return table


if __name__ == "__main__" and "--breaks" in sys.argv:
    for layout, row in graph_breaks().items():
        print(layout, row)
