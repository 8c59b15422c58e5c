"""The GAT benchmark: its two recipes agree, its graph is a coalesced index with self-loops,
and one case runs through the harness."""

from __future__ import annotations

import torch

from benchmarks import bench_graph, harness


def test_power_law_edges_are_unique_sorted_with_self_loops():
    edges = bench_graph.power_law_edges(50)
    keys = edges[0] * 50 + edges[1]
    assert torch.equal(keys, keys.unique())  # sorted, no duplicate
    loops = edges[:, edges[0] == edges[1]]
    assert torch.equal(loops[0], torch.arange(50))
    in_degree = torch.bincount(edges[0], minlength=50)  # edges per destination
    assert in_degree.max() > 4 * in_degree.float().median()  # a heavy tail


def test_masked_and_gather_recipes_agree():
    assert bench_graph.agreement(nodes=40, heads=3) < 1e-5


def test_one_case_runs():
    case = bench_graph.cases(quick=True)[0]
    r = harness.run_case(case, min_run_time=0.001, use_probe=False, rounds=1)
    assert r["status"] == "ok" and "ratio" in r["baselines"]["gather"]


def test_glue_profile_agrees_with_the_library_and_times_every_variant():
    """``profile_graph_glue``'s minimal forms give the library's outputs and gradients (so
    that a step saved measures glue, not a different computation), and every variant
    runs."""
    import pytest

    from benchmarks import profile_graph_glue
    from layouts import _native

    if not _native.available():
        pytest.skip("the minimal forms call the native kernels")
    m = profile_graph_glue.measure(nodes=40, min_run_time=0.01, rounds=1)
    assert m["agree"] < 1e-5
    for name in ("library", "gather", "all", *profile_graph_glue.OPS):
        assert m[name] > 0
    assert "| all |" in profile_graph_glue.report(m)


def test_in_step_profile_times_every_phase_and_every_op_of_both_layers():
    """``profile_graph_glue --in-step``: each phase of both recipes' steps and each lap of
    the masked layer, in both layers, timed (the laps sum to at most the forward)."""
    from benchmarks import profile_graph_glue

    m = profile_graph_glue.in_step(nodes=40, rounds=1, steps=2)
    assert set(m["phases"]) == set(profile_graph_glue.PHASES)
    assert all(a > 0 and b > 0 for a, b in m["phases"].values())
    assert list(m["ops"]) == ["node scores (plain)", "first sum", "second sum", "leaky_relu",
                              "softmax", "einsum", "to_tensor", "reshape, bias"]
    laps = sum(a + b for a, b in m["ops"].values())
    assert 0 < laps <= m["phases"]["forward"][0] * 1.5  # (medians of separate samples)
    assert "| first sum |" in profile_graph_glue.in_step_report(m)
