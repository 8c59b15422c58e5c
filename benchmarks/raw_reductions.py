"""The raw floor of a sparse reduction: the best plain-torch computation on the stored values.

A masked reduction along a dim of a 2-D sparse tensor groups its stored values by the other
coordinate (``sum(dim=1)`` groups by row). The raw floor does the same computation on the
plain values tensor, every stored value taking part and no mask anywhere: what the masked
result costs over it is the price of masked semantics (and of the library's overhead).

=============  ==========================================================================
reduction      raw computation (``g``: group of each value; rows of either layout use the
               row pointers, computed once outside the timed call)
=============  ==========================================================================
sum            ``torch.sum(csr, 1)`` on the plain CSR tensor (CSR rows);
               ``segment_reduce(v, "sum", offsets=crow)`` (COO rows);
               ``zeros(n).index_add_(0, g, v)`` otherwise
mean           group sum ÷ group size (``crow.diff()`` or ``bincount(g)``)
amax / amin    ``segment_reduce(v, "max", offsets=crow)`` (rows);
               ``scatter_reduce_(0, g, v, "amax")`` otherwise
argmax         group ``amax``, then the smallest coordinate where ``v == max[g]``
prod           ``segment_reduce(v, "prod")`` / ``scatter_reduce_(..., "prod")``
logsumexp      ``log(sum(exp(v - max[g]))) + max``
var            two passes: ``sum((v - mean[g])**2) / (size - 1)``
norm           ``sqrt(sum(v * v))``
softmax        ``e = exp(v - max[g]); e / sum(e)[g]``
full           ``values.sum()``, ``values.amax()``, ``torch.logsumexp(values, 0)``, ...
=============  ==========================================================================

>>> import torch
>>> g = Groups(torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1]), 2)
>>> raw_reduction("sum", torch.tensor([1., 2., 3.]), g)
tensor([3., 3.])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

REDUCTIONS = ("sum", "mean", "amax", "amin", "argmax", "prod", "logsumexp", "var", "norm",
              "softmax")
INF = float("inf")


class Groups(NamedTuple):
    """How the stored values of a 2-D sparse tensor fall into the groups of a reduction."""

    index: torch.Tensor  # the group of each stored value, int64
    coord: torch.Tensor  # each value's coordinate along the reduced dim (for argmax)
    count: int  # the number of groups
    offsets: torch.Tensor | None = None  # row pointers when the groups are CSR rows
    columns: torch.Tensor | None = None  # the CSR column indices (for torch.sum(csr, 1))
    width: int = 0  # the number of columns, with ``columns``


def groups_of(layout: str, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int],
              dim: int) -> Groups:
    """The groups of ``reduce(dim)`` over a ``layout`` (``"coo"``/``"csr"``) tensor.

    ``rows`` / ``cols`` are the coordinates of the stored values in storage order (row-major).
    """
    if dim == 1:  # row-major storage: rows are runs, reduced over row pointers in both
        # layouts (a COO's pointers are computed once, outside the timed call, as
        # masked_sparse caches them per index tensor)
        offsets = torch._convert_indices_from_coo_to_csr(rows, shape[0])
        return Groups(rows, cols, shape[0], offsets, cols if layout == "csr" else None,
                      shape[1])
    return Groups(cols, rows, shape[1])


def _group_sum(x: torch.Tensor, g: Groups) -> torch.Tensor:
    if g.offsets is not None:
        return torch.segment_reduce(x, "sum", offsets=g.offsets)
    return x.new_zeros(g.count).index_add_(0, g.index, x)


def _group_size(g: Groups) -> torch.Tensor:
    if g.offsets is not None:
        return g.offsets.diff()
    return torch.bincount(g.index, minlength=g.count)


def _group_extreme(x: torch.Tensor, g: Groups, largest: bool = True) -> torch.Tensor:
    if g.offsets is not None:
        return torch.segment_reduce(x, "max" if largest else "min", offsets=g.offsets)
    fill = -INF if largest else INF
    return x.new_full((g.count,), fill).scatter_reduce_(0, g.index, x,
                                                        "amax" if largest else "amin")


def _plain_csr_sum(x: torch.Tensor, g: Groups) -> torch.Tensor:
    assert g.offsets is not None and g.columns is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        csr = torch.sparse_csr_tensor(g.offsets, g.columns, x, (g.count, g.width),
                                      check_invariants=False)
    return csr.sum(1, keepdim=True)


def raw_reduction(name: str, v: torch.Tensor, g: Groups) -> torch.Tensor:
    """The raw floor of reduction ``name`` of the values ``v`` over the groups ``g``."""
    if name == "sum":
        return _plain_csr_sum(v, g) if g.columns is not None else _group_sum(v, g)
    if name == "mean":
        return _group_sum(v, g) / _group_size(g)
    if name in ("amax", "amin"):
        return _group_extreme(v, g, name == "amax")
    if name == "argmax":
        hit = v == _group_extreme(v, g)[g.index]
        key = torch.where(hit, g.coord, g.coord.new_tensor(torch.iinfo(g.coord.dtype).max))
        return key.new_full((g.count,), torch.iinfo(key.dtype).max).scatter_reduce_(
            0, g.index, key, "amin")
    if name == "prod":
        if g.offsets is not None:
            return torch.segment_reduce(v, "prod", offsets=g.offsets)
        return v.new_ones(g.count).scatter_reduce_(0, g.index, v, "prod")
    if name == "logsumexp":
        m = _group_extreme(v, g)
        return _group_sum((v - m[g.index]).exp_(), g).log_() + m
    if name == "var":
        size = _group_size(g)
        d = v - (_group_sum(v, g) / size)[g.index]
        return _group_sum(d.mul_(d), g) / (size - 1)
    if name == "norm":
        return _group_sum(v * v, g).sqrt_()
    if name == "softmax":
        e = (v - _group_extreme(v, g)[g.index]).exp_()
        return e.div_(_group_sum(e, g)[g.index])
    raise ValueError(f"raw_reduction: unknown reduction {name!r}; expected one of {REDUCTIONS}")


FULL: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin,
    "argmax": torch.argmax, "prod": torch.prod,
    "logsumexp": lambda v: torch.logsumexp(v, 0), "var": torch.var,
    "norm": torch.linalg.vector_norm,
}


def masked_reduction(name: str, dim: int | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``mt -> reduction(mt, dim)`` as a user writes it (``dim=None``: the full reduction)."""
    if name == "softmax":
        return lambda a: torch.softmax(a, dim)
    if name == "logsumexp":
        return lambda a: torch.logsumexp(a, dim if dim is not None else (0, 1))
    if name == "norm":
        return lambda a: torch.linalg.vector_norm(a, dim=dim)
    op = getattr(torch, name)
    return (lambda a: op(a)) if dim is None else (lambda a: op(a, dim))
