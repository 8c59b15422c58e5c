"""Refusing conversions that cannot fit, before they allocate.

A sparse masked tensor can describe a shape far larger than any machine (a COO matrix with
2**40 rows and three entries is 50 bytes); converting it to a layout whose size grows with
the shape -- strided (``to_dense``, ``to_tensor(v != 0)``, ``to_numpy``,
``from_scipy(m, layout="strided")``) or compressed (CSR's row pointers) -- would ask the
allocator for terabytes, and either fail after a long time or make the machine swap.

Note [Memory rule]
~~~~~~~~~~~~~~~~~~
The size of the result is computed from the shape, the number of stored elements and the
dtype (values + bool mask + index tensors, ``layouts.storage_nbytes``) *before* allocating.
A conversion raises ``MemoryError`` naming itself, the bytes and the way out when that size
exceeds the memory available to new allocations: ``MemAvailable`` of ``/proc/meminfo``
(or ``psutil``) for the CPU, ``torch.cuda.mem_get_info`` for a GPU. Sizes under 64 MiB are
never checked (no system call on the hot path); where the available memory cannot be read,
nothing is refused.
"""

from __future__ import annotations

from typing import Any

import torch

import layouts

_CHECK_ABOVE = 64 << 20


def available_bytes(device: torch.device) -> int | None:
    """Memory available for new allocations on ``device``, or None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(what: str, layout: str, shape: Any, nnz: int, dtype: torch.dtype,
               device: torch.device, alternative: str,
               options: dict[str, Any] | None = None) -> None:
    """Raise ``MemoryError`` if ``what`` would build more than the memory available."""
    shape = tuple(int(n) for n in shape)
    need = layouts.storage_nbytes(layout, shape, nnz, dtype, options)
    if need is None or need < _CHECK_ABOVE:
        return
    have = available_bytes(device)
    if have is not None and need > have:
        raise MemoryError(f"{what}: the {layout} result of shape {shape} needs "
                          f"{_human(need)} ({need} bytes) but {_human(have)} is available on "
                          f"{device}; {alternative}")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{size:.1f} {unit}" if unit != "bytes" else f"{n} bytes"
        size /= 1000
    raise AssertionError("unreachable")
