"""``torch.where`` on MaskedTensors, in every layout.

Semantics (docs/design.md, docs/semantics.md), written once here for every layout:

- the result element at a position comes from the operand that ``cond`` chooses there, and so
  does its mask: ``mask = where(cond, mask_a, mask_b)``;
- a plain Tensor operand (or a scalar) broadcasts to the masked operand and takes its mask,
  as in binary ops; for a sparse masked operand it is read at the stored positions only;
- ``cond`` is a plain bool tensor (dense, or sparse in the operands' layout: read at their
  stored positions, absent entries read as False) or a bool MaskedTensor (positions where
  ``cond`` itself is unspecified are unspecified in the result);
- sparse masked operands must share the index pattern (their masks may differ); the result
  keeps those index tensors (the same objects).

Note [Gradient of where]
~~~~~~~~~~~~~~~~~~~~~~~~
``torch.where`` is the op where "no gradient" and "zero gradient" part ways (PyTorch issues
10729 and 52248): a position that ``cond`` does not choose from ``a`` does not depend on
``a`` at all. Plain autograd sends it a zero, and ``0 * inf`` in the chain rule before it
turns that zero into NaN. Here the gradient reaching ``a`` is a MaskedTensor over ``a``'s own
storage (its index tensors) whose mask is ``mask_a & cond & mask_grad``: positions not
chosen get *no* gradient, exactly as in ``torch.masked``, so ``where(False, a / 0, c)``
gives ``a`` a fully masked gradient, not NaN. That gradient mask is narrower than ``a``'s;
backward formulas and gradient accumulation combine it with wider masks by the rules in
:mod:`masked_sparse.ops.backward_masks`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.autograd.function import once_differentiable

import layouts
from layouts import Storage

from .. import _func
from .._autograd import grad_on
from .._registry import implements
from .._tensor import MaskedTensor, _wrap
from .plain_operands import lift_operands
from .pointwise import _same_index, read_plain

aten = torch.ops.aten
_OP = "where"


class _Operands(NamedTuple):
    """``where``'s operands read on the reference storage's values (values-shaped)."""

    ref: Storage  # the storage whose index (and shape) the result takes
    cond: torch.Tensor  # bool, broadcastable to ref.values
    cond_mask: torch.Tensor | None  # mask of a MaskedTensor cond
    a: Any  # values tensor / broadcastable plain tensor / scalar
    b: Any
    mask_a: torch.Tensor
    mask_b: torch.Tensor


def _share_index(storages: list[Storage]) -> list[Storage]:
    """Storages of one shape, layout and index pattern, re-based on the first's index objects.

    Masks may differ: only the stored positions must agree.
    """
    first = storages[0]
    for s in storages[1:]:
        if s.layout is not first.layout or s.shape != first.shape:
            raise ValueError(
                f"{_OP}: MaskedTensor operands must have the same shape and layout, got "
                f"{tuple(first.shape)} {first.layout.name} and {tuple(s.shape)} {s.layout.name}; "
                f"convert with .to_dense() / .to_sparse_coo() first")
        if not _same_index(first, s):
            raise ValueError(
                f"{_OP}: {first.layout.name} MaskedTensor operands must store the same positions "
                f"(the same index tensors; their masks may differ), got {first.values.shape[0]} "
                f"and {s.values.shape[0]} stored elements at different indices; build both with "
                f"the same indices, e.g. b = masked_tensor(<b's data at a's indices>, mask)")
    return [Storage(first.layout, first.index, s.values, s.mask, s.shape) for s in storages]


def _read_cond(cond: torch.Tensor, ref: Storage) -> torch.Tensor:
    """A plain bool ``cond`` read at ``ref``'s stored positions."""
    if cond.layout != torch.strided and ref.index and layouts.get_layout(cond.layout) is ref.layout:
        pattern = ref.layout.to_torch(ref, ref.mask)
        return ref.layout.from_torch(cond, pattern).values
    if cond.shape == ref.shape and cond.layout == torch.strided:
        return ref.layout.gather(ref, cond)
    return read_plain(aten.where.self, ref, cond)


