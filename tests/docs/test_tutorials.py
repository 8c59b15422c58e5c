"""Every tutorial in ``tutorials/`` runs as a script in a fresh process, and its key printed
numbers match values computed here independently (dense torch / numpy / numpy.ma / scipy
arithmetic on the same inputs -- never numbers copied from the tutorial's output).

The tutorials run concurrently (one subprocess each) once per session. New tutorials are
picked up by the glob: they must at least run cleanly; add a checker below for their
numbers.
"""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from conftest import DEVICE, cpu_only

pytestmark = pytest.mark.device_generic

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))
NAN = float("nan")
#: Tutorials that need the CPU (``--device`` runs the others there through conftest's
#: ``OnDevice``: what the tutorial builds goes to the device, as if it said so).
CPU_ONLY = {"overview": "compares with numpy.ma through .numpy()",
            "scipy_interop": "scipy.sparse interop", "distributed": "gloo processes",
            "recommender": "scipy.sparse ratings"}
_ON_DEVICE = """import runpy, sys, torch
sys.path.insert(0, {tests!r})
from conftest import OnDevice
OnDevice(torch.device({device!r})).__enter__()
runpy.run_path({path!r}, run_name="__main__")
"""


def _command(path: Path) -> list[str]:
    if DEVICE.type == "cpu" or path.stem in CPU_ONLY:
        return [sys.executable, str(path)]
    code = _ON_DEVICE.format(tests=str(ROOT / "tests"), device=str(DEVICE), path=str(path))
    return [sys.executable, "-c", code]


@pytest.fixture(scope="session")
def runs() -> dict[str, subprocess.CompletedProcess]:
    # The checkout under test, not whichever copy of the package is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def run(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(_command(path), capture_output=True, text=True, timeout=300,
                              cwd=ROOT, env=env)

    with ThreadPoolExecutor(max_workers=max(1, len(TUTORIALS))) as pool:
        return dict(zip((p.stem for p in TUTORIALS), pool.map(run, TUTORIALS)))


def output(runs: dict, name: str) -> str:
    proc = runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# -- reading printed values ----------------------------------------------------------------
_TOKEN = re.compile(r"--|\b(?:True|False|nan)\b|-?\binf\b"
                    r"|(?<![\w.])-?\d+(?:\.\d*)?(?:e[+-]?\d+)?")


def _convert(tok: str):
    if tok == "--":
        return None
    if tok in ("True", "False"):
        return tok == "True"
    return float(tok)


def _find(out: str, label: str) -> int:
    """The position just past ``label``, which must start exactly one output line."""
    hits = [m.end() for m in re.finditer(r"(?m)^[ \t]*" + re.escape(label), out)]
    assert len(hits) == 1, f"label {label!r} starts {len(hits)} lines"
    return hits[0]


def printed(out: str, label: str, n: int, *, then: str | None = None) -> list:
    """The first ``n`` values printed after ``label`` (and after ``then`` past it):
    numbers as floats, ``--`` as None, True/False as bools."""
    pos = _find(out, label)
    if then is not None:
        pos = out.index(then, pos) + len(then)
    toks = _TOKEN.findall(out, pos)[:n]
    assert len(toks) == n, (label, toks)
    return [_convert(t) for t in toks]


def line_after(out: str, label: str) -> str:
    pos = _find(out, label)
    return out[pos:].split("\n", 1)[0].strip()


