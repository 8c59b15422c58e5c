"""``F.nll_loss`` and ``F.cross_entropy`` with masked operands: losses over a class dim.

The class dim is dim 1 (dim 0 of an unbatched ``(C,)`` input); the loss has one element per
*sample*, the input's shape without the class dim. Semantics (docs/losses.md):

- a masked input: the specified classes of each sample take part, the others are absent --
  ``cross_entropy``'s ``log_softmax`` runs over them (the masked ``torch.log_softmax``);
- class-index target: a sample is specified iff its target is (for a masked target), is not
  ``ignore_index``, and its target class is specified in the input (reading an unspecified
  element gives an unspecified result, as masked indexing does);
- probability target (floating, the input's shape): elementwise with the input (the binary-op
  rules for two masked operands); a sample is specified iff one of its classes is;
- ``label_smoothing`` spreads ``eps`` over the classes that take part in the sample:
  ``eps / K`` with ``K`` the number of its specified classes (torch's ``eps / C`` when all are);
- ``'none'``: a per-sample MaskedTensor -- for a masked input in the layout of a reduction
  along the class dim (strided stays strided, a sparse input gives COO), for a plain input
  with a masked target in the target's layout over its index tensors;
- ``'mean'``: the sum over the specified samples divided by the sum of their target classes'
  weights (class indices, torch's weighted mean; their number without ``weight``), or by
  their number (probabilities, as torch divides by the batch).

Everything runs on the stored values (Note [Losses through the values] in ``losses.py``): the
class of each stored element is a broadcast read of ``arange(C)``, its sample's target a
broadcast read of the target, and the per-sample sums a reduction along the class dim
(:func:`layouts.group_by`), so a sparse input stays O(nnz).

>>> import torch, torch.nn.functional as F, masked_sparse as ms
>>> logits = ms.masked_tensor(torch.tensor([[2., 0., 9.], [1., 1., 1.]]),
...                           torch.tensor([[True, True, False], [True, True, True]]))
>>> F.cross_entropy(logits, torch.tensor([0, 2]), reduction="none")  # class 2 of row 0 absent
MaskedTensor(
  [  0.1269,   1.0986]
)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import layouts
from layouts import Storage

from .._registry import implements, is_aten
from .._tensor import MaskedTensor, dtype_of
from ._fill import zero_fill
from .losses import aligned, bind, full_reduction, reduction_of, run

aten = torch.ops.aten


def _grouped(x: Any) -> Any:
    """A storage whose layout groups its own values (a layout without a ``group`` builder
    is reduced through its COO form: its elements are read in that form too)."""
    if isinstance(x, Storage) and x.index and x.layout.group is None:
        return x.layout.to_coo(x)
    return x


def _finish(out: Storage, reduction: str, weights: torch.Tensor | None = None) -> Storage:
    if reduction == "none":
        return out
    return full_reduction(out.values, out.mask, reduction, weights)


def _class_view(t: torch.Tensor, ndim: int, cd: int) -> torch.Tensor:
    """A per-class vector shaped to broadcast along the class dim of an ``ndim``-D input."""
    return t.view((t.shape[0],) + (1,) * (ndim - cd - 1))


def _probabilities(func: Any, logp: Any, target: Any, weight: Any, cd: int, eps: float,
                   reduction: str) -> Storage:
    ndim = len(logp.shape)
    operands = [_grouped(logp), _grouped(target)]
    if weight is not None:
        operands.append(_class_view(weight, ndim, cd))
    ref, values = aligned(func, operands)
    lp, t = values[0], values[1]
    mask = ref.mask
    g = layouts.group_by(ref, (cd,), False)
    if eps:  # spread over the classes that take part
        k = g.expand(g.reduce(mask, "sum")).expand(mask.shape).clamp(min=1)
        t = t * (1 - eps) + eps / k.to(t.dtype)
    term = -(t * lp)
    if weight is not None:
        term = term * values[2]
    out = g.build(g.reduce(zero_fill(term, mask), "sum"), g.reduce(mask, "any"))
    return _finish(out, reduction)


def _indices_masked_input(logp: Storage, target: Any, weight: Any, cd: int, ignore: int,
                          eps: float, reduction: str, n_classes: int) -> Storage:
    s = _grouped(logp)
    shape, ndim = s.mask.shape, len(s.shape)
    gather = s.layout.gather
    classes = torch.arange(n_classes, device=s.values.device)
    cls = gather(s, _class_view(classes, ndim, cd)).expand(shape)
    if isinstance(target, Storage):  # (already unsqueezed along the class dim)
        y, given = layouts.read_broadcast(target, s)
        y, taken = y.expand(shape), s.mask & given.expand(shape)
    else:
        y, taken = gather(s, target.unsqueeze(cd)).expand(shape), s.mask
    taken = taken & (y != ignore)  # the specified classes of the samples that count
    hit = taken & (cls == y)
    term = -s.values
    w = None
    if weight is not None:
        w = gather(s, _class_view(weight, ndim, cd)).expand(shape)
        term = term * w
    g = layouts.group_by(s, (cd,), False)
    loss = g.reduce(zero_fill(term, hit), "sum")
    if eps:
        smooth = g.reduce(zero_fill(term, taken), "sum")
        k = g.reduce(s.mask, "sum").clamp(min=1).to(smooth.dtype)
        loss = (1 - eps) * loss + eps * smooth / k
    weights = None if w is None else g.reduce(zero_fill(w, hit), "sum")
    return _finish(g.build(loss, g.reduce(hit, "any")), reduction, weights)


def _indices_plain_input(logp: torch.Tensor, target: Storage, weight: Any, cd: int,
                         ignore: int, eps: float, reduction: str) -> Storage:
    y, valid = target.values, target.mask & (target.values != ignore)
    zero = torch.zeros((), dtype=y.dtype, device=y.device)
    dense_y = target.densify(torch.where(valid, y, zero), 0).long()  # (the input is dense)
    picked = logp.gather(cd, dense_y.unsqueeze(cd)).squeeze(cd)
    wy = None
    if weight is not None:
        wy = weight.index_select(0, dense_y.reshape(-1)).view(dense_y.shape)
        picked = picked * wy
    loss = -picked
    if eps:
        n_classes = logp.shape[cd]
        terms = logp if weight is None else logp * _class_view(weight, logp.dim(), cd)
        loss = (1 - eps) * loss - (eps / n_classes) * terms.sum(cd)
    gather = target.layout.gather
    loss = gather(target, loss).expand(y.shape)
    weights = None if wy is None else gather(target, wy).expand(y.shape)
    return _finish(target.with_values(loss, valid), reduction, weights)


def _kernel(storages: list, func: Any, slots: tuple[str, ...], reduction: str, cd: int,
            ignore: int, eps: float, probabilities: bool, n_classes: int) -> Storage:
    v = dict(zip(slots, storages))
    logp, target, weight = v["input"], v["target"], v.get("weight")
    if probabilities:
        return _probabilities(func, logp, target, weight, cd, eps, reduction)
    if isinstance(logp, Storage):
        return _indices_masked_input(logp, target, weight, cd, ignore, eps, reduction,
                                     n_classes)
    return _indices_plain_input(logp, target, weight, cd, ignore, eps, reduction)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def _check(name: str, input: Any, target: Any, weight: Any,
           probabilities_allowed: bool) -> tuple[int, int, bool]:
    """``(class dim, number of classes, probability target?)``, or a clear error."""
    for what, x in (("input", input), ("target", target)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}(): {what} must be a Tensor, got {type(x).__name__}")
        if not isinstance(x, MaskedTensor) and x.layout != torch.strided:
            raise NotImplementedError(
                f"{name}(): a plain {x.layout} {what} cannot meet a MaskedTensor; pass "
                f"{what}.to_dense(), or wrap it with ms.masked_tensor({what}, mask)")
    ndim = len(_shape(input))
    if ndim == 0:
        raise ValueError(f"{name}(): input must have a class dim (1-D (C,) or (N, C, ...)), "
                         f"got a 0-d input")
    cd = 0 if ndim == 1 else 1
    n_classes = _shape(input)[cd]
    tdtype = dtype_of(target) if isinstance(target, MaskedTensor) else target.dtype
    probabilities = tdtype.is_floating_point
    if probabilities:
        if not probabilities_allowed:
            raise TypeError(f"{name}(): expected a target of class indices (an integer "
                            f"tensor), got {tdtype}; use F.cross_entropy for class "
                            f"probabilities")
        if _shape(target) != _shape(input):
            raise ValueError(f"{name}(): a target of class probabilities must have the "
                             f"input's shape {_shape(input)}, got {_shape(target)}")
    else:
        if tdtype.is_complex or tdtype == torch.bool:
            raise TypeError(f"{name}(): expected a target of class indices (an integer "
                            f"tensor) or of class probabilities, got {tdtype}")
        expected = _shape(input)[:cd] + _shape(input)[cd + 1:]
        if _shape(target) != expected:
            raise ValueError(f"{name}(): expected a target of shape {expected} (the "
                             f"input's without its class dim {cd}), got {_shape(target)}")
    if weight is not None:
        if isinstance(weight, MaskedTensor) or not isinstance(weight, torch.Tensor):
            raise TypeError(f"{name}(): weight must be a plain tensor of {n_classes} class "
                            f"weights, got {type(weight).__name__}; to leave classes out, "
                            f"mask them in the input")
        if _shape(weight) != (n_classes,):
            raise ValueError(f"{name}(): weight must have shape ({n_classes},), one weight "
                             f"per class, got {_shape(weight)}")
    return cd, n_classes, probabilities


def _check_indices(name: str, target: Any, n_classes: int, ignore: int) -> None:
    """torch's IndexError for a class index out of range among the specified targets (on
    the CPU, where reading it back costs nothing more; other devices skip the check)."""
    if isinstance(target, MaskedTensor):
        values, mask = target._storage.values, target._storage.mask
    else:
        values, mask = target, None
    if (not values.is_cpu or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active()):
        return
    bad = ((values < 0) | (values >= n_classes)) & (values != ignore)
    if mask is not None:
        bad = bad & mask
    if bad.any():
        raise IndexError(f"{name}(): Target {int(values[bad][0])} is out of bounds (the input "
                         f"has {n_classes} classes)")


def class_loss(op: Any, name: str, input: Any, target: Any, weight: Any, ignore_index: int,
               reduction: str, label_smoothing: float, log_softmax: bool) -> Any:
    """``nll_loss`` (``log_softmax=False``) or ``cross_entropy`` with masked operands."""
    cd, n_classes, probabilities = _check(name, input, target, weight, log_softmax)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}(): label_smoothing must be between 0.0 and 1.0, got "
                         f"{label_smoothing}")
    if not probabilities:
        _check_indices(name, target, n_classes, ignore_index)
    logp = torch.log_softmax(input, cd) if log_softmax else input
    if not probabilities and isinstance(target, MaskedTensor) and isinstance(logp, MaskedTensor):
        target = target.unsqueeze(cd)  # read by each stored element of its sample
    given = {k: x for k, x in (("input", logp), ("target", target), ("weight", weight))
             if x is not None}
    return run(op, _kernel, list(given.values()), op, tuple(given), reduction, cd, ignore_index,
               float(label_smoothing), probabilities, n_classes)


@implements(F.cross_entropy)
def cross_entropy(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = bind(op, F.cross_entropy, args, kwargs)
    red = reduction_of("cross_entropy", a["reduction"], a["size_average"], a["reduce"])
    return class_loss(op, "cross_entropy", a["input"], a["target"], a["weight"],
                      a["ignore_index"], red, a["label_smoothing"], True)


@implements(F.nll_loss)
def nll_loss(op: Any, *args: Any, **kwargs: Any) -> Any:
    a = bind(op, F.nll_loss, args, kwargs)
    red = reduction_of("nll_loss", a["reduction"], a["size_average"], a["reduce"])
    return class_loss(op, "nll_loss", a["input"], a["target"], a["weight"], a["ignore_index"],
                      red, 0.0, False)


@implements(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(op: Any, *args: Any, **kwargs: Any) -> Any:
    """aten's ``nll_loss_forward`` (reached from C++ by composite ops): ``(output,
    total_weight)``, the total weight as a plain tensor (0 when nothing is specified)."""
    assert is_aten(op)
    a = bind(op, F.nll_loss, args, kwargs)
    red = reduction_of("nll_loss", a["reduction"])
    out = class_loss(op, "nll_loss", a["input"], a["target"], a["weight"], a["ignore_index"],
                     red, 0.0, False)
    with torch.no_grad():  # each specified sample's loss is its weight when logp is -1
        minus_one = -torch.ones_like(a["input"])
        total = class_loss(op, "nll_loss", minus_one, a["target"], a["weight"],
                           a["ignore_index"], "sum", 0.0, False)
    return out, total.to_tensor(0)
