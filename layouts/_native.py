"""Native masked reductions: one compiled pass over values, mask and index.

Note [Native reductions]
~~~~~~~~~~~~~~~~~~~~~~~~
A masked reduction of stored values composed from torch ops makes several passes: fill the
unspecified values with the identity (``fill_unspecified``), then reduce (``segment_reduce``,
``index_add_``, ``scatter_reduce_``), and each torch call has a fixed cost before it
starts. scipy.sparse reduces in one compiled loop. The kernels of ``_native.c`` do the
same for a mask: per group, ``reduce(where(mask, values, identity))`` in one pass, the
mask applied by bit logic (no branch to mispredict), for

- ``all``: every element in one group (a full reduction);
- ``lines``: groups that are runs of consecutive elements given by offsets (CSR rows, the
  rows of a coalesced 2-D COO index);
- ``scatter``: a group index per element (the columns of a matrix);

and op ``sum``, ``sumsq`` (the sum of squares), ``prod``, ``amax``, ``amin`` on float32 and
float64 values, plus mask counts, and ``sqdev`` (:func:`deviations_all` & co.): per group the sum
of the squared deviations of the specified elements from a center per group, the second
pass of a variance (``kernels.moments.masked_sqdev``) in one pass instead of five torch ops
(expand the means, subtract, fill, square, sum); and
``sumexp`` (:func:`deviations_all` & co.), the same with ``exp`` for the square: the second pass
of a logsumexp (``kernels.logsumexp.masked_sumexp``) instead of expand, subtract, fill, exp, sum,
with the C file's own exp (Note [Native exp]: no libm call, so that the loops vectorize;
within 1 ULP of ``torch.exp`` in float64). Whole operations in one call save the torch ops
between their passes: a logsumexp (:func:`logsumexp_all` & co.: the max pass, the sumexp
pass and the log, the logsumexp family), a variance (:func:`moments`: count, sum,
mean, squared deviations: the moments family's ``masked_var``; a mean alone stops
after the mean; the sqdev pass serves the composed route where the one call does not
apply), and a softmax along the stored lines (:func:`softmax`: the softmax family; its
output holds the zeros already, so the caller keeps it instead of filling a copy: one
output-sized allocation less) or across them (columns), over the group ids.
``benchmarks/bench_native.py`` times the kernels against the raw torch ops and the composed
route, ``benchmarks/bench_scipy.py`` the reductions against scipy.sparse.

Sums accumulate in double (a row sum and a column sum of
the same entries agree, whatever the cancellation; float accumulation in blocks was
faster on float32 but lost 254 -> 0 on a 256-long row with +-1e8 ends); products in
the value type, as torch's do (an intermediate overflow is inf on both paths). Results
equal the composed path's up to summation order (``tests/kernels/test_native.py`` checks the
kernels against ``torch.where`` and ``scatter_reduce``,
``tests/kernels/test_sparse_reduce_kernels.py`` both paths against the dense reference).

On a CPU with AVX-512 (F, BW, VL) the runs of ``all`` and ``lines`` go through
hand-written vector code (the C file's "explicit AVX-512" section): the mask bytes become
a mask register (``vptestmb``) that the masked add / fma / mul / max obey, 64 elements a
block in independent accumulators, the last partial block read by masked loads (a short
row is one such block, with no scalar tail); a float32 sum is bound by its widening to
double. The sums' scatter kernels (column sums, means) there skip the unspecified
elements: per 8, the specified indices and values are compressed into a list
(``vpcompressq``), and only the list's entries update their group (an unspecified one adds
+0.0, which changes no group), in storage order: the same sums as the scalar loop.
Elsewhere the portable loops run (an OpenMP simd loop from 256 elements, 16 lanes below),
in 256-bit vectors on a CPU with AVX2.

The kernels check every index they read and return an error instead of touching memory
out of bounds. They run forward only, on CPU, eager: autograd, torch.func, torch.compile
and other devices take the composed path. They are one-threaded: on many cores, where
torch parallelizes some of its scatter and segment ops, the composed path may catch up on
large inputs (``bench_scipy`` runs at one thread and at several).

Note [Shipping the native kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The kernels are built when the package is installed (``setup.py``: optional setuptools
extensions, so that installing succeeds without a C compiler; ``pip install -e .`` builds
them in place, as ``python setup.py build_ext --inplace`` does), never at import or first
use, and nothing is written outside the package. The C file is compiled once per
instruction set into plain shared libraries loaded with ``ctypes`` (no Python C API, no
torch headers: nothing ties a build to a Python or torch version):
``_native_kernels.portable.so`` (baseline: SSE2 on x86-64, the only build on aarch64 and
others), ``_native_kernels.avx2.so`` and ``_native_kernels.avx512.so`` (the dot in the name:
no module name, so that no importer, ``pkgutil`` included, takes one for a Python module).
Whole builds per instruction
set rather than ``target`` attributes on functions: every kernel, helper and macro stays
written once and the explicit AVX-512 code keys on the compiler's own ``__AVX512F__``, the
choice is made once per process (ctypes binds the symbols of one build, no dispatch per
call), and no flag names the build machine's CPU (no ``-march=native``): a wheel runs on any
x86-64 CPU. At first use :func:`_library` loads the baseline build, asks it which the CPU
runs (``ms_cpu_isa``: ``__builtin_cpu_supports``, the OS's support of the wide registers
included), then loads the widest such build. ``MASKED_SPARSE_NATIVE=portable`` (or
``avx2``) caps the choice, so that the tests run every build this CPU takes;
``MASKED_SPARSE_NATIVE=0`` turns the kernels off.

Before a library is opened it is checked against the manifest the build wrote next to it
(``_native_kernels.json``): its size and SHA-256 (``dlopen`` of a truncated file can kill
the process with SIGBUS when a page past its end is touched: it is refused unread), and the
hash of the C source it was built from (a stale in-place build, ``_native.c`` edited since,
is refused rather than run as the old kernels); once open, ``ms_abi_version()`` must equal
:data:`_ABI`, ``ms_built_isa()`` the manifest's name for it, and every symbol
:func:`_declare` binds must be there. A build that fails a check is refused and the next
narrower one tried.

Without loaded kernels (not built, or refused) every caller runs its composed torch path
(the same results up to summation order, slower), and the first call that could have used
them warns once, with a :class:`NativeKernelsWarning` naming the reason and the fix. At
first use rather than at import: importing reads no library and opens none, and a process
that never reduces is not told about kernels it would not run. ``MASKED_SPARSE_NATIVE=0``
(the way to run the torch-op path that other devices take) warns once too, naming the
variable, so that a forgotten setting is never a silent slowdown. :func:`status`
(``layouts.native_status()``) says which implementation runs: ``"available (avx512)"``,
``"available (avx2)"``, ``"available (portable)"``, or why none.

>>> import torch
>>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
>>> out = scatter(v, m, "sum", torch.tensor([0, 0, 1]), 2)
>>> out is None or out.tolist() == [1.0, 3.0]
True
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import math
import os
import sys
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

_DIR = Path(__file__).parent  # where the build puts the kernels and their manifest
_MANIFEST = "_native_kernels.json"
_ABI = 2  # = MS_ABI in _native.c: the version of the kernels' signatures
_ISAS = ("portable", "avx2", "avx512")  # ms_built_isa() / ms_cpu_isa(): 0, 1, 2
_FIX = ("to build them, install the package again with a C compiler (gcc or clang) on the "
        "PATH: `pip install -e .` in a source checkout, or `python setup.py build_ext "
        "--inplace` there")
_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}
_C_TYPE = {torch.float64: ctypes.c_double, torch.float32: ctypes.c_float}
_OPS = {"sum": "sum", "sumsq": "sumsq", "prod": "prod", "amax": "max", "amin": "min"}
# what an unspecified element reads in each op (``layouts._fill.start``, for the float
# dtypes the kernels take)
_START = {"sum": 0.0, "sumsq": 0.0, "prod": 1.0, "amax": -math.inf, "amin": math.inf}
_SUMS = ("sum", "sumsq")  # accumulated in double
# group index types of the scatter kernels; the narrowest first (Note [Narrow group indices])
_INDEX = {torch.uint16: "u16", torch.int32: "i32", torch.int64: "i64"}
# sums of f(value - center): f(d) = d ** 2 (a variance), exp(d) (a logsumexp); the op
# named in an error
_DEVIATIONS = {"sqdev": "var", "sumexp": "logsumexp"}
_why_not = ""  # why the library is not available (``status``)
_isa = ""  # the instruction set of the loaded build (``status``)


class NativeKernelsWarning(UserWarning):
    """The native kernels are not loaded (not built at install, or the build was refused):
    the reductions run their torch-op implementation, slower. Said once per process, at
    the first call that could have used them (Note [Shipping the native kernels])."""


class _Refused(Exception):
    """Why a build is not loaded (a message for :class:`NativeKernelsWarning`)."""


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The loaded kernels of this CPU's build, their tables filled (:func:`_declare`); None
    (and the reason in ``_why_not``) when disabled or when no build passes the checks:
    callers compose torch ops instead. Note [Shipping the native kernels]."""
    global _why_not, _isa
    setting = os.environ.get("MASKED_SPARSE_NATIVE", "1")
    if setting == "0":  # said once too, as a missing build is (the rule)
        _why_not, _isa = "disabled by MASKED_SPARSE_NATIVE=0", ""
        warnings.warn("masked_sparse's native kernels are disabled by MASKED_SPARSE_NATIVE=0: "
                      "reductions run the slower torch-op implementation (the one other "
                      "devices take); unset MASKED_SPARSE_NATIVE to use them",
                      NativeKernelsWarning, stacklevel=_caller_level())
        return None
    cap = _ISAS.index(setting) if setting in _ISAS else len(_ISAS) - 1
    lib, _isa, problems = _load(_DIR, cap)
    if lib is None:
        _why_not = "; ".join(problems)
        warnings.warn(f"masked_sparse's native kernels are not loaded ({_why_not}): "
                      f"reductions run the slower torch-op implementation; {_FIX}",
                      NativeKernelsWarning, stacklevel=_caller_level())
    elif problems:
        warnings.warn(f"masked_sparse's native kernels: {'; '.join(problems)}; running the "
                      f"{_isa} build instead; {_FIX}", NativeKernelsWarning,
                      stacklevel=_caller_level())
    return lib


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this library and torch, for the
    warning of its caller: the user's line that first reduced, not a line of the library."""
    inside = (str(_DIR), str(_DIR.parent / "masked_sparse"), os.path.dirname(torch.__file__))
    try:
        frame, level = sys._getframe(2), 2  # the caller of _library, as warnings counts
    except ValueError:  # (no such frame)
        return 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def _load(directory: Path, cap: int = len(_ISAS) - 1) -> tuple[ctypes.CDLL | None, str, list]:
    """The widest build in ``directory`` that this CPU runs (at most ``_ISAS[cap]``) and
    that passes every check, declared (its kernels in the tables); its instruction set;
    the reasons any build was refused. ``(None, "", reasons)`` when none loads."""
    try:
        manifest = json.loads((directory / _MANIFEST).read_text())
        builds, source = manifest["kernels"], manifest["source_sha256"]
        if manifest["abi"] != _ABI:
            raise _Refused(f"{directory / _MANIFEST} is for kernels of ABI {manifest['abi']}, "
                           f"this version of masked_sparse takes {_ABI}: a stale build")
    except FileNotFoundError:
        return None, "", [f"no build in {directory} (the package was installed without a "
                          "working C compiler, or this source checkout was never built)"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, "", [f"{directory / _MANIFEST} is unreadable ({error!r})"]
    except _Refused as error:
        return None, "", [str(error)]
    c_file = directory / "_native.c"
    if c_file.exists() and hashlib.sha256(c_file.read_bytes()).hexdigest() != source:
        return None, "", [f"the build in {directory} is of another version of {c_file.name} "
                          "(edited or updated since it was built): rebuild it"]
    problems = []
    try:
        base = _open(directory, builds, "portable")
        widest = min(base.ms_cpu_isa(), cap)
    except _Refused as error:
        return None, "", [str(error)]
    for isa in reversed(_ISAS[:widest + 1]):
        if isa not in builds:
            continue
        try:
            lib = base if isa == "portable" else _open(directory, builds, isa)
            _declare_all(lib)
            return lib, isa, problems
        except _Refused as error:
            problems.append(str(error))
    return None, "", problems


def _open(directory: Path, builds: dict, isa: str) -> ctypes.CDLL:
    """The library of build ``isa``, opened once its bytes match the manifest and checked:
    its ABI and instruction set; raises :class:`_Refused`."""
    try:
        entry = builds[isa]
        path = directory / entry["file"]
        data = path.read_bytes()
        ok = len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    except (OSError, KeyError, TypeError) as error:
        raise _Refused(f"the {isa} build in {directory} is unreadable ({error!r})") from None
    if not ok:
        raise _Refused(f"{path} is damaged: its size or SHA-256 is not what the build wrote "
                       f"({len(data)} bytes, {entry['size']} built; truncated or modified)")
    try:
        lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))  # (its own symbols)
        for name in ("ms_abi_version", "ms_built_isa", "ms_cpu_isa"):
            getattr(lib, name).argtypes, getattr(lib, name).restype = [], ctypes.c_int
        abi, built = lib.ms_abi_version(), lib.ms_built_isa()
    except (OSError, AttributeError) as error:
        raise _Refused(f"{path} does not load ({error})") from None
    if abi != _ABI:
        raise _Refused(f"{path} holds kernels of ABI {abi}, this version of masked_sparse "
                       f"takes {_ABI}: a stale build")
    if _ISAS[built:built + 1] != (isa,):
        raise _Refused(f"{path} is not the {isa} build the manifest lists (its "
                       f"ms_built_isa() is {built})")
    return lib


