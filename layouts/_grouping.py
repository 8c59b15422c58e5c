"""Reductions as *groupings*: which output element each stored element reduces into.

A reduction over a set of dims partitions a tensor's elements into groups, one per output
element. A layout answers every reduction (sum, mean, var, argmax, median, softmax, ...)
by building one :class:`Grouping` for its storage: the core (``masked_sparse``) writes the
semantics once in terms of the few primitives below, and each layout computes them with
plain tensors -- dense ``torch.sum(dim)`` for strided, segment / scatter reductions over
the stored values for sparse layouts. A layout registers its builder as
``group=builder``; a layout without one is reduced through its COO form
(``layouts.group_by``), in O(nnz), never densified.

Primitives (all on plain tensors, differentiable with respect to ``values``)
--------------------------------------------------------------------------
``source``
    The storage whose ``values``/``mask`` the other primitives take (the input storage
    itself, or its COO form for layouts reduced through COO).
``reduce(values, op)``
    ``values`` shaped like ``source.values``, reduced per group with ``op`` in
    :data:`OPS`; the result holds the output storage's values. Every group of a sparse
    grouping has at least one stored element; a group without any element (a size-0
    reduced dim) reads 0 (False for ``any``, True for ``all``).
``expand(out)``
    An output-values tensor broadcast back onto ``source.values`` (each element reads its
    group's value): how means and maxima are subtracted before a second pass.
``positions()``
    Each element's row-major index within the reduced dims (its coordinate along the dim
    for one reduced dim, its linear index when every dim is reduced), broadcastable to
    ``source.values``: what ``argmax`` / ``max(dim)`` return.
``select(values, mask, rank)``
    Per group, the element of ascending-order ``rank`` among the ``mask``-ed elements
    (NaN sorts last), as ``(values, positions)``: how medians are picked.
``masked_reduce(values, mask, op)``
    ``reduce(where(mask, values, identity), op)`` for ``op`` "sum", "prod", "amax" or
    "amin" (unspecified elements read the op's identity), and "sumsq": the sum of the
    squares of ``where(mask, values, 0)``. A layout may fuse the fill into the reduction
    (Note [Native reductions]) by a ``_native_reduce`` method.

The masked primitives (``masked_*`` and ``softmax``) are kernel families (Note [One kernel
route] in ``layouts._kernels``): each runs a layout's ``_native_*`` method where it applies
(by device), else the ``_torch_*`` torch ops here, with one backward either way.
``masked_arg_extreme(values, mask, op)``
    Per group, ``masked_reduce(values, mask, op)`` for ``op`` "amax" or "amin" and the
    smallest ``positions()`` of a ``mask``-ed element reaching it (NaN counts as the
    extreme: the first NaN wins), both 0 where no element is specified: what ``argmax`` /
    ``max(dim)`` return. A layout may compute both in one pass.
``masked_sum(values, mask, with_count=False)``
    ``reduce(where(mask, values, 0), "sum")`` and, with ``with_count``, the number of
    ``mask``-ed elements per group (int64): a layout may fuse the two (strided does).
``masked_sqdev(values, mask, center)``
    Per group, the sum of ``where(mask, values - expand(center), 0)`` squared (``|.|**2``
    for complex values): the second pass of a variance around the group means ``center``.
    A layout may run it in one pass (Note [Native reductions]).
``masked_sumexp(values, mask, center)``
    Per group, the sum of ``exp(values - expand(center))`` over the ``mask``-ed elements
    (the others add nothing, whatever they hold): the second pass of a logsumexp around
    the group maxima ``center``. A layout may run it in one pass (Note [Native exp]).
``softmax(values, mask, log)``
    Softmax / log_softmax within each group of a ``keepdim=True`` grouping over the
    ``mask``-ed elements (the others weigh nothing), and whether the result already holds
    0 at every other element (the softmax family writes them; a layout's own softmax may
    leave anything there, and the caller zero-fills them); a group whose specified values
    are all -inf gives NaN, as in torch.
``build(out_values, out_mask)``
    The output :class:`Storage` (its layout is the layout's choice).
``restore(values)``
    An elementwise result (shaped like ``source.values``) as a storage of the *input's*
    layout, sharing its index tensors where possible (softmax).

>>> import torch, layouts
>>> s = layouts.get_layout("strided").from_torch(torch.ones(2, 3), torch.ones(2, 3).bool())
>>> g = layouts.group_by(s, (1,), keepdim=False)
>>> g.reduce(s.values, "sum").tolist()
[3.0, 3.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import _kernels
from .registry import Storage

OPS = ("sum", "prod", "amax", "amin", "any", "all")


class Grouping:
    """How the elements of one storage fall into the groups of a reduction over ``dims``.

    Subclasses implement the primitives described in the module docstring; ``dims`` is a
    sorted tuple of non-negative dims, ``keepdim`` keeps them with size 1.
    """

    source: Storage
    dims: tuple[int, ...]
    keepdim: bool
    out_shape: torch.Size

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        raise NotImplementedError

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # Note [One kernel route] (``layouts._kernels``): each masked primitive below is one
    # kernel family; ``_kernels.run`` picks the layout's ``_native_*`` implementation (the
    # C kernels; None where they do not apply) or the ``_torch_*`` one by device, and
    # records the family's backward when the values require grad.
    def masked_reduce(self, values: torch.Tensor, mask: torch.Tensor, op: str) -> torch.Tensor:
        return _kernels.reduce(self, values, mask, op)

    def masked_reduce_zeroed(self, values: torch.Tensor, mask: torch.Tensor, op: str,
                             specified: torch.Tensor) -> torch.Tensor | None:
        """Per group, ``masked_reduce(values, mask, op)`` with 0 where ``specified`` (the
        groups holding a specified element) is False -- the result values of an amax,
        amin, prod or 2-norm --
        from the native kernel, its fresh output zeroed in place by one native fill (no
        check whether any group is empty, no second output); None where no native kernel
        applies (autograd to record, a tracer, another device, no library): the caller
        reduces and fills (``benchmarks/profile_overhead.py --fixed`` measures both).

        >>> import layouts
        >>> s = layouts.get_layout("strided").from_strided(torch.tensor([[1., 5.], [2., 0.]]),
        ...     torch.tensor([[True, True], [False, False]]))
        >>> g = layouts.group_by(s, (1,), False)
        >>> out = g.masked_reduce_zeroed(s.values, s.mask, "amax", torch.tensor([True, False]))
        >>> out is None or out.tolist() == [5.0, 0.0]
        True
        """
        return _kernels.reduce_zeroed(self, values, mask, op, specified)

    def masked_sum(self, values: torch.Tensor, mask: torch.Tensor,
                   with_count: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        total = _kernels.reduce(self, values, mask, "sum")
        return total, (self.reduce(mask, "sum") if with_count else None)

    def masked_mean(self, values: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per group, the mean of its specified elements (0 where none is) and whether it
        has one; differentiable."""
        mean, specified = _kernels.moments(self, values, mask, None)
        return mean, specified

    def masked_var(self, values: torch.Tensor, mask: torch.Tensor, correction: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per group, the variance of its specified elements with ``correction`` (0 where
        ``count - correction <= 0``), their mean (0 where none is specified), and where the
        variance is specified; differentiable.
        """
        var, mean, specified = _kernels.moments(self, values, mask, correction)
        return var, mean, specified

    def masked_logsumexp(self, values: torch.Tensor, mask: torch.Tensor,
                         specified: torch.Tensor) -> torch.Tensor:
        """Per group, the log of the sum of ``exp`` of its specified elements, 0 where
        ``specified`` (the groups with one) is False; differentiable."""
        return _kernels.logsumexp(self, values, mask, specified)

    def softmax(self, values: torch.Tensor, mask: torch.Tensor,
                log: bool) -> tuple[torch.Tensor, bool]:
        return _kernels.softmax(self, values, mask, log), True

    def masked_arg_extreme(self, values: torch.Tensor, mask: torch.Tensor,
                           op: str) -> tuple[torch.Tensor, torch.Tensor]:
        top, at = _kernels.arg_extreme(self, values, mask, op)
        return top, at

    def kernel_groups(self, values: torch.Tensor) -> tuple | None:
        """The groups as the custom ops take them (Note [Kernel families as custom ops]):
        ``(offsets, which, index, n)`` -- every element one group (``offsets`` and
        ``index`` None), lines, or a scatter into ``n`` groups -- or None where this
        grouping has no such form (its torch ops run under compile)."""
        return None

    # -- the native implementations: None here (a layout overrides those it has) -------
    def _native_reduce(self, op: str, values: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor | None:
        return None

    def _native_moments(self, values: torch.Tensor, mask: torch.Tensor,
                        correction: float | None) -> tuple | None:
        return None

    def _native_logsumexp(self, values: torch.Tensor, mask: torch.Tensor,
                          specified: torch.Tensor) -> torch.Tensor | None:
        return None

    def _native_softmax(self, values: torch.Tensor, mask: torch.Tensor,
                        log: bool) -> torch.Tensor | None:
        return None

    def _native_arg(self, values: torch.Tensor, mask: torch.Tensor,
                    op: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    def _native_backward(self, op: str, mask: torch.Tensor, a: torch.Tensor,
                         **operands: Any) -> torch.Tensor | None:
        """A family's gradient with respect to the stored values in one native pass over
        this grouping's groups (``_native.backward``: ``op``, the per-group ``a`` and the
        ``operands`` b, c, x, y), or None: the family's torch-op backward runs."""
        return None

    # -- the torch-op implementations (every device; differentiable) -------------------
    def _torch_reduce(self, values: torch.Tensor, mask: torch.Tensor, op: str) -> torch.Tensor:
        if op == "sumsq":
            filled = zero_unspecified(values, mask)
            return self.reduce(filled * filled, "sum")
        return self.reduce(fill_unspecified(values, mask, start(op, values.dtype)), op)

    def _torch_arg(self, values: torch.Tensor, mask: torch.Tensor,
                   op: str) -> tuple[torch.Tensor, torch.Tensor]:
        top = self.masked_reduce(values, mask, op)
        at = self.expand(top)
        hit = values == at
        if values.is_floating_point():
            hit = hit | (torch.isnan(values) & torch.isnan(at))
        none = torch.iinfo(torch.long).max
        at = self.reduce(torch.where(hit & mask, self.positions(), none), "amin")
        found = at != none
        return zero_unspecified(top, found), zero_unspecified(at, found)

    def _torch_moments(self, values: torch.Tensor, mask: torch.Tensor,
                       correction: float | None) -> tuple:
        total, count = self.masked_sum(values, mask, with_count=True)
        mean = total / count.clamp(min=1)
        if correction is None:
            return mean, count > 0
        dof = count - correction  # float32, as torch makes an int64 tensor minus a float
        specified = dof > 0
        var = self.masked_sqdev(values, mask, mean) / torch.where(
            specified, dof, _fill_tensor(1, dof))
        return zero_unspecified(var, specified), mean, specified

    def _torch_logsumexp(self, values: torch.Tensor, mask: torch.Tensor,
                         specified: torch.Tensor) -> torch.Tensor:
        # The shift by the group's max cancels in value and gradient (detached: no backward
        # pass for it); a max that is not finite shifts by 0 (all -inf: log 0 = -inf; +inf:
        # inf; NaN: NaN).
        top = self.masked_reduce(values, mask, "amax").detach()
        top = torch.where(torch.isfinite(top), top, _fill_tensor(0, top))
        total = self.masked_sumexp(values, mask, top)
        one = _fill_tensor(1, total)
        out = torch.log(torch.where(specified, total, one)) + top
        return zero_unspecified(out, specified)

    def _torch_softmax(self, values: torch.Tensor, mask: torch.Tensor,
                       log: bool) -> torch.Tensor:
        # The shift cancels in value and gradient; detaching it saves a backward pass. A +inf
        # or NaN maximum is kept: the whole group is NaN, as torch.softmax gives.
        top = self.masked_reduce(values, mask, "amax").detach()
        top = torch.where(torch.isneginf(top), _fill_tensor(0, top), top)
        # Unspecified elements are shifted to 0, not -inf, before ``exp`` (torch's CPU exp is
        # much slower on arguments that underflow) and left out of the sum.
        shifted = zero_unspecified(values - self.expand(top), mask)
        e = shifted.exp()
        total = self.expand(self.masked_reduce(e, mask, "sum"))
        return zero_unspecified(shifted - total.log() if log else e / total, mask)

    def masked_sqdev(self, values: torch.Tensor, mask: torch.Tensor,
                     center: torch.Tensor) -> torch.Tensor:
        dev = zero_unspecified(values - self.expand(center), mask)
        return self.reduce((dev * dev.conj()).real if dev.is_complex() else dev * dev, "sum")

    def masked_sumexp(self, values: torch.Tensor, mask: torch.Tensor,
                      center: torch.Tensor) -> torch.Tensor:
        # Unspecified elements are shifted to 0, not -inf, then left out of the sum: torch's
        # CPU exp is much slower on arguments that underflow. exp in place: the fill's
        # output is a new tensor that no backward reads.
        shifted = fill_unspecified(values - self.expand(center), mask, 0).exp_()
        return self.masked_reduce(shifted, mask, "sum")

    def positions(self) -> torch.Tensor:
        raise NotImplementedError

    def select(self, values: torch.Tensor, mask: torch.Tensor,
               rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def build(self, out_values: torch.Tensor, out_mask: torch.Tensor) -> Storage:
        raise NotImplementedError

    def restore(self, values: torch.Tensor) -> Storage:
        raise NotImplementedError


def reduced_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> torch.Size:
    """``shape`` with ``dims`` removed (or kept with size 1)."""
    if keepdim:
        return torch.Size(1 if d in dims else n for d, n in enumerate(shape))
    return torch.Size(n for d, n in enumerate(shape) if d not in dims)


def zero_unspecified(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, values, 0)``: exact (NaN and inf under the mask become 0)."""
    return fill_unspecified(values, mask, 0)


# Same-size integer dtypes: the bits of a fill value (``_fill_bits``).
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16, torch.int64: torch.int64, torch.int32: torch.int32,
         torch.int16: torch.int16, torch.int8: torch.int8, torch.uint8: torch.uint8}
_FILL_MIN = 1 << 12  # below this, one ``where`` call costs less than the native call


def plain_eager(values: torch.Tensor) -> bool:
    """True when ``values`` may take a forward-only CPU fast path: a CPU tensor, eager (not
    compiling), no autograd to record and no ``torch.func`` transform active (their
    wrappers would meet dtype views and host reads they cannot follow)."""
    return (values.is_cpu and not torch.compiler.is_compiling()
            and not (values.requires_grad and torch.is_grad_enabled())
            and not torch._C._are_functorch_transforms_active())


def identity(op: str, dtype: torch.dtype) -> float | int | bool:
    """The identity of ``op`` ("amax" or "amin") in ``dtype``: what an unspecified element
    reads so that it never wins.

    >>> identity("amax", torch.int8), identity("amin", torch.float32)
    (-128, inf)
    """
    if dtype == torch.bool:
        return op == "amin"
    if dtype.is_floating_point:
        return -math.inf if op == "amax" else math.inf
    info = torch.iinfo(dtype)
    return info.min if op == "amax" else info.max


def start(op: str, dtype: torch.dtype) -> float | int | bool:
    """What an unspecified element reads in a masked ``op`` reduction: 0 for "sum" and
    "sumsq", 1 for "prod", else :func:`identity`."""
    return 0 if op in ("sum", "sumsq") else 1 if op == "prod" else identity(op, dtype)


def fill_unspecified(values: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    """``torch.where(mask, values, value)``, bit for bit: unspecified elements (NaN and inf
    included) read ``value``, specified ones keep their exact bits (-0.0 and NaN payloads).

    The one exact fill: differentiable (through ``torch.where``) when ``values`` requires
    grad; otherwise, on CPU, one native pass of masked blends (``_native.fill``: ``where``
    on CPU branches on its bool condition per element); ``torch.where`` everywhere else
    (other devices, torch.compile -- Inductor fuses it --, torch.func, no native library).

    >>> fill_unspecified(torch.tensor([1., float("nan")]), torch.tensor([True, False]),
    ...                  float("-inf")).tolist()
    [1.0, -inf]
    """
    if (values.dtype in _BITS and values.numel() >= _FILL_MIN and mask.shape == values.shape
            and plain_eager(values)):
        bits = _fill_bits(value, values.dtype)
        small = _broadcast_part(mask) if mask.dtype == torch.bool else mask
        if small is not mask:  # Note [Fill of a broadcast mask]
            as_int = values.view(_BITS[values.dtype])
            if bits == 0:
                return (as_int * small).view(values.dtype)
            keep = small.to(as_int.dtype)
            return torch.addcmul((1 - keep) * bits, as_int, keep).view(values.dtype)
        out = _native.fill(values, mask, bits)
        if out is not None:
            return out
    return torch.where(mask, values, _fill_tensor(value, values))


def _fill_tensor(value: Any, values: torch.Tensor) -> torch.Tensor:
    """``value`` as a 0-d tensor of the values' dtype and device, for ``where``. Below
    ``_FILL_MIN`` elements building it is a large part of a fill's fixed cost
    (``benchmarks/profile_overhead.py --fixed``): for plain eager CPU values (no tracer to
    see a shared constant, no dispatch mode), a Python number's tensor is built once per
    dtype (keyed as ``_fill_bits``: -0.0 is not 0.0) and reused; ``where`` only reads it,
    and nothing else sees it."""
    if (type(value) in (int, float, bool) and value == value and plain_eager(values)
            and not torch._C._len_torch_dispatch_stack()):
        key = (type(value), repr(value), values.dtype)
        fill = _FILL_TENSORS.get(key)
        if fill is None:
            with torch.inference_mode(False):  # (a normal tensor, whatever the mode)
                fill = torch.full((), value, dtype=values.dtype)
            if len(_FILL_TENSORS) < 1024:
                _FILL_TENSORS[key] = fill
        return fill
    return torch.full((), value, dtype=values.dtype, device=values.device)


_FILL_TENSORS: dict[tuple, torch.Tensor] = {}  # (type, repr, dtype) -> 0-d CPU tensor


def _broadcast_part(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with its broadcast (stride 0) dims cut to size 1 (``mask`` itself if none).

    Note [Fill of a broadcast mask]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A mask expanded over some dims (an attention mask shared by heads, a product's row mask
    expanded over the output's columns) is applied to the values' bits, viewed as an
    integer of the same width, with the compacted 0/1 mask: ``bits * keep`` for a zero fill,
    ``addcmul(fill_bits * (1 - keep), bits, keep)`` for any other value (one term is always
    0, so nothing overflows). Exact (each element keeps its bits or takes the fill's), each
    stored mask element read once, vectorized; ``where`` and the native blend would walk
    the expanded bool mask element by element. Measured by
    ``python -m benchmarks.bench_training_ops`` (attention rows).
    """
    small = mask
    for d in range(mask.dim()):
        if mask.stride(d) == 0 and mask.shape[d] > 1:
            small = small.narrow(d, 0, 1)
    return small


def _fill_bits(value: Any, dtype: torch.dtype) -> int:
    """The bits of ``value`` in ``dtype`` as an integer of its width; remembered for Python
    numbers (0, 1, +-inf: the usual fills), keyed by their repr (-0.0 is not 0.0)."""
    number = type(value) in (int, float, bool) and value == value  # NaN: not remembered
    key = (type(value), repr(value), dtype) if number else None
    bits = _FILL_BITS.get(key) if number else None
    if bits is None:
        bits = torch.tensor(value, dtype=dtype).view(_BITS[dtype]).item()
        if number and len(_FILL_BITS) < 1024:
            _FILL_BITS[key] = bits
    return bits


_FILL_BITS: dict[tuple, int] = {}


def reduce_dense(values: torch.Tensor, dims: tuple[int, ...], keepdim: bool,
                 op: str) -> torch.Tensor:
    """``values`` reduced with ``op`` over ``dims`` with dense torch ops.

    ``dims=()`` reduces nothing (unlike ``torch.sum(x, ())``); size-0 reduced dims give
    0 (False for ``any``, True for ``all``) instead of torch's error for ``amax`` & co.
    """
    if not dims:
        return values.bool() if op in ("any", "all") else values
    if any(values.shape[d] == 0 for d in dims) and op != "sum":
        shape = reduced_shape(values.shape, dims, keepdim)
        if op in ("any", "all"):
            return torch.full(shape, op == "all", dtype=torch.bool, device=values.device)
        return torch.zeros(shape, dtype=values.dtype, device=values.device)
    if op in ("any", "all") and values.dtype == torch.bool and not torch.compiler.is_compiling():
        # uint8 amax/amin are vectorized; bool any/all are much slower on CPU. Inductor
        # compiles the plain any/all well and fails on the uint8 view of a bool tensor.
        small = values.view(torch.uint8)
        out = small.amax(dims, keepdim=keepdim) if op == "any" else small.amin(dims, keepdim)
        return out.view(torch.bool)
    if op == "sum":
        return values.sum(dims, keepdim=keepdim)
    if op == "amax":
        return values.amax(dims, keepdim=keepdim)
    if op == "amin":
        return values.amin(dims, keepdim=keepdim)
    if op == "any":
        return values.any(dims, keepdim=keepdim)
    if op == "all":
        return values.all(dims, keepdim=keepdim)
    if op == "prod":
        for d in sorted(dims, reverse=True):
            values = values.prod(d, keepdim=keepdim)
        return values
    raise ValueError(f"reduce: unknown op {op!r}; expected one of {OPS}")


def sort_order(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Indices along ``dim`` that put the ``mask``-ed elements first, in ascending order of
    value (NaN last, ties by position), then the others."""
    order = torch.argsort(values.detach(), dim=dim, stable=True)
    unmasked = (~mask).gather(dim, order).to(torch.uint8)
    return order.gather(dim, torch.argsort(unmasked, dim=dim, stable=True))


# The native kernels import this module: imported last, once (not in every fill).
from . import _native  # noqa: E402
