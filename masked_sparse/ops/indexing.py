"""Indexing ops on MaskedTensors: ``mt[idx]``, ``index_select``, ``gather``, ``take``,
``masked_select`` and ``aten.index.Tensor``. The index is applied to data and mask alike.

- A strided masked tensor accepts every index torch accepts (the layout runs ``t[idx]`` on
  data and mask). ``mt[bool_tensor]`` and ``masked_select`` give a 1-D MaskedTensor of the
  selected elements, each keeping its own mask value.
- Other layouts get ``mt[idx]`` rewritten into ``select`` (ints), ``slice`` (slices with a
  positive step), ``unsqueeze`` (None), ``index_select`` (one 1-D integer tensor or list)
  and ``masked_select`` (one bool tensor of the full shape, dense or sparse); an index
  beyond that raises ``NotImplementedError`` with the way out.
- Index tensors must be plain tensors: an index cannot have unspecified entries.

Note [Item assignment]
~~~~~~~~~~~~~~~~~~~~~~
``mt[idx] = value`` runs torch's own ``__setitem__`` (a view of ``mt`` through the shape
kernels, then ``copy_``/``fill_``; autograd records it as for any tensor) on layouts whose
``getitem`` kernel returns views of the data -- the strided layout. ``value`` may be a
scalar or a plain tensor (written to the data; the mask is kept, as ``fill_`` does) or a
MaskedTensor whose mask matches the indexed part (as ``copy_`` requires). Sparse indexing
builds new tensors, so a write into them would be silently lost: sparse layouts raise.

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.arange(6.).view(2, 3), torch.tensor([[1, 0, 1], [0, 1, 1]]) > 0)
>>> mt.to_sparse_coo()[1, 1:]
MaskedTensor(
  [  4.0000,   5.0000]
)
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from layouts import Storage

from .._registry import implements, way_out
from .._tensor import MaskedTensor
from .shape import (
    REWRITES,
    Call,
    apply,
    check_supported,
    masked,
    meta,
    plain,
    run,
    unary,
    wrap_dim,
)

aten = torch.ops.aten


def _check_no_masked(idx: Any, op: str) -> None:
    items = idx if isinstance(idx, (tuple, list)) else (idx,)
    for it in items:
        if isinstance(it, (tuple, list)):
            _check_no_masked(it, op)
        else:
            plain(it, op, "index")


def _python_int(it: Any) -> int | None:
    """``it`` as an int when it is a Python (or NumPy) integer index, else None."""
    if isinstance(it, (bool, torch.Tensor, slice, list, tuple)) or it is None or it is Ellipsis:
        return None
    try:
        return operator.index(it)
    except TypeError:
        return None


def _dims_taken(it: Any) -> int:
    """How many dims of the indexed tensor one index item consumes, as torch counts them."""
    if it is None or isinstance(it, bool):
        return 0
    if isinstance(it, torch.Tensor) and it.dtype == torch.bool:
        return it.dim()
    return 1


def _check_int_indices(shape: torch.Size, idx: Any) -> None:
    """Raise torch's ``IndexError`` for a Python int index out of range, on the host.

    Note [Int indices are checked first]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``mt[1, 7]`` of a (4, 6) tensor would otherwise run the kernels of ``mt[1]`` first (a
    sparse layout's select reads its index tensors), and reach the bad 7 on the device,
    where an index kernel asserts instead of raising: on CUDA that loses the context. So
    every Python int of the index is checked against the shape before any kernel runs, on
    every layout. Index tensors are left to the kernels (checking them would sync); a
    malformed index (too many, two ellipses) is left to the existing errors.
    """
    items = idx if isinstance(idx, tuple) else (idx,)
    if sum(it is Ellipsis for it in items) > 1:
        return
    taken = [_dims_taken(it) for it in items]
    if sum(taken) > len(shape):
        return
    d = 0
    for k, (it, n) in enumerate(zip(items, taken)):
        if it is Ellipsis:  # the items after it index the last dims
            d = len(shape) - sum(taken[k + 1:])
            continue
        i = _python_int(it)
        if i is not None and not -shape[d] <= i < shape[d]:
            raise IndexError(f"index {i} is out of bounds for dimension {d} with size "
                             f"{shape[d]}")
        d += n


@implements(torch.Tensor.__getitem__)
def _getitem(op: Any, self: Any, idx: Any) -> Any:
    _check_no_masked(idx, "__getitem__")
    mt = masked(self, "__getitem__")
    _check_int_indices(mt.shape, idx)  # Note [Int indices are checked first]
    return run(op, Call("getitem", torch.Tensor.__getitem__, [mt], (idx,)))


@implements(aten.index.Tensor)
def _index(op: Any, self: Any, indices: Any) -> Any:
    _check_no_masked(list(indices), "index")
    return unary(op, "index", aten.index.Tensor, self, list(indices))


def _unsupported_index(s: Storage, why: str) -> NotImplementedError:
    ways = way_out(lambda lay: torch.Tensor.__getitem__ in lay.shape_ops)
    return NotImplementedError(f"MaskedTensor[{s.layout.name}] getitem: {why} is not supported "
                               f"for this layout; {ways}")


def _is_int_scalar(it: Any) -> bool:
    return isinstance(it, torch.Tensor) and it.dim() == 0 and not it.dtype.is_floating_point \
        and it.dtype != torch.bool


def _getitem_rewrite(s: Storage, idx: Any) -> Storage:
    """``storage[idx]`` through ``select``/``slice``/``unsqueeze``/``index_select``."""
    items = idx if isinstance(idx, tuple) else (idx,)
    items = tuple(torch.tensor(it, device=s.values.device) if isinstance(it, list) else it
                  for it in items)
    tensors = [it for it in items if isinstance(it, torch.Tensor) and not _is_int_scalar(it)]
    ndim = len(s.shape)
    if len(items) == 1 and tensors and tensors[0].dtype == torch.bool:
        mask = tensors[0]
        if tuple(mask.shape) != tuple(s.shape):
            raise _unsupported_index(s, f"a bool index of shape {tuple(mask.shape)} (not the "
                                        f"full shape {tuple(s.shape)})")
        return apply(aten.masked_select.default, s, mask, op="getitem")
    if len(tensors) > 1 or any(t.dim() != 1 or t.dtype == torch.bool for t in tensors):
        raise _unsupported_index(s, "an index with several, multi-dimensional or bool tensors")
    if any(isinstance(it, bool) for it in items):
        raise _unsupported_index(s, "a Python bool index")
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded: list[Any] = []
    for it in items:
        expanded.extend([slice(None)] * (ndim - consumed) if it is Ellipsis else [it])
    d, out_dim, new_dims = 0, 0, []
    for it in expanded:
        if it is None:  # unsqueezed last, so that selecting every dim always ends the same way
            new_dims.append(out_dim)
            out_dim += 1
            continue
        if isinstance(it, slice) or (isinstance(it, torch.Tensor) and it.dim() == 1):
            out_dim += 1  # a dim that stays
        if isinstance(it, slice):
            size = s.shape[d]
            start, stop, step = it.indices(size)
            if step <= 0:
                raise ValueError("getitem: step must be greater than zero (use .flip() to "
                                 "reverse)")
            if (start, max(stop, start), step) != (0, size, 1):
                s = apply(aten.slice.Tensor, s, d, start, max(stop, start), step, op="getitem")
            d += 1
        elif isinstance(it, torch.Tensor) and it.dim() == 1:
            index = _checked_index(it.long(), s.shape[d], wrap_negative=True)
            s = apply(aten.index_select.default, s, d, index, op="getitem")
            d += 1
        else:
            i, size = operator.index(it), s.shape[d]
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            s = apply(aten.select.int, s, d, i % size, op="getitem")
    for dim in new_dims:
        s = apply(aten.unsqueeze.default, s, dim, op="getitem")
    return s


def _checked_index(index: torch.Tensor, size: int, wrap_negative: bool) -> torch.Tensor:
    if index.dtype.is_floating_point or index.dtype in (torch.bool, torch.complex64,
                                                        torch.complex128):
        raise TypeError(f"index tensors must be integer tensors, got {index.dtype}")
    index = index.reshape(-1).long()
    if wrap_negative:
        index = torch.where(index < 0, index + size, index)
    if index.numel() and (bool((index < 0).any()) or bool((index >= size).any())):
        raise IndexError(f"index out of range for a dimension of size {size}")
    return index


def _index_rewrite(s: Storage, indices: list) -> Storage:
    idx = tuple(slice(None) if i is None else i for i in indices)
    return _getitem_rewrite(s, idx)


@implements(torch.Tensor.__setitem__)
def _setitem(op: Any, self: Any, idx: Any, value: Any) -> None:
    if not isinstance(self, MaskedTensor) and isinstance(value, MaskedTensor):
        _setitem_plain(self, idx, value)
        return
    mt = masked(self, "__setitem__")
    _check_no_masked(idx, "__setitem__")
    _check_int_indices(mt.shape, idx)  # Note [Int indices are checked first]
    check_supported("setitem", [mt])
    layout = mt._storage.layout
    if torch.Tensor.__getitem__ not in layout.shape_ops:  # Note [Item assignment]
        raise NotImplementedError(f"MaskedTensor[{layout.name}] setitem: this layout's "
                                  f"indexing does not return views of its data; assign into "
                                  f"mt.to_dense() instead")
    with DisableTorchFunctionSubclass():
        torch.Tensor.__setitem__(mt, idx, value)


def _setitem_plain(self: torch.Tensor, idx: Any, value: MaskedTensor) -> None:
    """``plain[idx] = mt``: the specified elements of ``mt`` are written, the others leave
    ``plain`` as it was (numpy.ma writes its masked elements' arbitrary data instead).

    Note [Masked values into plain tensors]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    An unspecified element has no value to write, so it writes nothing; the target keeps
    its own. This is how ``torch.autograd.gradcheck`` fills its plain Jacobian from a masked
    gradient: the zeros it allocated stay where the gradient is unspecified, which is the
    "no gradient" of a Jacobian (Note [Plain gradients for plain leaves]).
    """
    dense = value if not value._storage.index else value.to_dense()
    s = dense._storage
    with DisableTorchFunctionSubclass():
        old = self[idx]
        torch.Tensor.__setitem__(self, idx, torch.where(s.mask, s.values.to(self.dtype), old))


REWRITES[torch.Tensor.__getitem__] = _getitem_rewrite
REWRITES[aten.index.Tensor] = _index_rewrite


@implements(torch.index_select, torch.Tensor.index_select, aten.index_select.default)
def _index_select(op: Any, input: Any, dim: int, index: Any) -> Any:
    plain(index, "index_select", "index")
    meta(masked(input, "index_select")).index_select(dim, index.to("meta"))
    d = wrap_dim(dim, input.dim())
    size = input.shape[d] if input.dim() else 1
    index = _checked_index(index, size, False)
    return unary(op, "index_select", aten.index_select.default, input, d, index)


@implements(torch.gather, torch.Tensor.gather, aten.gather.default)
def _gather(op: Any, input: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    plain(index, "gather", "index")
    meta(masked(input, "gather")).gather(dim, index.to("meta"))
    return unary(op, "gather", aten.gather.default, input, wrap_dim(dim, input.dim()), index)


@implements(torch.take, torch.Tensor.take, aten.take.default)
def _take(op: Any, input: Any, index: Any) -> Any:
    plain(index, "take", "index")
    return unary(op, "take", aten.take.default, input, index)


@implements(torch.masked_select, torch.Tensor.masked_select, aten.masked_select.default)
def _masked_select(op: Any, input: Any, mask: Any) -> Any:
    plain(mask, "masked_select", "mask")
    masked(input, "masked_select")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"masked_select: the mask must be a bool tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    try:
        ok = torch.broadcast_shapes(mask.shape, input.shape) == input.shape
    except RuntimeError:
        ok = False
    if not ok or (mask.layout != torch.strided and mask.shape != input.shape):
        raise ValueError(f"masked_select: the bool mask of shape {tuple(mask.shape)} must "
                         f"broadcast to the MaskedTensor's shape {tuple(input.shape)}")
    return unary(op, "masked_select", aten.masked_select.default, input, mask)


