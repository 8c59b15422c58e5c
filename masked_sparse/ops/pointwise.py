"""Pointwise ops: one generic kernel for every aten op tagged ``torch.Tag.pointwise``.

Semantics (docs/design.md, docs/semantics.md), written once here for every layout:

- unary: the op runs on the values; mask and index tensors are kept (the same objects);
- MaskedTensor with MaskedTensor: both must have the same shape and specified set, else
  ``ValueError`` naming the op; identical index/mask objects make the check free;
- MaskedTensor with a plain Tensor: the Tensor broadcasts to the masked operand and is read
  at its stored positions only (a sparse masked operand never densifies);
- Python scalars pass through.
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .._registry import Handler, aggregates, fallback, implements, op_name, way_out
from .._shapes import broadcasts_to
from .._tensor import MaskedTensor, _wrap
from . import backward_masks


def _equal_bool(x: torch.Tensor, y: torch.Tensor) -> bool:
    """``torch.equal`` for two bool tensors of one shape, 8 bytes at a time where it can.

    ``torch.equal`` costs about the same per element whatever the dtype, so a contiguous
    bool mask is compared as int64 words (an eighth of the elements). Identical bytes are equal
    masks; a difference is confirmed by ``torch.equal`` itself (non-canonical bool bytes).
    """
    if x.numel() % 8 == 0 and x.numel() and x.is_contiguous() and y.is_contiguous():
        try:
            if torch.equal(x.reshape(-1).view(torch.int64), y.reshape(-1).view(torch.int64)):
                return True
        except RuntimeError:  # storage offset not 8-byte aligned: compare as bools
            pass
    return torch.equal(x, y)


def _same_mask(a: Storage, b: Storage) -> bool:
    if a.mask is b.mask:
        return True
    if a.mask.shape != b.mask.shape:
        return False
    if a.mask.dtype == b.mask.dtype == torch.bool:
        return _equal_bool(a.mask, b.mask)
    return torch.equal(a.mask, b.mask)


def _same_index(a: Storage, b: Storage) -> bool:
    return a.same_index(b) or all(
        x is y or (x.shape == y.shape and torch.equal(x, y)) for x, y in zip(a.index, b.index))


def align(func: Any, storages: list[Storage]) -> list[Storage]:
    """Storages of matching masks, sharing the first one's index tensors.

    Raises ``ValueError`` when the shapes, layouts or specified sets differ.
    """
    first = storages[0]
    if all(s is first or (s.same_index(first) and s.mask is first.mask) for s in storages):
        return storages
    for s in storages[1:]:
        if s.layout is not first.layout or s.shape != first.shape:
            raise ValueError(
                f"{op_name(func)}: MaskedTensor operands must have the same shape and layout, "
                f"got {tuple(first.shape)} {first.layout.name} and {tuple(s.shape)} "
                f"{s.layout.name}; convert with .to_dense() / .to_sparse_coo() first")
    if torch.compiler.is_compiling() and backward_masks.in_backward():
        # Traced backward (AOT autograd): comparing masks is data-dependent, and the
        # backward rule gives the same masks whether or not they are equal.
        combined = backward_masks.combine(func, storages, Storage.same_index)
        if combined is not None:
            return combined
    if all(_same_index(first, s) and _same_mask(first, s) for s in storages):
        return [Storage(first.layout, first.index, s.values, s.mask, s.shape) for s in storages]
    if first.index:
        # Same specified set stored differently (e.g. stored but masked-out entries)?
        dropped = [layouts.drop_unspecified(s) for s in storages]
        d0 = dropped[0]
        if all(_same_index(d0, d) and _same_mask(d0, d) for d in dropped):
            return [Storage(d0.layout, d0.index, d.values, d.mask, d.shape) for d in dropped]
    combined = backward_masks.combine(func, storages, _same_index)  # Note [Masks of gradients]
    if combined is not None:
        return combined
    raise ValueError(
        f"{op_name(func)}: the masks of MaskedTensor operands must match (same specified "
        f"elements); combine them explicitly, e.g. masked_tensor(a.to_tensor(0) + "
        f"b.to_tensor(0), a.get_mask() & b.get_mask())")


def _broadcast_shape(func: Any, storages: list[Storage]) -> torch.Size:
    shapes = [tuple(s.shape) for s in storages]
    ndim = max(len(t) for t in shapes)
    out = [1] * ndim
    for t in shapes:  # torch.broadcast_shapes runs a Python reference (see broadcasts_to)
        for i, n in enumerate(t, ndim - len(t)):
            if n != 1:
                if out[i] not in (1, n):
                    break
                out[i] = n
        else:
            continue
        break
    else:
        return torch.Size(out)
    try:
        return torch.Size(torch.broadcast_shapes(*(s.shape for s in storages)))
    except RuntimeError:
        shapes = ", ".join(str(tuple(s.shape)) for s in storages)
        raise ValueError(f"{op_name(func)}: MaskedTensor operands of shapes {shapes} do not "
                         f"broadcast to one shape") from None


def broadcast(func: Any, storages: list[Storage]) -> list[Storage]:
    """Storages of operands with different shapes, all read at one result pattern.

    Note [Broadcasting masked operands]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Each mask broadcasts with its data; the result is specified where every broadcast mask
    is True. The operands that already have the result's shape must have equal masks (the
    same-shape rule, :func:`align`) and their stored pattern is the result's: the smaller
    operands are read at those stored positions only (``layouts.read_broadcast``, O(nnz)),
    and must not take away a specified element of a full-shape operand -- that would make
    ``mt / mt.sum(1, keepdim=True)`` silently drop data, so it raises ``ValueError`` with
    the count (inside a backward pass it is the intersection, Note [Masks of gradients]).
    When no operand has the result's shape (``(3, 1) + (1, 4)``) the result is the
    intersection; a sparse first operand is expanded over its specified elements first.
    The returned storages share the index tensors and the mask of the result; a broadcast
    operand's values are read in the shape of the result's values (strided: broadcastable).
    """
    shape = _broadcast_shape(func, storages)
    full = [i for i, s in enumerate(storages) if s.shape == shape]
    if full:
        aligned = align(func, [storages[i] for i in full])
        ref = aligned[0]
        done = dict(zip(full, aligned))
    else:
        first = storages[0]
        if first.index:
            first = layouts.expand_specified(first, shape)
            first = first if storages[0].layout is first.layout else _try_layout(first,
                                                                              storages[0])
        else:
            first = Storage(first.layout, (), first.values, first.mask.expand(shape), shape)
        ref, done = first, {0: first}
    mask = ref.mask
    reads = {}
    for i, s in enumerate(storages):
        if i not in done:
            reads[i] = layouts.read_broadcast(s, ref)
            if not _one_true(reads[i][1]):
                mask = mask & reads[i][1]
    if full and reads and mask is not ref.mask:
        lost = ref.mask & ~mask
        if not backward_masks.in_backward() and _any(lost):
            raise ValueError(
                f"{op_name(func)}: broadcasting MaskedTensor operands of shapes "
                f"{', '.join(str(tuple(s.shape)) for s in storages)} would lose "
                f"{int(lost.sum())} specified element(s) of the operand of shape "
                f"{tuple(shape)} (the smaller operand's mask is False there); fill it first, "
                f"e.g. small.to_tensor(value), or mask the large operand to match")
        if not backward_masks.in_backward():
            mask = ref.mask  # the same set: keep the object (Note [Index sharing])
    return [Storage(ref.layout, ref.index, done[i].values if i in done else reads[i][0], mask,
                    shape) for i in range(len(storages))]


def _one_true(mask: torch.Tensor) -> bool:
    """True for a broadcast view of a single True (``read_broadcast``'s all-specified read):
    intersecting with it changes nothing."""
    return (mask.dim() > 0 and not any(mask.stride()) and mask.numel() > 0
            and bool(mask.as_strided((), ())))  # (its one element, no indexing)


def _any(mask: torch.Tensor) -> bool:
    """``bool(mask.any())`` through a byte maximum (torch's bool ``any`` takes a slower,
    unvectorized path on CPU; measured by ``benchmarks.bench_training_ops``)."""
    return mask.numel() > 0 and bool(mask.view(torch.uint8).amax())


def _try_layout(coo: Storage, like: Storage) -> Storage:
    """``coo`` in ``like``'s layout and format when it can hold it, else COO."""
    try:
        return like.layout.from_coo_like(coo, like)
    except ValueError:
        return coo


def read_plain(func: Any, storage: Storage, t: torch.Tensor) -> torch.Tensor:
    """A plain tensor operand broadcast to the masked operand and read at its positions."""
    if t.dim() == 0:
        return t
    if t.layout != torch.strided:
        # NotImplementedError, not TypeError: operators (mt - t) turn a TypeError into
        # NotImplemented and the message would be lost.
        raise NotImplementedError(
            f"{op_name(func)}: a plain {t.layout} tensor cannot be combined with a "
            f"{storage.layout.name} MaskedTensor; wrap it with masked_tensor(t, mask) or pass "
            f"t.to_dense()")
    if not broadcasts_to(t.shape, storage.shape):
        raise ValueError(
            f"{op_name(func)}: a plain tensor of shape {tuple(t.shape)} must broadcast to the "
            f"MaskedTensor's shape {tuple(storage.shape)} (the tensor takes the MaskedTensor's "
            f"mask)")
    return storage.layout.gather(storage, t)


def _is_inplace(func: Any) -> bool:
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


def _writes_out(func: Any) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
               for a in func._schema.arguments)


