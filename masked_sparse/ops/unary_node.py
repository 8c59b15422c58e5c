"""A unary pointwise op of a MaskedTensor that requires grad, recorded as one node.

Note [A unary op as one node]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``F.leaky_relu(scores, 0.2)``, ``F.gelu(h)``, ``mt ** 2``: left to torch's
autograd (Note [Two levels]), such an op is recorded above the MaskedTensor and its
derivative formula's ops run on MaskedTensors, each one a round trip through
``__torch_dispatch__``, in the backward. Between the small layers of a pruned MLP or a graph
attention step those round trips cost several times the kernels. So a Python-level call of
an out-of-place pointwise op on one real floating MaskedTensor that requires grad, with no
other tensor argument, is one node here:

- forward: the op runs on a detached copy of the values that requires grad, so that torch
  records its own derivative for them (the same kernel as the dispatch route, the same
  bits); the result wraps those values with the input's index and mask;
- backward: the incoming gradient's values, read at the input's stored positions, go
  through that recorded node -- torch's formula on plain tensors, no dispatch -- and come
  back over the input's storage with the incoming gradient's mask, as the formula's ops on
  MaskedTensors keep it (Note [Masks of gradients]).

The recorded node holds what torch's formula saves (the input's values: the same memory,
no copy), and in-place writes are caught by its version checks as torch catches them. Only
ops whose formula saves the input take this route (``F.leaky_relu``, ``F.gelu``,
``F.silu``, ``F.elu``, ``F.softplus``, ``torch.pow``, ...); the others keep the dispatch
route, which frees their input (Note [What the node keeps]). torch runs a node called
directly only inside a backward that computes every gradient (``.backward()``); inside one
that computes some inputs' gradients (``torch.autograd.grad``), where it skips nodes outside
its graph, the recorded graph is differentiated by a nested ``torch.autograd.grad``
instead. Complex values (a complex op's derivative may not be linear over the complex
numbers), in-place calls, ``out=``, layouts with kernels of their own and saved-tensor hooks
(``torch.utils.checkpoint``, ``save_on_cpu``: the recorded node's saved input is read
here in the forward, and such hooks allow one read) take the dispatch route as before.
With ``create_graph=True`` the backward runs the dispatch route once more and
differentiates it, so the gradient is differentiable again (Note [Double backward]).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.autograd.graph import GradientEdge

import layouts

from .. import _registry
from .._autograd import _FREED, grad_on
from .._tensor import MaskedTensor, _wrap, requires_grad_of
from .plain_operands import _classify


class _UnaryNode(torch.autograd.Function):
    """A unary pointwise op of ``mt`` whose values ``out`` torch computed from ``leaf`` (a
    detached copy of ``mt``'s values) and recorded (Note [A unary op as one node])."""

    @staticmethod
    def forward(ctx, mt: MaskedTensor, out: torch.Tensor, leaf: torch.Tensor,  # type: ignore[override]
                call: tuple) -> Any:
        s = mt._storage
        # the recorded node, not ``out``: it keeps what torch's formula saves, nothing more
        edge = GradientEdge(out.grad_fn, out.output_nr)  # (get_gradient_edge, unchecked)
        ctx.storage, ctx.edge, ctx.leaf, ctx.call = s, edge, leaf, call
        return _wrap(s.with_values(out.detach()))

    @staticmethod
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        s, edge = ctx.storage, ctx.edge
        if edge is None:  # freed by an earlier backward without retain_graph
            raise RuntimeError(_FREED)
        if torch.is_grad_enabled():  # create_graph=True: the dispatch route, differentiated
            func, args, kwargs = ctx.call
            with torch.enable_grad(), DisableTorchFunctionSubclass():
                again = func(*args, **kwargs)
            (to_input,) = torch.autograd.grad(again, args[0], grad, create_graph=True)
            return to_input, None, None, None
        keep = torch._C._autograd._get_current_graph_task_keep_graph()
        if isinstance(grad, MaskedTensor):  # its mask is the gradient's (Note [Masks of gradients])
            values, mask = layouts.read_at(grad._storage, s)
        else:
            values, mask = grad_on(grad, s)
        to_values = edge.node(values)  # torch's own formula
        if isinstance(to_values, tuple):
            to_values = to_values[0]
        if to_values is None:  # a backward that skips nodes outside its graph
            (to_values,) = torch.autograd.grad(edge, ctx.leaf, values, retain_graph=keep)
        if not keep:
            ctx.edge = ctx.leaf = ctx.call = None  # the graph goes with it, as torch's
        return _wrap(s.with_values(to_values, mask)), None, None, None


_APPLY = super(torch.autograd.Function, _UnaryNode).apply  # torch._C._FunctionBase.apply
_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_saved_tensor_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_NOT_TENSORS = (int, float, bool, str, type(None))
#: per callable: whether it is an out-of-place pointwise op, and where its ``inplace=``
#: argument sits among the positional ones (None: it has none)
_KINDS: dict[Any, tuple[bool, int | None]] = {}


def _kind(func: Any) -> tuple[bool, int | None]:
    kind = _KINDS.get(func)
    if kind is None:
        pointwise, inplace = _classify(func)
        try:
            names = list(inspect.signature(func).parameters)
        except (TypeError, ValueError):  # a builtin without a signature
            names = []
        kind = (pointwise and not inplace, names.index("inplace") if "inplace" in names else None)
        _KINDS[func] = kind
    return kind


@_registry.unary_node
def one_node(func: Any, args: tuple, kwargs: dict | None) -> MaskedTensor | None:
    """``func(*args, **kwargs)`` as one :class:`_UnaryNode` where it is an out-of-place
    pointwise op of one real floating MaskedTensor that requires grad and plain Python
    arguments (Note [A unary op as one node]); None to take the dispatch route.

    >>> import torch, torch.nn.functional as F, masked_sparse as ms
    >>> x = ms.masked_tensor(torch.tensor([-1., 2., 3.]), torch.tensor([True, True, False]),
    ...                      requires_grad=True)
    >>> F.leaky_relu(x, 0.5).sum().backward()
    >>> x.grad
    MaskedTensor(
      [  0.5000,   1.0000,       --]
    )
    """
    mt = args[0] if args else None
    if type(mt) is not MaskedTensor:
        return None
    pointwise, inplace_at = _kind(func)
    if not pointwise or func in _DECLINED:
        return None
    kwargs = kwargs or {}
    if kwargs.get("inplace") or (inplace_at is not None and len(args) > inplace_at
                                 and args[inplace_at]):
        return None
    s = mt._storage
    values = s.values
    if (not values.dtype.is_floating_point or s.layout.unary or s.layout.binary
            or not requires_grad_of(mt) or _compiling() or _transforms_active()
            or _saved_tensor_hooks(False) is not None or "out" in kwargs
            or not _plain_python(args[1:]) or not _plain_python(kwargs.values())):
        return None
    leaf = values.detach().requires_grad_()
    out = func(leaf, *args[1:], **kwargs)
    if type(out) is not torch.Tensor or out.shape != leaf.shape:
        return None
    if out.grad_fn is None:
        # no derivative (a comparison, a bool result): nothing to record; ``leaf`` itself
        # (an identity): the dispatch route
        return None if out.requires_grad else _wrap(s.with_values(out))
    if out.dtype is not leaf.dtype:
        return None
    node = out.grad_fn
    if type(node) not in _KEEPS_INPUT:  # Note [What the node keeps]: asked once per type
        if getattr(node, "_saved_self", None) is None:
            _DECLINED.add(func)
            return None
        _KEEPS_INPUT.add(type(node))
    return _APPLY(mt, out, leaf, (func, args, kwargs))


def _plain_python(values: Any) -> bool:
    """True when every one of ``values`` is a plain Python value (no tensor, no container
    that could hold one)."""
    for a in values:
        if type(a) not in _NOT_TENSORS:
            return False
    return True


# Note [What the node keeps]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# The node keeps torch's recorded node (not the op's result: the formula saves the result
# where it needs it, as torch's does) and, for ``create_graph=True``, the call itself, the
# input MaskedTensor included. That is no memory beyond torch's own route only where
# torch's formula saves the input (``leaky_relu``, ``gelu``, ``silu``, ``elu``,
# ``softplus``, ``pow``: the same values, no copy). A formula that saves only the result
# (``relu``, ``sigmoid``, ``tanh``, ``exp``) or nothing (``x + 1``) lets torch free the input
# after the forward, and keeping it here would hold a pre-activation per layer until the
# backward: those ops take the dispatch route (each callable is tried once).
_DECLINED: set = set()
_KEEPS_INPUT: set = set()  # the node types whose formula saves the input
