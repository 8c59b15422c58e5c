"""torch.compile on MaskedTensors: compiled vs eager, per op family and layout.

Each case times the *compiled* masked function (Inductor, ``dynamic=False``); its baselines
are the same masked function run eagerly (``eager``) and the compiled dense equivalent
written with ``torch.where`` / ``-inf`` (``floor``), including what the masked semantics
need (a count for ``mean`` / ``var``, zeros on fully masked softmax rows). A ratio below 1
against ``eager`` means compiling pays; the ratio against ``floor`` is the price of the
MaskedTensor over hand-written dense code. For the main families a third baseline,
``vector mask``, is that dense code given the mask as ``layouts._vector_mask.vector_mask``
computes it (Note [Compiled mask loads]): read as the masked code reads it, so the ratio
shows what the MaskedTensor itself costs once both load the mask alike. Compilation
happens once, when the cases are built.

``python -m benchmarks.bench_compile`` times the cases (``--quick``: 512² operands,
``--only TEXT``: the cases whose name contains TEXT, compiling only those);
``--breaks`` prints the graph breaks per layout and op family instead (the README's
compile table).

>>> names = [c[0] for c in cases(quick=True)]  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import masked_sparse as ms

Fn = Callable[..., Any]
NEG_INF = -math.inf
LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr")


COMPILE_SECONDS: dict[str, float] = {}  # training case -> first call (compile) time


def _compiled(fn: Fn, *args: Any) -> Callable[[], Any]:
    """``fn`` compiled with Inductor and warmed up on ``args``; a no-argument callable."""
    c = torch.compile(fn, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c(*args)
    return lambda: c(*args)


def _vector_mask(m: torch.Tensor) -> torch.Tensor:
    """``layouts._vector_mask.vector_mask`` for the contiguous, even-sized masks here,
    without its checks (Dynamo cannot trace ``storage_offset()`` on a plain tensor)."""
    return m.reshape(-1).view(torch.int16).view(torch.uint8).to(torch.int32).ne(0).view(m.shape)


def _dense_var(d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    count = m.sum(1, keepdim=True)
    mean = torch.where(m, d, 0).sum(1, keepdim=True) / count.clamp(min=1)
    return torch.where(m, d - mean, 0).square().sum(1) / (count.squeeze(1) - 1).clamp(min=1)


def _dense_softmax(d: torch.Tensor, m: torch.Tensor, log: bool = False) -> torch.Tensor:
    """The ``-inf`` softmax with zeros where unspecified (no NaN on fully masked rows)."""
    s = torch.where(m, d, NEG_INF)
    return torch.where(m, s.log_softmax(1) if log else s.softmax(1), 0)


#: op family -> (masked function of a MaskedTensor, dense function of (data, mask)).
STRIDED: dict[str, tuple[Fn, Fn]] = {
    "sum(1)": (lambda x: x.sum(1), lambda d, m: torch.where(m, d, 0).sum(1)),
    "mean(1)": (lambda x: x.mean(1),
                lambda d, m: torch.where(m, d, 0).sum(1) / m.sum(1).clamp(min=1)),
    "amax(1)": (lambda x: x.amax(1), lambda d, m: torch.where(m, d, NEG_INF).amax(1)),
    "amin(1)": (lambda x: x.amin(1), lambda d, m: torch.where(m, d, math.inf).amin(1)),
    "argmax(1)": (lambda x: x.argmax(1), lambda d, m: torch.where(m, d, NEG_INF).argmax(1)),
    "prod(1)": (lambda x: x.prod(1), lambda d, m: torch.where(m, d, 1).prod(1)),
    "logsumexp(1)": (lambda x: x.logsumexp(1),
                     lambda d, m: torch.where(m, d, NEG_INF).logsumexp(1)),
    "var(1)": (lambda x: x.var(1), _dense_var),
    "std(1)": (lambda x: x.std(1), lambda d, m: _dense_var(d, m).sqrt()),
    "norm(dim=1)": (lambda x: x.norm(dim=1), lambda d, m: torch.where(m, d, 0).norm(dim=1)),
    "(mt > 0).any(1)": (lambda x: (x > 0).any(1), lambda d, m: ((d > 0) & m).any(1)),
    "(mt > 0).all(1)": (lambda x: (x > 0).all(1), lambda d, m: ((d > 0) | ~m).all(1)),
    "count_nonzero(1)": (lambda x: x.count_nonzero(1), lambda d, m: ((d != 0) & m).sum(1)),
    "softmax(1)": (lambda x: x.softmax(1), _dense_softmax),
    "log_softmax(1)": (lambda x: x.log_softmax(1), lambda d, m: _dense_softmax(d, m, True)),
    "exp() * 2 + 1": (lambda x: x.exp() * 2 + 1, lambda d, m: d.exp() * 2 + 1),
}
#: Families also timed against the dense code reading the mask through ``vector_mask``.
VECTOR_MASK_FLOOR = ("sum(1)", "mean(1)", "amax(1)", "argmax(1)", "var(1)", "logsumexp(1)",
                     "softmax(1)", "log_softmax(1)")


def _strided(n: int, gen: torch.Generator, only: str | None) -> list[tuple]:
    data = torch.randn(n, n, generator=gen)
    mask = torch.rand(n, n, generator=gen) > 0.3
    mask[0] = False  # a fully masked row, as the semantics must handle
    mt = ms.masked_tensor(data, mask)
    out = []
    for family, (masked_fn, dense_fn) in STRIDED.items():
        name = f"strided {n}x{n} {family}"
        if only and only not in name:
            continue
        baselines = {"eager": lambda f=masked_fn: f(mt), "floor": _compiled(dense_fn, data, mask)}
        if family in VECTOR_MASK_FLOOR:
            baselines["vector mask"] = _compiled(
                lambda d, m, f=dense_fn: f(d, _vector_mask(m)), data, mask)
        out.append((name, _compiled(masked_fn, mt), baselines))
    return out


def _attention(n: int, d: int, gen: torch.Generator) -> tuple:
    """A masked softmax attention block against the dense ``-inf`` formulation (zeros on
    fully masked rows, as the masked result has)."""
    q, k, v = (torch.randn(n, d, generator=gen) for _ in range(3))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    causal[0] = False  # a fully masked row
    scale = 1 / math.sqrt(d)

    def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
        p = ms.as_masked_tensor(q @ k.T * scale, m).softmax(-1)
        return p.to_tensor(0) @ v

    def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
        return _dense_softmax(q @ k.T * scale, m) @ v

    def dense_vector_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
        return dense(q, k, v, _vector_mask(m))

    return (f"strided attention n={n} d={d}", _compiled(masked, q, k, v, causal),
            {"eager": lambda: masked(q, k, v, causal), "floor": _compiled(dense, q, k, v, causal),
             "vector mask": _compiled(dense_vector_mask, q, k, v, causal)})


def _sparse(layout: str, n: int, gen: torch.Generator, only: str | None) -> list[tuple]:
    data = torch.randn(n, n, generator=gen)
    mask = torch.rand(n, n, generator=gen) < 0.01
    mt = ms.masked_tensor(data, mask)
    mt = mt.to_sparse_bsr((2, 2)) if layout == "sparse_bsr" else ms.to_layout(mt, layout)
    vals = mt._storage.values

    def pointwise(x: Any) -> Any:
        return x.exp() * 2 + 1

    out = []
    name = f"{layout} {n}x{n} nnz=1% exp() * 2 + 1"
    if not only or only in name:
        out.append((name, _compiled(pointwise, mt),
                    {"eager": lambda: pointwise(mt), "floor": _compiled(pointwise, vals)}))
    name = f"{layout} {n}x{n} nnz=1% sum(1) (graph breaks)"
    if not only or only in name:
        out.append((name, _compiled(lambda x: x.sum(1), mt), {"eager": lambda: mt.sum(1)}))
    return out


def _mf_step(layout: str, n: int, m: int, k: int,
             gen: torch.Generator) -> tuple[Fn, Fn, list]:
    """A matrix factorisation step on a masked ``(n, m)`` rating matrix with 2% observed
    (``layout``): the sampled product minus broadcast plain biases, a masked MSE and its
    backward: ``(loss, step, params)``, ``step(loss)`` resets the gradients and runs it."""
    import torch.nn.functional as F

    mask = torch.rand(n, m, generator=gen) < 0.02
    R = ms.masked_tensor(torch.randn(n, m, generator=gen), mask)
    R = R if layout == "strided" else ms.to_layout(R, layout)
    params = [torch.randn(*shape, generator=gen).mul_(0.1).requires_grad_()
              for shape in ((n, k), (m, k), (n,), (m,))]

    def loss(U: torch.Tensor, V: torch.Tensor, bu: torch.Tensor, bi: torch.Tensor) -> Any:
        pred = torch.sparse.sampled_addmm(R, U, V.T, beta=0) - bu[:, None] - bi[None, :]
        return F.mse_loss(pred, R)

    def step(fn: Fn) -> Any:
        for p in params:
            p.grad = None
        out = fn(*params)
        out.backward()
        return out

    return loss, step, params


def _gat(layout: str, n: int, f: int, gen: torch.Generator) -> tuple[Fn, Fn, list]:
    """A GAT layer on a masked ``(n, n)`` adjacency with about 10 edges a node: per-edge
    scores by broadcasting, LeakyReLU, a masked softmax along rows, the product with the
    features, and the backward to the features."""
    import torch.nn.functional as F

    adj = torch.rand(n, n, generator=gen) < 10 / n
    A0 = ms.masked_tensor(torch.zeros(n, n), adj)
    A0 = A0 if layout == "strided" else ms.to_layout(A0, layout)
    h = torch.randn(n, f, generator=gen).requires_grad_()
    a_dst, a_src = torch.randn(f, generator=gen), torch.randn(f, generator=gen)

    def layer(h: torch.Tensor) -> torch.Tensor:
        hd = h.detach()
        scores = A0 + (hd @ a_dst)[:, None] + (hd @ a_src)[None, :]
        att = F.leaky_relu(scores, 0.2).softmax(1)
        return (att @ h).to_tensor(0).square().sum()

    def step(fn: Fn) -> Any:
        h.grad = None
        out = fn(h)
        out.backward()
        return out

    return layer, step, [h]


def _training(quick: bool, gen: torch.Generator, only: str | None) -> list[tuple]:
    """Training steps (forward and backward) compiled (Inductor, graph breaks allowed)
    against the same step run eagerly; the compile time is kept apart (``COMPILE_SECONDS``)."""
    out = []
    n, m = (600, 400) if quick else (6000, 3700)
    ng = 300 if quick else 3000
    builders = [(f"{lay} matrix factorisation step {n}x{m} 2% observed",
                 lambda lay=lay: _mf_step(lay, n, m, 32, gen)) for lay in TRAINING_LAYOUTS]
    builders += [(f"{lay} GAT layer n={ng}", lambda lay=lay: _gat(lay, ng, 16, gen))
                 for lay in TRAINING_LAYOUTS]
    for name, build in builders:
        if only and only not in name:
            continue
        fn, step, _ = build()
        fast = torch.compile(fn, dynamic=False)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(fast)
        COMPILE_SECONDS[name] = time.perf_counter() - start
        out.append((name, lambda s=step, c=fast: s(c), {"eager": lambda s=step, f=fn: s(f)}))
    return out


TRAINING_LAYOUTS = ("strided", "sparse_coo", "sparse_csr")


def cases(quick: bool = False, only: str | None = None) -> list[tuple]:
    """Compiled vs eager cases; ``quick`` uses smaller operands (same families); ``only``
    builds (and compiles) only the cases whose name contains it."""
    gen = torch.Generator().manual_seed(0)
    n = 512 if quick else 2048
    out = _strided(n, gen, only)
    na = 256 if quick else 1024
    if not only or only in f"strided attention n={na} d=64":
        out.append(_attention(na, 64, gen))
    for layout in LAYOUTS[1:]:
        out += _sparse(layout, 512 if quick else 2048, gen, only)
    return out + _training(quick, gen, only)


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
    A break is one of Dynamo's break reasons: ``graph_break_count`` misses a break that
    ends the function (``to_tensor(0)`` of a sparse input, run eagerly at the end).
    """
    gen = torch.Generator().manual_seed(0)
    base = ms.masked_tensor(torch.randn(4, 6, generator=gen), torch.rand(4, 6, generator=gen) > 0.4)
    table: dict[str, dict[str, int]] = {}
    for layout in LAYOUTS:
        mt = base.to_sparse_bsr((2, 2)) if layout == "sparse_bsr" else ms.to_layout(base, layout)
        row = table.setdefault(layout, {})
        for family, fn in FAMILIES.items():
            torch._dynamo.reset()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrapped = _between_pointwise(fn)
                row[family] = len(torch._dynamo.explain(wrapped)(mt).break_reasons)
    return table


def breaks_table(table: dict[str, dict[str, int]]) -> str:
    """The graph-break counts as a Markdown table: op family x layout."""
    layouts = list(table)
    rows = ["| op family | " + " | ".join(layouts) + " |",
            "|---|" + "---:|" * len(layouts)]
    for family in FAMILIES:
        rows.append(f"| {family} | " + " | ".join(str(table[lay][family]) for lay in layouts)
                    + " |")
    return "\n".join(rows)


def main() -> None:
    from benchmarks import harness

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="512² operands, 0.05 s a case")
    parser.add_argument("--only", metavar="TEXT", help="the cases whose name contains TEXT")
    parser.add_argument("--breaks", action="store_true", help="graph breaks per layout")
    args = parser.parse_args()
    if args.breaks:
        print(breaks_table(graph_breaks()))
        return
    torch.set_num_threads(1)
    harness.run_cases(cases(args.quick, args.only), "torch.compile (strided, sparse)",
                      min_run_time=0.05 if args.quick else 0.3)
    if COMPILE_SECONDS:
        print("\ncompile time of the training steps (first call, Inductor):")
        for name, seconds in COMPILE_SECONDS.items():
            print(f"  {name}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
