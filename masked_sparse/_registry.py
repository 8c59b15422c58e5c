"""The one way to register a masked op: ``@implements(*ops)``, ``handler(op, *args, **kwargs)``.

An op is either a Python-level callable (``torch.sum``, ``torch.Tensor.sum``, the ``layout``
property getter, ...) or an exact aten overload (``aten.sum.dim_IntList``); one handler may
serve both and tells them apart with :func:`is_aten`. ``__torch_function__`` consults the
Python-level entries, ``__torch_dispatch__`` the aten ones. Aten ops without an entry go to
the one :func:`fallback` (``ops/pointwise.resolve``): those tagged ``torch.Tag.pointwise``
get the generic "apply to the values" handler, registered here on first use.

The registry is the lowest layer of the core: it imports nothing of it. What the type in
``_tensor.py`` routes to, the few methods of the type written with the ops (:func:`method`)
and the type's check of aten-level calls (:func:`aten_autograd_check`) are registered here
by the layers above and found at call time.

Note [Two levels]
~~~~~~~~~~~~~~~~~
Pointwise ops go through the C++ dispatcher: autograd records its own formula on the
MaskedTensor (whose backward formulas are pointwise too, so masks keep matching) and the
handler runs on the values below autograd. Ops whose gradient must carry the *input's*
mask (reductions, where, conversions, sparse shape ops) are intercepted above autograd, at
their Python-level callables, where the handler attaches a backward that builds the
gradient from the input's storage; their aten overloads (calls from C++: backward
formulas, composite ops) run the same handler forward only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import layouts

Handler = Callable[..., Any]

#: Python-level callables -> handlers (read by ``__torch_function__``).
FUNCTIONS: dict[Any, Handler] = {}
#: Exact aten overloads -> handlers (read by ``__torch_dispatch__``).
ATEN: dict[Any, Handler] = {}
_FALLBACK: list[Callable[[Any, tuple], Handler]] = []
_ABOVE_CHECK: list[Callable[[Any, tuple], None]] = []
#: The one rewriter of plain operands that require grad (:func:`plain_operands`).
PLAIN_OPERANDS: list[Callable[[Any, tuple, Any], Any]] = []
UNARY_NODE: list[Callable[[Any, tuple, Any], Any]] = []


def is_aten(op: Any) -> bool:
    """True for an aten overload (called below autograd), False for a Python-level callable."""
    return isinstance(op, torch._ops.OpOverload)


def implements(*ops: Any) -> Callable[[Handler], Handler]:
    """Register ``handler(op, *args, **kwargs)`` for Python-level callables and aten overloads.

    >>> import torch
    >>> @implements(torch.Tensor.numel, torch.ops.aten.numel.default)   # doctest: +SKIP
    ... def numel(op, mt): ...
    """

    def decorator(handler: Handler) -> Handler:
        above = not all(is_aten(op) for op in ops)
        for op in ops:
            if not is_aten(op):
                FUNCTIONS[op] = handler
            elif above and not op.is_view and not op._schema.is_mutable:
                ATEN[op] = _differentiated_above(handler)
            else:  # views and in-place ops: torch's own formulas are the masked ones
                ATEN[op] = handler
        return handler

    return decorator


def _differentiated_above(handler: Handler) -> Handler:
    """``handler`` for an aten overload that eager code meets in ``__torch_function__``, where
    the masked autograd is recorded: arriving at the aten level with grad enabled, it first
    runs the :func:`aten_autograd_check` (Note [Aten-level autograd] in _tensor.py), which
    refuses a call that would lose the masked gradient."""

    def aten_handler(op: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            _ABOVE_CHECK[0](op, args)
        return handler(op, *args, **kwargs)

    return aten_handler


def aten_autograd_check(check: Callable[[Any, tuple], None]) -> Callable[[Any, tuple], None]:
    """Register ``check(op, args)``, run before the aten handler of an op differentiated
    above while grad is enabled: there is one, ``_tensor.check_aten_autograd``."""
    _ABOVE_CHECK[:] = [check]
    return check


def plain_operands(lift: Callable[[Any, tuple, Any], Any]) -> Callable[[Any, tuple, Any], Any]:
    """Register ``lift(op, args, kwargs)``, run on a Python-level call without a handler
    while grad is enabled: ``(args, kwargs)`` to call the op with instead, the op's result
    (a MaskedTensor: it ran), or None. There is
    one, ``ops/plain_operands.lift_plain_operands`` (Note [Plain operands get plain
    gradients])."""
    PLAIN_OPERANDS[:] = [lift]
    return lift


def unary_node(record: Callable[[Any, tuple, Any], Any]) -> Callable[[Any, tuple, Any], Any]:
    """Register ``record(op, args, kwargs)``, run on a Python-level call without a handler
    while grad is enabled and no plain operand requires grad: the op's result recorded as
    one node (a MaskedTensor), or None to run the call as it is. There is one,
    ``ops/unary_node.one_node`` (Note [A unary op as one node])."""
    UNARY_NODE[:] = [record]
    return record


def fallback(resolver: Callable[[Any, tuple], Handler]) -> Callable[[Any, tuple], Handler]:
    """Register ``resolver(op, args)``, which gives the handler of an aten overload without
    an entry (or raises): there is one, ``ops/pointwise.resolve``."""
    _FALLBACK[:] = [resolver]
    return resolver


def resolve(op: Any, args: tuple) -> Handler:
    """The handler of an aten overload without an entry in :data:`ATEN` (:func:`fallback`)."""
    return _FALLBACK[0](op, args)


class METHODS:
    """The MaskedTensor methods written with the code they call (``get_data`` with the
    conversions, ``reduce_ex`` with the serialization, ...), registered with :func:`method`
    as attributes of this class: the type calls ``METHODS.get_data(self)``, an attribute
    read that costs what a module's does (a dict lookup per call would cost more)."""


