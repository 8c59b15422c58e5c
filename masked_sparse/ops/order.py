"""Ordering along one dim on every layout: ``sort``, ``argsort``, ``msort``, ``topk``,
``kthvalue``.

Semantics (docs/design.md, docs/scans-sorting.md), written once here for every layout:

- only specified elements are ordered (stable: ties keep their input order; NaN as torch
  places it -- last ascending, first descending); unspecified elements come after them in
  either direction and are unspecified in the output;
- ``topk(k)`` is the first ``k`` slots of the sort (``largest=False``: ascending): a group
  with fewer than ``k`` specified elements has unspecified trailing slots; ``kthvalue(k)``
  is unspecified where fewer than ``k`` elements are specified;
- indices are MaskedTensors with the values' mask (and index tensors): positions along
  ``dim`` in the input.

Note [Sorted layout]
~~~~~~~~~~~~~~~~~~~~
A sort moves elements, so a sparse result cannot keep the input's pattern. It keeps each
line's *number* of stored elements and puts them at the front of the line: the sorted
specified elements at coordinates ``0 .. n_specified - 1`` along ``dim``, then the line's
stored-but-unspecified elements. The result has the input's layout when it can hold it
(COO, CSR, CSC; BSR when the blocksize still divides the shape, else COO), the same nnz,
and is built in O(nnz log nnz) without densifying; ``topk`` keeps the first ``k`` of each
line. ``kthvalue`` is a reduction and follows the reductions' layouts.

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.tensor([3., 1., 2., 0.]),
...                       torch.tensor([True, False, True, True]))
>>> torch.sort(mt).values
MaskedTensor(
  [  0.0000,   2.0000,   3.0000,       --]
)
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Grouping, Storage, zero_unspecified

from .._autograd import on_values
from .._registry import implements, is_aten, op_name
from .._tensor import MaskedTensor, _wrap
from . import reductions_args as A
from .reductions import run
from .reductions_args import bind


def k_sort(storages: list[Storage], dim: int, descending: bool, k: int | None) -> Any:
    """Values and indices of the (first ``k`` of the) masked sort along ``dim``."""
    s = storages[0]
    if s.values.dim() == 0:
        return s, s.with_values(torch.zeros((), dtype=torch.long, device=s.values.device))
    out, positions = layouts.lines_along(s, dim).sort(s.values, s.mask, descending, k)
    return (out.with_values(zero_unspecified(out.values, out.mask)),
            out.with_values(zero_unspecified(positions, out.mask)))


def k_kthvalue(g: Grouping, k: int) -> Any:
    v, m = g.source.values, g.source.mask
    count = g.reduce(m, "sum")
    value, position = g.select(v, m, torch.full_like(count, k - 1))
    specified = count >= k
    return (g.build(zero_unspecified(value, specified), specified),
            g.build(zero_unspecified(position, specified), specified))


def _check(mt: MaskedTensor, op: str) -> None:
    if mt.dtype.is_complex:
        raise TypeError(f"{op}(): complex MaskedTensors have no order; sort .abs() or .real")


def _check_k(k: Any, size: int, op: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"{op}(): k must be an int, got {k!r}")
    low = 0 if op == "topk" else 1
    if not low <= k <= size:
        raise ValueError(f"{op}(): k={k} is out of range for a dim of size {size} (expected "
                         f"{low} <= k <= {size})")
    return k


def _sorted(mt: MaskedTensor, dim: int, descending: bool, k: int | None,
            autograd: bool) -> tuple[MaskedTensor, MaskedTensor]:
    if autograd:
        return on_values(k_sort, [mt], dim, descending, k)
    with torch.no_grad():
        values, indices = k_sort([mt._storage], dim, descending, k)
    return _wrap(values), _wrap(indices)


def _dim(mt: MaskedTensor, dim: Any, op: str) -> int:
    dims = A.one_dim(dim, mt.dim(), op)
    return dims[0] if dims else 0


def sig_sort(input, dim=-1, descending=False, stable=False, *, out=None): ...


def sig_topk(input, k, dim=-1, largest=True, sorted=True, *, out=None): ...


def sig_kthvalue(input, k, dim=-1, keepdim=False, *, out=None): ...


def sig_msort(input, *, out=None): ...


aten = torch.ops.aten


@implements(torch.sort, torch.Tensor.sort, aten.sort.default, aten.sort.stable,
            torch.argsort, torch.Tensor.argsort, aten.argsort.default, aten.argsort.stable)
def _sort(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``sort`` (values and indices) and ``argsort`` (the indices): one ordering."""
    name, autograd = op_name(op), not is_aten(op)
    a = bind(sig_sort, args, kwargs, name)
    mt = a["input"]
    _check(mt, name)
    values, indices = _sorted(mt, _dim(mt, a["dim"], name),
                              A.check_bool(a["descending"], "descending", name), None, autograd)
    if name == "argsort":
        return indices
    return torch.return_types.sort((values, indices)) if autograd else (values, indices)


@implements(torch.msort, torch.Tensor.msort, aten.msort.default)
def _msort(op: Any, *args: Any, **kwargs: Any) -> Any:
    autograd = not is_aten(op)
    a = bind(sig_msort, args, kwargs, "msort")
    mt = a["input"]
    _check(mt, "msort")
    return _sorted(mt, _dim(mt, 0, "msort"), False, None, autograd)[0]


@implements(torch.topk, torch.Tensor.topk, aten.topk.default)
def _topk(op: Any, *args: Any, **kwargs: Any) -> Any:
    autograd = not is_aten(op)
    a = bind(sig_topk, args, kwargs, "topk")
    mt = a["input"]
    _check(mt, "topk")
    dim = _dim(mt, a["dim"], "topk")
    k = _check_k(a["k"], mt.shape[dim] if mt.dim() else 1, "topk")
    values, indices = _sorted(mt, dim, A.check_bool(a["largest"], "largest", "topk"), k,
                              autograd)
    return torch.return_types.topk((values, indices)) if autograd else (values, indices)


@implements(torch.kthvalue, torch.Tensor.kthvalue, aten.kthvalue.default)
def _kthvalue(op: Any, *args: Any, **kwargs: Any) -> Any:
    autograd = not is_aten(op)
    a = bind(sig_kthvalue, args, kwargs, "kthvalue")
    mt = a["input"]
    _check(mt, "kthvalue")
    dims = A.one_dim(a["dim"], mt.dim(), "kthvalue")
    k = _check_k(a["k"], mt.shape[dims[0]] if dims else 1, "kthvalue")
    out = run(op, "kthvalue", k_kthvalue, mt, dims,
              A.check_bool(a["keepdim"], "keepdim", "kthvalue"), k)
    return torch.return_types.kthvalue(out) if autograd else out

