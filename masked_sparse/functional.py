"""``torch.masked``'s functional reductions and normalizations, returning MaskedTensors.

Each function takes a plain tensor of any registered layout plus ``mask=`` (True =
specified), with ``torch.masked``'s names and arguments (``torch.masked.sum(input, dim,
*, keepdim, dtype, mask)`` ...), and returns a :class:`MaskedTensor` computed by the masked
op on ``as_masked_tensor(input, mask)``: differentiable with respect to ``input``, never
densifying a sparse input. Where ``torch.masked`` returns a plain tensor that holds an
arbitrary value for a fully masked group (0 for ``sum``, NaN for ``mean``, ...), the result
here leaves that element unspecified.

``mask`` may be omitted: a strided input is then specified everywhere; a sparse input at
its stored elements (its explicit zeros included, as ``ms.from_scipy`` reads scipy
matrices), since specifying the implicit zeros would densify it. A strided mask may be
given for a sparse input (its True positions are stored) and broadcasts to a strided input.
A MaskedTensor input is used with its own mask (``mask`` must then be omitted).

Note [Strided input without a mask]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
With ``mask=None`` every element of a strided input is specified. When the input has
elements, every group then has a specified element, so the masked result is torch's own op
on the plain input, specified everywhere -- exactly what ``torch.masked`` computes for
``mask=None``. The functions run that op directly (:func:`_masked` returns the input itself,
:func:`_specified` wraps the result): no full-size all-True mask, no fill pass, no mask
reduction (a row sum is torch's row sum). The masked route stays where the two differ: an
empty input (its groups are empty: unspecified, not 0 or NaN); dtypes other than float32 /
float64 (the masked ops order bools, refuse complex orders and non-float softmax with their
own messages, accumulate half precision in float32); and var / std, whose two passes
reproduce ``torch.masked``'s formula to the last bit where ``torch.var`` makes one pass.
(``prod`` over all dims is the one result that can differ from ``torch.masked``'s in the last
bits: it multiplies one dim at a time, a workaround for pytorch#56586.)

>>> import torch, masked_sparse as ms
>>> x = torch.tensor([[1., 2.], [3., 4.]])
>>> ms.functional.sum(x, 1, mask=torch.tensor([[True, False], [False, False]]))
MaskedTensor(
  [  1.0000,       --]
)
"""

from __future__ import annotations

import math
from typing import Any

import torch

import layouts

from . import _func
from ._autograd import lift, masked_over
from ._construct import as_masked_tensor
from ._shapes import broadcasts_to
from ._tensor import MaskedTensor
from .ops import reductions_args as A
from .ops.reductions import group_norm, run, source

__all__ = ["amax", "amin", "argmax", "argmin", "cumprod", "cumsum", "log_softmax", "logsumexp",
           "mean", "median", "norm", "normalize", "prod", "softmax", "softmin", "std", "sum",
           "var"]

_PLAIN_DTYPES = (torch.float32, torch.float64)  # Note [Strided input without a mask]


def _masked(input: Any, mask: Any, op: str, dtype: torch.dtype | None = None, *,
            plain: bool = True) -> MaskedTensor | torch.Tensor:
    """``input`` with ``mask`` as a MaskedTensor (cast to ``dtype``), differentiable; with
    ``plain``, a float strided input with elements and no mask stays plain (Note [Strided
    input without a mask]): the caller wraps its op's result with :func:`_specified`."""
    input = lift(input)  # a MaskedTensor argument of a torch.func transform
    if isinstance(input, MaskedTensor):
        if mask is not None:
            raise TypeError(f"masked_sparse.functional.{op}: input is a MaskedTensor, which "
                            f"carries its own mask; omit mask=")
        mt = input
    elif not isinstance(input, torch.Tensor):
        raise TypeError(f"masked_sparse.functional.{op}: input must be a torch.Tensor, got "
                        f"{type(input).__name__}")
    elif plain and mask is None and input.layout == torch.strided and input.numel() > 0 \
            and input.dtype in _PLAIN_DTYPES:
        mt = input
    else:
        mt = as_masked_tensor(input, _mask_for(input, mask, op))
    return mt if dtype is None or dtype == mt.dtype else mt.to(dtype)


def _specified(out: MaskedTensor | torch.Tensor) -> MaskedTensor:
    """An op's result as a MaskedTensor: a plain one (Note [Strided input without a
    mask]) specified everywhere.

    ``masked_over`` keeps the gradient reaching ``out`` plain, for torch's derivative
    formula of the op that made it; under a ``torch.func`` transform ``as_masked_tensor``
    wraps the transform's own tracked ``out`` (Note [MaskedTensors in torch.func]).
    """
    if isinstance(out, MaskedTensor):
        return out
    mask = layouts.all_true(out)  # broadcast: no memory per element
    return as_masked_tensor(out, mask) if _func.active() else masked_over(out, mask)


