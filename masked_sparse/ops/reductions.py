"""Reductions on every layout, along any dims, never densifying a sparse input.

Semantics (docs/design.md, docs/reductions.md, RFC-0027), written once here for every layout:

- only specified elements take part: unspecified ones are replaced by the op's identity
  (0 for sums, 1 for products, -inf / the dtype's min for maxima, ...) *before* any
  transformation, so garbage or NaN data under the mask can neither leak into a result
  nor into a gradient;
- a result element is specified iff its group has at least one specified element (for
  ``var`` / ``std``: more than ``correction`` of them, numpy.ma's rule); unspecified result
  elements hold 0;
- ``mean = sum / count``; ``var`` is two-pass (the squared deviations of the specified
  values from their group's mean: Note [The moments family] in ``layouts.kernels``);
  ``logsumexp`` subtracts the group maximum (Note [The logsumexp family]); norms are built
  from ``abs`` / ``pow``;
  ``argmax`` / ``max(dim)`` / ``median(dim)`` return indices in the full uncompressed shape;
- a full reduction returns a 0-d strided MaskedTensor; along dims, a sparse input keeps a
  sparse result (COO; CSR for a 2-D ``keepdim=True`` result of a CSR input).

The layouts only compute: :func:`layouts.group_by` gives a :class:`layouts.Grouping` with
``reduce`` / ``expand`` / ``build`` primitives (dense torch reductions for strided,
segment reductions over the stored values for sparse layouts, the COO form for layouts
without a kernel), and the kernel families of ``layouts.kernels`` (``masked_sum``,
``masked_var``, ...) compute the masked reductions over it. Everything is differentiable
with respect to the values and runs through :func:`masked_sparse._autograd.on_values`, so
gradients carry the input's mask.

Note [Fill before transform]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``torch.where(mask, v, identity)`` comes first, and every later op (abs, pow, exp, sqrt)
runs on the filled values: the gradient of ``where`` is exactly 0 on the unspecified
branch, so even an infinite derivative at the identity (``sqrt`` at 0, ``pow`` with a
negative exponent) never reaches an input element. Divisions and roots of per-group
quantities use a "safe" operand (``clamp(count, 1)``, ``where(s > 0, s, 1)``) so that empty
groups produce neither NaN values nor NaN gradients.

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.tensor([[1., 2.], [3., 4.]]),
...                       torch.tensor([[True, False], [False, False]]))
>>> torch.sum(mt, 1)
MaskedTensor(
  [  1.0000,       --]
)
"""

from __future__ import annotations

import math
from typing import Any

import torch

import layouts
from layouts import Grouping, Kernel, Storage, fill_unspecified, kernels, zero_unspecified

from .._autograd import on_values
from .._fill import all_specified
from .._registry import implements, is_aten, op_name
from .._tensor import MaskedTensor, _wrap, dtype_of, ndim_of, requires_grad_of
from . import reductions_args as A

aten = torch.ops.aten


#: The exact overload a layout keys its ``reduction`` kernel on, per op name. The kernel is
#: ``kernel(storage, dims, keepdim, *params)`` with the params of the generic ``k_*`` kernel
#: below (``max(dim)`` uses ``max``'s entry; a full ``max()`` uses ``amax``'s).
KEYS: dict[str, Any] = {
    "sum": aten.sum.dim_IntList, "nansum": aten.nansum.default, "mean": aten.mean.dim,
    "nanmean": aten.nanmean.default, "prod": aten.prod.dim_int, "amax": aten.amax.default,
    "amin": aten.amin.default, "max": aten.max.dim, "min": aten.min.dim,
    "argmax": aten.argmax.default, "argmin": aten.argmin.default, "all": aten.all.dims,
    "any": aten.any.dims, "count_nonzero": aten.count_nonzero.dim_IntList,
    "vector_norm": aten.linalg_vector_norm.default, "var": aten.var.correction,
    "std": aten.std.correction, "var_mean": aten.var_mean.correction,
    "std_mean": aten.std_mean.correction, "logsumexp": aten.logsumexp.default,
    "median": aten.median.dim, "nanmedian": aten.nanmedian.dim,
    "softmax": aten._softmax.default, "log_softmax": aten._log_softmax.default,
    "kthvalue": aten.kthvalue.default,
}