def _declare_all(lib: ctypes.CDLL) -> None:
    """:func:`_declare` into fresh tables, installed only once every symbol is there (a
    missing one leaves the tables as they were); raises :class:`_Refused`. They are
    installed into the tables' own dict objects, so that a caller that read a table before
    the library loaded (``_kind_and_kernel(_SOFTMAX, ...)`` loads it while checking its
    arguments) finds the kernels there, on the first call too."""
    before = {table: globals()[table] for table in _TABLES}
    globals().update({table: {} for table in _TABLES})
    try:
        _declare(lib)
    except AttributeError as error:  # ctypes: "...: undefined symbol: ms_..."
        globals().update(before)
        raise _Refused(f"a symbol is missing ({error})") from None
    for table, own in before.items():
        own.clear()
        own.update(globals()[table])
        globals()[table] = own


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of every kernel (so that ctypes converts, and checks, each call), and
    :data:`_KERNELS`, the kernel of each ``(kind, op, dtype)``."""
    p, n = ctypes.c_void_p, ctypes.c_int64
    for dtype, suffix in _SUFFIX.items():
        t = _C_TYPE[dtype]
        for op, name in _OPS.items():
            kernels = {"all": ([p, p, n, t, p], f"ms_all_{name}_{suffix}"),
                       "lines": ([p, p, n, p, n, p, n, t, p], f"ms_lines_{name}_{suffix}")}
            for kind, (argtypes, symbol) in kernels.items():
                _KERNELS[kind, op, dtype] = _declared(lib, symbol, argtypes)
            _KERNELS["scatter", op, dtype] = {
                index: _declared(lib, f"ms_scatter_{name}_{suffix}_{i}", [p, p, n, p, t, p, n])
                for index, i in _INDEX.items()}
        _FIRST[dtype] = _declared(lib, f"ms_first_{suffix}", [p, p, n, t, p])
        for dev in _DEVIATIONS:
            _DEV[dev, "all", dtype] = _declared(lib, f"ms_all_{dev}_{suffix}", [p, p, n, p, p])
            _DEV[dev, "lines", dtype] = _declared(lib, f"ms_lines_{dev}_{suffix}",
                                                  [p, p, n, p, n, p, n, p, p])
            _DEV[dev, "scatter", dtype] = {
                index: _declared(lib, f"ms_scatter_{dev}_{suffix}_{i}", [p, p, n, p, p, p, n])
                for index, i in _INDEX.items()}
        _LSE["all", dtype] = _declared(lib, f"ms_all_logsumexp_{suffix}", [p, p, n, p])
        _LSE["lines", dtype] = _declared(lib, f"ms_lines_logsumexp_{suffix}",
                                         [p, p, n, p, n, p, n, p])
        _LSE["scatter", dtype] = {
            index: _declared(lib, f"ms_scatter_logsumexp_{suffix}_{i}", [p, p, n, p, p, p, p, n])
            for index, i in _INDEX.items()}
        c = ctypes.c_double
        _MOMENTS["all", dtype] = _declared(lib, f"ms_all_moments_{suffix}",
                                           [p, p, n, c, p, p, p])
        _MOMENTS["lines", dtype] = _declared(lib, f"ms_lines_moments_{suffix}",
                                             [p, p, n, p, n, p, n, c, p, p, p])
        _MOMENTS["scatter", dtype] = {
            index: _declared(lib, f"ms_scatter_moments_{suffix}_{i}",
                             [p, p, n, p, p, c, p, p, p, p, n])
            for index, i in _INDEX.items()}
        flag = ctypes.c_int
        _SOFTMAX["all", dtype] = _declared(lib, f"ms_all_softmax_{suffix}",
                                           [p, p, n, flag, p])
        _SOFTMAX["lines", dtype] = _declared(lib, f"ms_lines_softmax_{suffix}",
                                             [p, p, n, p, n, p, n, flag, p])
        _CUMSUM[dtype] = _declared(lib, f"ms_lines_cumsum_{suffix}", [p, n, p, n, p])
        for kind in ("mm", "dot"):
            _PER_HEAD[kind, dtype] = _declared(lib, f"ms_per_head_{kind}_{suffix}",
                                               [p, p, n, n, n, p, p, n, n, p])
        _SOFTMAX["scatter", dtype] = {
            index: _declared(lib, f"ms_scatter_softmax_{suffix}_{i}",
                             [p, p, n, p, flag, p, p, p, n])
            for index, i in _INDEX.items()}
        _BACKWARD["lines", dtype] = _declared(lib, f"ms_lines_backward_{suffix}",
                                              [p, p, p, n, p, n, p, n, flag, p, p, p, p])
        _BACKWARD["scatter", dtype] = {
            index: _declared(lib, f"ms_scatter_backward_{suffix}_{i}",
                             [p, p, p, n, p, flag, p, p, p, p, p, n])
            for index, i in _INDEX.items()}
        _BACKWARD["softmax lines", dtype] = _declared(
            lib, f"ms_lines_softmax_backward_{suffix}", [p, p, p, n, p, n, p, n, p])
        for op in ("amax", "amin"):
            name = _OPS[op]
            _ARG["lines", op, dtype] = _declared(lib, f"ms_lines_arg{name}_{suffix}",
                                                 [p, p, n, p, n, p, n, p, t, p, p])
            _ARG["scatter", op, dtype] = {
                index: _declared(lib, f"ms_scatter_arg{name}_{suffix}_{i}",
                                 [p, p, n, p, p, t, p, p, n])
                for index, i in _INDEX.items()}
    for op in _SUMS:
        _SCATTER_TO[op] = {
            index: _declared(lib, f"ms_scatter_to_{op}_f32_{i}", [p, p, n, p, ctypes.c_float,
                                                               p, n])
            for index, i in _INDEX.items()}
    lib.ms_scatter_stack.restype = ctypes.c_int
    _SCATTER_TO["stack"] = lib.ms_scatter_stack()
    for width, unsigned in ((1, ctypes.c_uint8), (2, ctypes.c_uint16), (4, ctypes.c_uint32),
                            (8, ctypes.c_uint64)):
        _FILL[width] = _declared(lib, f"ms_fill_u{8 * width}", [p, p, n, unsigned, p])
    for dtype, suffix in _SUFFIX.items():
        _GATHER_ADD[dtype] = _declared(lib, f"ms_gather_add_{suffix}",
                                       [p, p, p, n, n, ctypes.c_int, p])
    for index, suffix in ((torch.int32, "i32"), (torch.int64, "i64")):
        _COMPACT[index] = _declared(lib, f"ms_compact_rows_{suffix}", [p, p, n, n, p, p])
        _COMPACT[index].restype = ctypes.c_int64
    for dtype, suffix in _SUFFIX.items():
        c, flag = ctypes.c_double, ctypes.c_int
        _SGD[dtype] = _declared(lib, f"ms_sgd_momentum_{suffix}",
                                [p, p, p, p, n, c, c, c, c, flag, flag, flag])
    lib.ms_all_count.argtypes = [p, n, p]
    lib.ms_lines_count.argtypes = [p, n, p, n, p, n, p]
    for index, i in _INDEX.items():
        _COUNT_SCATTER[index] = _declared(lib, f"ms_scatter_count_{i}", [p, n, p, p, n])
        if index is not torch.int64:
            _NARROW[index] = _declared(lib, f"ms_narrow_{i}", [p, n, n, p, p])
    return lib


def _declared(lib: ctypes.CDLL, symbol: str, argtypes: list) -> ctypes._CFuncPtr:
    kernel = getattr(lib, symbol)
    kernel.argtypes = argtypes
    return kernel


# (kind, op, dtype) -> kernel; a scatter entry is {index dtype: kernel}
_KERNELS: dict[tuple[str, str, torch.dtype], Any] = {}
_COUNT_SCATTER: dict[torch.dtype, ctypes._CFuncPtr] = {}  # index dtype -> count kernel
_NARROW: dict[torch.dtype, ctypes._CFuncPtr] = {}  # narrowed index dtype -> kernel
_FIRST: dict[torch.dtype, ctypes._CFuncPtr] = {}  # value dtype -> first-equal scan
# (kind, op, dtype) -> arg-extreme kernel (op "amax" / "amin"), as in _KERNELS
_ARG: dict[tuple[str, str, torch.dtype], Any] = {}
_FILL: dict[int, ctypes._CFuncPtr] = {}  # bytes per element -> exact fill
_GATHER_ADD: dict[torch.dtype, ctypes._CFuncPtr] = {}  # value dtype -> read-and-add
# (f, kind, value dtype) -> sum of f of the deviations kernel (f "sqdev": squared, "sumexp":
# exp); a scatter entry per index dtype
_DEV: dict[tuple[str, str, torch.dtype], Any] = {}
_LSE: dict[tuple[str, torch.dtype], Any] = {}  # (kind, dtype) -> logsumexp, as in _KERNELS
_SOFTMAX: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}  # (kind, dtype) -> softmax
_MOMENTS: dict[tuple[str, torch.dtype], Any] = {}  # (kind, dtype) -> mean / var, as _LSE
_CUMSUM: dict[torch.dtype, ctypes._CFuncPtr] = {}  # dtype -> running sums along lines
# (kind, dtype) -> the per-head product's kernels (kind "mm" or "dot": layouts/_per_head.py)
_PER_HEAD: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
# op ("sum", "sumsq") -> {index dtype: scatter of float32 values written as float32}, and
# "stack" -> the most groups those take (ms_scatter_stack: their double sums on the stack)
_SCATTER_TO: dict[str, Any] = {}
_BACKWARD: dict[tuple[str, torch.dtype], Any] = {}  # (kind, dtype) -> backward, as _LSE
_COMPACT: dict[torch.dtype, ctypes._CFuncPtr] = {}  # id dtype -> compaction (_compact.py)
_SGD: dict[torch.dtype, ctypes._CFuncPtr] = {}  # value dtype -> SGD momentum step (_sgd.py)
#: the tables :func:`_declare` fills (a test that loads another build swaps them all)
_TABLES = ("_KERNELS", "_COUNT_SCATTER", "_NARROW", "_FIRST", "_ARG", "_FILL", "_DEV",
           "_LSE", "_SOFTMAX", "_MOMENTS", "_CUMSUM", "_BACKWARD", "_SCATTER_TO",
           "_PER_HEAD", "_COMPACT", "_SGD", "_GATHER_ADD")


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, the native kernels are off, as with ``MASKED_SPARSE_NATIVE=0``:
    every caller runs its torch-op implementation, the one other devices take
    (``layouts.native_disabled()``; the tests run the device path on the CPU with it).

    Process-wide, not per thread: it swaps :func:`_library` (every kernel asks it) for one
    that answers None, and puts it back on exit; blocks nest. Nothing is cached against
    the kernels' state, so a call after the block runs them again.

    >>> with disabled():
    ...     available()
    False
    """
    global _library
    before = _library
    _library = _none
    try:
        yield
    finally:
        _library = before


