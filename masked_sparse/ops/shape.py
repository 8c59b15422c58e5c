"""Shape and movement ops on MaskedTensors of every layout: the mask follows the data.

Every op here moves elements without changing them, so its masked semantics are simple:
apply the same op to the data and to the mask. What differs per layout is only how the
storage is moved; that lives in the layout's ``shape_ops`` table (``layouts/_shape_*.py``).

Note [Shape op signatures]
~~~~~~~~~~~~~~~~~~~~~~~~~~
The core parses torch's many calling conventions (``x.view(2, 3)``, ``x.view((2, 3))``,
``torch.transpose(x, -1, 0)``, ...), checks them the way torch does (by running the op on
a ``meta`` tensor of the same shape, so errors are torch's own) and calls the layout
kernel ``shape_ops[overload](storage, *args)`` with *normalized* arguments: every dim is in
``[0, ndim)``, every shape is fully resolved (no ``-1``), every index is in range. The table
is keyed by exact aten overloads (``Tensor.__getitem__`` for Python indexing, which has none):

==================================  ===================================================
key                                 normalized arguments
==================================  ===================================================
``view.default`` / ``reshape``      ``shape`` (tuple) ; ``view.dtype``: ``dtype``
``permute.default``                 ``dims`` (tuple, a permutation)
``transpose.int``                   ``dim0, dim1``
``select.int``                      ``dim, index`` (``0 <= index < size``)
``slice.Tensor``                    ``dim, start, end, step`` (``0 <= start <= end <= size``)
``index_select.default``            ``dim, index`` (1-D int64, entries in ``[0, size)``)
``unsqueeze.default``               ``dim`` (in ``[0, ndim]``)
``squeeze.dims``                    ``dims`` (tuple of dims of size 1, not empty)
``expand.default`` / ``repeat``     ``shape`` (resolved) / ``repeats`` (tuple)
``flip.default`` / ``roll``         ``dims`` / ``shifts, dims`` (``dims`` may be empty)
``unfold.default``                  ``dim, size, step``
``gather.default`` / ``take``       ``dim, index`` / ``index``
``masked_select.default``           ``index`` (plain bool tensor broadcastable to the shape)
``index.Tensor``                    ``indices`` (a list of optional tensors)
``Tensor.__getitem__``              ``idx`` (a Python index holding no MaskedTensor)
``cat.default`` / ``stack``         a *list* of storages, then ``dim``
``split_with_sizes.default``        ``dim, lengths`` (consecutive pieces; a tuple result)
``unbind.int``                      ``dim`` (a tuple result)
==================================  ===================================================

A layout without a kernel for an op still gets it when it can be rewritten with other
shape ops (``REWRITES``: ``stack`` -> ``unsqueeze`` + ``cat``, ``__getitem__`` ->
``select``/``slice``/``unsqueeze``/``index_select``, ...). Otherwise, and for every op the
layout declares in its ``refuses`` table, it raises ``NotImplementedError`` naming the
layout, the op and the way out (only layouts that have the op are suggested).

Note [Gradients of shape ops]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Python-level calls (``torch.transpose``, ``Tensor.view``, ``Tensor.__getitem__``, ...) are
registered with ``@implements`` and computed through :func:`masked_sparse._autograd.on_values`:
the layout kernels move the *values* with differentiable torch ops, so the gradient is a
MaskedTensor over the input's own storage (its mask, its layout, its index tensors). The
same kernels are registered for the aten overloads (forward only), for calls that arrive
from C++ (autograd formulas, composite ops). Strided results keep torch's view semantics for
the data; sparse results are new tensors, as torch's sparse ops return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

import layouts
from layouts import Storage

from .._autograd import on_values
from .._registry import implements, is_aten, op_name, way_out
from .._tensor import MaskedTensor, _wrap

aten = torch.ops.aten

#: Shape ops computed from other shape ops for layouts without their own kernel.
REWRITES: dict[Any, Callable[..., Any]] = {}
#: Shape ops whose kernels take a list of storages.
LIST_OPS = frozenset({aten.cat.default, aten.stack.default, "reshape_cat", "reshape_each"})


def refusal(layout: layouts.Layout, op: str, name: Any = None) -> NotImplementedError | None:
    """The error for an op that ``layout`` declares in its ``refuses`` table, or None.

    ``op`` is the user-facing name; ``name`` the shape op it runs as (``broadcast_to`` runs
    as ``aten.expand.default``, so a layout refusing ``expand`` refuses both).
    """
    for key in (op, op_name(name) if name is not None else None):
        if key in layout.refuses:
            reason, fix = layout.refuses[key]
            return NotImplementedError(f"MaskedTensor[{layout.name}] {op}: {reason}; {fix}")
    return None


def apply(name: Any, target: Storage | list[Storage], *args: Any, op: str | None = None) -> Any:
    """Run shape op ``name`` (an aten overload) on a storage (or a list, for ``cat``/``stack``).

    Uses the layout's ``shape_ops`` kernel, else a rewrite in terms of other shape ops, else
    raises ``NotImplementedError``. ``op`` is the user-facing name used in messages.
    """
    layout = (target[0] if isinstance(target, list) else target).layout
    op = op or op_name(name)
    error = refusal(layout, op, name)
    if error is not None:
        raise error
    kernel = layout.shape_ops.get(name)
    out = kernel(target, *args) if kernel is not None else NotImplemented
    if out is not NotImplemented:
        return out
    rewrite = REWRITES.get(name)
    if rewrite is not None:
        out = rewrite(target, *args)
        return out if isinstance(target, list) else _restore(out, layout)
    raise NotImplementedError(
        f"MaskedTensor[{layout.name}] {op}: the {layout.name} layout has no kernel for it; "
        f"{way_out(lambda lay: name in lay.shape_ops and refusal(lay, op, name) is None)}")


def _restore(out: Any, layout: layouts.Layout) -> Any:
    """A rewrite's sparse result back in the input's layout, when that layout can hold it.

    A composed op on CSR may pass through COO (``mt[:, None, 3]`` unsqueezes to 3-D first);
    a 2-D result returns to CSR. A layout that cannot hold the shape says so with ValueError
    (CSR is 2-D only) and the result stays COO.
    """
    if not isinstance(out, Storage):
        return tuple(_restore(o, layout) for o in out)
    if out.layout is layout or not out.index:
        return out
    try:
        return layouts.convert(out, layout)
    except ValueError:
        return out


def check_supported(op: str, inputs: Sequence[MaskedTensor]) -> None:
    """Raise early for an op that an input's layout refuses, naming the user's op."""
    for mt in inputs:
        error = refusal(mt._storage.layout, op)
        if error is not None:
            raise error


# -- registration -----------------------------------------------------------------------
class Call(NamedTuple):
    """A parsed call: user-facing op, internal name, MaskedTensor inputs, normalized args."""

    op: str
    name: Any
    inputs: list[MaskedTensor]
    args: tuple


def _run(storages: list[Storage], call: Call) -> Any:
    target = storages if call.name in LIST_OPS else storages[0]
    return apply(call.name, target, *call.args, op=call.op)


def _wrap_out(out: Any) -> Any:
    if isinstance(out, Storage):
        return _wrap(out)
    return tuple(_wrap(o) for o in out)


def run(op: Any, call: Call) -> Any:
    """Run a parsed call: above autograd for a Python-level ``op`` (Note [Gradients of shape
    ops]), forward only for an aten overload."""
    check_supported(call.op, call.inputs)
    if is_aten(op):
        return _wrap_out(_run([m._storage for m in call.inputs], call))
    return on_values(_run, call.inputs, call)


# -- argument helpers ---------------------------------------------------------------------
def masked(x: Any, op: str) -> MaskedTensor:
    """``x`` if it is a MaskedTensor, else TypeError naming ``op``."""
    if not isinstance(x, MaskedTensor):
        raise TypeError(f"{op}: expected a MaskedTensor input, got {type(x).__name__}; a "
                        f"MaskedTensor can only be an input here, not an index or argument "
                        f"(use mt.to_tensor(value) or mt.get_mask() to pass a plain tensor)")
    return x


def plain(t: Any, op: str, what: str) -> Any:
    """``t`` unless it is a MaskedTensor (an index/argument cannot have unspecified entries)."""
    if isinstance(t, MaskedTensor):
        raise TypeError(f"{op}: the {what} must be a plain tensor, got a MaskedTensor; pass "
                        f"mt.to_tensor(value) (or mt.get_mask() for a bool index)")
    return t


def meta(mt: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``mt``'s shape: running an op on it checks arguments as torch does."""
    return torch.empty(mt.shape, dtype=mt.dtype, device="meta")


