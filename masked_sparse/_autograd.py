"""Autograd on the values: one generic Function for every op whose gradient must carry
the input's mask (reductions, ``where``, conversions, sparse shape ops, ...).

Note [Autograd on the values]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Layout kernels are written with differentiable torch ops on ``storage.values`` (index
and mask computations are side data). So an op on MaskedTensors is differentiated by
running its kernel on *leaf copies* of the input values under ``enable_grad`` and keeping
that small inner graph in the node: backward is one ``torch.autograd.grad`` call on it,
and each input gradient is rebuilt as a MaskedTensor over the input's own storage -- the
input's mask and index tensors. Unspecified output positions contribute nothing (their
incoming gradient is read as 0), which is what makes "no gradient" differ from "zero
gradient". This works unchanged for every layout, including user-registered ones. The
inner graph only references plain tensors, so no reference cycle forms with the outer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import layouts
from layouts import Kernel, Storage

from . import _func
from ._tensor import MaskedTensor, _wrap, requires_grad_of, unwrap_grad_tracking


def _as_outputs(result: Any) -> tuple[tuple[Any, ...], bool]:
    if isinstance(result, tuple) and not isinstance(result, Storage):
        return result, True
    return (result,), False


def _wrap_outputs(outs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_wrap(o) if isinstance(o, Storage) else o for o in outs)


def grad_on(grad: Any, s: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """An incoming gradient's values and mask at ``s``'s stored positions (shaped like
    ``s.values``): the one reader of gradients for every backward here.

    A MaskedTensor gradient is read with :func:`layouts.read_at` (positions it lacks are
    unspecified); a plain one -- dense, or sparse in ``s``'s layout -- carries ``s``'s mask.
    """
    grad = unwrap_grad_tracking(grad)  # Note [Functions for torch.func]
    if isinstance(grad, MaskedTensor):
        return layouts.read_at(grad._storage, s)
    if grad.layout != torch.strided:
        return s.layout.from_torch(grad, s.layout.to_torch(s, s.mask)).values, s.mask
    return s.layout.gather(s, grad).expand_as(s.values), s.mask


# torch's own message for a backward through a freed graph.
_FREED = ("Trying to backward through the graph a second time (or directly access saved "
          "tensors after they have already been freed). Saved intermediate values of the graph "
          "are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if "
          "you need to backward through the graph a second time or if you need to access saved "
          "tensors after calling backward.")


class _OnValues(_func.Function):
    # Note [Functions for torch.func]: forward takes no ctx and hands its inner graph to
    # setup_context through ``box`` (a list), which is what torch.func transforms require.
    @staticmethod
    def forward(fn: Kernel, extra: tuple, box: list, *inputs: Any) -> Any:
        carry_zero_fill = _fill.carry_zero_fill
        # ``requires_grad_of``: a MaskedTensor's property read would go through
        # ``__torch_function__`` (the flags are kept for setup_context: box).
        storages, leaves, flags = [], [], []
        for t in inputs:
            wanted = requires_grad_of(t)
            flags.append(wanted)
            if not isinstance(t, MaskedTensor):  # a plain operand: passed as a tensor
                leaf = t.detach().requires_grad_() if wanted else t
                if wanted:
                    leaves.append(leaf)
                storages.append(leaf)
                continue
            s = t._storage
            if wanted:
                leaf = carry_zero_fill(s.values, s.values.detach().requires_grad_())
                leaves.append(leaf)
                s = s.with_values(leaf)
            storages.append(s)
        prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(True)  # torch.enable_grad(), without its Python layers
        try:
            outs, is_tuple = _as_outputs(fn(storages, *extra))
        finally:
            torch._C._set_grad_enabled(prev)
        box.append((outs, leaves, flags))
        wrapped = [_wrap(o.with_values(carry_zero_fill(o.values, o.values.detach())))
                   if isinstance(o, Storage) else o for o in outs]
        return tuple(wrapped) if is_tuple else wrapped[0]

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Any) -> None:
        box, tensors = inputs[2], inputs[3:]
        ctx.outs, ctx.leaves, flags = box.pop()
        ctx.fn, ctx.extra = inputs[0], inputs[1]
        # Note [Double backward]: the inputs themselves, to differentiate the backward again.
        ctx.tensors = None if _func.active() else tensors
        if ctx.tensors is None:  # a transform's level: its own flags, not forward's
            flags = [requires_grad_of(t) for t in tensors]
        ctx.inputs = [None if not wanted else t._storage if isinstance(t, MaskedTensor) else t
                      for t, wanted in zip(tensors, flags)]
        outs = output if isinstance(output, tuple) else (output,)
        plain = [o for o in outs if not isinstance(o, MaskedTensor)]
        if plain:
            ctx.mark_non_differentiable(*plain)

    @staticmethod
    def backward(ctx, *grads: Any) -> Any:
        if ctx.outs is None:  # freed by an earlier backward without retain_graph
            raise RuntimeError(_FREED)
        if torch.is_grad_enabled() and ctx.tensors is not None:  # create_graph=True
            return (None, None, None, *_backward_with_graph(ctx.fn, ctx.extra, ctx.tensors,
                                                            ctx.outs, grads))
        outs, gvals = [], []
        for o, g in zip(ctx.outs, grads):
            if isinstance(o, Storage) and g is not None and o.values.requires_grad:
                outs.append(o.values)
                values, mask = grad_on(g, o)  # unspecified positions contribute nothing
                gvals.append(layouts.zero_unspecified(values, mask)
                             if isinstance(g, MaskedTensor) and not _all_specified(mask)
                             else values)
        # Keep the inner graph exactly as long as the outer one (retain_graph, gradcheck).
        keep = torch._C._autograd._get_current_graph_task_keep_graph()
        leaf_grads = [None] * len(ctx.leaves)
        if outs:  # Note [A family's backward without the engine], else the engine
            leaf_grads = (layouts.node_backward(outs, ctx.leaves, gvals)
                          or torch.autograd.grad(outs, ctx.leaves, gvals, allow_unused=True,
                                                 retain_graph=keep))
        it = iter(leaf_grads)
        result: list[Any] = [None, None, None]
        for s in ctx.inputs:
            if s is None:
                result.append(None)
                continue
            g = next(it)
            if not isinstance(s, Storage):  # a plain operand gets a plain gradient
                result.append(torch.zeros_like(s) if g is None else g)
                continue
            if g is None:
                g = torch.zeros_like(s.values)
            result.append(_wrap(s.with_values(g)))
        if not keep:
            ctx.outs = ctx.leaves = ctx.inputs = ctx.tensors = None  # free the inner graph now
        return tuple(result)


def _all_specified(mask: torch.Tensor) -> bool:
    return _fill.all_specified(mask)


def _backward_with_graph(fn: Kernel, extra: tuple, inputs: Sequence[Any],
                         outs: Sequence[Any], grads: Sequence[Any]) -> list[Any]:
    """The input gradients of ``fn`` as a differentiable function of the inputs and of
    ``grads`` (``create_graph=True``).

    Note [Double backward]
    ~~~~~~~~~~~~~~~~~~~~~~
    The first-order backward differentiates an inner graph built on *copies* of the input
    values, so its result does not depend on the inputs as far as autograd can see. When
    the backward itself must be differentiable (``torch.autograd.gradgradcheck``, a
    gradient penalty, hessians), the kernel runs again on values that stay connected to
    the inputs (``values_of``), the incoming gradients are read the same way, and the
    gradients are rebuilt as MaskedTensors by the differentiable ``as_masked_tensor``
    (``masked_grad``): every step is a torch op or a masked Function, so autograd
    differentiates the backward like any forward. The kernel runs twice only in this mode.
    """
    storages, wrt = [], []
    for t in inputs:
        if isinstance(t, MaskedTensor):
            s = t._storage
            if requires_grad_of(t):
                values = values_of(t)
                wrt.append(values)
                s = s.with_values(values)
            storages.append(s)
        else:
            storages.append(t)
            if t.requires_grad:
                wrt.append(t)
    with torch.enable_grad():
        new_outs, _ = _as_outputs(fn(storages, *extra))
    out_values, gvals = [], []
    for o, new, g in zip(outs, new_outs, grads):
        if isinstance(o, Storage) and g is not None and new.values.requires_grad:
            out_values.append(new.values)
            gvals.append(grad_values(g, new))
    got = iter(torch.autograd.grad(out_values, wrt, gvals, create_graph=True,
                                   allow_unused=True) if out_values else [None] * len(wrt))
    result: list[Any] = []
    for t in inputs:
        if not requires_grad_of(t):
            result.append(None)
            continue
        g = next(got)
        if isinstance(t, MaskedTensor):
            s = t._storage
            result.append(masked_grad(s, torch.zeros_like(s.values) if g is None else g))
        else:
            result.append(torch.zeros_like(t) if g is None else g)
    return result


def values_of(mt: MaskedTensor) -> torch.Tensor:
    """``mt``'s values as a tensor autograd connects to ``mt`` (Note [Double backward])."""
    return _func.Lift.apply(mt)[0]