def _none() -> None:
    """:func:`_library` within :func:`disabled`."""
    return None


def available() -> bool:
    """True when the native kernels are compiled and loaded (see :func:`status`); False
    while torch.compile traces (they never run in a compiled graph)."""
    return not torch.compiler.is_compiling() and _library() is not None


def status() -> str:
    """``"available (ISA)"`` with the instruction set of the loaded build (``avx512``,
    ``avx2`` or ``portable``), or why the native kernels are not (the composed torch path
    runs). Note [Shipping the native kernels]."""
    if _library is _none:
        return "disabled at run time (layouts.native_disabled())"
    return f"available ({_isa})" if _library() is not None else _why_not


def _eager_cpu(t: torch.Tensor) -> bool:
    """True for a plain CPU tensor with memory behind it, eager (``plain_eager``: not
    compiling, no autograd to record, no torch.func transform): not a subclass (a fake
    tensor has no data, a functorch wrapper hides its own), no dispatch mode active (fake
    mode, ``make_fx`` tracing would record nothing of a ctypes call)."""
    return (type(t) is torch.Tensor and t.is_cpu and not torch.compiler.is_compiling()
            and not (t.requires_grad and torch.is_grad_enabled())
            and not torch._C._are_functorch_transforms_active()
            and not torch._C._len_torch_dispatch_stack())


