"""Masked parameters whose gradient covers their pattern, through torch's multi-tensor
optimizers.

Note [Gradients over the parameter's pattern]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A MaskedTensor parameter whose gradient specifies every entry the parameter specifies, over
the parameter's own pattern -- what autograd gives it, in any layout; a dense gradient; a
gradient whose mask (and index) is equal to the parameter's but another tensor, as after a
collective, after clipping or when set by hand -- is updated elementwise over its stored
values: the dense algorithm on the specified entries and nothing elsewhere (Note [Lazy
updates]). That is torch's own multi-tensor step (``torch.optim.adam.adam`` & co.,
``foreach``) on the values tensor (for a strided parameter the dense weight itself, for CSR
its ``nnz`` values), given a gradient that is 0 at the unspecified entries -- the mask
applied once per step, one exact fill (:func:`filled_grad`) -- provided an entry with a zero
gradient does not move:

- SGD without momentum, Adagrad: ``param += 0`` and ``sum += 0 * 0`` leave it as it is.
- Adam's moments decay (``m *= beta1``): they must already be 0 there, and then the update
  ``0 / (sqrt(0) + eps)`` is 0. Same for SGD's momentum buffer. Every step through this
  path keeps them 0 there, so a state tensor is checked once (:func:`zero_outside`: one pass
  on the CPU; a state the optimizer created is known to be 0) and then tagged with the mask
  object and its own version, as the zero fill is (Note [Known zero fill]); a state written
  by anything else -- a loaded state dict -- is checked again, and one that is not 0 there
  (or one that cannot be checked without a host sync) takes the lazy path.
- Weight decay is folded into the gradient before the fill (``grad + weight_decay *
  param``: torch's own op) and AdamW's decoupled decay multiplies by a factor that is 1 at
  the unspecified entries, so torch is called with ``weight_decay=0``.

(SGD with momentum on the CPU takes the same pairs through one native pass instead, which
reads no unspecified gradient value and needs no fill: Note [SGD momentum in one pass] in
``layouts/_sgd.py``.)

So on the specified entries the numbers are torch's on the dense weights (the tests compare
against ``torch.optim`` at 1e-5 and hold the unspecified entries, values and states,
exactly fixed), at torch's speed (``benchmarks/bench_training.py``). Anything else -- a
gradient with another pattern or mask, a state that is not 0 where it must be --
takes the lazy path of :mod:`._entries`, which gives the same numbers where it updates.

Note [Equal masks without a host sync]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Whether a gradient covers the parameter is known for free when it shares the parameter's
mask (and index) objects. Otherwise the tensors are compared -- ``torch.equal`` of the
indices, then of the masks, else ``mask & ~grad_mask`` has no True -- once per pair of
tensors, and the verdict is kept in a table keyed weakly by the two tensors' identities and
version counters (:class:`_PairVerdicts`): a gradient whose mask object comes back step after
step is compared once, an in-place change of either mask bumps its version and brings a new
comparison, and a dead tensor's entry goes with it. The comparison reads a bool on the
host, which on CUDA would wait for the device; so it runs where the tensors are on the CPU
(``_scatter.on_cpu``) and nowhere else. On another device a pair not known to be equal takes
the lazy path, which needs no comparison: it steps the entries where both masks hold and
writes nothing else, so an equal mask gives torch's numbers there too, at the cost of a copy
and a ``where`` per tensor (``python -m benchmarks.bench_optim --device cuda`` times both).

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

from layouts import Storage

from .._fill import is_zero_filled, zero_fill
from .._id_tags import IdTags
from .._tensor import MaskedTensor
from . import _scatter
from ._scatter import gather_at


def _untracked(t: torch.Tensor) -> bool:
    """No verdict or tag is kept for ``t``: an inference tensor has no version counter, and
    Dynamo does not trace the tables."""
    return torch.is_inference(t) or torch.compiler.is_compiling()


class _PairVerdicts:
    """A verdict on a pair of tensors, valid while both live and neither has been written
    (Note [Equal masks without a host sync]): keyed by the two identities, checked against
    weak references and the version counters read when it was reached. At most ``size``
    entries (the oldest go first); an entry goes as soon as either tensor dies.

    >>> a, b, table = torch.ones(2), torch.ones(2), _PairVerdicts()
    >>> table.set(a, b, True); table.get(a, b)
    True
    >>> _ = b.add_(1); table.get(a, b) is None   # b was written: no verdict
    True
    """

    def __init__(self, size: int = 256) -> None:
        self._table: dict[tuple[int, int], tuple[Any, ...]] = {}
        self._size = size

    def get(self, a: torch.Tensor, b: torch.Tensor) -> bool | None:
        entry = self._table.get((id(a), id(b)))
        if entry is None:  # (an entry is never made for an inference tensor: see set)
            return None
        ref_a, ref_b, version_a, version_b, verdict = entry
        if (ref_a() is a and ref_b() is b and version_a == a._version
                and version_b == b._version):
            return verdict
        return None

    def set(self, a: torch.Tensor, b: torch.Tensor, verdict: bool) -> None:
        if _untracked(a) or _untracked(b):
            return
        key, table = (id(a), id(b)), self._table

        def forget(ref: weakref.ref, key: tuple[int, int] = key, table: dict = table) -> None:
            entry = table.get(key)
            if entry is not None and (entry[0] is ref or entry[1] is ref):
                del table[key]

        table.pop(key, None)  # re-inserted last: the newest
        table[key] = (weakref.ref(a, forget), weakref.ref(b, forget), a._version, b._version,
                      verdict)
        while len(table) > self._size:
            del table[next(iter(table))]


_TAGS = IdTags()  # state -> (mask or None for "0 everywhere", mask version, version)
_EQUAL = _PairVerdicts()  # (index or mask, index or mask) -> torch.equal
_COVERS = _PairVerdicts()  # (param mask, grad mask) -> grad mask True wherever param mask is
_FACTORS = IdTags()  # mask -> (version, value, factor)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal(a, b)`` for two tensors of one shape and dtype, read as 8-byte words
    where their memory allows (``torch.equal`` compares element by element: several times
    slower on a bool mask). Two bool tensors with other bytes than 0 and 1 may compare
    unequal while their values are equal: the caller then takes the lazy path, which is
    exact either way."""
    size = a.element_size()
    if not (a.is_contiguous() and b.is_contiguous() and a.numel() * size >= 8
            and (a.storage_offset() * size) % 8 == 0 and (b.storage_offset() * size) % 8 == 0):
        return torch.equal(a, b)
    x, y = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    n = x.numel() // 8 * 8
    return (torch.equal(x[:n].view(torch.int64), y[:n].view(torch.int64))
            and torch.equal(x[n:], y[n:]))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal(a, b)`` where it is free or known (Note [Equal masks without a host
    sync]); False where finding out would sync the host."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    verdict = _EQUAL.get(a, b)
    if verdict is None:
        if not _scatter.on_cpu(a):
            return False
        verdict = _same_bytes(a, b)
        _EQUAL.set(a, b, verdict)
    return verdict


