"""The native full-reduction kernels alone (``layouts/_native.c``, Note [Native reductions]):
one masked pass over a 1-D values tensor and its bool mask, called through ctypes with
every argument ready, against the raw torch op on the values with no mask. Run by hand:
``python -m benchmarks.bench_native`` (or through the suite, ``python -m benchmarks``).

Cases (ratio = kernel median / baseline median; 90% of the elements specified, values
near 1 so that a product stays finite):

- 1M float32 and 1M float64: ``sum``, ``sumsq``, ``prod``, ``amax``, ``amin`` of
  ``where(mask, values, identity)`` against ``floor``, the unmasked torch op
  (``values.sum()``, ``(values * values).sum()``, ``values.prod()``, ``values.amax()``,
  ``values.amin()``); targets 2x for ``sum``, 1.5x for the others (the kernels alone: the
  Python route of a masked reduction adds its fixed cost on top);
- the mask count (``count``) against ``mask.sum()``;
- 2M float64 (scipy's case): ``sum`` against scipy's ``data.sum()`` of the 1.8M specified
  entries (what ``csr_matrix.sum()`` reduces).

Timing: paired rounds of ``benchmarks.harness``, one thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import layouts._native as native
from layouts._fill import start

TITLE = "Native full reductions (kernel only)"
Case = tuple[str, Callable[[], Any], dict[str, Any], dict[str, float]]
_RAW = {"sum": lambda v: v.sum(), "sumsq": lambda v: (v * v).sum(),
        "prod": lambda v: v.prod(), "amax": lambda v: v.amax(), "amin": lambda v: v.amin()}


def _operands(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    values = (1 + torch.randn(n, generator=g, dtype=torch.float64) * 1e-3).to(dtype)
    return values, torch.rand(n, generator=g) < 0.9


def _kernel_call(values: torch.Tensor, mask: torch.Tensor, op: str) -> Callable[[], int]:
    """The ctypes call of the ``all`` kernel with its arguments computed once (the
    closure keeps the tensors behind the pointers alive)."""
    kernel = native._KERNELS["all", op, values.dtype]
    out = torch.empty(1, dtype=values.dtype)
    args = (values.data_ptr(), mask.data_ptr(), values.shape[0], start(op, values.dtype),
            out.data_ptr())
    return lambda keep=(values, mask, out): kernel(*args)


def _count_call(mask: torch.Tensor) -> Callable[[], int]:
    count, out = native._library().ms_all_count, torch.empty(1, dtype=torch.long)
    args = (mask.data_ptr(), mask.shape[0], out.data_ptr())
    return lambda keep=(mask, out): count(*args)


def cases(quick: bool = False) -> list[Case]:
    if not native.available():
        return [("native kernels", lambda: None, {"floor": f"unavailable: {native.status()}"})]
    out: list[Case] = []
    for dtype in (torch.float32, torch.float64):
        values, mask = _operands(10**6, dtype)
        name = str(dtype).removeprefix("torch.")
        for op, raw in _RAW.items():
            out.append((f"all {op} 1M {name}", _kernel_call(values, mask, op),
                        {"floor": lambda raw=raw, v=values: raw(v)},
                        {"floor": 2.0 if op == "sum" else 1.5}))
    # ``mask``: the 1M mask of the last dtype (the same draw for both)
    out.append(("all count 1M", _count_call(mask), {"floor": mask.sum}, {}))
    values, mask = _operands(2 * 10**6, torch.float64)
    baselines: dict[str, Any] = {"floor": values.sum}
    try:
        data = values[mask].numpy()
        baselines["scipy"] = data.sum  # csr_matrix.sum() is data.sum() of its entries
    except Exception as exc:  # noqa: BLE001
        baselines["scipy"] = f"numpy: {exc}"
    out.append(("all sum 2M float64", _kernel_call(values, mask, "sum"), baselines, {}))
    return out


if __name__ == "__main__":
    import sys

    from benchmarks.harness import module_main

    module_main(sys.modules[__name__])