def grad_values(grad: Any, s: Storage) -> torch.Tensor:
    """An incoming gradient's values at ``s``'s stored positions, 0 where it is unspecified;
    differentiable in ``grad`` while a backward builds a graph (Note [Double backward]).

    >>> import torch, layouts
    >>> s = layouts.get_layout("strided").from_strided(torch.zeros(3), torch.ones(3) > 0)
    >>> from masked_sparse import masked_tensor  # its unspecified values never leak
    >>> grad_values(masked_tensor(torch.tensor([5., 99., 7.]),
    ...                           torch.tensor([True, False, True])), s).tolist()
    [5.0, 0.0, 7.0]
    """
    if not isinstance(grad, MaskedTensor):
        if grad.layout != torch.strided and grad.requires_grad:
            grad = grad.to_dense()  # torch's sparse accessors would cut the graph
        values, mask = grad_on(grad, s)
    else:
        g = grad._storage
        data = values_of(grad) if torch.is_grad_enabled() else g.values
        values, mask = layouts.read_at(g.with_values(data), s)
    if mask is s.mask:
        return values
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_grad(s: Storage, values: torch.Tensor) -> MaskedTensor:
    """A gradient over ``s``'s mask and index with ``values``: differentiable in ``values``
    while a backward builds a graph (Note [Double backward]), else a plain wrap."""
    if torch._C._functorch.is_batchedtensor(values):
        raise NotImplementedError(
            "torch.func.jacrev / vmap of a vjp with respect to a MaskedTensor argument: a "
            "batch of masked gradients has no MaskedTensor form here; take the Jacobian with "
            "respect to the data, ms.as_masked_tensor(x, mask) inside the function")
    if torch.is_grad_enabled() and values.requires_grad:
        from ._construct import masked_over

        if _func.active() and not _func.builds_under_transforms(s.layout):
            return _compressed_grad_under_func(s, values)
        return masked_over(s.layout.to_torch(s, values), s.layout.to_torch(s, s.mask))
    return _wrap(s.with_values(values))