def _mask_for(input: torch.Tensor, mask: Any, op: str) -> torch.Tensor:
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise TypeError(f"masked_sparse.functional.{op}: mask must be a bool torch.Tensor or "
                        f"None, got {type(mask).__name__}")
    if input.layout == torch.strided:
        if mask is None:
            return torch.ones(input.shape, dtype=torch.bool, device=input.device)
        if mask.layout != torch.strided:
            mask = mask.to_dense()
        return mask.expand(input.shape)
    if mask is None:  # the input's own pattern: every stored element is specified
        layout = layouts.get_layout(input.layout)
        plain = input.detach()
        s = layout.from_torch(plain, plain)
        return layout.to_torch(s, torch.ones(s.values.shape, dtype=torch.bool,
                                             device=input.device))
    if mask.layout == torch.strided:
        return _stored_at(mask.expand(input.shape), input.layout)
    if mask.shape != input.shape:
        mask = _expand_sparse(mask, input.shape, op)
    if mask.layout != input.layout:  # sparse to sparse: O(nnz)
        return _stored_at(mask, input.layout)
    return mask


def _expand_sparse(mask: torch.Tensor, shape: torch.Size, op: str) -> torch.Tensor:
    """A sparse ``mask`` broadcast to ``shape`` as torch.masked broadcasts it: a sparse COO
    mask storing each of its True elements at every position it broadcasts to (O(output
    nnz), never dense).

    >>> m = torch.tensor([[True], [False]]).to_sparse_coo()
    >>> _expand_sparse(m, torch.Size([2, 3]), "sum").to_dense().tolist()
    [[True, True, True], [False, False, False]]
    """
    if not broadcasts_to(tuple(mask.shape), tuple(shape)):
        raise ValueError(f"masked_sparse.functional.{op}: mask of shape {tuple(mask.shape)} "
                         f"does not broadcast to the input's shape {tuple(shape)}")
    coo = mask.to_sparse_coo().coalesce()
    if coo.dense_dim():
        coo = coo.to_dense().to_sparse_coo()  # hybrid: its dense dims become sparse ones
    idx = coo.indices()[:, coo.values()]  # the True elements
    lead = len(shape) - mask.dim()
    idx = torch.cat([idx.new_zeros(lead, idx.shape[1]), idx])
    for d, n in enumerate(shape):
        if (mask.shape[d - lead] if d >= lead else 1) == 1 and n != 1:
            k = idx.shape[1]
            idx = idx.repeat_interleave(n, dim=1)
            idx[d] = torch.arange(n, device=idx.device).repeat(k)
    ones = torch.ones(idx.shape[1], dtype=torch.bool, device=idx.device)
    return torch.sparse_coo_tensor(idx, ones, shape).coalesce()


