"""Plain operands of pointwise ops that require grad: read at the masked operand's stored
positions by one autograd Function, so their gradient comes back plain.

Note [Plain operands get plain gradients]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A plain tensor meeting a MaskedTensor in a pointwise op (``R - b[:, None]``, ``d[:, None]
* A``, ``w / A``, ``torch.clamp(A, min=t)``) is read at the masked operand's stored
positions only (docs/semantics.md). Left to torch's own formulas, its gradient would be
the masked gradient of the result reduced by ``sum_to_size``: a MaskedTensor (sparse COO
for a sparse operand), which no torch optimizer takes, and on a sparse tensor the view
formulas before it (``select``, ``slice``) fail. So when such an operand requires grad,
the Python-level call first replaces it by :func:`plain_at` -- a MaskedTensor over the
masked operand's index and mask whose values are the plain tensor read at the stored
positions (``layouts.read_stored``: O(nnz), never densified) -- and the op runs between
MaskedTensors of one pattern (the pointwise fast path). :class:`_PlainAt`'s backward reads
the incoming masked gradient at those positions (0 where unspecified) and sums it back
onto the plain tensor's shape: ``index_add`` by the flat position each stored value was
read from (a row vector, a column, a same-shape matrix alike; for a strided operand the
dense ``sum_to_size``), so the plain tensor gets a plain gradient of its own shape, equal
to the dense reference's, 0 where it met only unspecified elements. Nothing here reads
device data on the host. The backward is written with differentiable ops, so
``create_graph=True`` differentiates it again. Inside ``torch.func`` transforms and
compiled graphs the operand is left to torch's formulas as before.

The decision is taken in ``__torch_function__`` (the only level above autograd for these
ops, Note [Two levels]), which calls :func:`lift_plain_operands` only when a plain tensor
argument requires grad; other calls pay one type check per argument.
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .. import _func, _registry
from .._autograd import grad_values
from .._shapes import broadcasts_to
from .._tensor import MaskedTensor, _wrap
from .pointwise import _is_pointwise, broadcast


class _PlainAt(torch.autograd.Function):
    """``plain`` read at ``storage``'s stored positions, as a MaskedTensor over its index."""

    @staticmethod
    def forward(ctx, plain: torch.Tensor, storage: Storage) -> Any:  # type: ignore[override]
        ctx.storage = storage
        ctx.shape, ctx.dtype = plain.shape, plain.dtype
        return _wrap(storage.with_values(layouts.read_stored(storage, plain.detach())))

    @staticmethod
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        return _plain_grad(ctx.storage, grad, ctx.shape).to(ctx.dtype), None


def _plain_grad(s: Storage, grad: Any, shape: torch.Size) -> torch.Tensor:
    """The gradient of a plain operand of ``shape`` read at ``s``'s stored positions: the
    incoming gradient's specified values summed back where each was read (an unspecified
    NaN too is never read)."""
    return layouts.sum_back(s, grad_values(grad, s), shape, s.mask)


class _PlainSum(torch.autograd.Function):
    """``a + b`` or ``a - b`` (``subtract``) of a MaskedTensor and a plain tensor (either
    side), the plain one read at the masked one's stored positions, as one Function
    (Note [A sum with a plain operand])."""

    @staticmethod
    def forward(ctx, a: Any, b: Any, subtract: bool) -> Any:  # type: ignore[override]
        masked_first = isinstance(a, MaskedTensor)
        masked, plain = (a, b) if masked_first else (b, a)
        s = masked._storage
        # (no grad mode in a Function's forward: ``plain`` is read as it is)
        values = layouts.add_stored(s, plain, ("sub" if masked_first else "rsub")
                                    if subtract else "add")
        ctx.storage, ctx.shape = s, plain.shape
        ctx.masked_first, ctx.subtract = masked_first, subtract
        return _wrap(s.with_values(values))

    @staticmethod
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        s, first = ctx.storage, ctx.masked_first
        need_masked, need_plain = ctx.needs_input_grad[:2] if first else ctx.needs_input_grad[1::-1]
        to_masked = to_plain = None
        if need_masked:
            to_masked = -grad if ctx.subtract and not first else grad
        if need_plain:
            to_plain = _plain_grad(s, grad, ctx.shape)
            if ctx.subtract and first:
                to_plain = -to_plain
        return (to_masked, to_plain, None) if first else (to_plain, to_masked, None)