def _compressed_grad_under_func(s: Storage, values: torch.Tensor) -> MaskedTensor:
    """:func:`masked_grad` of a compressed layout inside a ``torch.func`` transform, which
    cannot build a torch CSR / CSC / BSR tensor over its tracked values: built in COO (a
    torch sparse tensor it can build) and converted back, differentiably."""
    from ._construct import masked_over
    from .ops.conversion import to_layout

    coo = s.layout.to_coo(s.with_values(values))
    mt = masked_over(coo.layout.to_torch(coo, coo.values), coo.layout.to_torch(coo, coo.mask))
    return to_layout(_func.lift(mt), s.layout, **s.layout.options_of(s))


def on_values(fn: Kernel, inputs: Sequence[MaskedTensor], *extra: Any) -> Any:
    """Run ``fn(storages, *extra)`` and wrap its Storage outputs as MaskedTensors.

    ``fn`` must compute output values with differentiable torch ops on the input values;
    then gradients flow to the inputs as MaskedTensors with the inputs' masks. Plain
    tensors among ``inputs`` reach ``fn`` as they are and get plain gradients (the operand
    of a matrix product). Outputs that are plain tensors (indices, counts) are not
    differentiable.
    """
    if torch.is_grad_enabled():
        for t in inputs:
            if requires_grad_of(t):
                return _OnValues.apply(fn, extra, [], *inputs)
    # No gradient needed: the kernel's outputs are wrapped as they are, no graph is built.
    out = fn([t._storage if isinstance(t, MaskedTensor) else t for t in inputs], *extra)
    if isinstance(out, Storage):
        return _wrap(out)
    if isinstance(out, tuple):
        return _wrap_outputs(out)
    return out


# The fills live with the ops, which import this module: imported last, once (an import
# inside each call costs about as much as the lookups it serves).
from .ops import _fill  # noqa: E402
