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

The masked gradients live here too: reading an incoming gradient at a storage
(:func:`grad_on`, :func:`grad_values`) and building one over a storage (:func:`masked_grad`),
with the differentiable crossings between a MaskedTensor and plain tensors that they take
-- ``as_masked_tensor``'s Functions (plain data in, of the mask's layout or of another) and
:class:`Lift` (the values out, ``ms.lift``). They call each other (a backward builds its
gradient with ``as_masked_tensor``'s Function, whose own backward reads gradients): one
module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

import layouts
from layouts import Kernel, Storage

from . import _fill, _func
from ._mixed_layouts import data_storage, read_at_mask
from ._tensor import (
    MaskedTensor,
    _wrap,
    is_wrapped_masked,
    requires_grad_of,
    storage_from_tensors,
    unwrap_grad_tracking,
)


# -- masked gradients ----------------------------------------------------------------------
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
    values = s.layout.gather(s, grad)
    # (expanded only where it broadcasts: a strided gradient of the values' shape is read as
    # it is, one torch call less on every backward of ``to_tensor``)
    return (values if values.shape == s.values.shape else values.expand_as(s.values)), s.mask


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
    elif torch.is_grad_enabled():
        values, mask = layouts.read_at(grad._storage.with_values(values_of(grad)), s)
    else:
        g = grad._storage
        if (g.mask is s.mask and g.index is s.index and g.layout is s.layout
                and g.shape == s.shape):  # the pattern itself (a backward's common case)
            return g.values
        values, mask = layouts.read_at(g, s)
    if mask is s.mask:
        return values
    return layouts.zero_unspecified(values, mask)


def values_of(mt: MaskedTensor) -> torch.Tensor:
    """``mt``'s values as a tensor autograd connects to ``mt`` (Note [Double backward])."""
    return Lift.apply(mt)[0]


def masked_grad(s: Storage, values: torch.Tensor) -> MaskedTensor:
    """A gradient over ``s``'s mask and index with ``values``: differentiable in ``values``
    while a backward builds a graph (Note [Double backward]), else a plain wrap."""
    if torch._C._functorch.is_batchedtensor(values):
        raise NotImplementedError(
            "torch.func.jacrev / vmap of a vjp with respect to a MaskedTensor argument: a "
            "batch of masked gradients has no MaskedTensor form here; take the Jacobian with "
            "respect to the data, ms.as_masked_tensor(x, mask) inside the function")
    if torch.is_grad_enabled() and values.requires_grad:
        if _func.active() and not _func.builds_under_transforms(s.layout):
            return _compressed_grad_under_func(s, values)
        return masked_over(s.layout.to_torch(s, values), s.layout.to_torch(s, s.mask))
    return _wrap(s.with_values(values))


def _compressed_grad_under_func(s: Storage, values: torch.Tensor) -> MaskedTensor:
    """:func:`masked_grad` of a compressed layout inside a ``torch.func`` transform, which
    cannot build a torch CSR / CSC / BSR tensor over its tracked values: built in COO (a
    torch sparse tensor it can build) and converted back, differentiably: the lifted COO
    gradient holds values the transform tracks, so the conversion is plain torch ops on
    them, which the transform differentiates (Note [MaskedTensors in torch.func])."""
    coo = s.layout.to_coo(s.with_values(values))
    mt = masked_over(coo.layout.to_torch(coo, coo.values), coo.layout.to_torch(coo, coo.mask))
    return _wrap(layouts.convert(lift(mt)._storage, s.layout, **s.layout.options_of(s)))


# -- as_masked_tensor's Functions ----------------------------------------------------------
class _Box:
    """Hands a value from a Function's forward to its setup_context (not a pytree, so
    torch.func transforms pass it through unchanged).

    Note [as_masked_tensor's routes]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Eager: ``_AsMasked`` (its forward takes no ctx, the storage reaches ``setup_context`` in
    this box). Its gradient to ``data`` is a MaskedTensor, so derivative formulas run
    before ``data`` skip masked-out positions (PyTorch issue 4132), except for a plain leaf,
    which gets a plain ``.grad`` of its own layout, 0 where unspecified (Note [Plain
    gradients for plain leaves]): that is what gradcheck and optimizers take, and no
    formula is left to run. Neither simpler rule works: a gradient always plain brings
    PyTorch issue 4132 back, one always masked fails gradcheck. Inside a torch.func
    transform the Function is not used at all: the MaskedTensor is built over the tracked
    data (Note [MaskedTensors in torch.func]).
    """

    value: Storage
    plain_grad: bool = False  # Note [Double backward]: the gradient of data stays plain


class _AsMasked(_func.Function):
    @staticmethod
    def forward(data: torch.Tensor, mask: torch.Tensor, box: _Box) -> MaskedTensor:
        storage = storage_from_tensors(data.detach(), mask, "as_masked_tensor")
        box.value = storage
        return _wrap(storage)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: MaskedTensor) -> None:
        # Note [Functions for torch.func] in _tensor.py: under a transform ``output`` is
        # a functorch wrapper, so the storage comes through ``box``.
        ctx.storage = inputs[2].value
        ctx.to_plain_leaf = inputs[0].grad_fn is None or inputs[2].plain_grad

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        s = ctx.storage
        if torch.compiler.is_compiling():
            # Note [as_masked_tensor under torch.compile]: AOTAutograd fixes the type of
            # every gradient in the graph from the forward, where ``data`` is plain, so the
            # compiled gradient of ``data`` is a plain tensor: the masked gradient with 0
            # at unspecified positions (what eager gives after ``.to_tensor(0)``).
            return s.densify(_masked_values(s, grad), 0), None, None
        if ctx.to_plain_leaf:
            # Note [Plain gradients for plain leaves]: the gradient leaves the masked world
            # here. A leaf's ``.grad`` must have the leaf's own type and layout (gradcheck,
            # optimizers, torch.func), so it is the masked gradient with 0 where unspecified,
            # over the leaf's own index. No derivative formula runs after it, so no 0 * inf
            # can form; a non-leaf ``data`` instead gets the MaskedTensor, which keeps
            # unspecified positions out of the formulas before the leaf (PyTorch issue 4132).
            return s.layout.to_torch(s, _masked_values(s, grad)), None, None
        # The gradient reaching ``data`` carries the mask, as in torch.masked.
        if not isinstance(grad, MaskedTensor):
            grad = masked_grad(s, grad_on(grad, s)[0])
        return grad, None, None


