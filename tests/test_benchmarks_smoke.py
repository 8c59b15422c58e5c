"""Smoke test of the benchmark harness (no timing is asserted: benchmarks run by hand).

Keeps ``python -m benchmarks`` from rotting: the harness times a case, a failing baseline
is reported as unsupported, one that kills its process as crashing, and one real case of
the core module runs end to end on a tiny operand.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
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