def check(got: list, expected, tol: float = 1e-4) -> None:
    """``got`` (parsed) equals ``expected`` (None = unspecified, nan = nan) to print precision."""
    expected = list(expected)
    assert len(got) == len(expected), (got, expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None or isinstance(e, bool):
            assert g is e, (i, got, expected)
        elif math.isnan(e):
            assert isinstance(g, float) and math.isnan(g), (i, got, expected)
        else:
            assert isinstance(g, float) and abs(g - e) <= tol + tol * abs(e), (i, got, expected)


def masked_list(data: torch.Tensor, mask: torch.Tensor) -> list:
    """Row-major values of a masked tensor as it prints: None where unspecified."""
    return [float(d) if m else None for d, m in zip(data.flatten().tolist(),
                                                   mask.flatten().tolist())]


def row_reduce(data: np.ndarray, mask: np.ndarray, fn) -> list:
    """``fn`` of the specified elements of each row (None for a row with none)."""
    return [float(fn(d[m])) if m.any() else None for d, m in zip(data, mask)]


# -- every tutorial runs ---------------------------------------------------------------------
@pytest.mark.parametrize("path", [
    pytest.param(p, marks=cpu_only(CPU_ONLY[p.stem])) if p.stem in CPU_ONLY else p
    for p in TUTORIALS], ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(runs, path):
    proc = runs[path.stem]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    text = path.read_text()
    assert "# %%" in text and "# %% [markdown]" in text, "jupytext percent cells expected"


# -- overview --------------------------------------------------------------------------------
@cpu_only(CPU_ONLY["overview"])
def test_overview(runs):
    out = output(runs, "overview")
    data = torch.arange(24.0).reshape(3, 2, 4)
    mask = data % 3 != 0
    check(printed(out, "mt:\n", 24), masked_list(data, mask))
    check(printed(out, "x.grad through as_masked_tensor:", 3), [10.0, None, 10.0])
    check(printed(out, "to_tensor(0):", 4), [5.0, 0.0, 0.0, 8.0])
    check(printed(out, "to_tensor(nan):", 4), [5.0, NAN, NAN, 8.0])
    check(printed(out, "mt[:, :, 2:4]:", 12), masked_list(data[:, :, 2:4], mask[:, :, 2:4]))
    sel = torch.tensor([0, 2])
    check(printed(out, "mt[torch.tensor([0, 2])]:", 16), masked_list(data[sel], mask[sel]))
    check(printed(out, "mt[mt.get_mask()]:", int(mask.sum())), data[mask].tolist())

    d5 = np.arange(5.0)
    m5 = np.array([True, True, False, True, False])
    check(printed(out, "cos(m0):", 5), [math.cos(d) if m else None for d, m in zip(d5, m5)])
    check(printed(out, "m0 + m0:", 5), [2 * d if m else None for d, m in zip(d5, m5)])
    assert "m0 + m1 raises ValueError:" in out

    # numpy.ma: union of the holes; sums of the parts vs part of the sums.
    d0 = np.arange(10.0).reshape(2, 5)
    d1 = d0 + 10
    inv0 = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]], dtype=bool)
    inv1 = np.array([[0, 0, 0, 1, 1], [1, 1, 0, 0, 0]], dtype=bool)
    valid = ~(inv0 | inv1)
    union_sum = [float((d0 + d1)[:, j][valid[:, j]].sum()) if valid[:, j].any() else None
                 for j in range(5)]
    sum_of_sums = [float(d0[:, j][~inv0[:, j]].sum() + d1[:, j][~inv1[:, j]].sum())
                   for j in range(5)]
    assert union_sum != sum_of_sums
    check(printed(out, "numpy.ma (npm0 + npm1).sum(0):", 5), union_sum)
    check(printed(out, "numpy.ma npm0.sum(0) + npm1.sum(0):", 5), sum_of_sums)
    check(printed(out, "(a + b).sum(0), holes as 0:", 5), sum_of_sums)
    check(printed(out, "a.sum(0) + b.sum(0):", 5), sum_of_sums)

    # Reductions along dim 1, from the data and mask the tutorial printed.
    rd = np.array(printed(out, "data:\n", 24), dtype=float).reshape(8, 3)
    rm = np.array(printed(out, "mask:\n", 24), dtype=bool).reshape(8, 3)
    assert (~rm).all(1).any() and rm.any(1).any()  # some row empty, some not
    check(printed(out, "m:\n", 24), [float(d) if m else None for d, m in zip(rd.flat, rm.flat)])
    for label, fn in [("sum(m, 1):", np.sum), ("mean(m, 1):", np.mean),
                      ("prod(m, 1):", np.prod), ("amin(m, 1):", np.min),
                      ("amax(m, 1):", np.max), ("sum(m, 1) from CSR storage:", np.sum)]:
        check(printed(out, label, 8), row_reduce(rd, rm, fn))
    check(printed(out, "leaf.grad after sum:", 6), [1.0 if m else None for m in rm[:2].flat])

    y = np.arange(16.0) * np.fmod(np.arange(16.0), 4)
    check(printed(out, "y.mean():", 1), [y.mean()])
    check(printed(out, "z.nanmean():", 1), [y[y != 0].mean()])
    check(printed(out, "masked mean:", 2), [y[y != 0].mean(), True])
    check(printed(out, "plain argmin:", 1), [float(np.argmin(y))])
    check(printed(out, "masked argmin:", 2),
          [float(np.ma.masked_array(y, y == 0).argmin()), True])
    check(printed(out, "torch.nanmean(all nan):", 1), [NAN])
    check(printed(out, "masked mean, nothing specified:", 2), [None, False])
    check(printed(out, "masked sum, nothing specified:", 2), [None, False])
    assert line_after(out, "layout of a CSR row sum:") == "torch.sparse_coo"


