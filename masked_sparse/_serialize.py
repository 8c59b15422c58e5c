"""Persistence: pickle, ``torch.save`` / ``torch.load(weights_only=True)`` and deepcopy.

Note [Pickling from plain tensors]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A MaskedTensor pickles as a call ``_rebuild_masked(layout_name, shape, index, values,
mask, requires_grad, state)`` whose arguments are plain tensors, a str, ints, a bool and a
dict. ``torch.load(..., weights_only=True)`` accepts plain tensors and builtins already; the
one global it would refuse, ``_rebuild_masked``, is registered with
``torch.serialization.add_safe_globals`` when ``masked_sparse`` is imported, so users need
no allow-listing. ``torch.Tensor``'s default reduction is avoided on purpose: it would pickle
the ``Layout`` record by value (a copy, breaking ``storage.layout is layout``) and needs
``MaskedTensor`` itself allow-listed.

The rebuild function is safe to allow-list: it only builds a storage of a *registered*
layout from tensors and checks the layout's full invariants (O(nnz)) before wrapping it,
so a crafted file cannot produce an invalid MaskedTensor. Index tensors shared by several
MaskedTensors (``b = a.exp()`` shares ``a``'s indices and mask) are the same Python objects,
which pickle memoizes: after loading they are shared again, so masks still compare in O(1).
``requires_grad`` and extra attributes (``_is_param`` of an ``nn.Parameter``) round-trip;
``.grad`` is not saved, as for plain tensors, but ``copy.deepcopy`` copies it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

import layouts

from ._registry import method
from ._tensor import MaskedTensor, _wrap, is_storage_attr


def _rebuild_masked(layout_name: str, shape: Any, index: Any, values: torch.Tensor,
                    mask: torch.Tensor, requires_grad: bool, state: dict) -> MaskedTensor:
    """Rebuild a pickled MaskedTensor (the target of :func:`reduce_masked`)."""
    tensors = (*index, values, mask)
    if not isinstance(layout_name, str) or not all(type(t) is torch.Tensor for t in tensors):
        raise TypeError("MaskedTensor unpickling: expected a layout name and plain tensors, "
                        f"got {type(layout_name).__name__} and "
                        f"{[type(t).__name__ for t in tensors]}")
    if mask.dtype != torch.bool:
        raise TypeError(f"MaskedTensor unpickling: the mask must be bool, got {mask.dtype}")
    layout = layouts.get_layout(layout_name)
    storage = layout.build(tuple(index), values, mask, torch.Size(shape))
    layout.validate(storage, full=True)
    out = _wrap(storage, bool(requires_grad))
    for name, value in dict(state).items():
        if isinstance(name, str) and not is_storage_attr(name) and not name.startswith("__"):
            setattr(out, name, value)
    return out


def _extra_state(mt: MaskedTensor) -> dict[str, Any]:
    return {k: v for k, v in mt.__dict__.items() if not is_storage_attr(k)}


@method("reduce_ex")
def reduce_masked(mt: MaskedTensor, proto: int) -> tuple[Any, tuple[Any, ...]]:
    """``MaskedTensor.__reduce_ex__``: rebuild from plain tensors (see the module note)."""
    s = mt._storage
    values = s.values.detach() if s.values.requires_grad else s.values
    return _rebuild_masked, (s.layout.name, tuple(s.shape), tuple(s.index), values, s.mask,
                             mt.requires_grad, _extra_state(mt))


@method("deepcopy")
def deepcopy_masked(mt: MaskedTensor, memo: dict[int, Any]) -> MaskedTensor:
    """``MaskedTensor.__deepcopy__``: copies of every tensor, index sharing kept via ``memo``."""
    if id(mt) in memo:
        return memo[id(mt)]
    if not mt.is_leaf:
        raise RuntimeError("deepcopy: only MaskedTensors created explicitly by the user (graph "
                           "leaves) can be deep-copied, as for plain tensors; copy "
                           "mt.detach() instead")
    s = mt._storage
    with torch.no_grad():
        values = s.values.detach() if s.values.requires_grad else s.values
        storage = s.layout.build(tuple(copy.deepcopy(i, memo) for i in s.index),
                                 copy.deepcopy(values, memo), copy.deepcopy(s.mask, memo),
                                 s.shape)
    out = _wrap(storage, mt.requires_grad)
    memo[id(mt)] = out
    if mt.grad is not None:
        out.grad = copy.deepcopy(mt.grad, memo)
    for name, value in _extra_state(mt).items():
        setattr(out, name, copy.deepcopy(value, memo))
    return out


if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([_rebuild_masked])