def same_pattern(ps: Storage, gs: Storage) -> bool:
    """True when ``gs`` stores exactly the positions ``ps`` stores, in the same order: its
    values line up with the parameter's (the same index objects, or equal ones)."""
    if gs.values.shape != ps.values.shape or gs.shape != ps.shape:
        return False
    if ps.same_index(gs):
        return True
    return (gs.layout is ps.layout and len(gs.index) == len(ps.index)
            and all(_equal(a, b) for a, b in zip(ps.index, gs.index)))


def covers(mask: torch.Tensor, grad_mask: torch.Tensor) -> bool:
    """True when ``grad_mask`` is True wherever ``mask`` is (equal masks, or a gradient that
    specifies more), known without a device sync (Note [Equal masks without a host sync])."""
    if grad_mask is mask:
        return True
    if grad_mask.device != mask.device:
        return False
    verdict = _COVERS.get(mask, grad_mask)
    if verdict is None:
        if not _scatter.on_cpu(mask):
            return False
        verdict = ((mask.shape == grad_mask.shape and mask.dtype == grad_mask.dtype
                    and _same_bytes(mask, grad_mask))
                   or not bool(mask.logical_and(grad_mask.logical_not()).any()))
        _COVERS.set(mask, grad_mask, verdict)
    return verdict