def _fast_path(func: Any, args: tuple) -> Any:
    """The common out-of-place calls without the general bookkeeping, or None.

    Note [Pointwise fast path]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    Most calls are one MaskedTensor alone, with a scalar (a Python number or the 0-d
    "wrapped number" tensor torch makes of it), or with a MaskedTensor sharing its index and
    mask objects (any result of an op on it). For those ``apply_to_values`` would align
    nothing and read nothing, so this path runs the op on the values directly: same
    result, less fixed cost per op (``python -m benchmarks.profile_overhead``).
    """
    if len(args) > 2 or type(args[0]) is not MaskedTensor:
        return None
    s = args[0]._storage
    if s.layout.unary or s.layout.binary:  # the layout may have its own kernel
        return None
    if len(args) == 1:
        out = func(s.values)
    else:
        other = args[1]
        if type(other) is MaskedTensor:
            t = other._storage
            if t is not s and not (t.mask is s.mask and t.index is s.index
                                   and t.layout is s.layout):
                return None
            other = t.values
        elif isinstance(other, torch.Tensor) and (type(other) is not torch.Tensor
                                                  or other.dim() != 0):
            return None
        out = func(s.values, other)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(s.with_values(o)) for o in out)
    return _wrap(s.with_values(out))


def layout_kernel(func: Any, args: tuple) -> Any:
    """The ``unary`` / ``binary`` kernel of the first masked operand's layout, or None."""
    for a in args:
        if isinstance(a, MaskedTensor):
            layout = a._storage.layout
            if not (layout.unary or layout.binary):  # most layouts: no hashing of ``func``
                return None
            return layout.unary.get(func) or layout.binary.get(func)
    return None


