"""Masked losses: ``torch.nn.functional``'s losses over the specified elements, every layout.

``F.mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits`` (elementwise), ``nll_loss`` and ``cross_entropy`` (over a
class dim, :mod:`._class_losses`) take a MaskedTensor as the input, the target or both
(``weight`` / ``pos_weight`` too). Semantics, written once here for every layout
(docs/losses.md):

- the loss of each specified element is torch's own (the op with ``reduction='none'`` on the
  specified values); unspecified elements take no part;
- ``reduction='none'`` returns a MaskedTensor with the masked operand's layout, index tensors
  and mask; ``'sum'`` sums the specified losses and ``'mean'`` divides that by their number
  (by the sum of their weights where torch divides by the weights: ``mse_loss`` / ``l1_loss``
  with ``weight``, ``nll_loss`` / ``cross_entropy`` with class indices), each a 0-d
  MaskedTensor, specified iff some element is (a mean of nothing is unspecified, not NaN);
- masked operands follow the binary-op rules (same specified set, or broadcasting that
  loses no specified element; else ``ValueError``); a plain operand is read at the masked
  operand's stored positions only, so a sparse input stays O(nnz);
- gradients are those of the dense reference over the specified elements: a masked operand
  gets its own mask and layout, a plain one a plain gradient, 0 where it met only
  unspecified elements (:func:`masked_sparse._autograd.on_values`).

Note [Losses through the values]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A loss is one kernel on the operands' storages run under ``on_values``: align the masked
operands and read the plain ones at their positions (as elementwise ops do), apply torch's
own loss with ``reduction='none'`` to the value tensors, and reduce with a zero fill and a
sum over the values (a count of the mask, or a sum of the weights, for a mean). Every step is
on ``storage.values``, so every layout -- a registered one included -- takes the same path and
a sparse operand costs O(nnz); one autograd node per loss.

>>> import torch, torch.nn.functional as F, masked_sparse as ms
>>> pred = ms.masked_tensor(torch.tensor([1., 2., 9.]), torch.tensor([True, True, False]))
>>> F.mse_loss(pred, torch.tensor([0., 0., 0.]))
MaskedTensor(  2.5000, True)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn import _reduction

import layouts
from layouts import Storage

from .._autograd import on_values
from .._registry import implements, is_aten, op_name
from .._tensor import MaskedTensor, _wrap
from ._fill import zero_fill
from .pointwise import align, broadcast, read_plain

aten = torch.ops.aten
_STRIDED = layouts.get_layout(torch.strided)
REDUCTIONS = ("none", "mean", "sum")  # (aten's enum order)


# -- shared by every loss ----------------------------------------------------------------
def reduction_of(name: str, reduction: Any, size_average: Any = None,
                 reduce: Any = None) -> str:
    """The reduction as a string: aten's enum, the legacy flags (torch warns), or checked."""
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    if isinstance(reduction, int) and not isinstance(reduction, bool) and 0 <= reduction < 3:
        reduction = REDUCTIONS[reduction]
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}(): {reduction!r} is not a valid value for reduction; use "
                         f"'none', 'mean' or 'sum'")
    return reduction


def run(op: Any, kernel: Callable[..., Any], operands: list, *extra: Any) -> Any:
    """``kernel(storages, *extra)`` under ``on_values`` for a Python-level op (gradients:
    module docstring), forward only for an aten overload (reached below autograd)."""
    if not is_aten(op):
        return on_values(kernel, operands, *extra)
    with torch.no_grad():
        out = kernel([o._storage if isinstance(o, MaskedTensor) else o for o in operands],
                     *extra)
    if isinstance(out, Storage):
        return _wrap(out)
    return tuple(_wrap(o) if isinstance(o, Storage) else o for o in out)


def aligned(func: Any, operands: list) -> tuple[Storage, list[torch.Tensor]]:
    """The masked operands aligned (binary-op rules) and every operand's values at the
    result's stored positions, each of the shape of the result's mask."""
    masked = [o for o in operands if isinstance(o, Storage)]
    shape = masked[0].shape
    if all(s.shape == shape for s in masked):
        masked = align(func, masked)
    else:
        masked = broadcast(func, masked)
    ref = masked[0]
    full = ref.mask.shape
    it = iter(masked)
    values = []
    for o in operands:
        v = next(it).values if isinstance(o, Storage) else read_plain(func, ref, o)
        values.append(v.expand(full))
    return ref, values


def full_reduction(loss: torch.Tensor, mask: torch.Tensor, reduction: str,
                   weights: torch.Tensor | None = None) -> Storage:
    """The 0-d masked ``sum`` or ``mean`` of the specified ``loss`` values (the mean divided
    by the sum of the specified ``weights`` when given, else by their number), specified
    iff some element is: an empty mean is unspecified, 0 under its mask, with 0 gradients.

    Half precision sums in float32, as torch's losses do (Note [Half precision accumulates
    in float32] in ``reductions.py``).
    """
    mask = mask.expand(loss.shape)
    wide = torch.float32 if loss.dtype in (torch.float16, torch.bfloat16) else loss.dtype
    total = zero_fill(loss, mask).sum(dtype=wide)
    specified = mask.any()
    if reduction == "mean":
        if weights is None:
            denominator = mask.sum().to(wide)
        else:
            denominator = zero_fill(weights.expand(loss.shape), mask).sum(dtype=wide)
        one = torch.ones((), dtype=wide, device=total.device)
        total = total / torch.where(specified, denominator, one)
    return _STRIDED.build((), total.to(loss.dtype), specified, torch.Size())


