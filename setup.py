"""Build the native kernels (``layouts/_native.c``) when the package is installed.

Everything else about the package is in ``pyproject.toml``; this file only adds the C
kernels, as optional extensions: where no C compiler works, ``pip install`` still succeeds
and the library runs its torch-op implementation (it says so with a
``layouts.NativeKernelsWarning``, Note [Native reductions] in ``layouts/_native.py``).

The one C file is compiled once per instruction set into plain shared libraries that
``layouts/_native.py`` loads with ``ctypes`` (no Python C API, no torch headers):
``layouts/_native_kernels.portable.so`` (baseline: SSE2 on x86-64, the only build on
aarch64 and others), and on x86-64 ``_native_kernels.avx2.so`` and
``_native_kernels.avx512.so`` (a dot in the name: no importer takes them for modules). The
loader asks the baseline build which one the CPU runs, so one build (and a wheel) serves
every x86-64 CPU: never ``-march=native``. Next to them the build writes
``_native_kernels.json``, the manifest the loader checks every file against (size and
SHA-256, the kernels' ABI version, the hash of the C source) before it loads one.

In a source checkout, ``pip install -e .`` builds them in place (so does
``python setup.py build_ext --inplace``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = "layouts/_native.c"
MANIFEST = "_native_kernels.json"
# -g0: no debug info (size). -falign-*: every function and loop starts a cache line, so
# that an edit elsewhere in the file does not move a hot loop across one (an unrelated
# change slowed a scatter backward kernel by its placement alone, visibly in
# benchmarks.bench_training_reductions across lines).
# -fno-trapping-math: the kernels never read the floating-point exception flags, and
# without it GCC keeps a loop with a clamp such as `x < lo ? lo : x` (Note [Native exp])
# scalar -- if-converting the comparison would raise its flag unconditionally -- so the
# builds without explicit AVX-512 passes ran exp one double at a time. It changes no value.
FLAGS = ["-O3", "-g0", "-std=gnu11", "-fopenmp-simd", "-fno-trapping-math",
         "-falign-functions=64", "-falign-loops=64"]
AVX2 = ["-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mpopcnt"]  # = ms_cpu_isa()'s checks
# instruction set -> its flags; the loader picks by ms_built_isa() / ms_cpu_isa()
VARIANTS = {"portable": []}
if platform.machine().lower() in ("x86_64", "amd64"):
    VARIANTS["avx2"] = AVX2
    VARIANTS["avx512"] = AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                 "-mavx512cd"]


def _name(isa: str) -> str:
    return f"layouts._native_kernels_{isa}"


class BuildKernels(build_ext):
    """``build_ext`` for the kernels: library names that are no module names
    (``_native_kernels.avx2.so``: a ctypes library, no ABI tag, and nothing an importer or
    ``pkgutil`` would take for a module), one object directory per variant (they compile
    the same source), and the manifest next to the libraries it lists."""

    def get_ext_filename(self, fullname: str) -> str:
        *package, name = fullname.split(".")  # (called with the bare name too)
        if name.startswith("_native_kernels_"):
            return os.path.join(*package, f"_native_kernels.{name[16:]}.so")
        return super().get_ext_filename(fullname)

    def run(self) -> None:
        self.parallel = None  # build_extension swaps build_temp: one variant at a time
        self._built: dict[str, str] = {}  # isa -> the library's path under build_lib
        super().run()  # builds into build_lib, then copies in place for --inplace / -e
        if not self._built:
            print(f"warning: the native kernels were not built ({SOURCE}: no C compiler, or "
                  "it failed); masked_sparse will run its torch-op implementation",
                  file=sys.stderr)
        self._write_manifest(Path(self.build_lib) / "layouts")
        if self.inplace:
            self._write_manifest(self._package_dir())

    def copy_extensions_to_source(self) -> None:
        """Unlink each in-place library before the copy: a process that has the old one
        loaded keeps its file (a copy over it would truncate it under the process's mapping,
        which dies of SIGBUS at its next touch of a page)."""
        for ext in self.extensions:
            target = self._package_dir() / os.path.basename(self.get_ext_filename(ext.name))
            if target.exists():
                target.unlink()
        super().copy_extensions_to_source()

    def build_extension(self, ext: Extension) -> None:
        temp = self.build_temp
        self.build_temp = os.path.join(temp, ext.name)
        try:
            super().build_extension(ext)  # raises where it fails; optional: reported, skipped
        finally:
            self.build_temp = temp
        self._built[ext.isa] = self.get_ext_fullpath(ext.name)

    def _package_dir(self) -> Path:
        return Path(self.get_finalized_command("build_py").get_package_dir("layouts"))

    def _write_manifest(self, directory: Path) -> None:
        """List the libraries built now (none: no manifest, and a stale one is removed)."""
        target = directory / MANIFEST
        if target.exists():
            target.unlink()
        kernels = {}
        for isa, built in self._built.items():
            data = (directory / os.path.basename(built)).read_bytes()
            kernels[isa] = {"file": os.path.basename(built), "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()}
        if not kernels:
            return
        source = Path(SOURCE).read_bytes()
        abi = int(re.search(rb"#define MS_ABI (\d+)", source).group(1))
        manifest = {"abi": abi, "source_sha256": hashlib.sha256(source).hexdigest(),
                    "kernels": kernels}
        directory.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(manifest, indent=1) + "\n")

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if not self.inplace:
            outputs.append(os.path.join(self.build_lib, "layouts", MANIFEST))
        return outputs

    def get_output_mapping(self) -> dict[str, str]:
        mapping = super().get_output_mapping()
        if self.inplace:
            regular = os.path.join(self.build_lib, "layouts", MANIFEST)
            mapping[regular] = str(self._package_dir() / MANIFEST)
        return mapping


def _extension(isa: str, flags: list[str]) -> Extension:
    ext = Extension(_name(isa), [SOURCE], extra_compile_args=FLAGS + flags,
                    libraries=["m"], optional=True,
                    # the kernels call each other (logsumexp: max, then sumexp): bound in
                    # their own library, whichever other build the process has loaded
                    extra_link_args=["-Wl,-Bsymbolic"] if sys.platform == "linux" else [])
    ext.isa = isa
    return ext


setup(ext_modules=[_extension(isa, flags) for isa, flags in VARIANTS.items()],
      cmdclass={"build_ext": BuildKernels})