def covering_values(param: torch.Tensor, grad: Any) -> torch.Tensor | None:
    """The gradient's values over ``param``'s stored values where it covers every entry the
    parameter specifies (Note [Gradients over the parameter's pattern]), else None."""
    if not isinstance(param, MaskedTensor):
        return None
    ps = param._storage
    if ps.values.is_complex():
        return None
    if isinstance(grad, MaskedTensor):
        gs = grad._storage
        if (gs.values.dtype == ps.values.dtype and same_pattern(ps, gs)
                and covers(ps.mask, gs.mask)):
            return gs.values
        return None
    if (type(grad) is torch.Tensor and grad.layout == torch.strided
            and grad.shape == ps.shape and grad.dtype == ps.values.dtype):
        return gather_at(grad, ps)  # a dense gradient specifies every entry
    return None


def full_pairs(params: Sequence[torch.Tensor], grads: Sequence[Any],
               positions: list[int]) -> tuple[list[int], list[int], dict[int, torch.Tensor]]:
    """``(full, rest, values)`` of ``positions``: the MaskedTensor parameters whose gradient
    covers their pattern (Note [Gradients over the parameter's pattern]), all the others,
    and the gradient values of each full one."""
    full: list[int] = []
    rest: list[int] = []
    values: dict[int, torch.Tensor] = {}
    for i in positions:
        found = covering_values(params[i], grads[i])
        if found is None:
            rest.append(i)
        else:
            full.append(i)
            values[i] = found
    return full, rest, values


def target_and_mask(param: MaskedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = param._storage
    return s.values, s.mask


def filled_grad(param: MaskedTensor, values: torch.Tensor, *, negate: bool = False,
                weight_decay: float = 0.0) -> torch.Tensor:
    """The gradient's ``values`` (negated, plus ``weight_decay * param`` as torch adds it),
    exactly 0 at the parameter's unspecified entries: the one fill of a step."""
    target, mask = target_and_mask(param)
    g = values
    if negate:
        g = torch.neg(g)
    if weight_decay != 0:
        g = g.add(target, alpha=weight_decay)
    elif is_zero_filled(g, mask):
        return g
    return zero_fill(g, mask)  # (on the CPU one native pass, faster than a bitwise ``and``)


def zero_outside(state: torch.Tensor | None, mask: torch.Tensor) -> bool:
    """True when ``state`` is 0 wherever ``mask`` is False (None: a buffer torch creates
    from the filled gradient). Known after a step through here or for a state the optimizer
    created (:func:`mark_zero`), else one pass on the CPU; unknown (False) elsewhere."""
    if state is None or is_known_zero_outside(state, mask):
        return True
    if not _scatter.on_cpu(state):
        return False
    ok = not bool(state.ne(0).logical_and_(mask.logical_not()).any())
    if ok:
        mark(state, mask)
    return ok


def is_known_zero_outside(state: torch.Tensor, mask: torch.Tensor) -> bool:
    """True when a tag says ``state`` is 0 wherever ``mask`` is False (no pass)."""
    tag = _TAGS.get(state)
    if tag is None or tag[2] != state._version:
        return False
    return tag[0] is None or (tag[0] is mask and tag[1] == mask._version)


def mark(state: torch.Tensor | None, mask: torch.Tensor) -> None:
    """Record that ``state`` is 0 wherever ``mask`` is False, at its current version."""
    if state is not None and not _untracked(state):
        _TAGS.set(state, (mask, mask._version, state._version))


def mark_zero(state: torch.Tensor) -> None:
    """Record that ``state`` is 0 everywhere (a state just created), at its version."""
    if not _untracked(state):
        _TAGS.set(state, (None, 0, state._version))


def decay_factor(mask: torch.Tensor, value: Any, like: torch.Tensor) -> torch.Tensor:
    """``value`` where ``mask`` is True and exactly 1 elsewhere, ``like``'s dtype: AdamW's
    decoupled decay (``param *= 1 - lr * weight_decay``) on the specified entries only.
    Kept per mask object while ``value`` is unchanged."""
    entry = _FACTORS.get(mask)
    key = float(value)
    if (entry is not None and entry[0] == mask._version and entry[1] == key
            and entry[2].dtype == like.dtype and entry[2].device == like.device
            and entry[3] == entry[2]._version):
        return entry[2]
    factor = torch.full(like.shape, key, dtype=like.dtype, device=like.device)
    factor.masked_fill_(mask.logical_not(), 1.0)
    _FACTORS.set(mask, (mask._version, key, factor, factor._version))
    return factor