def _operands(cond: Any, a: Any, b: Any) -> _Operands:
    if not isinstance(cond, torch.Tensor):
        raise TypeError(f"{_OP}: condition must be a bool tensor, got {type(cond).__name__}")
    if cond.dtype != torch.bool:
        raise TypeError(f"{_OP}: condition must have dtype torch.bool, got {cond.dtype}; "
                        f"pass cond.bool() or (cond != 0)")
    for x in (a, b):
        if not isinstance(x, (torch.Tensor, bool, int, float, complex)):
            raise TypeError(f"{_OP}: operands must be tensors or Python scalars, got "
                            f"{type(x).__name__}")
    ops = [cond, a, b]
    masked = [i for i, x in enumerate(ops) if isinstance(x, MaskedTensor)]
    aligned = dict(zip(masked, _share_index([ops[i]._storage for i in masked])))
    ref = aligned.get(1, aligned.get(2, aligned.get(0)))

    if 0 in aligned:
        c, cond_mask = aligned[0].values, aligned[0].mask
    else:
        c, cond_mask = _read_cond(cond, ref), None

    def read(i: int) -> tuple[Any, torch.Tensor]:
        # A plain operand takes the mask of the masked operand (of cond if neither is).
        if i in aligned:
            return aligned[i].values, aligned[i].mask
        x = ops[i]
        return (read_plain(aten.where.self, ref, x) if isinstance(x, torch.Tensor) else x,
                ref.mask)

    (va, ma), (vb, mb) = read(1), read(2)
    return _Operands(ref, c, cond_mask, va, vb, ma, mb)


def _result(o: _Operands) -> Storage:
    values = torch.where(o.cond, o.a, o.b)
    mask = torch.where(o.cond, o.mask_a, o.mask_b)
    if o.cond_mask is not None:
        mask = mask & o.cond_mask
    shape = o.ref.values.shape
    return o.ref.with_values(values.expand(shape), mask.expand(shape))


class _Where(_func.Function):
    @staticmethod
    def forward(cond: Any, a: Any, b: Any, box: list) -> MaskedTensor:
        o = _operands(cond, a, b)
        out = _result(o)
        box.append((o, out))  # for setup_context (Note [Functions for torch.func])
        return _wrap(out)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: MaskedTensor) -> None:
        cond, a, b, box = inputs
        ctx.o, ctx.out = box.pop()
        ctx.targets = [x._storage if isinstance(x, MaskedTensor) else None for x in (a, b)]
        ctx.dtypes = [x.dtype if isinstance(x, torch.Tensor) else None for x in (a, b)]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Any) -> tuple[Any, ...]:
        o, out = ctx.o, ctx.out
        gv, gmask = grad_on(grad, out)
        chosen = o.cond.expand(out.values.shape)
        if o.cond_mask is not None:
            chosen = chosen & o.cond_mask
        grads: list[Any] = [None]
        for i, (pick, own_mask) in enumerate([(chosen, o.mask_a), (~chosen, o.mask_b)]):
            if not ctx.needs_input_grad[i + 1]:
                grads.append(None)
                continue
            # Note [Gradient of where]: positions not chosen get no gradient (masked out).
            values = layouts.zero_unspecified(gv, pick).to(ctx.dtypes[i])
            mask = pick & gmask & own_mask
            base = ctx.targets[i] if ctx.targets[i] is not None else out
            grads.append(_wrap(base.with_values(values, mask)))
        return (*grads, None)


def where(condition: Any, input: Any, other: Any, *, out: Any = None) -> MaskedTensor:
    """``torch.where(condition, input, other)`` with masked semantics.

    The result takes each element -- and whether it is specified -- from the operand that
    ``condition`` chooses; a plain tensor or scalar operand takes the masked operand's mask.
    Gradients reach only the chosen, specified elements (Note [Gradient of where]).

    >>> import torch, masked_sparse as ms
    >>> a = ms.masked_tensor(torch.tensor([1., 2., 3.]), torch.tensor([True, False, True]))
    >>> torch.where(torch.tensor([True, True, False]), a, 0.)
    MaskedTensor(
      [  1.0000,       --,   0.0000]
    )
    """
    if out is not None:
        raise TypeError(f"{_OP}: out= is not supported for MaskedTensors; use the returned "
                        f"tensor")
    tensors = [x for x in (input, other) if isinstance(x, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        # Note [Plain operands get plain gradients]
        input, other = lift_operands(condition, input, other)
        return _Where.apply(condition, input, other, [])
    return _wrap(_result(_operands(condition, input, other)))


@implements(torch.where)
def _torch_where(op: Any, condition: Any, input: Any = None, other: Any = None, *,
                 out: Any = None) -> Any:
    if input is None and other is None:
        raise NotImplementedError(
            f"MaskedTensor[{condition._storage.layout.name}] where(condition): the one-argument "
            f"form (nonzero) is not supported; use condition.to_tensor(False).nonzero("
            f"as_tuple=True)")
    return where(condition, input, other, out=out)


@implements(torch.Tensor.where)
def _tensor_where(op: Any, self: Any, condition: Any, other: Any) -> MaskedTensor:
    return where(condition, self, other)


@implements(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _aten_where(op: Any, condition: Any, input: Any, other: Any) -> MaskedTensor:
    # Calls from C++ (backward formulas such as clamp's): forward only, below autograd.
    return _wrap(_result(_operands(condition, input, other)))