def _masked_values(s: Storage, grad: torch.Tensor) -> torch.Tensor:
    """The incoming gradient read at ``s``'s stored positions, 0 where unspecified."""
    values = grad_values(grad, s)  # Note [Double backward]
    return layouts.zero_unspecified(values, s.mask)


def as_masked(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """``as_masked_tensor(data, mask)`` for ``data`` that requires grad, outside torch.func
    transforms (Note [as_masked_tensor's routes])."""
    return _AsMasked.apply(data, mask, _Box())


def masked_over(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """``as_masked_tensor`` for gradients built inside a backward (Note [Double backward]):
    the gradient reaching ``data`` is plain, 0 where unspecified, as for a leaf, so torch's
    formulas of the backward's own ops (broadcasts included) never meet a MaskedTensor."""
    box = _Box()
    box.plain_grad = True
    return _AsMasked.apply(data, mask, box)


class _ReadAtMask(torch.autograd.Function):
    """:func:`read_at_mask` with the plain gradient of the data (Note [The mask's layout
    wins]): the incoming gradient at the mask's specified positions, 0 elsewhere, put back
    in the data's layout."""

    @staticmethod
    def forward(ctx, data: torch.Tensor, mask: torch.Tensor) -> Any:  # type: ignore[override]
        storage = read_at_mask(data.detach(), mask)
        ctx.storage = storage
        ctx.data_storage = None if data.layout == torch.strided else data_storage(data.detach())
        return _wrap(storage)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        s = ctx.storage
        values, mask = grad_on(grad, s)
        values = layouts.zero_unspecified(values, mask & s.mask)
        d = ctx.data_storage
        if d is None:  # dense data: the gradient scattered at the mask's positions
            return s.densify(values, 0), None
        at_data, _ = layouts.read_at(s.with_values(values), d)
        return d.layout.to_torch(d, at_data), None


def as_masked_across_layouts(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """``as_masked_tensor`` of data and mask of different layouts (checked): a MaskedTensor
    of the mask's layout (Note [The mask's layout wins] in _mixed_layouts.py)."""
    if torch.is_grad_enabled() and data.requires_grad:
        return _ReadAtMask.apply(data, mask)
    return _wrap(read_at_mask(data, mask))


# -- the values out: ms.lift ---------------------------------------------------------------
class Lift(_func.Function):
    """The values and mask of a MaskedTensor, as tensors the transform tracks: the values
    differentiable (their gradient returns as a MaskedTensor over the input's storage)."""

    @staticmethod
    def forward(mt: Any) -> tuple[torch.Tensor, torch.Tensor]:
        s = mt._storage
        return s.values.view_as(s.values), s.mask

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Any) -> None:
        ctx.storage = _func.innermost(inputs[0])._storage
        ctx.lifted_shape = output[0].shape  # per example under vmap
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _: Any) -> Any:
        s = ctx.storage
        if not s.index and s.shape != ctx.lifted_shape:
            raise NotImplementedError(
                "ms.lift: per-example gradients (vmap of grad / vjp) with respect to a "
                "MaskedTensor argument have no MaskedTensor form; differentiate with respect "
                "to the data instead, ms.as_masked_tensor(x, mask) inside the function")
        if isinstance(grad, MaskedTensor):  # the values fed a masked op (double backward)
            grad = grad_values(grad, s)
        return masked_grad(s, grad)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, mt: Any) -> tuple[tuple, tuple]:
        s = mt._storage
        if s.index:  # a batch dim of the tensor is no dim of its values
            raise NotImplementedError(
                f"ms.lift under torch.func.vmap: a batch of {s.layout.name} MaskedTensors "
                f"has no per-example values tensor; vmap over the strided data instead, "
                f"ms.as_masked_tensor(x, mask).to_sparse_coo() (or to_sparse_csr(), ...) "
                f"inside the function, or leave the argument unlifted (vmap runs the "
                f"masked kernels on it as it is)")
        return (s.values.view_as(s.values), s.mask), (in_dims[0], in_dims[0])


