"""Masked parameters whose gradient has their own pattern, through torch's multi-tensor
optimizers.

Note [Gradients over the parameter's pattern]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A MaskedTensor parameter whose gradient is stored over the very same index and mask objects
-- what autograd gives it, in any layout -- is updated elementwise over its stored values:
the dense algorithm on the specified entries and nothing elsewhere (Note [Lazy updates]).
That is torch's own multi-tensor step (``torch.optim.adam.adam`` & co., ``foreach``) on the
values tensor (for a strided parameter the dense weight itself, for CSR its ``nnz`` values),
given a gradient that is 0 at the unspecified entries -- the mask applied once per step, one
exact fill (:func:`filled_grad`) -- provided an entry with a zero gradient does not move:

- SGD without momentum, Adagrad: ``param += 0`` and ``sum += 0 * 0`` leave it as it is.
- Adam's moments decay (``m *= beta1``): they must already be 0 there, and then the update
  ``0 / (sqrt(0) + eps)`` is 0. Same for SGD's momentum buffer. Every step through this
  path keeps them 0 there, so a state tensor is checked once (:func:`zero_outside`: one pass)
  and then tagged with the mask object and its own version, as the zero fill is (Note
  [Known zero fill]); a state written by anything else -- a lazy step under another mask, a
  loaded state dict -- is checked again, and one that is not 0 there takes the lazy path.
- Weight decay is folded into the gradient before the fill (``grad + weight_decay *
  param``: torch's own op) and AdamW's decoupled decay multiplies by a factor that is 1 at
  the unspecified entries, so torch is called with ``weight_decay=0``.

So on the specified entries the numbers are torch's on the dense weights (the tests compare
against ``torch.optim`` at 1e-5 and hold the unspecified entries, values and states,
exactly fixed), at torch's speed (``benchmarks/bench_training.py``). Anything else -- a
gradient with another pattern or mask, a state that is not 0 where it must be --
takes the lazy masked path of :mod:`.functional`.

>>> import torch, masked_sparse as ms
>>> w = torch.nn.Parameter(ms.masked_tensor(torch.ones(3), torch.tensor([True, False, True])))
>>> opt = ms.optim.Adam([w], lr=0.1)
>>> (w * torch.tensor([1., 2., 3.])).sum().backward()
>>> opt.step()
>>> w._storage.values.detach()
tensor([0.9000, 1.0000, 0.9000])
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._fill import is_zero_filled, zero_fill
from .._tensor import MaskedTensor


class _IdTags:
    """A table keyed weakly by tensor identity, as ``WeakIdKeyDictionary``, read without
    building a weak reference per lookup: an optimizer step reads and rewrites one tag per
    state tensor (``benchmarks/bench_training.py`` times the step). An entry dies with its
    tensor (the weak reference's callback), and a reused ``id`` is told apart by the
    reference itself.

    >>> t, tags = torch.zeros(2), _IdTags()
    >>> tags.set(t, "tag"); tags.get(t), tags.get(torch.zeros(2))
    ('tag', None)
    """

    def __init__(self) -> None:
        self._table: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, t: torch.Tensor) -> Any:
        entry = self._table.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def set(self, t: torch.Tensor, value: Any) -> None:
        key, table = id(t), self._table
        entry = table.get(key)
        if entry is not None and entry[0]() is t:
            table[key] = (entry[0], value)
            return

        def forget(ref: weakref.ref, key: int = key, table: dict = table) -> None:
            if (table.get(key) or (None,))[0] is ref:
                del table[key]

        table[key] = (weakref.ref(t, forget), value)


_TAGS = _IdTags()  # state -> (mask, mask version, version)
_FACTORS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # mask -> (version, value, factor)


def full_pairs(params: Sequence[torch.Tensor], grads: Sequence[Any],
               positions: list[int]) -> tuple[list[int], list[int]]:
    """``(full, rest)`` of ``positions``: the MaskedTensor parameters whose gradient is a
    MaskedTensor over the same index and mask objects (Note [Gradients over the parameter's
    pattern]), and all the others."""
    full: list[int] = []
    rest: list[int] = []
    for i in positions:
        p, g = params[i], grads[i]
        if isinstance(p, MaskedTensor) and isinstance(g, MaskedTensor):
            ps, gs = p._storage, g._storage
            if (gs.mask is ps.mask and (gs.index is ps.index or ps.same_index(gs))
                    and gs.values.shape == ps.values.shape
                    and gs.values.dtype == ps.values.dtype and not ps.values.is_complex()):
                full.append(i)
                continue
        rest.append(i)
    return full, rest


def target_and_mask(param: MaskedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = param._storage
    return s.values, s.mask


def filled_grad(param: MaskedTensor, grad: MaskedTensor, *, negate: bool = False,
                weight_decay: float = 0.0) -> torch.Tensor:
    """The gradient's values (negated, plus ``weight_decay * param`` as torch adds it),
    exactly 0 at the parameter's unspecified entries: the one fill of a step."""
    values, mask = target_and_mask(param)
    g = grad._storage.values
    if negate:
        g = torch.neg(g)
    if weight_decay != 0:
        g = g.add(values, alpha=weight_decay)
    elif is_zero_filled(g, mask):
        return g
    return zero_fill(g, mask)


def zero_outside(state: torch.Tensor | None, mask: torch.Tensor) -> bool:
    """True when ``state`` is 0 wherever ``mask`` is False (None: a buffer torch creates
    from the filled gradient). Known after a step through here, else one pass."""
    if state is None:
        return True
    tag = _TAGS.get(state)
    if (tag is not None and tag[0] is mask and tag[1] == mask._version
            and tag[2] == state._version):
        return True
    ok = not bool(state.ne(0).logical_and_(mask.logical_not()).any())
    if ok:
        mark(state, mask)
    return ok


def mark(state: torch.Tensor | None, mask: torch.Tensor) -> None:
    """Record that ``state`` is 0 wherever ``mask`` is False, at its current version."""
    if state is not None and not torch.compiler.is_compiling():
        _TAGS.set(state, (mask, mask._version, state._version))


def decay_factor(mask: torch.Tensor, value: Any, like: torch.Tensor) -> torch.Tensor:
    """``value`` where ``mask`` is True and exactly 1 elsewhere, ``like``'s dtype: AdamW's
    decoupled decay (``param *= 1 - lr * weight_decay``) on the specified entries only.
    Kept per mask object while ``value`` is unchanged."""
    entry = _FACTORS.get(mask)
    key = float(value)
    if (entry is not None and entry[0] == mask._version and entry[1] == key
            and entry[2].dtype == like.dtype and entry[3] == entry[2]._version):
        return entry[2]
    factor = torch.full(like.shape, key, dtype=like.dtype, device=like.device)
    factor.masked_fill_(mask.logical_not(), 1.0)
    _FACTORS[mask] = (mask._version, key, factor, factor._version)
    return factor