def _mask_ok(mask: torch.Tensor, n: int | torch.Size) -> bool:
    """A bool CPU mask a kernel reads: a contiguous vector of ``n`` (a shape: of that
    shape, read in order), as :func:`_index_ok`."""
    return (type(mask) is torch.Tensor and mask.dtype is torch.bool and mask.is_cpu
            and mask.is_contiguous() and mask.shape == ((n,) if type(n) is int else n))


def _index_ok(index: torch.Tensor, n: int | torch.Size, group: bool = False) -> bool:
    """An index a kernel reads: int64 offsets and lines, a ``group`` index of any type of
    ``_INDEX``; a vector of ``n`` (a shape: of that shape, contiguous, read in order)."""
    return (type(index) is torch.Tensor
            and (index.dtype in _INDEX if group else index.dtype is torch.long)
            and index.is_cpu and index.is_contiguous()
            and index.shape == ((n,) if type(n) is int else n))


# Note [One check per call]
# The checks of :func:`_readable` run on every kernel call, and a small reduction is
# mostly such fixed costs (``benchmarks/profile_overhead.py --fixed``): they are written
# as one expression over names bound at import (no nested helpers), each property read
# once. ``_library`` stays a lookup of this module's global (tests swap it).
_TENSOR, _BOOL = torch.Tensor, torch.bool
_grad_enabled = torch.is_grad_enabled
_transforms_active = torch._C._are_functorch_transforms_active
_modes_active = torch._C._len_torch_dispatch_stack
_compiling = torch.compiler.is_compiling


def _applies(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """True where a reduction kernel may read ``values`` and ``mask``: 1-D, and
    :func:`_readable`."""
    return values.dim() == 1 and _readable(values, mask)


def _readable(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """True where a kernel may read ``values`` and ``mask`` element by element: a bool mask
    of the values' shape, both contiguous, CPU, eager, no autograd or torch.func, and the
    library loaded (any dtype: the kernel tables say which they take): :func:`_mask_ok`
    and :func:`_eager_cpu` in one expression (Note [One check per call])."""
    return (type(values) is _TENSOR and type(mask) is _TENSOR and mask.dtype is _BOOL
            and values.is_cpu and mask.is_cpu and mask.shape == values.shape
            and values.is_contiguous() and mask.is_contiguous()
            and not (values.requires_grad and _grad_enabled())
            and not _transforms_active() and not _modes_active() and not _compiling()
            and _library() is not None)


def _kernel(kind: str, values: torch.Tensor, mask: torch.Tensor, op: str):
    """The kernel for ``values`` and ``mask``, or None where the native path does not apply
    (other dtypes or shapes, autograd, torch.func, compiling, other devices)."""
    return _KERNELS.get((kind, op, values.dtype)) if _applies(values, mask) else None


class IndexOutOfRange(ValueError, RuntimeError):
    """A kernel's index (a group id, a line pointer or a listed line) is out of range: the
    kernel checked it in C and wrote nothing out of bounds. A ``ValueError`` (bad input);
    also a ``RuntimeError``, what the kernels raised before they named the index."""


def _check(status: int, what: str, *, index: torch.Tensor | None = None, groups: int = 0,
           offsets: torch.Tensor | None = None, which: torch.Tensor | None = None,
           size: int = 0) -> None:
    """Raise :class:`IndexOutOfRange` where a kernel returned an error status, naming the
    op ``what``, the first bad entry of the kernel's ``index`` (group ids into ``groups``)
    or of its ``offsets`` (line pointers into ``size`` stored values) and ``which`` (listed
    lines), and its bound.

    >>> try:
    ...     _check(-1, "sum", index=torch.tensor([0, 7, 1]), groups=3)
    ... except ValueError as error:
    ...     "group index 7 of stored element 1 is outside [0, 3)" in str(error)
    True
    """
    if status == 0:
        return
    where = _bad_entry(index, groups, offsets, which, size)
    raise IndexOutOfRange(f"masked reduction ({what}): an index is out of range"
                          f"{f' ({where})' if where else ''}; the sparse index was modified "
                          "after the tensor was built, or is corrupt (rebuild the "
                          "MaskedTensor)")


def _bad_entry(index: torch.Tensor | None, groups: int, offsets: torch.Tensor | None,
               which: torch.Tensor | None, size: int) -> str | None:
    """The first entry out of range among a kernel's index tensors, in words (the error
    path of :func:`_check` only)."""
    if index is not None:
        ids = index.long()
        bad = ((ids < 0) | (ids >= groups)).nonzero()
        if bad.numel():
            j = int(bad[0])
            return f"group index {int(ids[j])} of stored element {j} is outside [0, {groups})"
    if offsets is not None:
        lines = offsets.shape[0] - 1
        if which is not None:
            bad = ((which < 0) | (which >= lines)).nonzero()
            if bad.numel():
                j = int(bad[0])
                return f"listed line {int(which[j])} (entry {j}) is outside [0, {lines})"
        bad = ((offsets < 0) | (offsets > size)).nonzero()
        if bad.numel():
            i = int(bad[0])
            return f"line pointer {int(offsets[i])} (entry {i}) is outside [0, {size}]"
        bad = (offsets.diff() < 0).nonzero()
        if bad.numel():
            i = int(bad[0])
            return (f"line pointer {int(offsets[i + 1])} (entry {i + 1}) is below the one "
                    f"before it, {int(offsets[i])}")
        if lines >= 0 and (int(offsets[0]) != 0 or int(offsets[-1]) != size):
            return (f"the line pointers run from {int(offsets[0])} to {int(offsets[-1])}, not "
                    f"over the {size} stored values")
    return None


def reduce_all(values: torch.Tensor, mask: torch.Tensor, op: str) -> torch.Tensor | None:
    """``reduce(where(mask, values, identity))`` over every element, shape ``(1,)``, for
    ``op`` "sum", "sumsq" (the sum of squares), "prod", "amax" or "amin"; None where the
    native kernels do not apply (use the composed path)."""
    kernel = _kernel("all", values, mask, op)
    if kernel is None:
        return None
    out = values.new_empty(1)
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], _START[op],
              out.data_ptr()):
        _check(-1, op)
    return out


def _line_args(offsets: torch.Tensor, which: torch.Tensor | None) -> tuple | None:
    """The arguments a lines kernel takes for ``offsets`` and ``which`` -- the pointers,
    the number of lines, the listed lines (NULL: all) and their number, the output's
    length last -- or None where they are not int64 CPU vectors a kernel may read. Called
    once the kernel applies (plain eager values): a torch.func wrapper has no pointer.

    Note [Line arguments once per index]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``offsets`` and ``which`` are a grouping's cached line facts, the same tensors call
    after call: their checked arguments are kept per ``offsets`` object (a weak reference:
    the entry goes with it) with the very ``which`` object, and served while both version
    counters are unchanged. An in-place write bumps a version counter (``set_`` and
    ``resize_`` included), so what such a tensor holds now is checked again; the data
    pointer is compared too (``.data`` assignment keeps the counter). The kernels check
    every pointer and line they read, cached or not (:class:`IndexOutOfRange`).
    """
    entry = _LINE_ARGS.get(id(offsets))
    if entry is not None and entry[0]() is offsets and entry[1] is which:
        try:
            if (entry[2] == offsets._version and entry[3] == offsets.data_ptr()
                    and (which is None or (entry[4] == which._version
                                           and entry[5] == which.data_ptr()))):
                return entry[6]
        except RuntimeError:  # an inference tensor: no version counter (never cached)
            pass
    args = _checked_line_args(offsets, which)
    if (args is not None and not offsets.is_inference()
            and (which is None or not which.is_inference())):
        key = id(offsets)
        forget = functools.partial(_forget, key)
        _LINE_ARGS[key] = (weakref.ref(offsets, forget),
                           which, offsets._version, args[0],
                           None if which is None else which._version, args[2], args)
    return args


_LINE_ARGS: dict[int, tuple] = {}  # id(offsets) -> Note [Line arguments once per index]


def _forget(key: int, _: object, cache: dict = _LINE_ARGS) -> None:
    cache.pop(key, None)  # ``cache`` bound early: the module may be torn down first


def _checked_line_args(offsets: torch.Tensor, which: torch.Tensor | None) -> tuple | None:
    """:func:`_line_args`, checked."""
    if type(offsets) is not torch.Tensor or offsets.dim() != 1:
        return None
    lines = offsets.shape[0] - 1  # (the checks of _index_ok, the shape read once)
    if (lines < 0 or offsets.dtype is not torch.long or not offsets.is_cpu
            or not offsets.is_contiguous()):
        return None
    if which is None:
        return offsets.data_ptr(), lines, None, lines
    if not _index_ok(which, which.shape[0]):
        return None
    return offsets.data_ptr(), lines, which.data_ptr(), which.shape[0]