def _stored_at(mask: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    """``mask`` in the sparse ``layout`` (a strided mask: storing exactly its True elements)."""
    if layout == torch.sparse_coo:
        return mask.to_sparse_coo()
    return mask.to_sparse(layout=layout)


def _dims(dim: Any) -> Any:
    return () if dim is None else dim


# -- reductions -------------------------------------------------------------------------
def sum(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
        dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Sum of the specified elements over ``dim`` (all dims when None), as ``torch.masked.sum``.

    >>> import torch, masked_sparse as ms
    >>> ms.functional.sum(torch.tensor([1., 2., 4.]), mask=torch.tensor([True, False, True]))
    MaskedTensor(  5.0000, True)
    """
    mt = _masked(input, mask, "sum")
    return _specified(torch.sum(mt, _all_dims(dim, mt), keepdim=keepdim, dtype=dtype))


def _all_dims(dim: Any, mt: MaskedTensor | torch.Tensor) -> Any:
    return tuple(range(mt.dim())) if dim is None else dim


def prod(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
         dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Product of the specified elements over ``dim``: an int, a tuple of ints, or all
    dims for None or ``()`` (as ``torch.masked.prod``).

    >>> import torch, masked_sparse as ms
    >>> x = torch.tensor([[1., 2.], [3., 4.]])
    >>> ms.functional.prod(x, (0, 1), mask=torch.tensor([[True, False], [True, True]]))
    MaskedTensor( 12.0000, True)
    """
    mt = _masked(input, mask, "prod")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if isinstance(mt, MaskedTensor) or not (dim is None or isinstance(dim, int)):
        from .ops.reductions import _prod  # tuples of dims: torch.prod takes one int only

        if not isinstance(mt, MaskedTensor):
            mt = _masked(input, mask, "prod", plain=False)
        return _specified(_prod(torch.prod, mt, _dims(dim), keepdim=keepdim, dtype=dtype))
    if dim is None:
        out = torch.prod(mt, dtype=dtype)
        return _specified(out.reshape((1,) * mt.dim()) if keepdim else out)
    return _specified(torch.prod(mt, dim, keepdim=keepdim, dtype=dtype))


def amax(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
         dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Maximum of the specified elements over ``dim`` (all dims when None)."""
    return _specified(torch.amax(_masked(input, mask, "amax", dtype), _dims(dim),
                                keepdim=keepdim))


def amin(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
         dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Minimum of the specified elements over ``dim`` (all dims when None)."""
    return _specified(torch.amin(_masked(input, mask, "amin", dtype), _dims(dim),
                                keepdim=keepdim))


def argmax(input: torch.Tensor, dim: int | None = None, *, keepdim: bool = False,
           dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Index of the first maximum among the specified elements along ``dim``."""
    return _specified(torch.argmax(_masked(input, mask, "argmax", dtype), dim, keepdim=keepdim))


def argmin(input: torch.Tensor, dim: int | None = None, *, keepdim: bool = False,
           dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Index of the first minimum among the specified elements along ``dim``."""
    return _specified(torch.argmin(_masked(input, mask, "argmin", dtype), dim, keepdim=keepdim))


def mean(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
         dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Mean of the specified elements over ``dim`` (all dims when None)."""
    mt = _masked(input, mask, "mean")
    return _specified(torch.mean(mt, _all_dims(dim, mt), keepdim=keepdim, dtype=dtype))


def median(input: torch.Tensor, dim: int = -1, *, keepdim: bool = False,
           dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Lower median of the specified elements along one ``dim`` (values only, as
    ``torch.masked.median``)."""
    mt = _masked(input, mask, "median", dtype)
    return _specified(torch.median(mt, dim, keepdim=keepdim).values)


def logsumexp(input: torch.Tensor, dim: Any = None, *, keepdim: bool = False,
              dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """``log(sum(exp(x)))`` of the specified elements over ``dim`` (all dims when None)."""
    mt = _masked(input, mask, "logsumexp", dtype)
    return _specified(torch.logsumexp(mt, _all_dims(dim, mt), keepdim=keepdim))


def norm(input: torch.Tensor, ord: float = 2.0, dim: Any = None, *, keepdim: bool = False,
         dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Vector ``ord``-norm of the specified elements over ``dim`` (all dims when None)."""
    mt = _masked(input, mask, "norm")
    return _specified(torch.linalg.vector_norm(mt, ord, dim, keepdim, dtype=dtype))


def var(input: torch.Tensor, dim: Any = None, unbiased: bool | None = None, *,
        correction: float | None = None, keepdim: bool = False,
        dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Variance of the specified elements; a group needs more than ``correction`` of them."""
    return _spread(torch.var, "var", input, dim, unbiased, correction, keepdim, dtype, mask)


def std(input: torch.Tensor, dim: Any = None, unbiased: bool | None = None, *,
        correction: float | None = None, keepdim: bool = False,
        dtype: torch.dtype | None = None, mask: torch.Tensor | None = None) -> MaskedTensor:
    """Standard deviation of the specified elements (see :func:`var`)."""
    return _spread(torch.std, "std", input, dim, unbiased, correction, keepdim, dtype, mask)


def _spread(fn: Any, op: str, input: Any, dim: Any, unbiased: Any, correction: Any,
            keepdim: bool, dtype: Any, mask: Any) -> MaskedTensor:
    mt = _masked(input, mask, op, dtype, plain=False)
    if unbiased is not None:
        if correction is not None:
            raise TypeError(f"masked_sparse.functional.{op}: pass either unbiased or "
                            f"correction, not both")
        correction = int(unbiased)
    return fn(mt, _all_dims(dim, mt), correction=1 if correction is None else correction,
              keepdim=keepdim)


# -- normalizations ---------------------------------------------------------------------
def softmax(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
            mask: torch.Tensor | None = None) -> MaskedTensor:
    """Softmax over the specified elements of each slice along ``dim``; keeps the mask."""
    return _specified(torch.softmax(_masked(input, mask, "softmax"), dim, dtype=dtype))


def log_softmax(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
                mask: torch.Tensor | None = None) -> MaskedTensor:
    """Log-softmax over the specified elements of each slice along ``dim``; keeps the mask."""
    return _specified(torch.log_softmax(_masked(input, mask, "log_softmax"), dim, dtype=dtype))


def softmin(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
            mask: torch.Tensor | None = None) -> MaskedTensor:
    """``softmax(-input)`` over the specified elements along ``dim``; keeps the mask."""
    return _specified(torch.softmax(-_masked(input, mask, "softmin"), dim, dtype=dtype))


def _k_normalize(g: layouts.Grouping, ord: float, eps: float,
                 dtype: torch.dtype | None) -> layouts.Storage:
    v, m = source(g, dtype)
    norms, _ = group_norm(g, v, m, ord)
    out = v / g.expand(torch.clamp_min(norms, eps))
    return g.restore(layouts.zero_unspecified(out, m))


def normalize(input: torch.Tensor, ord: float, dim: int, *, eps: float = 1e-12,
              dtype: torch.dtype | None = None,
              mask: torch.Tensor | None = None) -> MaskedTensor:
    """Each slice along ``dim`` divided by ``max(norm of its specified elements, eps)``.

    >>> import torch, masked_sparse as ms
    >>> ms.functional.normalize(torch.tensor([3., 9., 4.]), 2.0, 0,
    ...                         mask=torch.tensor([True, False, True]))
    MaskedTensor(
      [  0.6000,       --,   0.8000]
    )
    """
    mt = _masked(input, mask, "normalize")
    if not (mt.dtype.is_floating_point or mt.dtype.is_complex) and dtype is None:
        raise TypeError(f"masked_sparse.functional.normalize: expected a floating point "
                        f"input, got {mt.dtype}; pass dtype=torch.float32")
    dims = A.one_dim(dim, mt.dim(), "normalize")
    if not isinstance(mt, MaskedTensor):  # Note [Strided input without a mask]
        x = mt if dtype is None else mt.to(dtype)
        norms = torch.linalg.vector_norm(x, ord, dims, keepdim=True)
        return _specified(x / torch.clamp_min(norms, eps))
    return run(normalize, "normalize", _k_normalize, mt, dims, True, float(ord), float(eps),
               dtype)


# -- scans --------------------------------------------------------------------------------
def cumsum(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
           mask: torch.Tensor | None = None) -> MaskedTensor:
    """Running sum of the specified elements along ``dim``; keeps the mask."""
    return _scan("cumsum", input, dim, dtype, mask)


def cumprod(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None,
            mask: torch.Tensor | None = None) -> MaskedTensor:
    """Running product of the specified elements along ``dim``; keeps the mask."""
    return _scan("cumprod", input, dim, dtype, mask)


def _scan(op: str, input: Any, dim: int, dtype: Any, mask: Any) -> MaskedTensor:
    return _specified(getattr(torch, op)(_masked(input, mask, op), dim, dtype=dtype))


# -- binary -------------------------------------------------------------------------------
def logaddexp(input: torch.Tensor, other: torch.Tensor, *, dtype: torch.dtype | None = None,
              input_mask: torch.Tensor | None = None,
              other_mask: torch.Tensor | None = None) -> MaskedTensor:
    """``log(exp(input) + exp(other))`` over the specified elements, as
    ``torch.masked.logaddexp``: an unspecified operand counts as ``-inf`` (adds nothing).

    The result is specified where either operand is (torch.masked returns ``-inf`` where
    neither is); masks broadcast to their operands, operands to each other. Strided only,
    as torch.masked: sparse operands raise ``NotImplementedError``.

    >>> import torch, masked_sparse as ms
    >>> ms.functional.logaddexp(torch.tensor([-100., -200., -300.]), torch.tensor([-1., -2., -3.]),
    ...                         input_mask=torch.tensor([True, False, True]),
    ...                         other_mask=torch.tensor([True, False, True]))
    MaskedTensor(
      [ -1.0000,       --,  -3.0000]
    )
    """
    a = _masked(input, input_mask, "logaddexp", plain=False)
    b = _masked(other, other_mask, "logaddexp", plain=False)
    for x in (a, b):
        if x.layout != torch.strided:
            raise NotImplementedError(
                f"masked_sparse.functional.logaddexp: strided operands only (as torch.masked), "
                f"got a {x.layout} one; pass .to_dense()")
    dtype = dtype or a.dtype
    fa = layouts.fill_unspecified(a.get_data(), a.get_mask(), -math.inf)
    fb = layouts.fill_unspecified(b.get_data(), b.get_mask(), -math.inf)
    out = torch.logaddexp(fa, fb).to(dtype)
    mask = (a.get_mask() | b.get_mask()).expand(out.shape)
    return as_masked_tensor(out, mask)