def plain_at(plain: torch.Tensor, storage: Storage) -> MaskedTensor:
    """``plain`` (broadcastable to ``storage.shape``) read at ``storage``'s stored positions:
    a MaskedTensor with ``storage``'s index and mask objects, whose gradient reaches
    ``plain`` as a plain tensor of its shape (Note [Plain operands get plain gradients]).

    >>> import torch, masked_sparse as ms
    >>> A = ms.masked_tensor(torch.ones(2, 3), torch.tensor([[1, 0, 1], [0, 1, 0]]).bool())
    >>> b = torch.tensor([1., 2.], requires_grad=True)
    >>> (A.to_sparse_csr() * b[:, None]).sum().backward()
    >>> b.grad
    tensor([2., 1.])
    """
    return _PlainAt.apply(plain, storage)


def lift_operands(cond: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``torch.where``'s operands ``a`` and ``b``, a plain one that requires grad read by
    :func:`plain_at` at the first masked one's pattern (``a``, ``b``, then ``cond``)."""
    if _func.active() or torch.compiler.is_compiling():
        return a, b
    ref = next((x._storage for x in (a, b, cond) if isinstance(x, MaskedTensor)), None)
    if ref is None:
        return a, b
    return tuple(plain_at(x, ref) if _needs_lift(x) and broadcasts_to(x.shape, ref.shape)
                 else x for x in (a, b))  # type: ignore[return-value]


# -- which Python-level callables are pointwise -------------------------------------------
_ALIASES = {"truediv": "div", "rdiv": "div", "idiv": "div_", "itruediv": "div_",
            "floordiv": "floor_divide", "ifloordiv": "floor_divide_", "mod": "remainder",
            "imod": "remainder_", "subtract": "sub", "multiply": "mul", "divide": "div",
            "true_divide": "div", "rpow": "pow", "radd": "add", "rmul": "mul"}
_KNOWN: dict[Any, tuple[bool, bool]] = {}


def _classify(func: Any) -> tuple[bool, bool]:
    """(pointwise, in place) for a Python-level callable, by its aten op's tags."""
    try:
        return _KNOWN[func]
    except (KeyError, TypeError):
        pass
    name = getattr(func, "__name__", "") or ""
    dunder = name.startswith("__") and name.endswith("__")
    name = name.strip("_") if dunder else name
    name = _ALIASES.get(name, name)
    if dunder and name.startswith("i") and _aten_pointwise(name[1:] + "_"):
        name = name[1:] + "_"
    elif dunder and not _aten_pointwise(name) and _aten_pointwise(name[1:]):
        name = name[1:]  # __rsub__ is aten.rsub; __rpow__ and the like are their op
    result = (_aten_pointwise(name), name.endswith("_"))
    try:
        _KNOWN[func] = result
    except TypeError:
        pass
    return result


def _aten_pointwise(name: str) -> bool:
    packet = getattr(torch.ops.aten, name, None) if name else None
    if packet is None:
        return False
    return any(_is_pointwise(getattr(packet, o)) for o in packet.overloads())


def _needs_lift(a: Any) -> bool:
    return (isinstance(a, torch.Tensor) and not isinstance(a, MaskedTensor) and a.requires_grad
            and a.layout == torch.strided)


@_registry.plain_operands
def lift_plain_operands(func: Any, args: tuple, kwargs: dict | None) -> Any:
    """``(args, kwargs)`` with every plain operand that requires grad replaced by
    :func:`plain_at` over the masked operands' pattern, the result of a sum or difference
    run here (Note [A sum with a plain operand]), or None to run the call as it is
    (``__torch_function__`` calls it only when some plain tensor argument requires grad)."""
    pointwise, inplace = _classify(func)
    if not pointwise or _func.active():
        return None
    if torch.compiler.is_compiling():  # Note [Plain operands under torch.compile]
        return _lift_eagerly(func, args, kwargs)
    sign = _SUMS.get(func)
    if sign is not None and not kwargs and len(args) == 2:
        done = _sum_with_plain(*(args[::-1] if sign[1] else args), sign[0])
        if done is not None:
            return done
    return _lift(func, args, kwargs)


# Note [A sum with a plain operand]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``A0 + e_dst[:, None]`` (graph attention's scores), ``R - b[:, None]`` (a recommender's
# residual): a sum or difference of a MaskedTensor and a plain tensor that requires grad is
# the commonest plain-operand call. Lifted, it would be two recorded ops (``plain_at``, then
# the op between MaskedTensors); :class:`_PlainSum` records it as one, with the same values
# (the same read, the same single add or subtract) and the same gradients (the masked
# operand's is the incoming gradient, negated for a subtrahend, as torch's formula gives;
# the plain operand's is ``plain_at``'s). Anything else -- another dtype or device (type
# promotion), ``alpha=``, a layout with its own binary kernels, two MaskedTensors -- is
# lifted as above.
#: ``func: (subtract, operands reversed)`` for the sums and differences of two tensors
_SUMS: dict[Any, tuple[bool, bool]] = {
    **dict.fromkeys((torch.add, torch.Tensor.add, torch.Tensor.__add__), (False, False)),
    torch.Tensor.__radd__: (False, True),
    **dict.fromkeys((torch.sub, torch.subtract, torch.Tensor.sub, torch.Tensor.subtract,
                     torch.Tensor.__sub__), (True, False)),
    torch.Tensor.__rsub__: (True, True),
}


def _sum_with_plain(a: Any, b: Any, subtract: bool) -> MaskedTensor | None:
    """``a - b`` (``subtract``) or ``a + b`` as one :class:`_PlainSum` where one of them is
    a MaskedTensor and the other a plain tensor that requires grad and can join it without
    promotion; else None."""
    masked, plain = (a, b) if type(a) is MaskedTensor else (b, a)
    if type(masked) is not MaskedTensor or not _needs_lift(plain):
        return None
    s = masked._storage
    if (s.layout.unary or s.layout.binary or plain.dtype != s.values.dtype
            or plain.device != s.values.device or not broadcasts_to(plain.shape, s.shape)):
        return None
    # (``Function.apply`` less its Python layer, as layouts.kernels._route does: no
    # setup_context, no torch.func transform active here)
    return _SUM_APPLY(a, b, subtract)


_SUM_APPLY = super(torch.autograd.Function, _PlainSum).apply  # torch._C._FunctionBase.apply


# Note [Plain operands under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``plain_at`` is an autograd Function over a Storage (not a tensor argument), which Dynamo
# does not trace. Under torch.compile the lift runs eagerly, outside the graph (a graph
# break where Dynamo reaches it), so that the plain operand still gets its plain gradient --
# the GAT scores ``A0 + d[:, None] + s[None, :]`` train compiled as they do eagerly
# (``tests/compile/test_compile_training.py``).
@torch.compiler.disable
def _lift_eagerly(func: Any, args: tuple, kwargs: dict | None) -> tuple | None:
    return _lift(func, args, kwargs)


def _lift(func: Any, args: tuple, kwargs: dict | None) -> tuple | None:
    _, inplace = _classify(func)
    values = (*args, *(kwargs or {}).values())
    storages = [a._storage for a in values if isinstance(a, MaskedTensor)]
    if not storages or (inplace and not isinstance(args[0], MaskedTensor)):
        return None  # the op raises its own error
    ref = storages[0]
    if any(s.shape != ref.shape for s in storages):
        ref = broadcast(func, storages)[0]

    def lift(a: Any) -> Any:
        if _needs_lift(a) and broadcasts_to(a.shape, ref.shape):
            return plain_at(a, ref)
        return a

    return tuple(map(lift, args)), {k: lift(v) for k, v in (kwargs or {}).items()}