def lines(values: torch.Tensor, mask: torch.Tensor, op: str, offsets: torch.Tensor,
          which: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per line ``which[i]`` (its elements ``offsets[which[i]]`` up to
    ``offsets[which[i] + 1]``; every line when ``which`` is None),
    ``reduce(where(mask, values, identity))``; None where the native kernels do not
    apply."""
    kernel = _kernel("lines", values, mask, op)
    args = None if kernel is None else _line_args(offsets, which)
    if kernel is None or args is None:
        return None
    out = values.new_empty(args[-1])
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *args,
              _START[op], out.data_ptr()):
        _check(-1, op, offsets=offsets, which=which, size=values.shape[0])
    return out


def scatter(values: torch.Tensor, mask: torch.Tensor, op: str, index: torch.Tensor,
            n: int, shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """Into ``n`` groups, ``out[index[j]] op= where(mask, values, identity)[j]`` (groups
    without an element hold the identity); None where the native kernels do not apply.
    ``values`` and ``mask`` are vectors; with ``shape`` (the result's, of ``n`` elements)
    they may have any one shape, their elements ``j`` in order (contiguous, so that a hybrid
    tensor's ``(nnz, h...)`` values are read as they are, without a reshape), and ``index``
    a vector or the values' shape. ``index`` is of int64, int32 or uint16 (:func:`narrow`),
    one group per element."""
    kernels = _KERNELS.get(("scatter", op, values.dtype)) if (
        (shape is not None or values.dim() == 1) and _readable(values, mask)) else None
    size = values.numel()
    if kernels is None or not (_index_ok(index, size, group=True) or (
            shape is not None and _index_ok(index, values.shape, group=True))):
        return None
    if op in _SUMS:
        if values.dtype is torch.float32 and n <= _SCATTER_TO["stack"]:
            kernel = _SCATTER_TO[op][index.dtype]
            out = values.new_empty(n) if shape is None else values.new_empty(*shape)
        else:  # double sums, rounded after (float32) or as they are (float64)
            kernel, out = kernels[index.dtype], torch.empty(n, dtype=torch.float64)
    else:
        kernel, out = kernels[index.dtype], values.new_empty(n)
    if kernel(values.data_ptr(), mask.data_ptr(), size, index.data_ptr(), _START[op],
              out.data_ptr(), n):
        _check(-1, op, index=index.reshape(-1), groups=n)
    if out.dtype is not values.dtype:
        out = out.to(values.dtype)
    return out if shape is None or out.dim() == len(shape) else out.view(*shape)


def first(values: torch.Tensor, mask: torch.Tensor, x: torch.Tensor,
          checked: bool = False) -> int | None:
    """The index of the first element of ``values`` that is specified and equals the
    one-element ``x`` (with ``x`` NaN: is NaN), -1 when there is none; None where the
    native kernels do not apply. With ``x`` the masked maximum, the masked argmax.
    ``checked``: the caller has just had a native kernel read these ``values`` and ``mask``
    (:func:`reduce_all` found ``x``), so :func:`_applies` holds (Note [One check per call]).

    >>> v, m = torch.tensor([5., 7., 7.]), torch.tensor([True, False, True])
    >>> first(v, m, torch.tensor([7.])) in (None, 2)
    True
    """
    kernel = _FIRST.get(values.dtype) if checked or _applies(values, mask) else None
    if kernel is None:
        return None
    out = torch.empty(1, dtype=torch.long)
    _check(kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], float(x),
                  out.data_ptr()), "argmax")
    return int(out)


# Note [Native arg-extremes]
# argmax / argmin / max(dim) / min(dim) along dims composed from torch ops take about a dozen
# passes: the masked extreme, broadcast back onto the elements, compared, NaNs found apart,
# the positions of the hits filled, and their minimum per group. The arg kernels find each
# group's extreme and the position of its first specified element reaching it in one call
# (a line: two vector loops over the line while it is in cache; a scatter: one scalar pass
# updating both). NaN counts as the extreme and the first NaN wins (torch's rule); "first"
# is the smallest position, compared explicitly (not the storage order). A group without a
# specified element reads 0 and 0 (what an unspecified output element holds: the caller
# needs no fill pass). Positions are int64 (``Grouping.positions``). Along rows the line
# kernel's max and AVX-512 scan replace the dozen passes (a scalar scan was slower); along
# columns the scatter kernel branches on "not below the top", which mispredicts at every
# new maximum, yet the branch-free variants measured slower: they store every element's
# update, or read the values twice. ``benchmarks/bench_reductions.py`` times both.


def _arg_ok(values: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
            checked: bool) -> bool:
    """The arg kernels' checks; with ``checked``, those of the positions alone: the caller
    has just asked :func:`arg_applies` of the same ``values`` and ``mask`` (Note [One check
    per call])."""
    return (checked or _applies(values, mask)) and _index_ok(positions, values.shape[0])


def arg_applies(values: torch.Tensor, mask: torch.Tensor, op: str) -> bool:
    """True where the arg-extreme kernels take ``values`` and ``mask`` (a caller checks it
    before it builds the positions and group ids they read)."""
    return _applies(values, mask) and ("lines", op, values.dtype) in _ARG


def _arg_out(n: int, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values.new_empty(n), torch.empty(n, dtype=torch.long)


def arg_lines(values: torch.Tensor, mask: torch.Tensor, op: str, offsets: torch.Tensor,
              which: torch.Tensor | None, positions: torch.Tensor, checked: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per line (as :func:`lines`), the masked extreme of ``values`` (``op`` "amax" or
    "amin") and the smallest of ``positions`` (int64, one per element) among the specified
    elements reaching it, NaN counting as the extreme, (0, 0) where none is specified (Note
    [Native arg-extremes]); None where the native kernels do not apply. ``checked``: the
    caller has just asked :func:`arg_applies` of these ``values`` and ``mask``.

    >>> v, m = torch.tensor([1., 3., 3., 9.]), torch.tensor([True, True, True, False])
    >>> out = arg_lines(v, m, "amax", torch.tensor([0, 4]), None, torch.tensor([0, 5, 2, 1]))
    >>> out is None or (out[0].tolist(), out[1].tolist()) == ([3.0], [2])
    True
    """
    kernel = _ARG.get(("lines", op, values.dtype)) \
        if _arg_ok(values, mask, positions, checked) else None
    args = None if kernel is None else _line_args(offsets, which)
    if kernel is None or args is None:
        return None
    top, at = _arg_out(args[-1], values)
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *args,
              positions.data_ptr(), _START[op], top.data_ptr(), at.data_ptr()):
        _check(-1, "arg" + op[1:], offsets=offsets, which=which, size=values.shape[0])
    return top, at


def arg_scatter(values: torch.Tensor, mask: torch.Tensor, op: str, index: torch.Tensor,
                n: int, positions: torch.Tensor, checked: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Into ``n`` groups (as :func:`scatter`), the masked extreme of ``values`` and the
    smallest of ``positions`` among the specified elements reaching it, as
    :func:`arg_lines` (``checked`` too); None where the native kernels do not apply."""
    kernels = _ARG.get(("scatter", op, values.dtype)) \
        if _arg_ok(values, mask, positions, checked) else None
    if kernels is None or not _index_ok(index, values.shape[0], group=True):
        return None
    top, at = _arg_out(n, values)
    _check(kernels[index.dtype](values.data_ptr(), mask.data_ptr(), values.shape[0],
                                index.data_ptr(), positions.data_ptr(),
                                _START[op], top.data_ptr(), at.data_ptr(), n),
           "arg" + op[1:], index=index, groups=n)
    return top, at


def fill(values: torch.Tensor, mask: torch.Tensor, bits: int,
         out: torch.Tensor | None = None) -> torch.Tensor | None:
    """``where(mask, values, fill)`` bit for bit, in one pass, for ``bits`` the fill's bit
    pattern as an integer of the values' width (1, 2, 4 or 8 bytes an element): a new
    contiguous tensor of the values' shape (``out=values``: written in place, element by
    element); None where the native kernels do not apply (not contiguous, another device,
    autograd, a transform, compiling).

    >>> out = fill(torch.tensor([1., 2.]), torch.tensor([True, False]), 0)
    >>> out is None or out.tolist() == [1.0, 0.0]
    True
    """
    kernel = _FILL.get(values.element_size()) if _readable(values, mask) else None
    if kernel is None:
        return None
    if out is None:
        out = torch.empty_like(values)  # contiguous, as the values
    elif out is not values:
        raise ValueError("fill: out must be None or the values themselves")
    kernel(values.data_ptr(), mask.data_ptr(), values.numel(), bits, out.data_ptr())
    return out


#: :func:`gather_add`'s ops, as its kernel numbers them
GATHER_OPS = {"add": 0, "sub": 1, "rsub": 2}


def gather_add(values: torch.Tensor, dense: torch.Tensor, at: torch.Tensor,
               op: str = "add") -> torch.Tensor | None:
    """``values + dense.flatten()[at]`` in one pass (``op`` ``"sub"``: ``values - ...``,
    ``"rsub"``: ``... - values``), with ``at`` int64 flat positions of ``values``' shape:
    the roundings of torch's ``take`` then ``add`` / ``sub``. None where the native kernels
    do not apply (another dtype or device, a ``dense`` of another dtype or not contiguous,
    autograd, a transform, compiling); raises :class:`IndexOutOfRange` at a position outside
    ``dense``, having written nothing.

    >>> out = gather_add(torch.tensor([1., 2.]), torch.tensor([10., 20.]), torch.tensor([1, 1]))
    >>> out is None or out.tolist() == [21.0, 22.0]
    True
    """
    if (type(values) is not _TENSOR or type(dense) is not _TENSOR
            or dense.dtype is not values.dtype or not values.is_cpu or not dense.is_cpu
            or not values.is_contiguous() or not dense.is_contiguous()
            or not _index_ok(at, values.shape)
            or ((values.requires_grad or dense.requires_grad) and _grad_enabled())
            or _transforms_active() or _modes_active() or _compiling()
            or _library() is None):  # (loads the library: the table is filled then)
        return None
    kernel = _GATHER_ADD.get(values.dtype)
    if kernel is None:
        return None
    out = torch.empty_like(values)
    if kernel(values.data_ptr(), dense.data_ptr(), at.data_ptr(), values.numel(),
              dense.numel(), GATHER_OPS[op], out.data_ptr()):
        raise IndexOutOfRange(f"a plain operand read at stored positions: a position is "
                              f"outside its {dense.numel()} elements (the sparse index was "
                              f"modified after construction: rebuild the tensor from a "
                              f"valid index)")
    return out


def _count_ok(mask: torch.Tensor) -> bool:
    return _mask_ok(mask, mask.numel()) and _eager_cpu(mask) and _library() is not None


def count_all(mask: torch.Tensor) -> torch.Tensor | None:
    """The number of True elements of a 1-D bool ``mask``, shape ``(1,)`` int64, or None."""
    if not _count_ok(mask):
        return None
    out = torch.empty(1, dtype=torch.long)
    _check(_library().ms_all_count(mask.data_ptr(), mask.shape[0], out.data_ptr()), "count")
    return out


def count_lines(mask: torch.Tensor, offsets: torch.Tensor,
                which: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per line (as :func:`lines`), the number of True elements of ``mask`` (int64)."""
    args = _line_args(offsets, which) if _count_ok(mask) else None
    if args is None:
        return None
    out = torch.empty(args[-1], dtype=torch.long)
    if _library().ms_lines_count(mask.data_ptr(), mask.shape[0], *args, out.data_ptr()):
        _check(-1, "count", offsets=offsets, which=which, size=mask.shape[0])
    return out


def count_scatter(mask: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor | None:
    """Per group (as :func:`scatter`), the number of True elements of ``mask`` (int64)."""
    if not (_count_ok(mask) and _index_ok(index, mask.shape[0], group=True)):
        return None
    out = torch.empty(n, dtype=torch.long)
    _check(_COUNT_SCATTER[index.dtype](mask.data_ptr(), mask.shape[0], index.data_ptr(),
                                       out.data_ptr(), n), "count", index=index, groups=n)
    return out


# Note [Narrow group indices]
# A scatter pass (a column sum: element j into group index[j]) reads per stored element its
# value, its mask byte and its int64 group index: 17 bytes for a float64, where scipy reads
# 12 (an int32 index). The loop waits on memory, so a narrower index is faster
# (``benchmarks/bench_scipy.py``'s column sums; unrolling and prefetching the output
# measured no gain; the index is what pays). The groupings keep
# one narrowed copy per index tensor and reduction, with the grouping's other index facts
# (``cached`` per index and version: an index written in place is narrowed again, never
# read stale): +2 bytes per stored element (uint16, at most 65536
# groups), else +4 (int32), O(nnz) memory while the index lives. It holds group ids, not
# key slots: a grouping over key slots (columns) maps each slot to its group in the same
# pass (``remap``), so the kernels write the groups directly and no selection of the
# present slots follows (torch ops fewer per small column reduction). The first eager
# scatter over an index without autograd makes it, in one pass (less than it saves on that
# first kernel) that also checks the range: an index with an element out of range
# is not narrowed, and its own kernel raises. The kernels read an int32 index as given
# too, and an int32 CSR's column reductions never build the int64 copy of its column index
# (the slot keys are built only for torch passes).


def narrow(index: torch.Tensor, n: int,
           remap: torch.Tensor | None = None) -> torch.Tensor | None:
    """A copy of the int64 group ``index`` into ``n`` groups as the scatter kernels read it
    fastest: uint16 when ``n <= 65536``, else int32 when ``n <= 2**31``, made in one pass
    (Note [Narrow group indices]); None when ``index`` is not int64, when an element is out
    of range (its own scatter raises; so does a ``remap`` entry) or when the kernels are not
    available. Never ``index`` itself: the groupings cache the result per index tensor,
    and a cached fact must not keep its index alive. With ``remap`` (int64, ``n`` entries
    in ``[0, n)``) the copy holds ``remap[index]``: the group of each element's key slot.

    >>> out = narrow(torch.tensor([3, 0, 2]), 4)
    >>> out is None or (out.tolist(), out.dtype) == ([3, 0, 2], torch.uint16)
    True
    >>> out = narrow(torch.tensor([3, 0, 3]), 4, remap=torch.tensor([0, 0, 0, 1]))
    >>> out is None or out.tolist() == [1, 0, 1]
    True
    """
    to = torch.uint16 if n <= 2**16 else torch.int32 if n <= 2**31 else None
    if (to is None or not _index_ok(index, index.shape[0])
            or (remap is not None and not _index_ok(remap, n))
            or not _eager_cpu(index) or _library() is None):
        return None
    out = torch.empty(index.shape[0], dtype=to)
    if _NARROW[to](index.data_ptr(), index.shape[0], n,
                   None if remap is None else remap.data_ptr(), out.data_ptr()) != 0:
        return None
    return out


# -- sums of a function of the deviations: the second pass of a variance, a logsumexp -----
def _dev_kernel(f: str, kind: str, values: torch.Tensor, mask: torch.Tensor,
                center: torch.Tensor, ncenter: int):
    """The ``kind`` kernel of :func:`deviations_all` & co. for ``f``, or None where it does not
    apply: the conditions of :func:`_applies`, and a ``center`` of the values' dtype and
    ``ncenter`` elements that the kernel may read, with no autograd to record (the rest of
    :func:`_eager_cpu` is global state, checked with ``values``)."""
    if not (_applies(values, mask) and type(center) is torch.Tensor
            and center.dtype is values.dtype and center.shape == (ncenter,)
            and center.is_cpu and center.is_contiguous()
            and not (center.requires_grad and torch.is_grad_enabled())):
        return None
    return _DEV.get((f, kind, values.dtype))


def deviations_all(f: str, values: torch.Tensor, mask: torch.Tensor,
                   center: torch.Tensor) -> torch.Tensor | None:
    """The sum over the specified elements of ``f(values - center)``, ``f`` "sqdev" (the
    square) or "sumexp" (``exp``: the kernels' own, Note [Native exp] in ``_native.c``, at
    most 1 ULP from ``torch.exp`` in float64), for a one-element ``center``, shape ``(1,)``,
    accumulated in double. An unspecified element adds nothing, whatever it holds. None
    where the native kernels do not apply (use the composed path).

    >>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
    >>> out = deviations_all("sqdev", v, m, torch.tensor([2.]))
    >>> out is None or out.tolist() == [2.0]
    True
    >>> out = deviations_all("sumexp", v, m, torch.tensor([1.]))
    >>> out is None or torch.allclose(out, 1 + torch.tensor([2.]).exp())
    True
    """
    kernel = _dev_kernel(f, "all", values, mask, center, 1)
    if kernel is None:
        return None
    out = torch.empty(1, dtype=values.dtype)
    _check(kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], center.data_ptr(),
                  out.data_ptr()), _DEVIATIONS[f])
    return out


def deviations_lines(f: str, values: torch.Tensor, mask: torch.Tensor, center: torch.Tensor,
                     offsets: torch.Tensor,
                     which: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per line (as :func:`lines`; ``center[i]`` is output line ``i``'s), the sum of
    ``f(values - center[i])`` over its specified elements (as :func:`deviations_all`); None
    where the native kernels do not apply."""
    n = offsets.shape[0] - 1 if which is None else which.shape[0]
    kernel = _dev_kernel(f, "lines", values, mask, center, n)
    args = None if kernel is None else _line_args(offsets, which)
    if args is None:
        return None
    out = values.new_empty(args[-1])
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *args, center.data_ptr(),
              out.data_ptr()):
        _check(-1, _DEVIATIONS[f], offsets=offsets, which=which, size=values.shape[0])
    return out


def logsumexp_all(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """The masked logsumexp of every element in one call, shape ``(1,)``: the log of the
    sum of ``exp`` of the specified elements, 0 where none is (the caller's result mask
    says which); step for step the composed path (the logsumexp family's torch ops), the exp
    of Note [Native exp]. None where the native kernels do not apply.

    >>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
    >>> out = logsumexp_all(v, m)
    >>> out is None or torch.allclose(out, torch.logsumexp(torch.tensor([1., 3.]), 0))
    True
    """
    kernel = _LSE.get(("all", values.dtype)) if _applies(values, mask) else None
    if kernel is None:
        return None
    out = torch.empty(1, dtype=values.dtype)
    _check(kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], out.data_ptr()),
           "logsumexp")
    return out


def logsumexp_lines(values: torch.Tensor, mask: torch.Tensor, offsets: torch.Tensor,
                    which: torch.Tensor | None = None) -> torch.Tensor | None:
    """Per line (as :func:`lines`), the masked logsumexp of its elements (as
    :func:`logsumexp_all`: 0 for a line without a specified element); None where the
    native kernels do not apply."""
    kernel = _LSE.get(("lines", values.dtype)) if _applies(values, mask) else None
    args = None if kernel is None else _line_args(offsets, which)
    if kernel is None or args is None:
        return None
    out = values.new_empty(args[-1])
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *args, out.data_ptr()):
        _check(-1, "logsumexp", offsets=offsets, which=which, size=values.shape[0])
    return out


def logsumexp_scatter(values: torch.Tensor, mask: torch.Tensor, index: torch.Tensor,
                      specified: torch.Tensor, n: int) -> torch.Tensor | None:
    """Into ``n`` groups (as :func:`scatter`), the masked logsumexp of each (as
    :func:`logsumexp_all`), 0 where the bool ``specified`` (one per group) is False; None
    where the native kernels do not apply."""
    kernels = _LSE.get(("scatter", values.dtype)) if _applies(values, mask) else None
    if (kernels is None or not _index_ok(index, values.shape[0], group=True)
            or not _mask_ok(specified, n)):
        return None
    out = torch.empty(n, dtype=values.dtype)
    sums = torch.empty(n, dtype=torch.float64)
    _check(kernels[index.dtype](values.data_ptr(), mask.data_ptr(), values.shape[0],
                                index.data_ptr(), specified.data_ptr(), sums.data_ptr(),
                                out.data_ptr(), n), "logsumexp", index=index, groups=n)
    return out


def _kind_and_kernel(table: dict, values: torch.Tensor, mask: torch.Tensor,
                     offsets: torch.Tensor | None, index: torch.Tensor | None,
                     column: bool = False) -> tuple:
    """For the functions that take the kind of call from their arguments: "all" (neither
    ``offsets`` nor ``index``), "lines" (``offsets``) or "scatter" (``index``), and that
    kind's kernel in ``table`` for the values' dtype, None where the kernels do not apply
    (:func:`_applies`; with ``column``, :func:`_column` values too)."""
    kind = "all" if offsets is None and index is None else "lines" if index is None else \
        "scatter"
    shaped = values.dim() == 1 or (column and _column(values))
    return kind, table.get((kind, values.dtype)) if shaped and _readable(values, mask) else None


def _column(t: torch.Tensor) -> bool:
    """True for a column ``(n, 1, ...)``: more than one dim, each past the first of size 1.
    Contiguous, its ``n`` elements lie in memory as a vector's do, so that a kernel that
    returns one value per element reads and writes it as it is, the result shaped like it
    (one head of a hybrid tensor's values, ``(nnz, 1)``), without a reshape each way."""
    return t.dim() > 1 and t.numel() == t.shape[0]


def moments(values: torch.Tensor, mask: torch.Tensor, correction: float | None,
            offsets: torch.Tensor | None = None, which: torch.Tensor | None = None,
            index: torch.Tensor | None = None, counts: torch.Tensor | None = None
            ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None:
    """The masked mean and, with a ``correction`` (None: the mean alone), variance in one
    call, per group: over one group of every element; with ``offsets`` per line (as
    :func:`lines`); with ``index`` and the groups' ``counts`` of specified elements (int64,
    one per group) per group (as :func:`scatter`). Returns the variance (0 where ``count -
    correction <= 0``; None without a correction), the mean (0 where nothing is specified)
    and where the result is specified; step for step the composed paths
    (the moments family's torch ops). None where the native kernels do not apply.

    >>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
    >>> out = moments(v, m, 1.0)
    >>> out is None or [t.tolist() for t in out] == [[2.0], [2.0], [True]]
    True
    """
    kind, kernel = _kind_and_kernel(_MOMENTS, values, mask, offsets, index)
    if kernel is None:
        return None
    groups: tuple = ()
    if kind == "lines":
        groups = _line_args(offsets, which)
        if groups is None:
            return None
        n = groups[-1]
    elif kind == "scatter":
        n = 0 if counts is None else counts.shape[0]
        if not (_index_ok(index, values.shape[0], group=True) and counts is not None
                and _index_ok(counts, n)):
            return None
        kernel = kernel[index.dtype]  # (sums None: the kernel's stack array)
        sums = None if n <= _SCATTER_TO["stack"] else torch.empty(n, dtype=torch.float64)
        groups = (index.data_ptr(), counts.data_ptr())
    else:
        n = 1
    var = None if correction is None else values.new_empty(n)
    mean, specified = values.new_empty(n), torch.empty(n, dtype=torch.bool)
    groups += (0.0 if correction is None else float(correction),)
    tail = (None if var is None else var.data_ptr(), mean.data_ptr(), specified.data_ptr())
    if kind == "scatter":
        groups += (None if sums is None else sums.data_ptr(),)
        tail += (n,)
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *groups, *tail):
        _check(-1, "mean" if correction is None else "var",
               index=index if kind == "scatter" else None, groups=n,
               offsets=offsets if kind == "lines" else None, which=which,
               size=values.shape[0])
    return var, mean, specified


def softmax(values: torch.Tensor, mask: torch.Tensor, log: bool,
            offsets: torch.Tensor | None = None, which: torch.Tensor | None = None,
            index: torch.Tensor | None = None, n: int = 0) -> torch.Tensor | None:
    """The masked softmax (``log``: log_softmax) of every element in one call, 0 where
    unspecified: over one group of every element; with ``offsets`` per line (as
    :func:`lines`; the lines must hold every element); with ``index`` per group of ``n``
    (as :func:`scatter`). Step for step the composed path (the softmax family's), the exp
    of Note [Native exp]. None where the native kernels do not apply.

    >>> v, m = torch.tensor([1., float("nan"), 3.]), torch.tensor([True, False, True])
    >>> out = softmax(v, m, False)  # over 1 and 3; 0 at the unspecified NaN
    >>> out is None or torch.allclose(out, torch.tensor([0.1192, 0., 0.8808]), atol=1e-4)
    True
    """
    kind, kernel = _kind_and_kernel(_SOFTMAX, values, mask, offsets, index, column=True)
    if kernel is None:
        return None
    out = torch.empty_like(values)
    what = "log_softmax" if log else "softmax"
    if kind == "scatter":
        if not _index_ok(index, values.shape[0], group=True):
            return None
        tops, sums = torch.empty(n, dtype=values.dtype), torch.empty(n, dtype=torch.float64)
        _check(kernel[index.dtype](values.data_ptr(), mask.data_ptr(), values.shape[0],
                                   index.data_ptr(), int(log), tops.data_ptr(),
                                   sums.data_ptr(), out.data_ptr(), n), what,
               index=index, groups=n)
        return out
    lines = () if offsets is None else _line_args(offsets, which)
    if lines is None:
        return None
    if kernel(values.data_ptr(), mask.data_ptr(), values.shape[0], *lines, int(log),
              out.data_ptr()):
        _check(-1, what, offsets=offsets, which=which, size=values.shape[0])
    return out


def cumsum_lines(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor | None:
    """Per line (``offsets`` from 0 to the number of values: every element in one line, in
    order) the running sum of ``values``, restarting at each line, accumulated in double and
    rounded to the values' type at every element: ``torch.cumsum`` of each line, bit for
    bit (its CPU kernel accumulates float32 in double too). None where the native kernels do
    not apply (other dtypes or shapes, autograd, torch.func, compiling, other devices).

    >>> out = cumsum_lines(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 2, 4]))
    >>> out is None or out.tolist() == [1.0, 3.0, 3.0, 7.0]
    True
    """
    kernel = _CUMSUM.get(values.dtype) if (
        values.dim() == 1 and values.is_contiguous() and _eager_cpu(values)
        and _library() is not None) else None
    args = None if kernel is None else _line_args(offsets, None)
    if args is None:
        return None
    out = torch.empty_like(values)
    _check(kernel(values.data_ptr(), values.shape[0], *args[:2], out.data_ptr()), "cumsum",
           offsets=offsets, size=values.shape[0])
    return out


def deviations_scatter(f: str, values: torch.Tensor, mask: torch.Tensor,
                       center: torch.Tensor, index: torch.Tensor,
                       n: int) -> torch.Tensor | None:
    """Into ``n`` groups (as :func:`scatter`; ``center[g]`` is group ``g``'s), the sum of
    ``f(values - center[index])`` over the specified elements (as :func:`deviations_all`),
    accumulated in double; None where the native kernels do not apply."""
    kernels = _dev_kernel(f, "scatter", values, mask, center, n)
    if kernels is None or not _index_ok(index, values.shape[0], group=True):
        return None
    out = torch.empty(n, dtype=torch.float64)
    _check(kernels[index.dtype](values.data_ptr(), mask.data_ptr(), values.shape[0],
                                index.data_ptr(), center.data_ptr(), out.data_ptr(), n),
           _DEVIATIONS[f], index=index, groups=n)
    return out.to(values.dtype)


#: the backward kernels' ops (``enum`` in _native.c) -> (their code, the arguments each
#: reads besides ``a``), and the op an error names
_BACKWARD_OPS = {"expand": (0, ""), "dev": (1, "xb"), "exp": (2, "xb"), "softmax": (3, "xy"),
                 "log_softmax": (4, "xy"), "ties": (5, "xb")}


def backward(op: str, mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None = None,
             x: torch.Tensor | None = None, y: torch.Tensor | None = None,
             c: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
             which: torch.Tensor | None = None, index: torch.Tensor | None = None,
             n: int = 0, what: str = "") -> torch.Tensor | None:
    """The gradient of a grouped reduction with respect to its stored values, in one pass:
    ``out[j] = mask[j] ? f(x[j], y[j], a[g], b[g]) : +0.0`` for the group ``g`` of element
    ``j`` -- per line (``offsets``, ``which``: as :func:`softmax`; the lines hold every
    element) or per group of ``index`` into ``n`` (as :func:`scatter`). ``a``, ``b``, ``c``
    hold one value per group (per listed line), ``x`` and ``y`` one per element (``mask``'s
    shape, 1-D); ``op`` is one of

    - ``"expand"``: ``a`` (sum: the gradient; mean: the gradient / the count);
    - ``"dev"``: ``(x - b) * a``, plus ``c`` where given (var);
    - ``"exp"``: ``a * exp(x - b)`` (logsumexp);
    - ``"softmax"``: ``x * (y - a)``; ``"log_softmax"``: ``y - exp(x) * a``;
    - ``"ties"``: ``a / t`` where ``x == b``, ``t`` the group's count of specified such
      elements, else 0 (amax / amin: split among the ties).

    Step for step the torch-op backwards of the kernel families (``layouts/kernels/``; the
    exps within an ULP of torch's). None where the kernels do not apply (other dtypes,
    devices, shapes, no library); ``what`` is the op an error names.

    >>> m = torch.tensor([True, False, True])
    >>> out = backward("expand", m, torch.tensor([2., 5.]), index=torch.tensor([0, 1, 1]), n=2)
    >>> out is None or out.tolist() == [2.0, 0.0, 5.0]
    True
    """
    code, reads = _BACKWARD_OPS[op]
    dtype, nnz = a.dtype, mask.shape[0] if mask.dim() == 1 else -1
    kind = "lines" if offsets is not None else "scatter"
    kernel = _BACKWARD.get((kind, dtype)) if (
        nnz >= 0 and _mask_ok(mask, nnz) and _library() is not None) else None
    if kernel is None:
        return None
    if kind == "lines":
        lines = _line_args(offsets, which)
        if lines is None:
            return None
        groups = lines[-1]
    else:
        if index is None or not _index_ok(index, nnz, group=True):
            return None
        kernel, groups = kernel[index.dtype], n
    operands = (x, y, a, b, c)
    for name in reads:
        if operands["xyabc".index(name)] is None:
            return None
    vectors: list[torch.Tensor | None] = []  # (they keep the pointers' memory alive)
    for t, numel in zip(operands, (nnz, nnz, groups, groups, groups)):
        if t is not None:
            t = _vector(t, dtype, numel)
            if t is None:
                return None
        vectors.append(t)
    pointers = [None if t is None else t.data_ptr() for t in vectors]
    x_, y_, a_, b_, c_ = pointers
    out = torch.empty(nnz, dtype=dtype)
    if kind == "lines":
        status = kernel(x_, y_, mask.data_ptr(), nnz, *lines, code, a_, b_, c_,
                        out.data_ptr())
    else:
        shares = torch.empty(n if op == "ties" else 0, dtype=torch.float64)
        status = kernel(x_, y_, mask.data_ptr(), nnz, index.data_ptr(), code, a_, b_, c_,
                        shares.data_ptr(), out.data_ptr(), n)
    if status != 0:
        _check(status, f"{what or op} backward", index=index if kind == "scatter" else None,
               groups=n, offsets=offsets, which=which, size=nnz)
    return out


def softmax_backward(out: torch.Tensor, grad: torch.Tensor, mask: torch.Tensor,
                     offsets: torch.Tensor, which: torch.Tensor | None = None
                     ) -> torch.Tensor | None:
    """The softmax's gradient with respect to its input along lines (as :func:`softmax`'s)
    in one call: per line, ``total`` = the masked sum of ``grad * out``, then ``out * (grad
    - total)`` where ``mask``, +0.0 elsewhere. The same steps, and bits, as the composed
    route (a multiply, :func:`lines`' sum and :func:`backward`'s ``"softmax"``), without
    its two intermediate vectors and three calls. None where the kernels do not apply.

    >>> m = torch.tensor([True, True, False])
    >>> got = softmax_backward(torch.tensor([0.5, 0.5, 0.]), torch.tensor([1., 0., 9.]), m,
    ...                        torch.tensor([0, 3]))
    >>> got is None or got.tolist() == [0.25, -0.25, 0.0]
    True
    """
    dtype, nnz = out.dtype, mask.shape[0] if mask.dim() == 1 or _column(mask) else -1
    kernel = _BACKWARD.get(("softmax lines", dtype)) if (
        nnz >= 0 and _mask_ok(mask, mask.shape)  # (a vector or a column: nnz above)
        and _library() is not None) else None
    lines = None if kernel is None else _line_args(offsets, which)
    if lines is None:
        return None
    x, y = _vector(out, dtype, nnz), _vector(grad, dtype, nnz)
    if x is None or y is None:
        return None
    result = torch.empty_like(mask, dtype=dtype)  # (shaped like the mask: a column too)
    if kernel(x.data_ptr(), y.data_ptr(), mask.data_ptr(), nnz, *lines, result.data_ptr()):
        _check(-1, "softmax backward", offsets=offsets, which=which, size=nnz)
    return result


def _vector(t: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor | None:
    """``t`` as the contiguous memory a kernel reads as a vector (itself where it is
    contiguous, whatever its shape: its elements in order; else a copy), or None where
    :func:`_operand_ok` refuses it."""
    if not _operand_ok(t, dtype, numel):
        return None
    return contiguous(t)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where it is contiguous (no torch call: ``Tensor.contiguous`` is a
    dispatcher call even then), else its contiguous copy: the memory a kernel reads in
    order, whatever the shape."""
    return t if t.is_contiguous() else t.contiguous()


def _operand_ok(t: torch.Tensor, dtype: torch.dtype, numel: int) -> bool:
    """True for a plain CPU tensor of ``dtype`` with ``numel`` elements (any shape and
    strides: the caller reshapes it into a contiguous vector)."""
    return (type(t) is torch.Tensor and t.dtype is dtype and t.is_cpu
            and t.numel() == numel and not t.is_complex())
