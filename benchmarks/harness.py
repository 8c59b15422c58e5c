"""Timing, crash-safe baselines and tables for the benchmark suite.

A benchmark module exposes ``cases()`` returning a list of cases; a case is a tuple
``(name, masked_sparse_fn, {baseline_name: fn})`` with an optional fourth element
``{baseline_name: max_ratio}`` of targets; the target key ``"time"`` (``TIME``) is an
absolute limit in seconds on masked_sparse's own time (``{"time": 15e-6}``: at most 15 µs;
Note [Absolute targets]). Every callable takes no argument. A baseline may
also be a string: the reason it cannot run (printed in its cell). The ratio printed for a
baseline is masked_sparse's time over the baseline's (the median of per-round ratios, Note
[Paired rounds]): below 1 means masked_sparse is faster. Conventional baseline names:
``floor`` (the raw torch op on the values / the plain dense expression), ``torch.masked``,
``numpy.ma``; any other name gets its own column.

Note [Crash-safe baselines]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
Some baselines do not merely raise: ``torch.masked``'s CSR paths can build an invalid CSR
tensor that takes the process down. So before a baseline is timed it runs once in a forked
child (``probe``); an exception there marks it "unsupported", a signal marks it "crashes",
and only a baseline that ran cleanly is timed in this process. Where ``os.fork`` does not
exist the probe runs in-process (a crash then ends the run).

Note [Absolute targets]
~~~~~~~~~~~~~~~~~~~~~~~
A ratio target is checked on the median of paired ratios, which the load of a shared
machine moves little (Note [Paired rounds]). An absolute target (``TIME``, e.g. a fixed
cost of 15 µs) has no partner to cancel the load, so it is checked on the *fastest*
round's time per call (``best_s``: the block least disturbed by other processes, as
``timeit`` recommends), and tables print that time next to the target.

>>> from benchmarks.harness import run_case
>>> r = run_case(("noop", lambda: None, {"floor": lambda: None}), min_run_time=0.001)
>>> sorted(r["baselines"])
['floor']
"""

from __future__ import annotations

import faulthandler
import inspect
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.benchmark import Timer

Fn = Callable[[], Any]
CORE_BASELINES = ("floor", "torch.masked", "numpy.ma")