def method(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the function that MaskedTensor's method ``name`` calls (:class:`METHODS`).

    >>> @method("get_data")   # doctest: +SKIP
    ... def get_data(mt): ...
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(METHODS, name, fn)
        return fn

    return decorator


def op_name(op: Any) -> str:
    """The user-facing name of ``op``: ``"logsumexp"`` for ``torch.special.logsumexp``,
    ``torch.Tensor.logsumexp`` and ``aten.logsumexp.default`` alike (computed once per op)."""
    try:
        return _NAMES[op]
    except (KeyError, TypeError):  # TypeError: an unhashable op, named every time
        pass
    name = getattr(op, "_opname", None) or getattr(op, "__name__", None) or str(op)
    for prefix in ("special_", "linalg_"):
        name = name.removeprefix(prefix)
    try:
        _NAMES[op] = name
    except TypeError:
        pass
    return name


_NAMES: dict[Any, str] = {}


def way_out(has_op: Callable[[layouts.Layout], bool], *, fill: bool = True) -> str:
    """What to do about an op a layout lacks: convert to a registered layout that has it
    (``has_op(layout)``), or compute on plain tensors.

    ``fill=False`` for an op that aggregates elements (a reduction, a loss): filling the
    unspecified elements (``mt.to_tensor(0)``) would count them in its means and counts, so
    the way out is the specified elements alone (:func:`aggregates`)."""
    ways = [".to_dense()" if lay.torch_layout is torch.strided else
            f"ms.to_layout(mt, {lay.name!r})" for lay in layouts.registered_layouts()
            if has_op(lay)]
    if fill:
        plain = ("compute it on plain tensors: mt.to_tensor(value), mt.get_data() or "
                 "mt.to_dense()")
    else:
        plain = ("compute it on the specified elements as a plain tensor: d = mt.to_dense(); "
                 "d.get_data()[d.get_mask()]")
    if not ways:
        return plain
    return f"convert first: {' or '.join(ways)}; or {plain}"


def aggregates(op: Any) -> bool:
    """True for an op whose result summarizes many elements -- tagged a reduction, or a
    loss -- where a fill of the unspecified elements changes the answer (a mean, a count)."""
    name = op_name(op)
    return torch.Tag.reduction in getattr(op, "tags", ()) or "loss" in name or name == "kl_div"