# -- running a kernel: the layout's own, else the generic one on a grouping ----------------
def _reduce(storages: list[Storage], key: Any, kernel: Kernel, dims: tuple[int, ...],
            keepdim: bool, extra: tuple) -> Any:
    s = storages[0]
    own = s.layout.reduction.get(key) if key is not None else None
    out = own(s, dims, keepdim, *extra) if own is not None else NotImplemented
    if out is not NotImplemented:
        return out
    return kernel(layouts.group_by(s, dims, keepdim), *extra)


def _reduce_wide(storages: list[Storage], key: Any, kernel: Kernel, dims: tuple[int, ...],
                 keepdim: bool, extra: tuple, narrow: torch.dtype) -> Any:
    """:func:`_reduce` of the values in float32, floating results cast to ``narrow``
    (Note [Half precision accumulates in float32]); differentiable through both casts."""
    s = storages[0]
    out = _reduce([s.with_values(s.values.float())], key, kernel, dims, keepdim, extra)
    if isinstance(out, Storage):
        return _narrow(out, narrow)
    return tuple(_narrow(o, narrow) if isinstance(o, Storage) else o for o in out)


def _narrow(s: Storage, dtype: torch.dtype) -> Storage:
    return s.with_values(s.values.to(dtype)) if s.values.is_floating_point() else s


def accumulate(dtype: torch.dtype | None) -> tuple[torch.dtype | None, torch.dtype | None]:
    """``(compute dtype, dtype to return)`` of a reduction whose result has ``dtype``.

    Note [Half precision accumulates in float32]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A float16 sum of a thousand 200s overflows (its max is 65504) and bfloat16 keeps 8 bits
    of mantissa, so torch accumulates both in float32 and returns the input's dtype. Sums,
    means, ``var`` / ``std``, norms, ``logsumexp`` and ``softmax`` do the same here, on every
    layout: the values are read as float32 (a layout's own kernel included), the results
    cast back. ``accumulate(torch.float16)`` is ``(torch.float32, torch.float16)``; other
    dtypes compute as they are, ``(dtype, None)``.
    """
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32, dtype
    return dtype, None


def run(op: Any, name: str, kernel: Kernel, mt: MaskedTensor, dims: tuple[int, ...],
        keepdim: bool, *extra: Any, narrow: torch.dtype | None = None) -> Any:
    """Reduction ``name`` of ``mt``: the layout's ``reduction[KEYS[name]]`` kernel, else
    ``kernel(grouping, *extra)``; Storage outputs are wrapped. With ``narrow`` the values
    are reduced in float32 and the results cast to ``narrow`` (:func:`accumulate`).

    A Python-level ``op`` runs through ``on_values`` (gradients carry ``mt``'s mask); an
    aten overload (called below autograd, from C++) runs forward only.
    """
    key = KEYS.get(name)  # None: an op without an aten overload (functional.normalize)
    fn, extra2 = (_reduce, ()) if narrow is None else (_reduce_wide, (narrow,))
    if not is_aten(op):
        if torch.is_grad_enabled() and requires_grad_of(mt):
            return on_values(fn, [mt], key, kernel, dims, keepdim, extra, *extra2)
        # no gradient to record: what ``on_values`` runs then, without its layer
        out = fn([mt._storage], key, kernel, dims, keepdim, extra, *extra2)
    else:
        with torch.no_grad():
            out = fn([mt._storage], key, kernel, dims, keepdim, extra, *extra2)
    if isinstance(out, Storage):
        return _wrap(out)
    return tuple(_wrap(o) if isinstance(o, Storage) else o for o in out)


def _full(value: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), value, dtype=like.dtype, device=like.device)