def sizes(size: Sequence[Any]) -> tuple[int, ...]:
    """``(2, 3)`` from either ``f(2, 3)`` or ``f((2, 3))``."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def wrap_dim(dim: Any, ndim: int) -> int:
    """``dim`` in ``[0, ndim)`` (call after a meta check so that it is in range)."""
    return int(dim) % max(ndim, 1)


def dims_of(dims: Any, ndim: int) -> tuple[int, ...]:
    if dims is None:
        return ()
    if isinstance(dims, (int, torch.SymInt)):
        dims = (dims,)
    return tuple(wrap_dim(d, ndim) for d in dims)


def unary(op: Any, label: str, name: str, x: Any, *args: Any) -> Any:
    """Run one-input ``op`` (named ``label`` in messages) as layout op ``name`` on ``x``."""
    return run(op, Call(label, name, [masked(x, label)], args))


# -- view / reshape family ------------------------------------------------------------
@implements(torch.Tensor.view, aten.view.default, aten.view.dtype)
def _view(op: Any, self: Any, *size: Any, dtype: Any = None) -> Any:
    if dtype is not None or (len(size) == 1 and isinstance(size[0], torch.dtype)):
        return unary(op, "view", aten.view.dtype, self, dtype if dtype is not None else size[0])
    shape = meta(self).view(sizes(size)).shape
    return unary(op, "view", aten.view.default, self, tuple(shape))


@implements(aten._unsafe_view.default)
def _unsafe_view(op: Any, self: Any, size: Any) -> Any:
    shape = tuple(meta(self).reshape(sizes((size,))).shape)
    return unary(op, "_unsafe_view", aten.reshape.default, self, shape)


@implements(torch.reshape, torch.Tensor.reshape)
def _reshape(op: Any, input: Any, *shape: Any) -> Any:
    shape = tuple(meta(input).reshape(sizes(shape)).shape)
    return unary(op, "reshape", aten.reshape.default, input, shape)


@implements(torch.Tensor.view_as)
def _view_as(op: Any, self: Any, other: Any) -> Any:
    shape = tuple(meta(self).view(other.shape).shape)
    return unary(op, "view_as", aten.view.default, self, shape)


@implements(torch.Tensor.reshape_as)
def _reshape_as(op: Any, self: Any, other: Any) -> Any:
    shape = tuple(meta(self).reshape(other.shape).shape)
    return unary(op, "reshape_as", aten.reshape.default, self, shape)


@implements(torch.flatten, torch.Tensor.flatten)
def _flatten(op: Any, input: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    shape = meta(input).flatten(start_dim, end_dim).shape
    return unary(op, "flatten", aten.reshape.default, input, tuple(shape))


@implements(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(op: Any, input: Any, dim: int, sizes: Any) -> Any:
    shape = tuple(meta(input).unflatten(dim, sizes).shape)
    return unary(op, "unflatten", aten.reshape.default, input, shape)


@implements(torch.ravel, torch.Tensor.ravel)
def _ravel(op: Any, input: Any) -> Any:
    return unary(op, "ravel", aten.reshape.default, input, (input.numel(),))


def _view_dtype(s: Storage, dtype: torch.dtype) -> Storage:
    if dtype.itemsize != s.values.dtype.itemsize:
        raise NotImplementedError(f"MaskedTensor[{s.layout.name}] view(dtype): only dtypes of "
                                  f"the same element size keep the mask's shape; use "
                                  f".to_tensor(value).view({dtype}) instead")
    return s.with_values(s.values.view(dtype))


REWRITES[aten.view.dtype] = _view_dtype
REWRITES[aten.alias.default] = lambda s: s


# -- dim permutations -----------------------------------------------------------------
@implements(torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes,
            torch.swapdims, torch.Tensor.swapdims, aten.transpose.int)
def _transpose(op: Any, input: Any, dim0: int, dim1: int) -> Any:
    meta(input).transpose(dim0, dim1)
    n = input.dim()
    dim0, dim1 = wrap_dim(dim0, n), wrap_dim(dim1, n)
    return unary(op, "transpose", aten.transpose.int, input, dim0, dim1)


@implements(torch.t, torch.Tensor.t, aten.t.default)
def _t(op: Any, input: Any) -> Any:
    meta(input).t()
    if input.dim() < 2:
        return unary(op, "t", aten.alias.default, input)
    return unary(op, "t", aten.transpose.int, input, 0, 1)


@implements(torch.permute, torch.Tensor.permute, aten.permute.default)
def _permute(op: Any, input: Any, *dims: Any) -> Any:
    meta(input).permute(sizes(dims))
    dims = dims_of(sizes(dims), input.dim())
    return unary(op, "permute", aten.permute.default, input, dims)


@implements(torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def _movedim(op: Any, input: Any, source: Any, destination: Any) -> Any:
    meta(input).movedim(source, destination)
    n = input.dim()
    src, dst = dims_of(source, n), dims_of(destination, n)
    order: list[int | None] = [None] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(n) if d not in src)
    dims = tuple(next(rest) if o is None else o for o in order)
    return unary(op, "movedim", aten.permute.default, input, dims)


@implements(torch.Tensor.T.__get__)
def _T(op: Any, input: Any) -> Any:
    return unary(op, "T", aten.permute.default, input, tuple(range(input.dim() - 1, -1, -1)))


@implements(torch.Tensor.mT.__get__)
def _mT(op: Any, input: Any) -> Any:
    _ = meta(input).mT
    n = input.dim()
    return unary(op, "mT", aten.transpose.int, input, n - 2, n - 1)


REWRITES[aten.transpose.int] = lambda s, d0, d1: apply(
    aten.permute.default, s,
    tuple(d1 if d == d0 else d0 if d == d1 else d for d in range(len(s.shape))))


# -- select / slice / narrow / squeeze / unsqueeze ------------------------------------
@implements(torch.select, torch.Tensor.select, aten.select.int)
def _select(op: Any, input: Any, dim: int, index: Any) -> Any:
    meta(input).select(dim, int(index))
    n = input.dim()
    d = wrap_dim(dim, n)
    return unary(op, "select", aten.select.int, input, d, int(index) % input.shape[d])


@implements(aten.slice.Tensor)
def _slice(op: Any, self: Any, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Any:
    d = wrap_dim(dim, self.dim())
    lo, hi, st = slice(start, end, step).indices(self.shape[d])
    return unary(op, "slice", aten.slice.Tensor, self, d, lo, max(lo, hi), st)


@implements(torch.narrow, torch.Tensor.narrow, aten.narrow.default, torch.narrow_copy,
            torch.Tensor.narrow_copy, aten.narrow_copy.default)
def _narrow(op: Any, input: Any, dim: int, start: Any, length: int) -> Any:
    meta(input).narrow(dim, int(start), int(length))
    d = wrap_dim(dim, input.dim())
    lo = int(start) % input.shape[d] if int(start) < 0 else int(start)
    return unary(op, op_name(op), aten.slice.Tensor, input, d, lo, lo + int(length), 1)


@implements(torch.unsqueeze, torch.Tensor.unsqueeze, aten.unsqueeze.default)
def _unsqueeze(op: Any, input: Any, dim: int) -> Any:
    meta(input).unsqueeze(dim)
    dim = int(dim) % (input.dim() + 1)
    return unary(op, "unsqueeze", aten.unsqueeze.default, input, dim)


@implements(torch.squeeze, torch.Tensor.squeeze, aten.squeeze.default, aten.squeeze.dim,
            aten.squeeze.dims)
def _squeeze(op: Any, input: Any, dim: Any = None) -> Any:
    if dim is not None:
        meta(input).squeeze(dim)
    n = input.dim()
    dims = range(n) if dim is None else dims_of(dim, n)
    ones = tuple(sorted({d for d in dims if input.shape[d] == 1}))
    if not ones:
        return unary(op, "squeeze", aten.alias.default, input)
    return unary(op, "squeeze", aten.squeeze.dims, input, ones)


# -- expand / repeat / flip / roll / unfold ---------------------------------------------
@implements(torch.Tensor.expand, aten.expand.default)
def _expand(op: Any, self: Any, *size: Any, implicit: bool = False) -> Any:
    shape = tuple(meta(self).expand(sizes(size)).shape)
    return unary(op, "expand", aten.expand.default, self, shape)


@implements(torch.Tensor.expand_as)
def _expand_as(op: Any, self: Any, other: Any) -> Any:
    return unary(op, "expand_as", aten.expand.default, self,
                 tuple(meta(self).expand(other.shape).shape))


@implements(torch.broadcast_to, torch.Tensor.broadcast_to)
def _broadcast_to(op: Any, input: Any, size: Any) -> Any:
    return unary(op, "broadcast_to", aten.expand.default, input,
                 tuple(meta(input).broadcast_to(sizes((size,))).shape))


@implements(torch.Tensor.repeat, aten.repeat.default)
def _repeat(op: Any, self: Any, *repeats: Any) -> Any:
    meta(self).repeat(sizes(repeats))
    return unary(op, "repeat", aten.repeat.default, self, sizes(repeats))


@implements(torch.tile, torch.Tensor.tile)
def _tile(op: Any, input: Any, dims: Any) -> Any:
    reps = sizes((dims,))
    reps = (1,) * max(0, input.dim() - len(reps)) + reps
    meta(input).repeat(reps)
    return unary(op, "tile", aten.repeat.default, input, reps)


@implements(torch.flip, torch.Tensor.flip, aten.flip.default)
def _flip(op: Any, input: Any, *dims: Any) -> Any:
    meta(input).flip(sizes(dims))
    return unary(op, "flip", aten.flip.default, input, dims_of(sizes(dims), input.dim()))


@implements(torch.fliplr, torch.Tensor.fliplr)
def _fliplr(op: Any, input: Any) -> Any:
    meta(input).fliplr()
    return unary(op, "fliplr", aten.flip.default, input, (1,))


@implements(torch.flipud, torch.Tensor.flipud)
def _flipud(op: Any, input: Any) -> Any:
    meta(input).flipud()
    return unary(op, "flipud", aten.flip.default, input, (0,))


@implements(torch.roll, torch.Tensor.roll, aten.roll.default)
def _roll(op: Any, input: Any, shifts: Any, dims: Any = None) -> Any:
    meta(input).roll(shifts, dims if dims is not None else ())
    shifts = sizes((shifts,)) if not isinstance(shifts, (int, torch.SymInt)) else (int(shifts),)
    dims = dims_of(dims, input.dim())
    return unary(op, "roll", aten.roll.default, input, shifts, dims)


@implements(torch.Tensor.unfold, aten.unfold.default)
def _unfold(op: Any, self: Any, dimension: int, size: int, step: int) -> Any:
    meta(self).unfold(dimension, size, step)
    dim = wrap_dim(dimension, self.dim())
    return unary(op, "unfold", aten.unfold.default, self, dim, int(size), int(step))