def _check_masked_operand(name: str, what: str, x: Any) -> None:
    if x is not None and not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}(): {what} must be a Tensor, got {type(x).__name__}")


# -- the elementwise losses ----------------------------------------------------------------
def _pairwise(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A loss of (input, target) with an optional elementwise ``weight`` factor."""
    def loss(v: dict[str, torch.Tensor], **params: Any) -> torch.Tensor:
        out = fn(v["input"], v["target"], reduction="none", **params)
        return out * v["weight"] if "weight" in v else out

    return loss


def _bce(v: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.binary_cross_entropy(v["input"], v["target"], weight=v.get("weight"),
                                  reduction="none")


def _bce_logits(v: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(v["input"], v["target"], weight=v.get("weight"),
                                              pos_weight=v.get("pos_weight"), reduction="none")


#: name -> (per-element loss of the values, does a weighted mean divide by the weights?)
ELEMENTWISE: dict[str, tuple[Callable[..., torch.Tensor], bool]] = {
    "mse_loss": (_pairwise(F.mse_loss), True),
    "l1_loss": (_pairwise(F.l1_loss), True),
    "smooth_l1_loss": (_pairwise(F.smooth_l1_loss), False),
    "huber_loss": (_pairwise(F.huber_loss), False),
    "binary_cross_entropy": (lambda v: _bce(v), False),
    "binary_cross_entropy_with_logits": (lambda v: _bce_logits(v), False),
}


def _elementwise_kernel(storages: list, func: Any, slots: tuple[str, ...], reduction: str,
                        params: dict[str, Any]) -> Storage:
    ref, values = aligned(func, storages)
    v = dict(zip(slots, values))
    name = op_name(func)
    fn, by_weight = ELEMENTWISE[name]
    loss = fn(v, **params)
    if reduction == "none":
        return ref.with_values(loss)
    return full_reduction(loss, ref.mask, reduction, v.get("weight") if by_weight else None)


def elementwise(op: Any, name: str, reduction: str, params: dict[str, Any],
                **operands: Any) -> Any:
    """One elementwise loss (Note [Losses through the values])."""
    for what, x in operands.items():
        _check_masked_operand(name, what, x)
    given = {k: x for k, x in operands.items() if x is not None}
    return run(op, _elementwise_kernel, list(given.values()), op, tuple(given), reduction,
               params)


def bind(op: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call to ``fn`` (a ``torch.nn.functional`` loss) or to its aten
    overload ``op`` (whose tensor is ``self`` and whose reduction is aten's enum), by name."""
    if is_aten(op):
        names = [a.name for a in op._schema.arguments]
        bound = {"reduction": 1, **dict(zip(names, args)), **kwargs}
        bound["input"] = bound.pop("self")
        return bound
    signature = _SIGNATURES.get(fn)
    if signature is None:
        signature = _SIGNATURES[fn] = inspect.signature(fn)
    try:
        b = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{fn.__name__}(): {e}") from None
    b.apply_defaults()
    return b.arguments


_SIGNATURES: dict[Any, inspect.Signature] = {}


def _elementwise_handler(name: str, params: dict[str, Any]) -> Callable[..., Any]:
    fn = getattr(F, name)

    def handler(op: Any, *args: Any, **kwargs: Any) -> Any:
        a = bind(op, fn, args, kwargs)
        if fn is F.l1_loss and a.get("weight") is None:
            a["weight"] = _weight_torch_dropped()
        red = reduction_of(name, a["reduction"], a.get("size_average"), a.get("reduce"))
        return elementwise(op, name, red, {p: a.get(p, d) for p, d in params.items()},
                           input=a["input"], target=a["target"], weight=a.get("weight"),
                           pos_weight=a.get("pos_weight"))

    handler.__name__ = handler.__qualname__ = name
    return handler


def _weight_torch_dropped() -> Any:
    """Note [l1_loss's weight]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch's ``F.l1_loss`` hands a call with a MaskedTensor to ``__torch_function__`` without
    its ``weight`` argument (it passes ``size_average``, ``reduce`` and ``reduction`` only),
    which would silently drop the weights. The weight is read from that call's frame, a few
    frames up (``F.l1_loss`` -> ``handle_torch_function`` -> ``__torch_function__`` -> here).
    """
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            break
        if frame.f_code is F.l1_loss.__code__:
            return frame.f_locals.get("weight")
        frame = frame.f_back
    return None


# F.l1_loss is composite in aten (its aten overload never reaches a MaskedTensor).
for _name, _params, _aten in (
        ("mse_loss", {}, (aten.mse_loss.default,)),
        ("l1_loss", {}, ()),
        ("smooth_l1_loss", {"beta": 1.0}, (aten.smooth_l1_loss.default,)),
        ("huber_loss", {"delta": 1.0}, (aten.huber_loss.default,)),
        ("binary_cross_entropy", {}, (aten.binary_cross_entropy.default,)),
        ("binary_cross_entropy_with_logits", {},
         (aten.binary_cross_entropy_with_logits.default,))):
    implements(getattr(F, _name), *_aten)(_elementwise_handler(_name, _params))


from . import _class_losses  # noqa: E402, F401  (nll_loss and cross_entropy register there)
