"""Smoke test of the benchmark harness (no timing is asserted: benchmarks run by hand).

Keeps ``python -m benchmarks`` from rotting: the harness times a case, a failing baseline
is reported as unsupported, one that kills its process as crashing, and one real case of
the core module runs end to end on a tiny operand.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_core, bench_order, harness, run  # noqa: E402


def _raise() -> None:
    raise NotImplementedError("no kernel")


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def test_run_case_reports_ratios_and_failures():
    x = torch.ones(4)
    case = ("ones + ones", lambda: x + x,
            {"floor": lambda: x + x, "broken": _raise, "absent": "not in this library"},
            {"floor": 1e9})
    r = harness.run_case(case, min_run_time=0.001, use_probe=False, rounds=1)
    assert r["status"] == "ok" and r["median_s"] > 0
    assert r["baselines"]["floor"]["ratio"] > 0
    assert r["baselines"]["broken"]["status"] == "unsupported"
    assert r["baselines"]["absent"] == {"status": "unsupported", "why": "not in this library"}
    assert r["target_check"] == {"floor": "met"}
    table = harness.table([r])
    assert "ones + ones" in table and "unsupported" in table


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the crash probe needs os.fork")
def test_probe_survives_a_crashing_baseline():
    assert harness.probe(lambda: None) == ("ok", "")
    assert harness.probe(_raise)[0] == "unsupported"
    status, why = harness.probe(_crash)
    assert status == "crashes" and "SIGSEGV" in why


def test_one_core_case_runs():
    gen = torch.Generator().manual_seed(0)
    cases = {c[0]: c for c in bench_core.sparse_cases(100, gen, smallest=True)}
    r = harness.run_case(cases["csr nnz=1e2 mt + mt (shared index)"], min_run_time=0.001,
                         use_probe=False, rounds=1)
    assert r["status"] == "ok"
    assert set(r["baselines"]) == {"floor", "torch.masked", "torch.sparse"}
    assert "ratio" in r["baselines"]["floor"]


def test_modules_and_entry_point(capsys):
    assert run.module_names()[:3] == ["bench_core", "bench_reductions", "bench_optim"]
    module, _note = run.load("bench_reductions")
    assert module is not None and callable(module.cases)
    # ``python benchmarks/run.py``: the file works as a script (run here without a process).
    script = runpy.run_path(str(ROOT / "benchmarks" / "run.py"), run_name="as_script")
    with pytest.raises(SystemExit) as exit_info:
        script["main"](["--help"])
    assert exit_info.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_order_cases_run_on_a_small_matrix():
    gen = torch.Generator().manual_seed(0)
    cases = {c[0]: c for c in bench_order.sparse_cases(100, 1000, gen)}
    assert "csr nnz=1e3 topk(10, dim=1)" in cases
    r = harness.run_case(cases["coo nnz=1e3 sort(dim=1)"], min_run_time=0.001,
                         use_probe=False, rounds=1)
    assert r["status"] == "ok" and "ratio" in r["baselines"]["floor"]
    assert "order" in " ".join(run.module_names())


def test_raw_reductions_equal_the_masked_ones_when_everything_is_specified():
    from benchmarks.bench_goals import sparse_operands
    from benchmarks.raw_reductions import REDUCTIONS, groups_of, masked_reduction, raw_reduction

    ops = sparse_operands(300, torch.Generator().manual_seed(0), specified=1.0)
    for layout in ("coo", "csr"):
        for dim in (0, 1):
            groups = groups_of(layout, ops["rows"], ops["cols"], ops["shape"], dim)
            for name in REDUCTIONS:
                ours = masked_reduction(name, dim)(ops[layout])
                raw = raw_reduction(name, ops["values"], groups)
                if name == "softmax":
                    torch.testing.assert_close(ours._storage.values, raw)
                    continue
                raw = raw.to_dense().reshape(-1) if raw.layout != torch.strided else raw
                mask = ours.get_mask().to_dense()
                expected = torch.where(mask, raw, 0).to(ours.dtype)
                torch.testing.assert_close(ours.to_tensor(0).to_dense(), expected,
                                           msg=f"{layout} {name}(dim={dim})")


def test_scipy_check_catches_a_wrong_reduction(monkeypatch):
    from benchmarks import bench_scipy

    m = bench_scipy.reduction_matrix(rows=40, cols=5, nnz=150)  # some rows are full
    bench_scipy.check(m)
    wrong = dict(bench_scipy.OPS)
    wrong["row max"] = (lambda t: t.amin(1),) + wrong["row max"][1:]
    monkeypatch.setattr(bench_scipy, "OPS", wrong)
    with pytest.raises(AssertionError, match="row max"):
        bench_scipy.check(m)


def test_time_targets_are_checked():
    r = harness.run_case(("noop", lambda: None, {}, {harness.TIME: 1.0}), min_run_time=0.001,
                         use_probe=False, rounds=1)
    assert r["target_check"] == {harness.TIME: "met"}
    r = harness.run_case(("noop", lambda: None, {}, {harness.TIME: 1e-15}),
                         min_run_time=0.001, use_probe=False, rounds=1)
    assert r["target_check"] == {harness.TIME: "missed"} and "≤" in harness.table([r])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_readme_section_from_one_tiny_run(tmp_path):
    """``--readme README --plot PNG`` on tiny operands: every table in the results file,
    stamped; the README's five summary lines and the chart, the file's text outside the
    markers kept; the memory bound flags a densification."""
    pytest.importorskip("matplotlib")
    from benchmarks import memory, readme

    target = tmp_path / "README.md"
    target.write_text(f"# title\n\n{readme.BEGIN}\nold\n{readme.END}\n\n## next\n")
    plot = tmp_path / "scaling.png"
    sizes = {"scipy": (60, 30, 400), "large": 2000, "small": 100, "memory": 20_000,
             "memory_layouts": ("coo",), "memory_ops": ("noop", "sqrt", "to_dense"),
             "scaling": (100,)}
    result = tmp_path / "out.json"
    results = tmp_path / "RESULTS.md"
    text = readme.run("python -m benchmarks --readme", 0.001, str(target), str(plot),
                      str(result), sizes=sizes, use_probe=False, results_path=results)
    written = target.read_text()
    assert "old" not in written and text in written and written.endswith("## next\n")
    assert plot.stat().st_size > 0 and f"]({plot})" in text
    summary = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(summary) == 5 and "benchmarks/RESULTS.md" in summary[-1]
    assert "|" not in text  # the tables stay out of the README
    full = results.read_text()
    import numpy

    for stamp in (f"torch {torch.__version__}", f"numpy {numpy.__version__}", "scipy ",
                  "Python ", time.strftime("%Y-%m-%d")):
        assert stamp in full and stamp in summary[-1]
    for heading in ("Against scipy.sparse", "÷ raw", "Fixed cost", "Peak extra memory",
                    "Scaling"):
        assert heading in full
    assert "| column max |" in full and "| argmax |" in full and "| COO dim=0 |" in full
    rows = {r["op"]: r for r in json.loads(result.read_text())["memory"]}
    assert rows["noop"]["peak"] < 2**20
    assert rows["sqrt"]["output"] == 20_000 * 4 and not rows["sqrt"]["flagged"]
    assert rows["to_dense"]["flagged"]  # a densification is over output + 4 x input
    assert "over it: coo to_dense." in full and memory.BOUND_FACTOR == 4
    assert "coo to_dense" in summary[3]