def apply_to_values(func: Any, args: tuple, kwargs: dict, inplace: bool) -> Any:
    """Run ``func`` on the values of its MaskedTensor operands (see module docstring), or the
    layout's own ``unary`` / ``binary`` kernel on their storages when it has one."""
    summed = backward_masks.plain_sum(func, args, kwargs)  # Note [Masks of gradients]
    if summed is not NotImplemented:
        return summed
    if not inplace and not kwargs:
        fast = _fast_path(func, args)
        if fast is not None:
            return fast
    kernel = layout_kernel(func, args)
    masked = [a for a in args if isinstance(a, MaskedTensor)]
    masked += [v for v in kwargs.values() if isinstance(v, MaskedTensor)]
    storages = [m._storage for m in masked]
    shape = storages[0].shape
    if all(s.shape == shape for s in storages):
        aligned = align(func, storages)
    else:
        aligned = broadcast(func, storages)
        if inplace and isinstance(args[0], MaskedTensor) and args[0].shape != aligned[0].shape:
            raise ValueError(f"{op_name(func)}: in-place result of shape {tuple(args[0].shape)} "
                             f"cannot hold the broadcast shape {tuple(aligned[0].shape)}")
    by_id = {id(m): s for m, s in zip(masked, aligned)}
    ref = aligned[0]

    if inplace and not isinstance(args[0], MaskedTensor):
        raise TypeError(
            f"{op_name(func)}: an in-place op on a plain tensor cannot take a MaskedTensor "
            f"operand (the mask would be lost); use the out-of-place op, or fill first "
            f"with mt.to_tensor(value)")

    if kernel is not None:  # storages in; a plain operand read at ref's positions
        def as_storage(a: Any) -> Any:
            if isinstance(a, MaskedTensor):
                return by_id[id(a)]
            return ref.with_values(read_plain(func, ref, a)) if isinstance(a, torch.Tensor) else a

        out = kernel(*map(as_storage, args), **{k: as_storage(v) for k, v in kwargs.items()})
        if out is not NotImplemented and inplace:
            args[0]._storage = out
            return args[0]
        if out is not NotImplemented:
            return _wrap(out) if isinstance(out, Storage) else type(out)(_wrap(o) for o in out)

    def unwrap(a: Any) -> Any:
        if isinstance(a, MaskedTensor):
            return by_id[id(a)].values
        if isinstance(a, torch.Tensor):
            return read_plain(func, ref, a)
        return a

    new_args = tuple(unwrap(a) for a in args)
    new_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    if inplace:
        self = args[0]
        if by_id[id(self)] is not self._storage:
            self._storage = by_id[id(self)]
        func(*new_args, **new_kwargs)
        return self
    out = func(*new_args, **new_kwargs)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(ref.with_values(o)) for o in out)
    return _wrap(ref.with_values(out))