# -- sparsity --------------------------------------------------------------------------------
def test_sparsity(runs):
    out = output(runs, "sparsity")
    rows, cols = [0, 0, 1, 2], [1, 3, 0, 2]
    vals = [1.0, 2.0, 3.0, 4.0]
    spec = [True, True, False, True]
    dense = np.zeros((3, 4))
    mask = np.zeros((3, 4), dtype=bool)
    for r, c, v, s in zip(rows, cols, vals, spec):
        dense[r, c], mask[r, c] = v, s

    def as_list(d, m):
        return [float(x) if k else None for x, k in zip(d.flat, m.flat)]

    check(printed(out, "coo:\n", 12), as_list(dense, mask))
    assert line_after(out, "coo layout:") == "torch.sparse_coo"
    assert line_after(out, "coo + dense row layout:") == "torch.sparse_coo"
    # Data on another pattern: read at the mask's specified positions, absent -> 0.
    other = np.zeros((3, 4))
    other[0, 1], other[1, 1] = 7.0, 8.0
    check(printed(out, "data on another pattern:\n", 12), as_list(other, mask))
    check(printed(out, "exp(coo) * 2 + coo:\n", 12), as_list(np.exp(dense) * 2 + dense, mask))
    assert line_after(out, "same index objects:") == "True"
    assert line_after(out, "shared with get_data():") == "True"
    bias = np.array([10.0, 20.0, 30.0, 40.0])
    check(printed(out, "coo + dense row:\n", 12), as_list(dense + bias, mask))
    check(printed(out, "to_tensor(0):\n", 4, then="values="),
          [v if s else 0.0 for v, s in zip(vals, spec)])
    assert line_after(out, "to_tensor(0) layout:") == "torch.sparse_coo"
    assert line_after(out, "to_tensor(-1) layout:") == "torch.strided"
    with np.errstate(divide="ignore"):
        check(printed(out, "sqrt(csr) / csr:\n", 12),
              as_list(np.sqrt(dense) / np.where(mask, dense, 1), mask))
    assert line_after(out, "same crow/col objects:") == "True"
    assert line_after(out, "coo -> csr equals csr:") == "True"
    check(printed(out, "stored entries after the round trip:", 1), [float(mask.sum())])

    check(printed(out, "coo.sum(0):\n", 4),
          [float(dense[:, j][mask[:, j]].sum()) if mask[:, j].any() else None for j in range(4)])
    check(printed(out, "coo.amax(1):\n", 3), row_reduce(dense, mask, np.max))
    check(printed(out, "csr.mean(1):\n", 3), row_reduce(dense, mask, np.mean))
    check(printed(out, "csr.sum(1, keepdim=True):\n", 3), row_reduce(dense, mask, np.sum))
    assert "torch.sparse_csr" in out[out.index("csr.sum(1, keepdim=True):"):][:200]
    check(printed(out, "coo.sum():", 2), [float(dense[mask].sum()), True])

    # The 1e6 x 1e6 example, regenerated: the maximum of each stored row, summed.
    n = 1_000_000
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(n, (2, 1000), generator=gen)
    v = torch.rand(1000, generator=gen).double()
    cells: dict = {}
    for r, c, x in zip(idx[0].tolist(), idx[1].tolist(), v.tolist()):
        cells[(r, c)] = cells.get((r, c), 0.0) + x  # duplicates are summed (coalesced)
    row_max: dict = {}
    for (r, _), x in cells.items():
        row_max[r] = max(row_max.get(r, -math.inf), x)
    check(printed(out, "total of the row maxima:", 2), [sum(row_max.values()), True], tol=1e-5)


