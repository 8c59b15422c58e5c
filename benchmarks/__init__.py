"""Benchmarks for masked_sparse against the raw torch ops, torch.masked and numpy.ma.

Run by hand, never part of the tests' timing::

    python -m benchmarks --quick            # or: python benchmarks/run.py --quick
    python -m benchmarks --json out.json --ratio-plot ratios.png
    python -m benchmarks --readme README.md --plot benchmarks/scaling.png  # RESULTS.md + README

Every benchmark module (``bench_*.py``) exposes ``cases()``: a list of
``(name, masked_sparse_fn, {baseline_name: fn})`` tuples (optionally a fourth element,
``{baseline_name: max_ratio}`` targets) and ``main()`` to run alone. The harness
(:mod:`benchmarks.harness`) times each callable with ``torch.utils.benchmark`` on one
thread, prints medians and the ratio masked_sparse / baseline, and runs every baseline once
in a forked child first, so that a baseline that crashes the process (``torch.masked``'s CSR
paths can) is reported as "crashes" instead of ending the run.
"""

from . import harness as _harness  # noqa: E402, F401  (Note [Allocator noise]: set on import)