def keep_freed_memory() -> bool:
    """Note [Allocator noise]
    ~~~~~~~~~~~~~~~~~~~~~~~~
    glibc's malloc hands freed memory at the top of its heap back to the system and serves
    large blocks from fresh mappings, whose pages fault on first touch; which of the two a
    step's temporaries get depends on what ran before in the process (an optimizer step
    after other cases measured twice as slow, with hundreds of page faults per step, on
    either side of a comparison, whichever side it happened to). The benchmarks switch both
    off once (``mallopt``: no trimming, a fixed mmap threshold of 32 MiB), so that each side
    reuses the memory it freed, as jemalloc and tcmalloc do. A benchmark setting of this
    process only, made when the benchmarks are imported outside pytest: the library, and the
    test suite (which imports the benchmarks to smoke-test them), keep glibc's defaults.
    Where the environment sets glibc's own ``MALLOC_*_THRESHOLD_`` (``benchmarks/memory.py``'s
    children, which must see freed memory go back), it is left alone. Returns whether it
    applied.
    """
    if (not sys.platform.startswith("linux") or "pytest" in sys.modules or any(
            k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(libc.mallopt(m_trim_threshold, 1 << 30) and
                libc.mallopt(m_mmap_threshold, 1 << 25))


keep_freed_memory()
TIME = "time"  # the target key of an absolute limit (seconds): Note [Absolute targets]


class Case(NamedTuple):
    """One benchmark case; a plain 3- or 4-tuple with the same fields works as well."""

    name: str
    fn: Fn
    baselines: dict[str, Fn | str]
    targets: dict[str, float] | None = None


def measure(fn: Fn, min_run_time: float) -> float:
    """Median seconds per call of ``fn`` with ``torch.utils.benchmark``, one thread."""
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg[:160]}"


def _status_of(exc: BaseException) -> str:
    if isinstance(exc, (NotImplementedError, TypeError, RuntimeError, ValueError,
                        AttributeError, IndexError)):
        return "unsupported"
    return "error"


def probe(fn: Fn, timeout: float = 300.0) -> tuple[str, str]:
    """Run ``fn`` once in a forked child: ``("ok", "")``, ``("unsupported", why)``, ...

    See Note [Crash-safe baselines].
    """
    if not hasattr(os, "fork"):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 -- any failure is a result to report
            return _status_of(exc), _short(exc)
        return "ok", ""
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run once, report, leave without any cleanup
        os.close(read_fd)
        faulthandler.disable()  # a crash is a result here, not a traceback to print
        code, text = 0, "ok"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except BaseException as exc:  # noqa: BLE001
            code, text = 1, f"{_status_of(exc)}\n{_short(exc)}"
        try:
            os.write(write_fd, text.encode(errors="replace")[:4000])
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return "timeout", f"no result after {timeout:.0f} s"
        else:
            time.sleep(0.005)
    with os.fdopen(read_fd, "rb") as f:
        text = f.read().decode(errors="replace")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return "crashes", f"the process died with {signal.Signals(sig).name}"
    if os.WEXITSTATUS(status) != 0:
        kind, _, why = text.partition("\n")
        return (kind or "crashes"), why or f"exit status {os.WEXITSTATUS(status)}"
    return "ok", ""


def run_case(case: Sequence[Any], min_run_time: float = 0.2, use_probe: bool = True,
             rounds: int | None = None,
             probed: dict[str, tuple[str, str]] | None = None) -> dict:
    """Time one case: masked_sparse's median and each baseline's median and ratio.

    Note [Paired rounds]
    ~~~~~~~~~~~~~~~~~~~~
    The machine may be shared (other processes come and go), which moves every timing by
    up to several times for seconds at a stretch. So masked_sparse and its baselines are
    timed in interleaved *rounds*: each round times one block of every callable back to
    back (``Timer.timeit``, blocks of about ``min_run_time / 5``; the order alternates
    between rounds). A median is taken over the rounds' blocks, and a ratio is the median
    of the per-round ratios: the two sides of a ratio always ran within milliseconds of
    each other, under the same load. ``rounds`` defaults to as many as fit in about
    ``4 * min_run_time`` per case, between 3 and 15. ``probed`` holds the probe results of
    baselines already probed (``run_cases`` probes every case before it times any: a fork
    write-protects the parent's pages, and the faults that follow would land in timings).
    """
    name, fn, baselines = case[0], case[1], case[2]
    targets = dict(case[3]) if len(case) > 3 and case[3] else {}
    result: dict[str, Any] = {"name": name, "targets": targets, "baselines": {},
                              "median_s": None, "status": "ok"}
    entries: dict[str, dict[str, Any]] = {b: {} for b in baselines}
    runnable: dict[str, Fn] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn()  # warm-up (and the per-op decisions get cached)
            runnable[""] = fn
        except Exception as exc:  # noqa: BLE001
            result.update(status=_status_of(exc), why=_short(exc))
        for bname, bfn in baselines.items():
            if isinstance(bfn, str):
                entries[bname].update(status="unsupported", why=bfn)
                continue
            if probed is not None and bname in probed:
                status, why = probed[bname]
            else:
                status, why = probe(bfn) if use_probe else ("ok", "")
            entries[bname].update(status=status, why=why)
            if status == "ok":
                runnable[bname] = bfn
        times = paired_rounds(runnable, min_run_time, rounds, result, entries)
    for key, ts in times.items():
        (result if key == "" else entries[key])["median_s"] = statistics.median(ts)
    if "" in times:
        result["best_s"] = min(times[""])
    for key, entry in entries.items():
        if key in times and "" in times:
            entry["ratio"] = statistics.median(a / b for a, b in zip(times[""], times[key]))
    result["baselines"] = entries
    result["target_check"] = {
        b: _check(result.get("best_s") if b == TIME else entries.get(b, {}).get("ratio"), limit)
        for b, limit in targets.items()}
    return result


def paired_rounds(runnable: dict[str, Fn], min_run_time: float, rounds: int | None,
                   result: dict, entries: dict) -> dict[str, list[float]]:
    """Per-round seconds per call of every callable (see Note [Paired rounds])."""
    timers, numbers, per_call = {}, {}, {}
    block = min_run_time / 5
    for key, f in list(runnable.items()):
        timer = Timer(stmt="fn()", globals={"fn": f}, num_threads=1)
        try:
            once = max(timer.timeit(1).mean, 1e-9)
            number = max(1, round(block / once))
            if number > 1:  # calibrate on a block: one call is too short to trust
                once = max(timer.timeit(number).mean, 1e-9)
                number = max(1, round(block / once))
        except Exception as exc:  # noqa: BLE001
            del runnable[key]
            (result if key == "" else entries[key]).update(status=_status_of(exc),
                                                           why=_short(exc))
            continue
        timers[key], numbers[key], per_call[key] = timer, number, once
    if rounds is None:
        per_round = sum(max(block, per_call[k]) for k in timers) or block
        rounds = int(min(15, max(3, 4 * min_run_time * len(timers) / per_round)))
    times: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(rounds):
        for key in (list(timers) if r % 2 == 0 else list(reversed(timers))):
            times[key].append(timers[key].timeit(numbers[key]).mean)
    return times


def _check(measured: float | None, limit: float) -> str:
    """``"met"`` when ``measured`` (a ratio, or seconds: Note [Absolute targets]) is within."""
    if measured is None:
        return "n/a"
    return "met" if measured <= limit else "missed"


def cases_of(module: Any, quick: bool, device: str = "cpu") -> list[Sequence[Any]]:
    """``module.cases()``, passing ``quick=`` and ``device=`` where its signature takes
    them."""
    params = inspect.signature(module.cases).parameters
    kwargs = {k: v for k, v in (("quick", quick), ("device", device)) if k in params}
    return list(module.cases(**kwargs))


# -- formatting ------------------------------------------------------------------------------
def fmt_time(seconds: float | None) -> str:
    """``1.23 ms``-style text for a duration in seconds."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def fmt_ratio(entry: dict | None) -> str:
    if not entry:
        return ""
    if "ratio" in entry:
        r = entry["ratio"]
        return f"{r:.3g}×" if r >= 0.01 else f"{r:.2g}×"
    return entry.get("status", "?")


def fmt_target(baseline: str, limit: float) -> str:
    """``floor ≤1.5×`` for a ratio target, ``≤15 µs`` for a ``TIME`` target."""
    return f"≤{fmt_time(limit)}" if baseline == TIME else f"{baseline} ≤{limit:g}×"


def fmt_best(result: dict) -> str:
    """The fastest round's time of a case with a ``TIME`` target (Note [Absolute targets])."""
    return f"best {fmt_time(result.get('best_s'))}" if TIME in result["targets"] else ""


def _fmt_target(result: dict) -> str:
    parts = []
    for b, limit in result["targets"].items():
        mark = {"met": "✓", "missed": "✗ MISSED", "n/a": "n/a"}[result["target_check"][b]]
        best = f" ({fmt_best(result)})" if b == TIME else ""
        parts.append(f"{fmt_target(b, limit)}{best} {mark}")
    return "; ".join(parts)


def columns_of(results: Iterable[dict]) -> list[str]:
    """Baseline names in a section: the conventional ones first, then others as met."""
    seen: list[str] = []
    for r in results:
        for b in r["baselines"]:
            if b not in seen:
                seen.append(b)
    return [b for b in CORE_BASELINES if b in seen] + [b for b in seen
                                                       if b not in CORE_BASELINES]


def table(results: list[dict]) -> str:
    """A Markdown table: case, masked_sparse median, ratio per baseline, targets."""
    cols = columns_of(results)
    has_targets = any(r["targets"] for r in results)
    head = ["case", "masked_sparse"] + [f"÷ {c}" for c in cols] + (
        ["target"] if has_targets else [])
    rows = [head, ["---"] + ["---:"] * (1 + len(cols)) + (["---"] if has_targets else [])]
    for r in results:
        ms_cell = fmt_time(r["median_s"]) if r["status"] == "ok" else r["status"]
        row = [r["name"], ms_cell] + [fmt_ratio(r["baselines"].get(c)) for c in cols]
        if has_targets:
            row.append(_fmt_target(r))
        rows.append(row)
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def notes(results: list[dict]) -> list[str]:
    """One line per distinct reason a baseline or case could not run."""
    seen: dict[str, list[str]] = {}
    for r in results:
        if r["status"] != "ok":
            seen.setdefault(f"masked_sparse {r['status']}: {r.get('why', '')}", []).append(
                r["name"])
        for b, e in r["baselines"].items():
            if e.get("status") not in (None, "ok") and e.get("why"):
                seen.setdefault(f"{b} {e['status']}: {e['why']}", []).append(r["name"])
    return [f"{why}  [{len(names)} case(s), e.g. {names[0]}]" for why, names in seen.items()]


def print_section(title: str, results: list[dict]) -> None:
    print(f"\n### {title}\n")
    print(table(results))
    lines = notes(results)
    if lines:
        print("\nNotes:")
        for line in lines:
            print(f"- {line}")


def run_cases(cases: Iterable[Sequence[Any]], title: str = "cases", min_run_time: float = 0.2,
              use_probe: bool = True, only: str | None = None, verbose: bool = True,
              safe: Iterable[str] = ()) -> list[dict]:
    """Time every case (those whose name contains ``only``) and print the section's table.

    Baselines named in ``safe`` (plain torch or scipy calls) skip the crash probe.
    """
    safe = set(safe)
    results = []
    cases = [c for c in cases if not only or only in c[0]]
    probes: list[dict[str, tuple[str, str]]] = []
    for case in cases:  # every fork before any timing (see run_case)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probes.append({b: probe(f) if use_probe and b not in safe else ("ok", "")
                           for b, f in case[2].items() if not isinstance(f, str)})
    for case, probed in zip(cases, probes):
        try:
            results.append(run_case(case, min_run_time, use_probe, probed=probed))
        except Exception:  # noqa: BLE001 -- one broken case must not end the run
            traceback.print_exc()
        if verbose and results and results[-1]["name"] == case[0]:
            r = results[-1]
            ratios = ", ".join(f"{b} {fmt_ratio(e)}" for b, e in r["baselines"].items())
            print(f"  {r['name']}: {fmt_time(r['median_s'])} ({ratios})", file=sys.stderr,
                  flush=True)
    if verbose:
        print_section(title, results)
    return results


