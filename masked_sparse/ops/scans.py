"""Scans along one dim on every layout: ``cumsum``, ``cumprod``, ``cummax``, ``cummin``,
``logcumsumexp``.

Semantics (docs/design.md, docs/scans-sorting.md), written once here for every layout:

- the value at a specified position is the scan over the *specified* elements of its line
  up to it: unspecified ones are replaced by the op's identity (0, 1, -inf / the dtype's
  minimum, +inf / its maximum, -inf) before the scan, so they never contribute;
- the output mask is the input mask, and a sparse result keeps the input's index tensors
  (the same objects): a scan moves no element;
- ``cummax`` / ``cummin`` indices are MaskedTensors with the same mask; they are positions
  along ``dim`` in the input, and a specified index always names a specified element (an
  identity never beats a specified value; ties go to the later element, as in torch);
- NaN propagates as in torch; unspecified output values hold 0.

The layouts only compute: :func:`layouts.lines_along` arranges the stored elements line by
line (the torch op along the dim for strided storages, padded segmented scans over the
stored values for sparse ones, Note [Padded lines] in ``layouts/_lines.py``). The kernel
runs through :func:`masked_sparse._autograd.on_values`, so gradients of ``cumsum``,
``cumprod`` and ``logcumsumexp`` carry the input's mask, and an unspecified element gets
none (Note [Fill before transform] in ``reductions.py``).

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.tensor([1., 2., 3., 4.]),
...                       torch.tensor([True, False, True, True]))
>>> torch.cumsum(mt, 0)
MaskedTensor(
  [  1.0000,       --,   4.0000,   8.0000]
)
"""

from __future__ import annotations

import math
from typing import Any

import torch

import layouts
from layouts import Storage, fill_unspecified, identity, zero_unspecified

from .._autograd import on_values
from .._registry import implements, is_aten, op_name
from .._tensor import _wrap
from . import reductions_args as A
from .reductions_args import bind


def _identity(op: str, dtype: torch.dtype) -> Any:
    if op == "cumsum":
        return 0
    if op == "cumprod":
        return 1
    if op == "logcumsumexp":
        return -math.inf
    return identity("amax" if op == "cummax" else "amin", dtype)


def k_scan(storages: list[Storage], op: str, dim: int, dtype: torch.dtype | None) -> Any:
    """``op`` along ``dim`` over the specified elements; the indices of cummax/cummin."""
    s = storages[0]
    v = s.values if dtype is None or s.values.dtype == dtype else s.values.to(dtype)
    if len(s.shape) == 0:  # a 0-d tensor (sparse: 0 or 1 stored) is one line of one element
        out, idx = v, (torch.zeros(v.shape, dtype=torch.long, device=v.device)
                       if op in ("cummax", "cummin") else None)
    else:
        filled = fill_unspecified(v, s.mask, _identity(op, v.dtype))
        out, idx = layouts.lines_along(s, dim).scan(filled, op)
    result = s.with_values(zero_unspecified(out, s.mask))
    if idx is None:
        return result
    return result, s.with_values(zero_unspecified(idx, s.mask))


def sig_scan(input, dim, *, dtype=None, out=None): ...


def sig_scan_nodtype(input, dim, *, out=None): ...


_aten = torch.ops.aten


@implements(torch.cumsum, torch.Tensor.cumsum, _aten.cumsum.default,
            torch.cumprod, torch.Tensor.cumprod, _aten.cumprod.default,
            torch.cummax, torch.Tensor.cummax, _aten.cummax.default,
            torch.cummin, torch.Tensor.cummin, _aten.cummin.default,
            torch.logcumsumexp, torch.Tensor.logcumsumexp, _aten.logcumsumexp.default)
def _scan(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    with_indices = name in ("cummax", "cummin")
    a = bind(sig_scan if name in ("cumsum", "cumprod") else sig_scan_nodtype, args, kwargs,
             name)
    mt = a["input"]
    if mt.dtype.is_complex and name != "cumsum":
        raise TypeError(f"{name}(): complex MaskedTensors have no order here; scan .real or "
                        f".abs() instead")
    dims = A.one_dim(a["dim"], mt.dim(), name)
    dtype = A.check_dtype(a.get("dtype"), name)
    out_dtype = None
    if not with_indices:  # torch's dtype rules and errors (int cumsum -> int64, ...)
        out_dtype = A.result_dtype(getattr(torch, name), mt.dtype, 0,
                                   **({"dtype": dtype} if dtype else {}))
    dim = dims[0] if dims else 0
    if not is_aten(op):
        out = on_values(k_scan, [mt], name, dim, out_dtype)
        return getattr(torch.return_types, name)(out) if with_indices else out
    with torch.no_grad():  # an aten call, below autograd: forward only
        res = k_scan([mt._storage], name, dim, out_dtype)
    return tuple(_wrap(r) for r in res) if with_indices else _wrap(res)
