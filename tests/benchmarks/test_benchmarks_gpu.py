"""Smoke test of ``python -m benchmarks.gpu`` (the device benchmark): it runs on the CPU
with tiny operands, writes every section of its report (the device table in the form
``layouts/kernels/_device_table.py`` reads included), and its raw kernels and
baselines compute what the masked op computes (no timing is asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")


@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("op", gpu.OPS)
@pytest.mark.parametrize("dim", [0, 1])
def test_baselines_compute_the_masked_reduction(layout, op, dim):
    m = gpu.matrix(3000, torch.device("cpu"))
    out = gpu.masked_op(op, m[layout], dim)()
    specified = out.get_mask().to_dense()
    want = out.to_tensor(0).to_dense()
    assert specified.any() and (dim == 0 or not specified.all())  # rows may be empty
    for name, fn in [*gpu.raw_ops(op, m, dim).items(), ("dense", gpu.dense_op(op, m, dim))]:
        got = fn()
        torch.testing.assert_close(got[specified], want[specified], msg=f"{name} {op}")
    assert isinstance(gpu.torch_sparse_op(op, m, layout, dim), str) == (
        op not in ("sum", "amax", "mean"))
    if op == "sum":  # torch's own sparse sum, of the specified entries only
        got = gpu.torch_sparse_op(op, m, layout, dim)().to_dense().reshape(-1)
        torch.testing.assert_close(got[specified], want[specified])


def test_quick_cpu_run_writes_every_section(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text('<testsuites><testsuite tests="10" failures="1" errors="0" skipped="3" '
                     'time="12.5"><testcase classname="tests.test_x" name="test_y">'
                     '<failure message="AssertionError: off by one&#10;more"/></testcase>'
                     '</testsuite></testsuites>')
    out = tmp_path / "RESULTS-cpu.md"
    assert gpu.main(["--device", "cpu", "--quick", "--min-time", "0.0005", "--out", str(out),
                     "--tests", str(junit)]) == 0
    text = out.read_text()
    assert "- tests: 6 passed, 1 failed, 0 errors, 3 skipped (of 10, 12 s)" in text
    assert "- `tests.test_x::test_y`: AssertionError: off by one\n" in text
    for heading in ("## Reductions", "### Raw kernels", "## Softmax", "## Pruned MLP",
                    "## Attention", "## Optimizer step", "## Full reductions",
                    "### Table for layouts/kernels/_device_table.py", "## Strided masked linear",
                    "## Sparse kernels or a dense buffer"):
        assert heading in text
    assert "ms.attention" in text and "current threshold (cpu)" in text
    table = text.split("```python\n")[1].split("```")[0]
    rows = eval("{" + table + "}")  # the form of _device_table.TABLE
    from layouts.kernels import _device_table
    for (op, kind), by_device in rows.items():
        assert (op, kind) in _device_table.TABLE and set(by_device) == {"cpu"}
        assert all(name in _device_table.KERNELS for _, name in by_device["cpu"])
    assert "coo nnz=2k log_softmax(dim=0)" in text and "csr nnz=2k argmax()" in text
    for op in gpu.OPS:
        for dim in (0, 1):
            assert f"- {op}(dim={dim}): " in text  # the fastest raw kernel per op
    assert "csr nnz=2k amax(dim=1)" in text and "SparseAdam step" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | " in line]
    assert not any("n/a" in row.split(" | ")[2] for row in rows if "masked" not in row), rows


def test_a_stopped_run_reports_what_it_measured():
    text = gpu.report(torch.device("cpu"), None, {"mlp": {
        "case": "MLP", "masked": {"s": 2e-3}, "dense": {"s": 1e-3}}})
    assert "| MLP | 2.000 ms | 2.00 |" in text
    assert text.count("not run (the run stopped before it)") == 9  # the other sections
    assert "- tests: not run" in text


def test_a_failing_section_is_reported_and_the_others_run(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this here\nsecond line")

    monkeypatch.setattr(gpu, "mlp_step", broken)
    text = gpu.run(torch.device("cpu"), quick=True, min_time=0.0005)
    assert ("## Sections that failed on the device\n\n"
            "- mlp: RuntimeError: no kernel for this here\n") in text
    assert "SparseAdam step" in text  # the sections after it ran


def test_cuda_absent_is_reported_not_crashed(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    assert gpu.main(["--device", "cuda", "--quick"]) == 2
    assert "is_available() is False" in capsys.readouterr().err


def test_product_sweep_finds_a_crossover_and_reports_the_threshold():
    from benchmarks import bench_products

    rows = [{"workload": "w", "density": d, "sparse": s, "dense buffer": 1.0, "W*M": 1.0}
            for d, s in ((0.01, 0.5), (0.1, 0.9), (0.2, 1.5), (0.5, 3.0))]
    assert bench_products.crossover(rows, "w") == 0.2
    assert bench_products.crossover([{**r, "sparse": 0.1} for r in rows], "w") is None
    text = bench_products.report(rows, torch.device("cpu"))
    assert "dense from 20.0% stored" in text and "current threshold (cpu)" in text
