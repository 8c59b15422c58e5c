"""Joining and splitting MaskedTensors: ``cat``, ``stack``, ``split``, ``chunk``, ``unbind``,
``tensor_split`` and the composite stackers (``hstack``, ``vstack``, ``dstack``,
``column_stack``, ``atleast_*d``, ``hsplit``, ...). Masks are joined and split with the data.

Torch implements the composites in C++ on top of ``cat``/``slice``/``view``; they are
intercepted here so that they run through the layout kernels *and* get the values-level
gradient of Note [Gradients of shape ops] (the gradient keeps the input's mask and layout).
``cat`` needs MaskedTensors of one layout; sparse inputs are joined without densifying.

>>> import torch, masked_sparse as ms
>>> a = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
>>> torch.stack([a, a.flip(0)]).to_sparse_coo().get_mask().to_dense()
tensor([[ True, False],
        [False,  True]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from layouts import Storage

from .._registry import implements, op_name
from .._tensor import MaskedTensor
from .shape import REWRITES, Call, apply, masked, meta, run, unary, wrap_dim

aten = torch.ops.aten


def _tensors(tensors: Any, op: str, one_layout: bool = True) -> list[MaskedTensor]:
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{op}: expected a non-empty list of MaskedTensors")
    for t in tensors:
        if not isinstance(t, MaskedTensor):
            raise TypeError(f"{op}: every input must be a MaskedTensor, got "
                            f"{type(t).__name__}; wrap plain tensors with masked_tensor(t, "
                            f"torch.ones_like(t, dtype=torch.bool))")
    names = {t._storage.layout.name for t in tensors}
    if one_layout and len(names) > 1:
        raise ValueError(f"{op}: MaskedTensor inputs must share one layout, got "
                         f"{sorted(names)}; convert with .to_dense() / .to_sparse_coo() first")
    return tensors


def _no_out(out: Any, op: str) -> None:
    if out is not None:
        raise TypeError(f"{op}: out= is not supported for MaskedTensors (the result's mask "
                        f"and storage come from the inputs); use out = torch.{op}(tensors)")


@implements(torch.cat, torch.concat, torch.concatenate, aten.cat.default)
def _cat(op: Any, tensors: Any, dim: int = 0, *, axis: Any = None, out: Any = None) -> Any:
    _no_out(out, "cat")
    ts = _tensors(tensors, "cat")
    dim = dim if axis is None else axis
    torch.cat([meta(t) for t in ts], dim)
    return run(op, Call("cat", aten.cat.default, ts, (wrap_dim(dim, ts[0].dim()),)))


@implements(torch.stack, aten.stack.default)
def _stack(op: Any, tensors: Any, dim: int = 0, *, out: Any = None) -> Any:
    _no_out(out, "stack")
    ts = _tensors(tensors, "stack")
    torch.stack([meta(t) for t in ts], dim)
    return run(op, Call("stack", aten.stack.default, ts, (int(dim) % (ts[0].dim() + 1),)))


def _stack_rewrite(storages: list[Storage], dim: int) -> Storage:
    return apply(aten.cat.default, [apply(aten.unsqueeze.default, s, dim) for s in storages], dim)


def _pieces(op: Any, x: Any, parts: Sequence[torch.Tensor], dim: int) -> Any:
    """Split ``x`` along ``dim`` into pieces of the lengths of ``parts`` (meta tensors)."""
    d = wrap_dim(dim, x.dim())
    lengths = tuple(p.shape[d] for p in parts)
    return unary(op, op_name(op), aten.split_with_sizes.default, x, d, lengths)


@implements(torch.split, torch.Tensor.split, aten.split.Tensor, aten.split_with_sizes.default)
def _split(op: Any, tensor: Any, split_size_or_sections: Any, dim: int = 0) -> Any:
    s = split_size_or_sections
    s = int(s) if isinstance(s, (int, torch.SymInt)) else list(s)
    return _pieces(op, tensor, meta(masked(tensor, "split")).split(s, dim), dim)


@implements(torch.chunk, torch.Tensor.chunk, aten.chunk.default)
def _chunk(op: Any, input: Any, chunks: int, dim: int = 0) -> Any:
    return _pieces(op, input, meta(masked(input, "chunk")).chunk(chunks, dim), dim)


@implements(torch.unbind, torch.Tensor.unbind, aten.unbind.int)
def _unbind(op: Any, input: Any, dim: int = 0) -> Any:
    meta(masked(input, "unbind")).unbind(dim)
    return unary(op, "unbind", aten.unbind.int, input, wrap_dim(dim, input.dim()))


def _split_rewrite(s: Storage, dim: int, lengths: tuple[int, ...]) -> tuple[Storage, ...]:
    out, start = [], 0
    for n in lengths:
        out.append(apply(aten.slice.Tensor, s, dim, start, start + n, 1))
        start += n
    return tuple(out)


REWRITES[aten.stack.default] = _stack_rewrite
REWRITES[aten.split_with_sizes.default] = _split_rewrite
REWRITES[aten.unbind.int] = lambda s, dim: tuple(apply(aten.select.int, s, dim, i)
                                                  for i in range(s.shape[dim]))


# -- composites ---------------------------------------------------------------------------
@implements(torch.tensor_split, torch.Tensor.tensor_split)
def _tensor_split(op: Any, input: Any, indices_or_sections: Any, dim: int = 0) -> Any:
    parts = torch.tensor_split(meta(masked(input, "tensor_split")), indices_or_sections, dim)
    return _pieces(op, input, parts, dim)


@implements(torch.hsplit, torch.Tensor.hsplit)
def _hsplit(op: Any, input: Any, sections: Any) -> Any:
    parts = torch.hsplit(meta(masked(input, "hsplit")), sections)
    return _pieces(op, input, parts, 0 if input.dim() == 1 else 1)


@implements(torch.vsplit, torch.Tensor.vsplit)
def _vsplit(op: Any, input: Any, sections: Any) -> Any:
    return _pieces(op, input, torch.vsplit(meta(masked(input, "vsplit")), sections), 0)


@implements(torch.dsplit, torch.Tensor.dsplit)
def _dsplit(op: Any, input: Any, sections: Any) -> Any:
    return _pieces(op, input, torch.dsplit(meta(masked(input, "dsplit")), sections), 2)


def _reshape_cat(storages: list[Storage], shapes: Sequence[tuple[int, ...]],
                 dim: int) -> Storage:
    pieces = [apply(aten.reshape.default, s, shape) for s, shape in zip(storages, shapes)]
    return apply(aten.cat.default, pieces, dim)


def _reshape_each(storages: list[Storage],
                  shapes: Sequence[tuple[int, ...]]) -> tuple[Storage, ...]:
    return tuple(apply(aten.reshape.default, s, shape) for s, shape in zip(storages, shapes))


REWRITES["reshape_cat"] = _reshape_cat
REWRITES["reshape_each"] = _reshape_each


def _column(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, 1) if t.dim() < 2 else t


#: stacker -> (how it lifts each input, the dim it joins along for that many dims).
_STACKERS: dict[Any, tuple[Any, Any]] = {
    torch.hstack: (torch.atleast_1d, lambda n: 0 if n == 1 else 1),
    torch.vstack: (torch.atleast_2d, lambda n: 0),
    torch.row_stack: (torch.atleast_2d, lambda n: 0),
    torch.dstack: (torch.atleast_3d, lambda n: 2),
    torch.column_stack: (_column, lambda n: 1),
}


@implements(*_STACKERS)
def _stacker(op: Any, tensors: Any) -> Any:
    name, (lift, dim_of) = op_name(op), _STACKERS[op]
    ts = _tensors(tensors, name)
    op([meta(t) for t in ts])
    shapes = tuple(tuple(lift(meta(t)).shape) for t in ts)
    return run(op, Call(name, "reshape_cat", ts, (shapes, dim_of(len(shapes[0])))))


@implements(torch.atleast_1d, torch.atleast_2d, torch.atleast_3d)
def _atleast(op: Any, *tensors: Any) -> Any:
    name = op_name(op)
    single = len(tensors) == 1 and isinstance(tensors[0], torch.Tensor)
    ts = [masked(tensors[0], name)] if single else _tensors(
        tensors[0] if len(tensors) == 1 else tensors, name, one_layout=False)
    shapes = tuple(tuple(op(meta(t)).shape) for t in ts)
    if single:
        return unary(op, name, aten.reshape.default, ts[0], shapes[0])
    return run(op, Call(name, "reshape_each", ts, (shapes,)))