def source(g: Grouping, dtype: torch.dtype | None = None,
           nan: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouping's values (cast to ``dtype``) and mask (NaN excluded with ``nan``)."""
    v, m = g.source.values, g.source.mask
    if dtype is not None and v.dtype != dtype:
        v = v.to(dtype)
    if nan and (v.is_floating_point() or v.is_complex()):
        m = m & ~torch.isnan(v)
    return v, m


def safe_root(s: torch.Tensor, p: float) -> torch.Tensor:
    """``s ** (1/p)`` with value and gradient 0 where ``s == 0`` (NaN and inf pass through,
    as in torch's norms).

    The root of 0 is 0 for ``p > 0``: without a gradient to protect (``plain_eager``) the
    plain root gives the same values, in one op instead of five.
    """
    if p > 0 and layouts.plain_eager(s):
        return s.sqrt() if p == 2 else s.pow(1.0 / p)
    zero = s == 0
    safe = torch.where(zero, _full(1, s), s)
    root = safe.sqrt() if p == 2 else safe.pow(1.0 / p)
    return torch.where(zero, _full(0, root), root)


# -- kernels: (grouping, *params) -> Storage | tuple -------------------------------------
def k_sum(g: Grouping, dtype: torch.dtype, nan: bool) -> Storage:
    v, m = source(g, dtype, nan)
    return g.build(kernels.masked_sum(g, v, m)[0], g.reduce(m, "any"))


def k_mean(g: Grouping, dtype: torch.dtype, nan: bool) -> Storage:
    v, m = source(g, dtype, nan)
    return g.build(*kernels.masked_mean(g, v, m))


def k_prod(g: Grouping, dtype: torch.dtype) -> Storage:
    v, m = source(g, dtype)
    specified = g.reduce(m, "any")
    out = kernels.masked_reduce_zeroed(g, v, m, "prod", specified)  # (None: reduce, then fill)
    if out is None:
        out = zero_unspecified(kernels.masked_reduce(g, v, m, "prod"), specified)
    return g.build(out, specified)


def k_extreme(g: Grouping, op: str) -> Storage:
    v, m = source(g)
    specified = g.reduce(m, "any")
    out = kernels.masked_reduce_zeroed(g, v, m, op, specified)  # zeroed in place
    if out is None:
        out = kernels.masked_reduce(g, v, m, op)
        if not all_specified(specified):  # an empty group holds the op's identity (+-inf)
            out = zero_unspecified(out, specified)
    return g.build(out, specified)


def k_all_any(g: Grouping, op: str, dtype: torch.dtype) -> Storage:
    v, m = source(g)
    truth = v if v.dtype == torch.bool else v != 0
    specified = g.reduce(m, "any")
    out = g.reduce(fill_unspecified(truth, m, op == "all"), op)
    return g.build((out & specified).to(dtype), specified)


def k_count_nonzero(g: Grouping) -> Storage:
    v, m = source(g)
    return g.build(g.reduce(m & (v != 0), "sum"), g.reduce(m, "any"))


def k_norm(g: Grouping, ord: float, dtype: torch.dtype | None, out_dtype: torch.dtype) -> Storage:
    v, m = source(g, dtype)
    if ord == 2 and not v.is_complex():  # the sums of squares zeroed, their roots in place
        specified = g.reduce(m, "any")  # (the root of +0.0 is +0.0: the same bits)
        out = kernels.masked_reduce_zeroed(g, v, m, "sumsq", specified)
        if out is not None:  # (to(): a call even when the dtype is already out_dtype)
            out = out.sqrt_()
            return g.build(out if out.dtype is out_dtype else out.to(out_dtype), specified)
    out, specified = group_norm(g, v, m, ord)
    return g.build(zero_unspecified(out, specified).to(out_dtype), specified)


def group_norm(g: Grouping, v: torch.Tensor, m: torch.Tensor,
               ord: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``ord``-norm of the specified elements of each group, and which groups have one."""
    specified = g.reduce(m, "any")
    if ord == 2 and not v.is_complex():  # the sum of squares fused with the fill
        return safe_root(kernels.masked_reduce(g, v, m, "sumsq"), 2), specified
    a = fill_unspecified(v, m, 0).abs()
    if ord == math.inf:
        out = g.reduce(a, "amax")
    elif ord == -math.inf:
        out = g.reduce(fill_unspecified(a, m, math.inf), "amin")
    elif ord == 0:
        out = g.reduce(m & (a != 0), "sum").to(a.dtype)
    elif ord == 1:
        out = g.reduce(a, "sum")
    elif ord == 2:
        out = safe_root(g.reduce(a * a, "sum"), 2)
    else:
        powered = a.pow(ord)
        if ord < 0:
            powered = fill_unspecified(powered, m, 0)
        out = safe_root(g.reduce(powered, "sum"), ord)
    return out, specified


def k_var(g: Grouping, correction: float, std: bool, with_mean: bool) -> Any:
    v, m = source(g)
    var, mean, specified = kernels.masked_var(g, v, m, correction)
    out = g.build(safe_root(var, 2) if std else var, specified)
    return (out, g.build(mean, g.reduce(m, "any"))) if with_mean else out


def k_logsumexp(g: Grouping, dtype: torch.dtype) -> Storage:
    v, m = source(g, dtype)
    specified = g.reduce(m, "any")
    if v.is_complex():
        return g.build(_complex_logsumexp(g, v, m, specified), specified)
    return g.build(kernels.masked_logsumexp(g, v, m, specified), specified)


def _complex_logsumexp(g: Grouping, v: torch.Tensor, m: torch.Tensor,
                       specified: torch.Tensor) -> torch.Tensor:
    """torch's complex ``logsumexp``: the largest real part (0 when infinite) is taken out
    before ``exp`` and added back after ``log``; unspecified elements add nothing."""
    top = kernels.masked_reduce(g, v.real, m, "amax")
    top = torch.where(torch.isinf(top) | ~specified, _full(0, top), top)
    filled = fill_unspecified(v, m, 0)  # Note [Fill before transform]
    terms = fill_unspecified((filled - g.expand(top)).exp(), m, 0)
    return zero_unspecified(g.reduce(terms, "sum").log() + top, specified)


def k_arg(g: Grouping, op: str, with_values: bool) -> Any:
    """argmax/argmin (op "amax"/"amin"): first position of the extreme, NaN first."""
    v, m = source(g)
    specified = g.reduce(m, "any")
    top, position = kernels.masked_arg_extreme(g, v, m, op)
    index = g.build(position, specified)
    return (g.build(top, specified), index) if with_values else index


def k_median(g: Grouping, nan: bool, with_index: bool) -> Any:
    """The lower median of the specified elements (torch's choice); NaN wins unless ``nan``."""
    v, m = source(g, None, nan)
    count = g.reduce(m, "sum").long()  # over no dim (a 0-d input) the sum is the bool mask
    rank = (count - 1).div(2, rounding_mode="floor")
    if v.is_floating_point():  # NaN sorts last; torch returns the first NaN
        nans = g.reduce(m & torch.isnan(v), "sum").long()
        rank = torch.where(nans > 0, count - nans, rank)
    value, position = g.select(v, m, rank.clamp(min=0))
    specified = count > 0
    out = g.build(zero_unspecified(value, specified), specified)
    if not with_index:
        return out
    return out, g.build(zero_unspecified(position, specified), specified)


# -- the torch-level forms: handler(op, *args, **kwargs) ----------------------------------
@implements(torch.sum, torch.Tensor.sum, aten.sum.default, aten.sum.dim_IntList,
            torch.nansum, torch.Tensor.nansum, aten.nansum.default,
            torch.mean, torch.Tensor.mean, aten.mean.default, aten.mean.dim,
            torch.nanmean, torch.Tensor.nanmean, aten.nanmean.default)
def _summing(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    a = A.bind(A.sig_sum, args, kwargs, name)
    mt = a["input"]
    s = mt._storage
    dims = A.normalize_dims(a["dim"], len(s.shape), name)
    wanted = A.check_dtype(a["dtype"], name)
    dtype = A.result_dtype(getattr(torch, name), s.values.dtype,
                           **({} if wanted is None else {"dtype": wanted}))
    kernel = k_mean if name.endswith("mean") else k_sum
    dtype, narrow = accumulate(dtype)
    return run(op, name, kernel, mt, dims, A.check_bool(a["keepdim"], "keepdim", name), dtype,
               name.startswith("nan"), narrow=narrow)


@implements(torch.prod, torch.Tensor.prod, aten.prod.default, aten.prod.dim_int)
def _prod(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = A.bind(A.sig_sum, args, kwargs, "prod")
    mt = a["input"]
    dims = A.normalize_dims(a["dim"], ndim_of(mt), "prod")
    dtype = A.result_dtype(torch.prod, dtype_of(mt), dtype=A.check_dtype(a["dtype"], "prod"))
    return run(op, "prod", k_prod, mt, dims, A.check_bool(a["keepdim"], "keepdim", "prod"),
               dtype)


def _check_real(mt: MaskedTensor, op: str) -> int:
    """Refuse a complex ``mt``; its number of dims (read with its dtype, one storage read)."""
    s = mt._storage
    if s.values.dtype.is_complex:
        raise TypeError(f"{op}(): complex MaskedTensors have no order; reduce .abs() or "
                        f".real instead")
    return len(s.shape)


@implements(torch.amax, torch.Tensor.amax, aten.amax.default,
            torch.amin, torch.Tensor.amin, aten.amin.default)
def _extreme(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    a = A.bind(A.sig_amax, args, kwargs, name)
    mt = a["input"]
    dims = A.normalize_dims(a["dim"], _check_real(mt, name), name)
    return run(op, name, k_extreme, mt, dims, A.check_bool(a["keepdim"], "keepdim", name), name)


@implements(torch.max, torch.Tensor.max, aten.max.default, aten.max.dim,
            torch.min, torch.Tensor.min, aten.min.default, aten.min.dim)
def _min_max(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if isinstance(other, torch.Tensor) or not isinstance(args[0], MaskedTensor):
        rest = {k: v for k, v in kwargs.items() if k != "other"}
        operands = args if len(args) > 1 else (args[0], other)
        return getattr(torch, name + "imum")(*operands, **rest)  # max(a, b) = maximum(a, b)
    a = A.bind(A.sig_minmax, args, kwargs, name)
    mt = a["input"]
    _check_real(mt, name)
    if a["dim"] is None:
        return run(op, "a" + name, k_extreme, mt, tuple(range(ndim_of(mt))), False, "a" + name)
    dims = A.one_dim(a["dim"], ndim_of(mt), name)
    out = run(op, name, k_arg, mt, dims, A.check_bool(a["keepdim"], "keepdim", name),
              "a" + name, True)
    return out if is_aten(op) else getattr(torch.return_types, name)(out)


@implements(aten.max.other, aten.min.other)
def _min_max_other(op: Any, input: Any, other: Any) -> Any:
    return getattr(aten, op_name(op) + "imum").default(input, other)


@implements(torch.argmax, torch.Tensor.argmax, aten.argmax.default,
            torch.argmin, torch.Tensor.argmin, aten.argmin.default)
def _arg(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    a = A.bind(A.sig_dim, args, kwargs, name)
    mt = a["input"]
    ndim = _check_real(mt, name)
    dims = tuple(range(ndim)) if a["dim"] is None else A.one_dim(a["dim"], ndim, name)
    return run(op, name, k_arg, mt, dims, A.check_bool(a["keepdim"], "keepdim", name),
               "a" + name[3:], False)


@implements(torch.all, torch.Tensor.all, aten.all.default, aten.all.dim, aten.all.dims,
            torch.any, torch.Tensor.any, aten.any.default, aten.any.dim, aten.any.dims)
def _all_any(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    a = A.bind(A.sig_dim, args, kwargs, name)
    mt = a["input"]
    dims = A.normalize_dims(a["dim"], ndim_of(mt), name)
    dtype = A.result_dtype(getattr(torch, name), dtype_of(mt))
    return run(op, name, k_all_any, mt, dims, A.check_bool(a["keepdim"], "keepdim", name),
               name, dtype)


@implements(torch.count_nonzero, torch.Tensor.count_nonzero, aten.count_nonzero.default,
            aten.count_nonzero.dim_IntList)
def _count_nonzero(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = A.bind(A.sig_count_nonzero, args, kwargs, "count_nonzero")
    mt = a["input"]
    dims = A.normalize_dims(a["dim"], ndim_of(mt), "count_nonzero")
    return run(op, "count_nonzero", k_count_nonzero, mt, dims, False)


def _norm_impl(op: Any, mt: MaskedTensor, ord: Any, dim: Any, keepdim: Any, dtype: Any,
               name: str) -> Any:
    if isinstance(ord, str) or isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"{name}(): ord must be a number (0, 1, 2, inf, -inf, p), got {ord!r}")
    dtype = A.check_dtype(dtype, name)
    out_dtype = A.result_dtype(torch.linalg.vector_norm, dtype_of(mt), ord, dtype=dtype)
    dims = A.normalize_dims(dim, ndim_of(mt), name)
    wide, narrow = accumulate(out_dtype)
    return run(op, "vector_norm", k_norm, mt, dims, A.check_bool(keepdim, "keepdim", name),
               float(ord), wide if narrow else dtype, wide, narrow=narrow)


@implements(torch.linalg.vector_norm, aten.linalg_vector_norm.default)
def _vector_norm(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = A.bind(A.sig_vector_norm, args, kwargs, "vector_norm")
    return _norm_impl(op, a["input"], a["ord"], a["dim"], a["keepdim"], a["dtype"],
                      "vector_norm")


@implements(torch.norm, torch.Tensor.norm, aten.norm.Scalar, aten.norm.ScalarOpt_dim,
            aten.norm.ScalarOpt_dim_dtype, aten.norm.ScalarOpt_dtype)
def _norm(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = A.bind(A.sig_norm, args, kwargs, "norm")
    p = a["p"]
    if p is None or p == "fro":
        p = 2
    elif isinstance(p, str):
        raise NotImplementedError(f"MaskedTensor[{a['input']._storage.layout.name}] norm: "
                                  f"p={p!r} is a matrix norm; use .to_dense() / .to_tensor(0) "
                                  f"and torch.linalg.matrix_norm")
    return _norm_impl(op, a["input"], p, a["dim"], a["keepdim"], a["dtype"], "norm")


@implements(torch.var, torch.Tensor.var, aten.var.correction,
            torch.std, torch.Tensor.std, aten.std.correction,
            torch.var_mean, aten.var_mean.correction, torch.std_mean, aten.std_mean.correction)
def _var(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    a = A.bind(A.sig_var, args, kwargs, name)
    mt = a["input"]
    dim, unbiased, correction = a["dim"], a["unbiased"], a["correction"]
    if isinstance(dim, bool):  # torch.var(x, True): the legacy `unbiased` overload
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): pass either unbiased or correction, not both")
    if correction is None:
        correction = 1 if unbiased is None else int(A.check_bool(unbiased, "unbiased", name))
    s = mt._storage
    dtype = s.values.dtype
    A.result_dtype(torch.var, dtype)  # torch's dtype check (floating / complex only)
    dims = A.normalize_dims(dim, len(s.shape), name)
    return run(op, name, k_var, mt, dims, A.check_bool(a["keepdim"], "keepdim", name),
               float(correction), name.startswith("std"), name.endswith("_mean"),
               narrow=accumulate(dtype)[1])


@implements(torch.logsumexp, torch.Tensor.logsumexp, torch.special.logsumexp,
            aten.logsumexp.default)
def _logsumexp(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = A.bind(A.sig_logsumexp, args, kwargs, "logsumexp")
    mt = a["input"]
    dims = A.normalize_dims(a["dim"], ndim_of(mt), "logsumexp")
    dtype, narrow = accumulate(A.result_dtype(torch.logsumexp, dtype_of(mt), 0))
    return run(op, "logsumexp", k_logsumexp, mt, dims,
               A.check_bool(a["keepdim"], "keepdim", "logsumexp"), dtype, narrow=narrow)


@implements(torch.median, torch.Tensor.median, aten.median.default, aten.median.dim,
            torch.nanmedian, torch.Tensor.nanmedian, aten.nanmedian.default, aten.nanmedian.dim)
def _median(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    nan = name.startswith("nan")
    a = A.bind(A.sig_minmax, args, kwargs, name)
    mt = a["input"]
    _check_real(mt, name)
    if a["dim"] is None:
        return run(op, name, k_median, mt, tuple(range(ndim_of(mt))), False, nan, False)
    dims = A.one_dim(a["dim"], ndim_of(mt), name)
    out = run(op, name, k_median, mt, dims, A.check_bool(a["keepdim"], "keepdim", name), nan,
              True)
    return out if is_aten(op) else getattr(torch.return_types, name)(out)
