"""Run the benchmark suite: ``python -m benchmarks`` or ``python benchmarks/run.py``.

Options: ``--quick`` (shorter timing, same cases), ``--json PATH`` (every median, ratio
and status), ``--plot PATH`` (the scaling chart, time against nnz from 1e3 to 1e7:
:mod:`benchmarks.scaling`; needs matplotlib, the ``bench`` extra), ``--ratio-plot PATH``
(a PNG bar chart of the ratios), ``--only TEXT`` (cases whose name contains TEXT),
``--modules a,b``, and ``--readme [README.md]``: instead of the suite, one run of the
README preset (:mod:`benchmarks.readme`: scipy comparison, ``bench_goals``, peak memory;
with ``--plot``, the scaling chart too): the full tables go to ``benchmarks/RESULTS.md``,
stamped with the machine, the date and the versions, and the README's "Performance"
section (five summary lines and the chart) is printed and, given a path, written between
its markers::

    python -m benchmarks --readme README.md --plot benchmarks/scaling.png

The suite is the union of the benchmark modules in this folder: ``bench_core`` (pointwise
ops, conversions, construction), ``bench_reductions`` (reductions and softmax; the
harness's own ``fallback_reductions`` stands in while that module is absent, and adds the
layouts, sizes and torch.masked columns it leaves out when it is present),
``bench_optim`` (one optimizer step), then any other ``bench_*.py`` module. Each exposes
``cases()``; see :mod:`benchmarks.harness` for the case format.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/run.py``: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import harness  # noqa: E402

HERE = Path(__file__).resolve().parent
MODULES = ("bench_core", "bench_reductions", "bench_optim")
FALLBACKS = {"bench_reductions": "fallback_reductions"}
PLOT_HINT = ("--plot needs matplotlib, which is not installed: pip install matplotlib "
             "(or pip install -e '.[bench]'); or drop --plot")


def module_names(selected: list[str] | None = None) -> list[str]:
    """The benchmark modules to run, in order: the known ones, then other ``bench_*``."""
    extra = sorted(p.stem for p in HERE.glob("bench_*.py") if p.stem not in MODULES)
    names = list(MODULES) + extra
    return [n for n in names if selected is None or n in selected]


def load(name: str) -> tuple[Any | None, str]:
    """Import ``benchmarks.<name>`` (or its fallback): ``(module or None, note)``."""
    note = ""
    if not (HERE / f"{name}.py").exists():
        if name not in FALLBACKS:
            return None, f"benchmarks/{name}.py is not present: its cases are not run"
        note = (f"benchmarks/{name}.py is not present: the harness's own "
                f"{FALLBACKS[name]} cases stand in")
        name = FALLBACKS[name]
    try:
        return importlib.import_module(f"benchmarks.{name}"), note
    except Exception as exc:  # noqa: BLE001 -- a module being written must not end the run
        return None, f"benchmarks/{name}.py could not be imported ({harness._short(exc)})"


def summary(sections: list[dict]) -> list[str]:
    """One line per target: met, missed or n/a, with the measured ratio."""
    lines = []
    for sec in sections:
        for r in sec["results"]:
            for b, limit in r["targets"].items():
                check = r["target_check"][b]
                if b == harness.TIME:
                    lines.append(f"{check:>6}: {r['name']} = {harness.fmt_time(r.get('best_s'))} "
                                 f"(target {harness.fmt_target(b, limit)})")
                    continue
                ratio = r["baselines"].get(b, {}).get("ratio")
                got = f"{ratio:.3g}×" if ratio is not None else "no ratio"
                lines.append(f"{check:>6}: {r['name']} ÷ {b} = {got} (target ≤ {limit:g}×)")
    return lines


def plot(sections: list[dict], path: str) -> None:
    """A horizontal bar chart of every ratio (log scale), one colour per baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for sec in sections for r in sec["results"]]
    cols = harness.columns_of(rows)
    height = max(3.0, 0.22 * len(rows) * max(1, len(cols)) ** 0.5 + 1.5)
    fig, ax = plt.subplots(figsize=(10, height))
    bar = 0.8 / max(1, len(cols))
    for j, col in enumerate(cols):
        ys, lefts, widths = [], [], []
        for i, r in enumerate(rows):
            ratio = r["baselines"].get(col, {}).get("ratio")
            if ratio:  # a bar from 1 to the ratio: left of 1 is faster, right is slower
                ys.append(i + (j - (len(cols) - 1) / 2) * bar)
                lefts.append(min(ratio, 1.0))
                widths.append(abs(ratio - 1.0))
        ax.barh(ys, widths, left=lefts, height=bar, label=f"masked_sparse ÷ {col}")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio (below 1: masked_sparse is faster)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_module(name: str, module: Any, note: str, args: argparse.Namespace,
                min_run_time: float, skip: set[str], sections: list[dict],
                skipped: list[str]) -> set[str] | None:
    """Time a module's cases (except the names in ``skip``), print its table, record it.

    Returns the names of its cases, or None when ``cases()`` failed.
    """
    print(f"[{name}] building cases", file=sys.stderr, flush=True)
    try:
        with warnings.catch_warnings():  # torch's sparse / torch.masked warnings
            warnings.simplefilter("ignore")
            cases = [c for c in harness.cases_of(module, args.quick) if c[0] not in skip]
    except Exception as exc:  # noqa: BLE001 -- a module being written must not end the run
        msg = f"{name}.cases() failed: {harness._short(exc)}"
        print(f"\n> {msg}")
        skipped.append(msg)
        return None
    title = getattr(module, "TITLE", name)
    if skip:
        title += " (harness cases for what the module above leaves out)"
    results = harness.run_cases(cases, title, min_run_time, not args.no_probe, args.only)
    sections.append({"module": name, "title": title, "note": note, "results": results})
    return {c[0] for c in cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="shorter timing per case (min-run-time 0.05 s instead of 0.3 s); "
                             "same cases")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--plot", metavar="PATH",
                        help="write the scaling chart (time against nnz, 1e3 to 1e7) as a PNG")
    parser.add_argument("--ratio-plot", metavar="PATH",
                        help="write a PNG bar chart of the ratios of the cases run")
    parser.add_argument("--readme", metavar="README", nargs="?", const="",
                        help="run the README preset: write the full tables to "
                             "benchmarks/RESULTS.md and print the README's Performance "
                             "section; given a file, also write it between its markers")
    parser.add_argument("--only", metavar="TEXT", help="run the cases whose name contains TEXT")
    parser.add_argument("--modules", metavar="A,B",
                        help=f"comma-separated modules (default: {','.join(module_names())})")
    parser.add_argument("--min-run-time", type=float, metavar="S",
                        help="seconds of timing per measurement (overrides --quick)")
    parser.add_argument("--no-probe", action="store_true",
                        help="run baselines in-process, without the crash probe (unsafe)")
    args = parser.parse_args(argv)
    if args.plot or args.ratio_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(PLOT_HINT, file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    if args.readme is not None:
        from benchmarks import readme

        readme.run(" ".join(["python -m benchmarks"] + (argv if argv is not None
                                                        else sys.argv[1:])),
                   args.min_run_time or (0.03 if args.quick else 0.06), args.readme or None,
                   args.plot, args.json, not args.no_probe)
        return 0
    min_run_time = args.min_run_time or (0.05 if args.quick else 0.3)
    env = harness.environment(min_run_time)
    print(f"# masked_sparse benchmarks ({'--quick' if args.quick else 'full'})\n")
    print(f"torch {env['torch']}, numpy {env['numpy']}, Python {env['python']}, "
          f"{env['processor']}, {env['torch_threads']} thread. Medians over interleaved "
          f"rounds of torch.utils.benchmark Timer blocks of ~{min_run_time / 5 * 1e3:.0f} ms "
          f"(benchmarks/harness.py, Note [Paired rounds]). Cells: masked_sparse time ÷ "
          f"baseline time, the median of per-round ratios (below 1: masked_sparse is "
          f"faster).")
    selected = args.modules.split(",") if args.modules else None
    sections, skipped = [], []
    for name in module_names(selected):
        module, note = load(name)
        if note:
            print(f"\n> {note}")
        if module is None:
            skipped.append(note)
            continue
        ran = _run_module(name, module, note, args, min_run_time, set(), sections, skipped)
        if name in FALLBACKS and not note and ran is not None:
            # The module is present; the harness's own cases
            # still add the layouts, sizes and torch.masked columns it leaves out.
            extra, _ = load(FALLBACKS[name])
            if extra is not None:
                print(f"\n> cases of {FALLBACKS[name]} that {name} does not have "
                      f"(other layouts, sizes, torch.masked)")
                _run_module(FALLBACKS[name], extra, "", args, min_run_time, ran, sections,
                            skipped)
    lines = summary(sections)
    if lines:
        print("\n### Targets\n")
        print("\n".join(f"- {line}" for line in lines))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"environment": env, "sections": sections, "skipped": skipped}, indent=1))
        print(f"\nwrote {args.json}")
    if args.ratio_plot:
        plot(sections, args.ratio_plot)
        print(f"wrote {args.ratio_plot}")
    if args.plot:
        from benchmarks import scaling

        print("\n[scaling] time against nnz", file=sys.stderr, flush=True)
        scaling.plot(scaling.measure(min_run_time=min(min_run_time, 0.1)), args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
