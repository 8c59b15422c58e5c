"""The one place that chooses how a kernel family runs (Note [Kernel families as ops]).

:func:`run` takes a family (a :class:`Family`: its implementations by device, its backward,
its custom op), the groups and the arguments, and picks:

- a tracer (torch.compile, a torch.func transform, a dispatch mode such as fake tensors or
  ``make_fx``, complex values: :func:`traced`): while torch.compile traces, the family's
  ``torch.library`` op (``masked_sparse::<family>``) where the groups are plain tensors;
  otherwise the family's torch-op implementation as plain differentiable torch ops, which
  the tracer records;
- values that require grad, with grad mode on: the family's forward recorded with its
  backward by one ``autograd.Function`` (:class:`_FamilyOp`);
- anything else (nothing to record, no tracer): the family's forward, called directly.

The forward is the implementation for the values' device -- on CPU the native kernels
where they apply, else the torch ops; on every other device the torch ops -- the very
implementations the custom op registers. The family modules' entry points
(``masked_reduce`` & co.) inline the last case as the direct call (:func:`direct`), so that
a small eager reduction pays no layer it does not need.

Note [Eager calls skip the dispatcher]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Eager code calls the implementations the custom ops register, without the custom ops: a
``torch.library`` op with ``register_autograd`` cost about four times as much per call as an
``autograd.Function`` over the same forward and backward, and without autograd its
dispatch alone cost ten times a small masked reduction's kernel
(``benchmarks/profile_overhead.py --fixed`` measures the fixed cost per call). The
compiled graph needs the op (a ctypes call cannot be traced); eager code needs only what
it registers. So there is one forward and one backward per family, reached three ways:
the direct call, the Function, the op.

Note [Observing modes]
~~~~~~~~~~~~~~~~~~~~~~
A dispatch mode usually means a tracer (fake tensors, ``make_fx``): the route records
torch ops and no native kernel runs. A mode that only watches the ops go by -- the test
suite's check that nothing syncs with the host -- declares ``observes_only = True``; the
route ignores it, so the watched call takes the route it takes without it (the native
kernels, which cannot be watched, still step aside under any mode: the watched call runs
the torch ops, the path of every other device).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

# (bound once: asked on every masked primitive; Dynamo knows them by object)
_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_modes_active = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled


def _tracing_modes() -> bool:
    """True while a dispatch mode other than an observing one is active (Note [Observing
    modes])."""
    return _modes_active() > 0 and any(not getattr(m, "observes_only", False)
                                       for m in _get_current_dispatch_mode_stack())


def traced(values: torch.Tensor) -> bool:
    """True where a tracer must see the torch ops (see the module docstring): the native
    kernels cannot serve ``values`` whatever its device, and the torch-op implementation
    runs differentiably."""
    return (_compiling() or _transforms_active() or values.is_complex()
            or (_modes_active() > 0 and _tracing_modes()))


def eager(values: torch.Tensor) -> bool:
    """True where index facts may be cached per index tensor: not tracing (a traced graph
    must not capture them), whether or not ``values`` requires grad."""
    return not (_compiling() or _transforms_active())


def direct(values: torch.Tensor) -> bool:
    """True where a family's forward is called as it is (the direct call of Note [Kernel
    families as ops]): nothing traces (:func:`traced`) and no backward is to be recorded."""
    return not (_compiling() or _transforms_active() or values.is_complex()
                or (values.requires_grad and _grad_enabled())
                or (_modes_active() > 0 and _tracing_modes()))


class Family:
    """One kernel family: ``native`` (the C kernels: CPU, or None where they do not
    apply), ``torch`` (torch ops: every device, differentiable when traced), ``forward``
    (the implementation for the values' device), ``backward`` (the masked kernels again),
    ``op`` (the family's custom op call while torch.compile traces, or None); outputs are
    tuples of tensors."""

    name = ""

    @staticmethod
    def native(g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple | None:
        raise NotImplementedError

    @staticmethod
    def torch(g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple:
        raise NotImplementedError

    @classmethod
    def forward(cls, g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple:
        """The CPU implementation (the native kernels, else the torch ops) on CPU; the torch
        ops on every other device."""
        out = cls.native(g, values, mask, *args) if values.is_cpu else None
        return out if out is not None else cls.torch(g, values, mask, *args)

    @staticmethod
    def backward(g: Any, values: torch.Tensor, mask: torch.Tensor, outs: tuple,
                 grads: tuple, *args: Any) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def op(g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple | None:
        return None


class _FamilyOp(torch.autograd.Function):
    """A family's forward, recorded with the family's backward (Note [Eager calls skip the
    dispatcher])."""

    @staticmethod
    def forward(ctx, family: type[Family], g: Any, args: tuple,  # type: ignore[override]
                values: torch.Tensor, mask: torch.Tensor) -> tuple:
        outs = family.forward(g, values, mask, *args)
        ctx.family, ctx.g, ctx.args, ctx.n_outputs = family, g, args, len(outs)
        ctx.set_materialize_grads(False)  # an output not used gets no gradient pass
        ctx.save_for_backward(values, mask, *outs)
        plain = [o for o in outs if not o.is_floating_point()]
        if plain:
            ctx.mark_non_differentiable(*plain)
        return outs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple:  # type: ignore[override]
        values, mask, *outs = ctx.saved_tensors
        grad = ctx.family.backward(ctx.g, values, mask, tuple(outs), grads, *ctx.args)
        return None, None, None, grad, None


_OP_NODE = _FamilyOp._backward_cls  # the type of a family node in a graph (its grad_fn)
_VIEW_NODE = type(torch.empty(1, requires_grad=True).view(1).grad_fn)  # ViewBackward0
_APPLY = super(torch.autograd.Function, _FamilyOp).apply  # torch._C._FunctionBase.apply


def run(family: type[Family], g: Any, values: torch.Tensor, mask: torch.Tensor,
        *args: Any) -> tuple:
    """``family``'s outputs for the groups ``g`` (see the module docstring)."""
    if _compiling() or _transforms_active() or values.is_complex() or (
            _modes_active() > 0 and _tracing_modes()):  # (:func:`traced`, inlined)
        if torch.compiler.is_compiling():
            out = family.op(g, values, mask, *args)
            if out is not None:
                return out
        return family.torch(g, values, mask, *args)
    if values.requires_grad and _grad_enabled():
        # torch's ``Function.apply`` less its Python layer: ``_FamilyOp`` has no
        # setup_context whose arguments it would bind, and no torch.func transform is
        # active here (traced)
        unwrap = torch._C._functorch.unwrap_if_dead
        return _APPLY(family, g, args, unwrap(values), unwrap(mask))
    return family.forward(g, values, mask, *args)


def node_backward(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                  grads: list[torch.Tensor]) -> list[torch.Tensor | None] | None:
    """``torch.autograd.grad(outputs, inputs, grads, allow_unused=True)`` where every output
    comes from one family node (:class:`_FamilyOp`) applied to an input leaf itself: that
    node's backward called directly; None elsewhere (the caller runs the engine).

    Note [A family's backward without the engine]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A masked op differentiates its kernel's small inner graph with one
    ``torch.autograd.grad`` call (Note [Autograd on the values] in ``masked_sparse``). For a
    reduction or softmax that graph is one node, a family's Function on the leaf copy of
    the values, and a run of the engine for it (graph task, input checks) costs as much as
    the node's own Python. So where the graph is that one node, outside a recorded backward
    (``create_graph``: the engine records the backward's ops) and anomaly mode, the node's
    ``backward`` runs as the engine would run it: gradients by output number, ``None`` for
    an output not used (the Function does not materialize them), its gradient for the
    values input. The node's saved tensors go when the caller drops the inner graph. A
    view on either side of the node -- heads as groups read the values flat and view the
    output back (Note [Heads as groups]) -- is read through: the gradient is reshaped as
    the view's backward would.

    >>> from layouts.kernels import Groups, masked_reduce
    >>> v = torch.tensor([1., 2.], requires_grad=True)
    >>> out = masked_reduce(Groups(2), v, torch.tensor([True, True]), "sum")
    >>> with torch.no_grad():
    ...     node_backward([out], [v], [torch.tensor([3.])])
    [tensor([3., 3.])]
    """
    node, viewed = outputs[0].grad_fn, None
    if type(node) is _VIEW_NODE and len(outputs) == 1:  # one output, viewed back
        viewed = grads[0].reshape(node._saved_self_sym_sizes)
        node, nr = node.next_functions[0]
    if (type(node) is not _OP_NODE or torch.is_grad_enabled() or torch.is_anomaly_enabled()
            or (len(outputs) > 1 and any(o.grad_fn is not node for o in outputs[1:]))):
        return None
    source = node.next_functions[0][0]  # the values input (the mask has no gradient)
    if type(source) is _VIEW_NODE:  # the values read flat
        source = source.next_functions[0][0]
    leaf = getattr(source, "variable", None)
    if leaf is None or not any(leaf is t for t in inputs):
        return None
    if viewed is not None:
        by_output: list[torch.Tensor | None] = [None] * node.n_outputs
        by_output[nr] = viewed
    elif len(outputs) == 1 and node.n_outputs == 1:
        by_output = list(grads)
    else:
        by_output = [None] * node.n_outputs
        for o, g in zip(outputs, grads):
            i = o.output_nr
            by_output[i] = g if by_output[i] is None else by_output[i] + g
    grad = _FamilyOp.backward(node, *by_output)[3]  # (the node is the Function's ctx)
    if grad is not None and grad.shape != leaf.shape:
        grad = grad.reshape(leaf.shape)
    return [grad if t is leaf else None for t in inputs]
