"""The per-head product: one sparse index, several heads of values (a hybrid COO storage).

``per_head_mm(coo, values, dense)`` is ``out[i, h, f] = sum_j S[i, j, h] * dense[j, h, f]``
for a 2-D COO storage ``S`` whose values have dense dims ``h`` (the heads): the product of
graph attention with ``H`` heads over one set of edges, the index stored and read once.

Note [The per-head product's kernels]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Two raw operations make the product and both its gradients. Entry ``e`` joins output line
``keep[e]`` to input line ``summed[e]`` (the rows and the columns of the index: ``S @ d``;
the other way round: ``S.T @ d``):

- ``mm``: ``out[keep[e], h, :] += v[e, h] * d[summed[e], h, :]``, the product; with ``keep``
  and ``summed`` swapped it is the gradient of ``d``;
- ``dot``: ``out[e, h] = sum_f a[keep[e], h, f] * b[summed[e], h, f]``, the gradient of the
  values (the output gradient and ``d`` read at the entry's two ends: a sampled dot).

Both take the ``(2, nnz)`` index itself and ``contract``, the row that is ``summed``: the
native kernels read its two rows in place, where they lie in the index's memory.

:class:`_Product` and :class:`_SampledDot` are autograd Functions whose backwards are each
other, so a second derivative composes. Each raw operation has an implementation per device:

- CPU, with the native kernels loaded: one C loop over the entries (``ms_per_head_mm`` and
  ``ms_per_head_dot`` in ``_native.c``), which never forms the ``(nnz, H, F)`` terms: composed
  from torch ops, the product's gather, multiply and ``index_add`` of those terms cost ten
  times a CSR matrix product's time, and its backward as much again;
- elsewhere (other devices, the native kernels off): torch ops with no host sync -- gather
  ``d`` at ``summed``, multiply, then a segment sum over the sorted rows where the device
  table says it beats ``index_add`` (narrow lines), else ``index_add``.

Under torch.compile and torch.func transforms the torch ops run without the Functions (they
have no vmap rule), differentiated by autograd.

>>> import torch, layouts
>>> coo = layouts.get_layout("sparse_coo")
>>> values = torch.tensor([[1., 10.], [2., 20.]])  # 2 stored entries x 2 heads
>>> index = torch.tensor([[0, 1], [0, 1]])          # at (0, 0) and (1, 1)
>>> s = coo.build((index,), values, values > 0, torch.Size([2, 2, 2]))
>>> per_head_mm(s, s.values, torch.ones(2, 2, 1)).flatten().tolist()
[1.0, 10.0, 2.0, 20.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import _native
from ._index import cached, crow_from_rows
from .kernels import _device_table
from .registry import Storage

Offsets = Callable[[], torch.Tensor] | None  # the row pointers of sorted ``keep``, on demand


def per_head_mm(coo: Storage, values: torch.Tensor, dense: torch.Tensor, *,
                contract: int = 1) -> torch.Tensor:
    """``out[i, h..., f...] = sum_j S[i, j, h...] * dense[j, h..., f...]`` for a 2-D COO
    storage ``S`` with dense dims ``h...`` (module docstring).

    ``values`` are the storage's values as the caller wants them read (unspecified ones
    zeroed); ``contract`` is the sparse dim summed over (1: ``S @ dense`` per head, 0:
    ``S.T @ dense``). O(nnz * numel(h, f)), the index read once; the result has ``dense``'s
    dtype and is differentiable with respect to ``values`` and ``dense`` (Note [The per-head
    product's kernels]).
    """
    (indices,) = coo.index
    n_keep = coo.shape[1 - contract]
    # The rows of a coalesced COO index are sorted: their pointers, kept per index tensor.
    offsets = ((lambda: cached(indices, "row pointers",
                               lambda: crow_from_rows(indices[0], n_keep)))
               if contract == 1 else None)
    if not _records(values, dense):
        return _mm(indices, contract, n_keep, values, dense, offsets)
    return _Product.apply(indices, contract, n_keep, values, dense, offsets)


def per_head_dot(coo: Storage, grad: torch.Tensor, dense: torch.Tensor, *,
                 contract: int = 1) -> torch.Tensor:
    """The gradient of :func:`per_head_mm`'s values: per stored entry and head, the dot
    product over the features of ``grad`` (the output's gradient) at the entry's kept line
    and ``dense`` at its summed line; ``(nnz, h...)``, differentiable in both (Note [The
    per-head product's kernels]).

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> s = coo.build((torch.tensor([[0, 1], [1, 0]]),), torch.ones(2, 1),
    ...               torch.ones(2, 1, dtype=torch.bool), torch.Size([2, 2, 1]))
    >>> grad, dense = torch.ones(2, 1, 3), torch.arange(6.).view(2, 1, 3)
    >>> per_head_dot(s, grad, dense).flatten().tolist()  # rows 0, 1 read columns 1, 0
    [12.0, 3.0]
    """
    (indices,) = coo.index
    heads = coo.values.dim() - 1
    if not _records(grad, dense):
        return _dot(indices, contract, grad, dense, heads)
    return _SampledDot.apply(indices, contract, grad, dense, heads)


def _records(x: torch.Tensor, y: torch.Tensor) -> bool:
    """True where the raw operation runs as its Function: a gradient is wanted and no
    tracer runs (under torch.compile and torch.func the torch ops are differentiated as
    they are: the Functions have no vmap rule); elsewhere nothing is recorded."""
    return (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


def per_head_specified(coo: Storage, *, contract: int = 1,
                       features: tuple[int, ...] = ()) -> torch.Tensor:
    """Which output lines of :func:`per_head_mm` hold a term, per head: ``(lines, h...)``
    bool, True where line ``i`` (a row; ``contract=0``: a column) has a specified entry for
    head ``h``; with ``features``, repeated over them (``(lines, h..., *features)``, the
    mask of the product's output, contiguous). Computed once per index, mask and features
    (cached on both).

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> mask = torch.tensor([[True, False], [False, False]])  # 2 entries x 2 heads
    >>> s = coo.build((torch.tensor([[0, 1], [0, 1]]),), mask.double(), mask,
    ...               torch.Size([2, 2, 2]))
    >>> per_head_specified(s).tolist()
    [[True, False], [False, False]]
    """
    (indices,) = coo.index
    mask = coo.mask

    def count() -> torch.Tensor:
        hits = torch.zeros((coo.shape[1 - contract],) + tuple(mask.shape[1:]),
                           dtype=torch.int32, device=mask.device)
        hits = hits.index_add_(0, indices[1 - contract], mask.to(torch.int32)) > 0
        if not features:
            return hits
        shape = hits.shape + (1,) * len(features)
        return hits.reshape(shape).expand(hits.shape + tuple(features)).contiguous()

    return cached(indices, ("per-head lines", contract, features), count, data=mask)


class _Product(torch.autograd.Function):
    """``mm`` (Note [The per-head product's kernels]) over the entries of ``indices`` (a
    ``(2, nnz)`` COO index, ``contract`` its summed row): differentiable in ``values`` and
    ``dense``, its backward a :class:`_SampledDot` and a swapped :class:`_Product`."""

    @staticmethod
    def forward(ctx, indices: torch.Tensor, contract: int, n_keep: int,
                values: torch.Tensor, dense: torch.Tensor, offsets: Offsets) -> torch.Tensor:
        ctx.save_for_backward(indices, values, dense)
        ctx.contract = contract
        return _mm(indices, contract, n_keep, values, dense, offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        indices, values, dense = ctx.saved_tensors
        contract = ctx.contract
        grad_values = grad_dense = None
        if ctx.needs_input_grad[3]:
            grad_values = _SampledDot.apply(indices, contract, grad, dense, values.dim() - 1)
            grad_values = grad_values.to(values.dtype)
        if ctx.needs_input_grad[4]:
            grad_dense = _Product.apply(indices, 1 - contract, dense.shape[0], values, grad,
                                        None)
        return None, None, None, grad_values, grad_dense, None


class _SampledDot(torch.autograd.Function):
    """``dot`` (Note [The per-head product's kernels]): ``(nnz, h...)`` from ``a`` and ``b``
    of shape ``(lines, h..., f...)`` with ``heads`` dims ``h``; differentiable in both."""

    @staticmethod
    def forward(ctx, indices: torch.Tensor, contract: int, a: torch.Tensor,
                b: torch.Tensor, heads: int) -> torch.Tensor:
        ctx.save_for_backward(indices, a, b)
        ctx.contract = contract
        return _dot(indices, contract, a, b, heads)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        indices, a, b = ctx.saved_tensors
        contract = ctx.contract
        grad_a = grad_b = None
        if ctx.needs_input_grad[2]:
            grad_a = _Product.apply(indices, contract, a.shape[0], grad.to(b.dtype), b, None)
        if ctx.needs_input_grad[3]:
            grad_b = _Product.apply(indices, 1 - contract, b.shape[0], grad.to(a.dtype), a,
                                    None)
        return None, None, grad_a, grad_b, None


def _mm(indices: torch.Tensor, contract: int, n_keep: int, values: torch.Tensor,
        dense: torch.Tensor, offsets: Offsets) -> torch.Tensor:
    """The raw ``mm`` on ``values``' device: native on the CPU, torch ops elsewhere.
    Entry ``e`` joins output line ``indices[1 - contract, e]`` to input line
    ``indices[contract, e]``."""
    shape = (n_keep,) + dense.shape[1:]
    kernel = _native_kernel("mm", values, dense, indices)
    if kernel is not None:
        heads = math.prod(values.shape[1:])
        out = dense.new_zeros(*shape)  # (unpacked: torch parses a Size argument slowly)
        _run(kernel, indices, contract, n_keep, dense.shape[0], values, dense, heads, out)
        return out
    keep, summed = indices[1 - contract], indices[contract]
    free = dense.dim() - values.dim()
    terms = values.reshape(values.shape + (1,) * free) * dense.index_select(0, summed)
    if offsets is not None and _sums_along_rows(terms):
        flat = terms.reshape(terms.shape[0], -1).to(dense.dtype)
        return torch.segment_reduce(flat, "sum", offsets=offsets(), unsafe=True).view(shape)
    return dense.new_zeros(shape).index_add(0, keep, terms.to(dense.dtype))


def _dot(indices: torch.Tensor, contract: int, a: torch.Tensor, b: torch.Tensor,
         heads: int) -> torch.Tensor:
    """The raw ``dot`` on ``a``'s device: native on the CPU, torch ops elsewhere (``a`` read
    at ``indices[1 - contract]``, ``b`` at ``indices[contract]``)."""
    shape = (indices.shape[1],) + a.shape[1:1 + heads]
    kernel = _native_kernel("dot", a, b, indices)
    if kernel is not None:
        out = a.new_empty(*shape)
        _run(kernel, indices, contract, a.shape[0], b.shape[0], a, b, math.prod(shape[1:]),
             out)
        return out
    terms = a.index_select(0, indices[1 - contract]) * b.index_select(0, indices[contract])
    if terms.dim() == 1 + heads:  # no feature dims
        return terms
    return terms.flatten(1 + heads).sum(-1)


def _native_kernel(kind: str, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor):
    """The C kernel for ``x`` and ``y``, or None where it does not apply: plain CPU tensors
    of one float dtype and an int64 index, eager, no dispatch mode, the library loaded."""
    if (type(x) is not torch.Tensor or type(y) is not torch.Tensor or not x.is_cpu
            or not y.is_cpu or x.dtype is not y.dtype or indices.dtype is not torch.long
            or _native._modes_active() or _native._library() is None):
        return None
    return _native._PER_HEAD.get((kind, x.dtype))


def _run(kernel, indices: torch.Tensor, contract: int, n_keep: int, n_summed: int,
         x: torch.Tensor, y: torch.Tensor, heads: int, out: torch.Tensor) -> None:
    """The kernel over the entries of ``indices``: its two rows are read in place, at their
    addresses in the contiguous index (no tensor per row)."""
    indices, x, y = _native.contiguous(indices), _native.contiguous(x), _native.contiguous(y)
    row = indices.shape[1] * indices.element_size()  # (bytes)
    at = indices.data_ptr()
    width = math.prod(y.shape[1:]) // heads if heads else 0
    status = kernel(at + (1 - contract) * row, at + contract * row, indices.shape[1], n_keep,
                    n_summed, x.data_ptr(), y.data_ptr(), heads, width, out.data_ptr())
    if status != 0:
        raise _native.IndexOutOfRange(
            f"per-head product: an index of the sparse operand is out of range (rows in "
            f"[0, {n_keep}) and columns in [0, {n_summed}) expected); the sparse index was "
            f"modified after construction: rebuild the tensor from a valid index")


#: The widest row (heads x features) a segment sum takes: ``segment_reduce`` walks the
#: columns one by one, so past a few dozen columns it loses to ``index_add`` (measured on
#: CPU at ``python -m benchmarks.bench_graph``'s sizes; the crossover lies between 24 and 32).
_SEGMENT_WIDEST = 24


def _sums_along_rows(terms: torch.Tensor) -> bool:
    """True where a segment sum over the rows is the device's faster raw kernel and runs:
    float32/64, narrow rows, eager (``segment_reduce`` has no batching rule for torch.func
    transforms)."""
    return (terms.dtype in (torch.float32, torch.float64) and terms.shape[0] > 0
            and terms[0].numel() <= _SEGMENT_WIDEST
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and _device_table.kernel("sum", "lines", terms.device, terms.numel()) == "segment")