def sized_cases(strided_cases: Any, sparse_cases: Any, strided_sizes: tuple[int, ...],
                sparse_nnz: tuple[int, ...], seed: int) -> list[Case]:
    """Every size of a module: ``strided_cases(n, gen, smallest)`` then ``sparse_cases``."""
    gen = torch.Generator().manual_seed(seed)
    out: list[Case] = []
    for n in strided_sizes:
        out += strided_cases(n, gen, smallest=n == min(strided_sizes))
    for nnz in sparse_nnz:
        out += sparse_cases(nnz, gen, smallest=nnz == min(sparse_nnz))
    return out


def module_main(module: Any) -> None:
    """``main()`` for a benchmark module run on its own: its cases, one table, one thread.

    A module may set ``MIN_RUN_TIME`` (seconds a case, default 0.3) and ``SAFE`` (the
    baselines that skip the crash probe, as :func:`run_cases` takes them). Where its
    ``cases`` takes a ``device``, ``--device`` chooses it; a module's ``agreement(device=)``
    (the largest difference between its recipes' results) is printed first.
    """
    import argparse

    parser = argparse.ArgumentParser(description=(module.__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing (0.05 s a case)")
    parser.add_argument("--only", help="the cases whose name contains this text")
    if "device" in inspect.signature(module.cases).parameters:
        parser.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    args = parser.parse_args()
    device = getattr(args, "device", "cpu")
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(module, "agreement"):
            print(f"recipes agree to {module.agreement(device=device):.2e}")
        run_cases(cases_of(module, args.quick, device),
                  getattr(module, "TITLE", module.__name__),
                  min_run_time=0.05 if args.quick else getattr(module, "MIN_RUN_TIME", 0.3),
                  only=args.only, safe=getattr(module, "SAFE", ()))


def environment(min_run_time: float) -> dict[str, Any]:
    """The machine and the versions a run measured on (stamped on every report)."""
    import numpy

    return {"torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": _cpu_name(), "torch_threads": torch.get_num_threads(),
            "min_run_time_s": min_run_time, "date": time.strftime("%Y-%m-%d")}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