_aten = torch.ops.aten
# Elementwise overloads that torch does not tag ``pointwise``.
UNTAGGED_POINTWISE = frozenset({
    _aten.floor_divide.default, _aten.floor_divide.Scalar, _aten.floor_divide_.Tensor,
    _aten.floor_divide_.Scalar, _aten.fill_.Scalar, _aten.fill_.Tensor, _aten.zero_.default,
    _aten.masked_fill.Scalar, _aten.masked_fill.Tensor, _aten.masked_fill_.Scalar,
    _aten.masked_fill_.Tensor, _aten.rsub.Tensor, _aten.rsub.Scalar, _aten.frexp.Tensor,
    _aten.ldexp.Tensor, _aten.true_divide.Scalar, _aten.isreal.default,
    _aten.polar.default, _aten.hardswish.default, _aten.hardswish_.default,
    _aten.log_sigmoid_forward.default, _aten.rrelu_with_noise.default,
    _aten.rrelu_with_noise_backward.default,
})
# Forward ops whose ``<name>_backward`` is elementwise though torch tags neither pointwise.
UNTAGGED_FORWARD = frozenset({"hardswish", "log_sigmoid"})


def is_elementwise_backward(func: Any) -> bool:
    """True for the functional ``<op>_backward`` of an elementwise ``<op>``.

    Note [Elementwise backward ops]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch's derivative formulas of many activations call a fused ``<op>_backward`` kernel
    (``leaky_relu_backward(grad, self, slope, ...)``, ``softplus_backward``, ...) that
    torch does not tag ``pointwise``. Each is elementwise over tensors of the output's shape
    when its forward is: the forward is tagged ``pointwise`` (or is in
    :data:`UNTAGGED_FORWARD`), the overload is the functional one, every tensor argument
    is a plain ``Tensor`` and it returns one tensor. Served by the generic kernel, the
    gradient of a masked activation keeps its mask and layout in every layout; a new
    activation of torch's is covered without a table entry
    (``tests/autograd/test_pointwise_gradients.py`` checks the rule on torch's registry).
    """
    name = func._opname
    if not name.endswith("_backward") or func._overloadname != "default":
        return False
    forward = name[: -len("_backward")]
    if forward not in UNTAGGED_FORWARD:
        packet = getattr(_aten, forward, None)
        if packet is None or not any(torch.Tag.pointwise in getattr(packet, o).tags
                                     for o in packet.overloads()):
            return False
    schema = func._schema
    tensors = [a for a in schema.arguments if "Tensor" in str(a.type)]
    return (len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"
            and all(str(a.type) == "Tensor" and a.alias_info is None for a in tensors))


def _is_pointwise(func: Any) -> bool:
    if (torch.Tag.pointwise in func.tags or func in UNTAGGED_POINTWISE
            or is_elementwise_backward(func)):
        return True
    # Some in-place variants (abs_, ...) lack the tag that their functional variant has.
    name = func._opname
    if name.endswith("_") and not name.startswith("_"):
        packet = getattr(torch.ops.aten, name[:-1], None)
        overload = getattr(packet, func._overloadname, None) if packet is not None else None
        return overload is not None and torch.Tag.pointwise in overload.tags
    return False


def pointwise(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The generic handler of out-of-place pointwise aten ops."""
    return apply_to_values(op, args, kwargs, False)


def pointwise_(op: Any, *args: Any, **kwargs: Any) -> Any:
    """The generic handler of in-place pointwise aten ops."""
    return apply_to_values(op, args, kwargs, True)


@fallback
def resolve(func: Any, args: tuple) -> Handler:
    """The handler for an op without a table entry: the generic pointwise one, if tagged so."""
    if _is_pointwise(func) and not _writes_out(func):
        return implements(func)(pointwise_ if _is_inplace(func) else pointwise)
    if layout_kernel(func, args) is not None:  # an op only some layouts have: not cached
        return pointwise_ if _is_inplace(func) else pointwise
    if backward_masks.in_backward() and not _is_inplace(func) and not _writes_out(func):
        return backward_masks.plain_fallback  # Note [Ops without a masked kernel in backward]
    masked = [a for a in args if isinstance(a, MaskedTensor)]
    where = ", ".join(sorted({m._storage.layout.name for m in masked})) or "?"
    ways = way_out(lambda lay: func in lay.unary or func in lay.binary,
                   fill=not aggregates(func))
    raise NotImplementedError(
        f"MaskedTensor[{where}] {op_name(func)}: no kernel for this op; {ways}")