# -- adagrad ---------------------------------------------------------------------------------
def _adagrad_reference():
    """One lazy Adagrad step by hand: state += g^2 and p -= lr g / (sqrt(state) + eps),
    at the three stored gradient entries only."""
    param = np.arange(8.0).reshape(2, 4)
    state = np.full((2, 4), 0.5)
    for (r, c), g in zip([(0, 2), (1, 0), (1, 2)], [3.0, 4.0, 5.0]):
        state[r, c] += g * g
        param[r, c] -= 0.1 * g / (math.sqrt(state[r, c]) + 1e-10)
    return param, state


def test_adagrad(runs):
    out = output(runs, "adagrad")
    param, state = _adagrad_reference()
    # The expected numbers, derived by hand above (a sanity check of the reference itself).
    np.testing.assert_allclose(param, [[0, 1, 1.9027, 3], [3.9015, 5, 5.9010, 7]], atol=1e-4)
    std_mask = np.zeros((2, 4), dtype=bool)
    std_mask[[0, 1, 1], [2, 0, 2]] = True
    check(printed(out, "state_sum:\n", 8), state.flat)
    check(printed(out, "std:\n", 3, then="values="), np.sqrt(state[std_mask]))
    check(printed(out, "state_sum2:\n", 8), state.flat)
    check(printed(out, "std2:\n", 8),
          [float(np.sqrt(s)) if m else None for s, m in zip(state.flat, std_mask.flat)])
    labels = ["param (torch sparse code):", "param2 (masked code):"]
    labels += [f"param ({name} masked gradient, four lines):"
               for name in ("strided", "sparse_coo", "sparse_csr")]
    labels += [f"param after ms.optim.functional.adagrad ({name}):"
               for name in ("dense Tensor", "torch sparse_coo Tensor", "masked strided",
                            "masked sparse_coo", "masked sparse_csr")]
    for label in labels:
        check(printed(out, label, 8), param.flat)
    assert out.count("param after ms.optim.functional.adagrad") == 5
    assert printed(out, "max |torch - masked_sparse| after 3 steps:", 1)[0] <= 1e-6
    assert line_after(out, "untouched rows unchanged:") == "True"