def lift(x: Any) -> Any:
    """A MaskedTensor argument of a ``torch.func`` transform as a MaskedTensor again.

    Inside ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``vmap`` a MaskedTensor argument
    arrives wrapped in a plain-typed tensor (torch strips tensor subclasses), which has no
    MaskedTensor methods and would get torch's dense derivative formulas. ``lift`` returns a
    MaskedTensor over the transform's tracked values instead (Note [MaskedTensors in
    torch.func]); anything else is returned unchanged, so ``lift`` is harmless outside a
    transform. The gradient that reaches the argument is a MaskedTensor with its mask.

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([1., 2., 4.]), torch.tensor([True, True, False]))
    >>> torch.func.grad(lambda x: ms.lift(x).mean().to_tensor(0))(mt)
    MaskedTensor(
      [  0.5000,   0.5000,       --]
    )
    """
    if not is_wrapped_masked(x):
        return x
    s = _func.innermost(x)._storage
    values, mask = Lift.apply(x)
    return _wrap(s.layout.build(s.index, values, mask, s.shape if s.index else values.shape))


# -- differentiating a kernel on the values ------------------------------------------------
def _as_outputs(result: Any) -> tuple[tuple[Any, ...], bool]:
    if isinstance(result, tuple) and not isinstance(result, Storage):
        return result, True
    return (result,), False


def _wrap_outputs(outs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_wrap(o) if isinstance(o, Storage) else o for o in outs)


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
                             if isinstance(g, MaskedTensor) and not _fill.all_specified(mask)
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