# -- nan_grad --------------------------------------------------------------------------------
def test_nan_grad(runs):
    out = output(runs, "nan_grad")
    x = np.array([-10.0, -5, 0, 5, 10, 50, 60, 70, 80, 90, 100], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)  # float32: overflows to inf for the large x, and inf * 0 = nan
        plain = np.where(x < 0, e, e * 0)
    assert np.isnan(plain).sum() == 2
    check(printed(out, "plain x.grad (10729):", 11), plain.astype(float), tol=1e-3)
    check(printed(out, "masked mx.grad:\n", 11),
          [float(np.exp(v)) if v < 0 else None for v in x], tol=1e-3)
    check(printed(out, "masked my.grad:\n", 11), [None if v < 0 else 1.0 for v in x])

    check(printed(out, "plain where(b, a/0, c):", 1), [1.0])
    check(printed(out, "plain gradient wrt a:", 1), [NAN])
    check(printed(out, "masked where(b, a/0, c):", 2), [1.0, True])
    check(printed(out, "masked gradient wrt a:", 2), [None, False])

    a = np.array([1.0, 2.0, np.nan])
    check(printed(out, "plain d nansum(a * b) / db:", 1), [NAN])
    check(printed(out, "masked d sum(a * b) / db:", 1), [float(np.nansum(a))])  # plain b

    check(printed(out, "plain x.grad (4132):", 2), [NAN, 1.0])
    check(printed(out, "masked x.grad (4132):\n", 2), [None, 1.0])

    # Safe softmax along dim 0, from the data and mask the tutorial printed.
    d = np.array(printed(out, "data:\n", 9)).reshape(3, 3)
    m = np.array(printed(out, "mask:\n", 9), dtype=bool).reshape(3, 3)
    w = np.arange(9.0).reshape(3, 3)
    probs = np.full((3, 3), np.nan)
    grad = np.full((3, 3), np.nan)
    for j in range(3):
        s = m[:, j]
        if s.any():
            ex = np.exp(d[s, j] - d[s, j].max())
            p = ex / ex.sum()
            probs[s, j] = p
            grad[s, j] = p * (w[s, j] - (p * w[s, j]).sum())
    empty_cols = ~m.any(0)
    assert empty_cols.any()
    expected_probs = [None if k == 0 else float(v) for v, k in zip(probs.flat, m.flat)]
    check(printed(out, "masked softmax(0):\n", 9), expected_probs, tol=1e-3)
    check(printed(out, "softmax(0) from CSR storage:\n", 9), expected_probs, tol=1e-3)
    check(printed(out, "masked gradient:\n", 9),
          [None if k == 0 else float(v) for v, k in zip(grad.flat, m.flat)], tol=1e-3)
    plain_probs = np.array(printed(out, "plain softmax(0):\n", 9)).reshape(3, 3)
    plain_grad = np.array(printed(out, "plain gradient:\n", 9)).reshape(3, 3)
    assert np.isnan(plain_probs[:, empty_cols]).all()
    assert np.isnan(plain_grad[:, empty_cols]).all()
    np.testing.assert_allclose(plain_probs[m], probs[m], atol=1e-3)


# -- scipy_interop ---------------------------------------------------------------------------
@cpu_only(CPU_ONLY["scipy_interop"])
def test_scipy_interop(runs):
    out = output(runs, "scipy_interop")
    r = np.array(printed(out, "ratings (0 = not rated):\n", 48)).reshape(6, 8)
    rated = r != 0  # ratings are 1..5: printed zeros are the unrated pairs
    check(printed(out, "stored ratings:", 1), [float(rated.sum())])
    means = row_reduce(r, rated, np.mean)
    assert None in means
    check(printed(out, "masked mean(1):\n", 6), means)
    assert line_after(out, "layout of the means:") == "torch.sparse_coo"
    centered = [float(v - means[i]) if k else None
                for i in range(6) for v, k in zip(r[i], rated[i])]
    check(printed(out, "centered:\n", 48), centered)
    check(printed(out, "stored entries:", 1), [float(rated.sum())])
    assert line_after(out, "type:") == "csr_array"
    assert line_after(out, "same pattern as the input:") == "True"
    for u in range(6):
        row = [float(v - means[u]) for v, k in zip(r[u], rated[u]) if k]
        if row:
            check(printed(out, f"user {u}:", len(row)), row)
        else:
            assert line_after(out, f"user {u}:") == "[]"

    # The large matrix, regenerated from the same seed; means from scipy's own arithmetic.
    rng = np.random.default_rng(5)
    sp.random(6, 8, density=0.3, format="csr", random_state=rng,
              data_rvs=lambda n: rng.integers(1, 6, n).astype(np.float64))
    big = sp.random(20_000, 10_000, density=1e-3, format="csr", random_state=rng,
                    data_rvs=lambda n: rng.integers(1, 6, n).astype(np.float64))
    counts = big.getnnz(axis=1)
    sums = np.asarray(big.sum(axis=1)).ravel()
    check(printed(out, "big: first five user means:", 5), sums[:5] / counts[:5])
    check(printed(out, "big: users with no rating:", 1), [float((counts == 0).sum())])
    check(printed(out, "big: stored entries before and after centering:", 2),
          [float(big.nnz), float(big.nnz)])

    # numpy.ma in and out, from the readings the tutorial printed.
    readings = printed(out, "numpy.ma readings:\n", 12)
    rows = [readings[i:i + 4] for i in range(0, 12, 4)]
    valid = [[v for v in row if v is not None] for row in rows]
    check(printed(out, "per-sensor mean, masked tensor:", 3),
          [sum(v) / len(v) if v else None for v in valid])
    check(printed(out, "per-sensor mean, numpy.ma:", 3),
          [sum(v) / len(v) if v else None for v in valid])
    check(printed(out, "per-sensor range, back in numpy.ma:", 3),
          [max(v) - min(v) if v else None for v in valid])


# -- attention -------------------------------------------------------------------------------
def _attention_reference():
    """Masked causal attention over the tutorial's inputs (same seed), in numpy, with the
    gradient of ``sum(out * weights)`` with respect to q written out by hand."""
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 5, 4
    q, k, v, w = (torch.randn(B, H, T, D).double().cpu().numpy() for _ in range(4))
    lengths = [5, 3]
    out = np.full((B, H, T, D), np.nan)
    grad_q = np.zeros((B, H, T, D))
    for b in range(B):
        for h in range(H):
            for i in range(lengths[b]):
                keys = np.arange(i + 1)  # causal, and i < length so every key is real
                s = k[b, h, keys] @ q[b, h, i] / math.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, h, i] = p @ v[b, h, keys]
                dp = v[b, h, keys] @ w[b, h, i]
                ds = p * (dp - (p * dp).sum())
                grad_q[b, h, i] = ds @ k[b, h, keys] / math.sqrt(D)
    return out, grad_q


def test_attention(runs):
    out = output(runs, "attention")
    ref, grad_q = _attention_reference()
    expected = [None if np.isnan(x) else float(x) for x in ref[1, 0].flat]
    check(printed(out, "masked attention, sequence 1, head 0:\n", 20), expected)
    dense = printed(out, "dense -inf recipe, sequence 1, head 0:\n", 20)
    assert all(math.isnan(x) for x in dense[12:])
    check(dense[:12], expected[:12])
    sdpa = printed(out, "SDPA, sequence 1, head 0:\n", 20)
    assert sdpa[12:] == [0.0] * 8
    assert printed(out, "max |masked - SDPA| where defined:", 1)[0] < 1e-5
    assert line_after(out, "ms.attention == the formula:") == "True True"
    assert line_after(out, "dense -inf recipe: NaN in q.grad, k.grad, v.grad:") == \
        "[False, False, True]"
    check(printed(out, "masked q.grad, sequence 1, head 0:\n", 20),
          [float(x) for x in grad_q[1, 0].flat])
    for name in "qkv":
        assert printed(out, f"max |{name}.grad - SDPA's|:", 1)[0] < 1e-5
    # Half of each weight matrix is kept: 16 x 8 and 1 x 16 weights.
    check(printed(out, "kept weights:", 2), [16 * 8 // 2, 16 // 2])
    assert line_after(out, "gradient layouts:") == "torch.sparse_csr torch.sparse_coo"
    first, last = printed(out, "loss at steps 0 and 59:", 2)
    assert last < first / 10
    assert line_after(out, "masks unchanged:") == "True"


# -- distributed -----------------------------------------------------------------------------
@cpu_only(CPU_ONLY["distributed"])
def test_distributed(runs):
    """2 processes under torchrun: masked collectives, and training equal to one process."""
    out = output(runs, "distributed")
    # rank 0 holds [1, 2, 3, 4] specified at {0, 1}; rank 1 holds [10, 20, 30, 40] at {1, 2}
    check(printed(out, "masked sum over ranks:", 4), [1.0, 22.0, 30.0, NAN])
    check(printed(out, "masked mean over ranks:", 4), [1.0, 11.0, 30.0, NAN])
    check(printed(out, "dist.all_reduce MAX:", 4), [1.0, 20.0, 30.0, NAN])
    assert line_after(out, "dist.all_reduce MAX:").endswith("torch.sparse_coo")
    # The tutorial's batches: 64 bags of 4 item ids out of 1000, seeded by the step.
    steps = [torch.randint(0, 1000, (64, 4), generator=torch.Generator().manual_seed(s))
             for s in range(5)]
    whole = steps[0].unique().numel()
    half = steps[0][:32].unique().numel()
    check(printed(out, "rows in the whole batch:", 1), [whole])
    check(printed(out, "rows in this rank's slice:", 1), [half])
    check(printed(out, "rows in this rank's slice:", 1, then="synchronized gradient:"), [whole])
    touched = torch.cat([s.reshape(-1) for s in steps]).unique().numel()
    check(printed(out, "embedding rows changed by training:", 1), [touched])
    (diff,) = printed(out, "max |2 processes - 1 process| over all parameters:", 1)
    assert diff < 1e-5


# -- pruning ---------------------------------------------------------------------------------
def test_pruning(runs):
    """Kept counts follow l1_unstructured's rule (drop round(amount * kept) of the kept
    entries each round), both models learn alike, and a fully pruned neuron gives the bias
    with prune, an unspecified output here, and either value by the one-line choice."""
    out = output(runs, "pruning")
    kept = [32 * 256, 256 * 256, 256 * 4]
    for r in range(1, 4):
        kept = [k - round(0.7 * k) for k in kept]
        check(printed(out, f"round {r}: kept weights per layer:", 3), kept)
        ref, mine = printed(out, f"round {r}, accuracy: torch.nn.utils.prune", 2)
        assert ref > 0.4 and abs(ref - mine) < 0.05  # 4 classes: chance is 0.25
    assert line_after(out, "round 1: kept weights per layer:").endswith("prune's: True")
    w = torch.tensor([[1.0, -2.0, 0.5], [0.1, 0.05, -0.1]])
    b = torch.tensor([0.3, 0.7])
    dense = (w.sum(1) + b).tolist()  # x = ones
    check(printed(out, "prune keeps weights:", 6), [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    check(printed(out, "prune output:", 2), [dense[0], b[1].item()])
    check(printed(out, "masked output:", 2), [dense[0], None])
    check(printed(out, "with the bias:", 2), [dense[0], b[1].item()])
    check(printed(out, "neuron dropped:", 2), [dense[0], 0.0])


# -- recommender -----------------------------------------------------------------------------
def _definitions(name: str) -> dict:
    """The imports, constants and functions a tutorial defines at top level, without running
    the rest of it (its data generator is shared; its training loop is what is checked)."""
    tree = ast.parse((ROOT / "tutorials" / f"{name}.py").read_text())
    keep = [node for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef)
            or isinstance(node, ast.Assign) and all(
                isinstance(v, ast.Constant) for v in getattr(node.value, "elts", [node.value]))]
    namespace: dict = {}
    exec(compile(ast.Module(keep, type_ignores=[]), name, "exec"), namespace)
    return namespace


def _dense_adagrad_rmse(train, test, u0, v0, *, lr: float, steps: int) -> float:
    """The same training on dense tensors: the whole U @ V.T, the squared error where a
    rating exists (torch.where), divided by the count; torch.optim.Adagrad."""
    target, where = torch.from_numpy(train.toarray()), torch.from_numpy(train.toarray() != 0)
    u, v = torch.nn.Parameter(u0.clone()), torch.nn.Parameter(v0.clone())
    opt = torch.optim.Adagrad([u, v], lr=lr)
    for _ in range(steps):
        error = torch.where(where, u @ v.T - target, 0)
        ((error ** 2).sum() / where.sum()).backward()
        opt.step()
        opt.zero_grad()
    t = test.tocoo()
    with torch.no_grad():
        pred = (u[torch.from_numpy(t.row.astype(np.int64))]
                * v[torch.from_numpy(t.col.astype(np.int64))]).sum(-1).numpy()
    return float(np.sqrt(np.mean((pred - t.data) ** 2)))


@cpu_only(CPU_ONLY["recommender"])
def test_recommender(runs):
    out = output(runs, "recommender")
    defs = _definitions("recommender")
    train, test = defs["ratings"]()
    users, items = train.shape
    check(printed(out, "ratings:", 3),
          [train.nnz, test.nnz, round(train.nnz / (users * items), 4)])
    mean = train.data.mean()
    baseline = np.sqrt(np.mean((test.data - mean) ** 2))
    check(printed(out, "global mean", 2), [mean, baseline])
    u0, v0 = defs["factors"]()
    t = train.tocoo()
    first = np.mean(((u0.numpy()[t.row] * v0.numpy()[t.col]).sum(1) - t.data) ** 2)
    check(printed(out, "masked route, first loss:", 1), [first])
    steps = defs["STEPS"]
    reference = _dense_adagrad_rmse(train, test, u0, v0, lr=0.3, steps=steps)
    (masked,) = printed(out, "masked route, test RMSE after", 2)[1:]
    check([masked], [reference], tol=2e-4)
    assert masked < 0.8 * baseline  # the model learned something the mean does not know
    check(printed(out, "gather + sparse Adagrad, test RMSE:", 1), [reference], tol=2e-4)
    assert printed(out, "largest factor difference to the masked route:", 1)[0] < 1e-4
    (adam,) = printed(out, "gather + SparseAdam, test RMSE:", 1)
    assert abs(adam - masked) < 0.05 * masked  # another optimizer, about the same error
    for label in ("masked / gather + sparse Adagrad:", "masked / gather + SparseAdam:"):
        assert printed(out, "step time, " + label, 1)[0] > 0
    assert line_after(out, "prediction layout:") == (
        "torch.sparse_csr | shares R's column index: True")


# -- graph attention -------------------------------------------------------------------------
def _gat_by_loops(x, edges, p, heads, hidden):
    """The two GAT layers node by node and head by head: a softmax over the node's
    neighbours (none: the empty sum), the weighted sum of their features, the bias."""
    n = x.shape[0]
    neighbours = [edges[1][edges[0] == i].tolist() for i in range(n)]

    def layer(wh, dst, src):  # wh (n, f) of one head, dst / src (f,)
        out = torch.zeros_like(wh)
        for i, js in enumerate(neighbours):
            if js:
                e = F.leaky_relu(wh[i] @ dst + wh[js] @ src, 0.2)
                out[i] = torch.softmax(e, 0) @ wh[js]
        return out

    wh = (x @ p["W1"]).view(n, heads, hidden)
    h = torch.cat([layer(wh[:, k], p["dst1"][k], p["src1"][k]) for k in range(heads)], 1)
    wh2 = F.elu(h + p["b1"]) @ p["W2"]
    return layer(wh2, p["dst2"], p["src2"]) + p["b2"]


def test_graph_attention(runs):
    out = output(runs, "graph_attention")
    defs = _definitions("graph_attention")
    edges, labels = defs["power_law_graph"](8)
    params = {k: v.detach() for k, v in defs["parameters"]().items()}
    with torch.no_grad():
        ref = _gat_by_loops(defs["features"](labels), edges, params, defs["HEADS"],
                            defs["HIDDEN"])
    check(printed(out, "small graph output, node 0:", 3), ref[0].tolist())
    check(printed(out, "isolated node, masked:", 3), ref[-1].tolist())
    check(printed(out, "isolated node, output bias:", 3), params["b2"].tolist())
    assert torch.equal(ref[-1], params["b2"])  # the reference's empty sum: the bias alone
    assert printed(out, "max |masked - careful dense|:", 1)[0] < 1e-5
    check(printed(out, "nodes the -inf recipe gives NaN:", 2), [8, 8])
    (first,) = printed(out, "step 0: loss", 1)
    (last,) = printed(out, "step 39: loss", 1)
    assert last < 0.8 * first
    big_edges, _ = defs["power_law_graph"](600)
    n_edges, accuracy = printed(out, "edges", 2)
    assert n_edges == big_edges.shape[1] and accuracy > 0.45  # 3 classes: chance is 1/3
    assert line_after(out, "the weights' gradients are plain tensors:") == "True"
