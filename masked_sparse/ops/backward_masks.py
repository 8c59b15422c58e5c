"""How gradients with different masks combine while autograd runs a backward pass.

Note [Masks of gradients]
~~~~~~~~~~~~~~~~~~~~~~~~~
Outside backward, binary ops demand equal masks (docs/semantics.md). Inside a
backward pass the only way two masks can differ is a gradient that is *narrower* than the
tensor it belongs to: ``where`` gives unchosen positions no gradient (Note [Gradient of
where]). A gradient's unspecified position means "nothing flows here", so while a graph task runs
(``torch._C._current_graph_task_id() != -1``):

- sums of gradients (``add`` / ``sub``: the engine accumulating the gradients of a tensor
  used twice, ``AccumulateGrad`` adding into ``.grad``, formulas adding terms) take the
  **union** of the masks, an unspecified term contributing 0; a plain tensor of the same
  shape is fully specified, so the sum is that plain tensor plus the masked term filled
  with 0 (a plain result);
- every other op (a formula's ``grad * saved``, ``grad / other``, ...) takes the
  **intersection**: no gradient in stays no gradient out.

Sparse operands must still store the same positions. Ops run by the user are unaffected.

Note [Ops without a masked kernel in backward]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A masked gradient flowing back into plain-tensor history (``as_masked_tensor(model(x),
mask)``) meets backward formulas of ops that MaskedTensor does not implement (``mm``,
``sparse_mask``, ...). There, and only while a graph task runs, the gradient is handed over
as a plain tensor of its layout with 0 for "no gradient" -- the convention of plain
autograd, which is what the plain history expects. In-place and ``out=`` ops still raise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map_only

import layouts
from layouts import Storage

from .._id_tags import IdTags
from .._tensor import MaskedTensor

aten = torch.ops.aten
_SUMS = frozenset({aten.add.Tensor, aten.add_.Tensor, aten.sub.Tensor, aten.sub_.Tensor})


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def combine(func: Any, storages: list[Storage], same_index: Any) -> list[Storage] | None:
    """Storages with differing masks combined by the rules above, or None if they cannot be."""
    first = storages[0]
    if not in_backward() or not all(same_index(first, s) for s in storages):
        return None
    if func in _SUMS:
        mask = first.mask
        for s in storages[1:]:
            mask = mask | s.mask
        return [Storage(first.layout, first.index, layouts.zero_unspecified(s.values, s.mask), mask,
                        s.shape) for s in storages]
    mask = first.mask
    for s in storages[1:]:
        mask = mask & s.mask
    return [Storage(first.layout, first.index, s.values, mask, s.shape) for s in storages]


def plain_sum(func: Any, args: tuple, kwargs: dict) -> Any:
    """A plain gradient plus a masked one (same shape) in backward: a plain tensor.

    Returns ``NotImplemented`` when the rule does not apply.
    """
    if func not in _SUMS or len(args) < 2 or not in_backward():
        return NotImplemented
    a, b = args[0], args[1]
    pair = (a, b) if isinstance(a, MaskedTensor) else (b, a)
    mt, plain = pair
    if not isinstance(mt, MaskedTensor) or isinstance(plain, MaskedTensor) or not isinstance(
            plain, torch.Tensor) or plain.shape != mt.shape or plain.layout != torch.strided:
        return NotImplemented
    s = mt._storage
    dense = s.densify(layouts.zero_unspecified(s.values, s.mask), 0)
    new_args = tuple(dense if x is mt else x for x in args)
    if mt is not a or func in (aten.add.Tensor, aten.sub.Tensor):
        return func(*new_args, **kwargs)
    # In place into a MaskedTensor (``.grad += plain``): it becomes fully specified.
    if s.values.shape != s.shape:
        raise NotImplementedError(
            f"MaskedTensor[{s.layout.name}] {func._opname}: cannot accumulate a dense gradient "
            f"into a sparse masked .grad in place; set .grad = None before this backward, or "
            f"give the tensor masked gradients only")
    out = func(*new_args, **kwargs)
    mt._storage = s.with_values(out, torch.ones_like(s.mask))
    return mt


# The plain form of each masked gradient handed to plain formulas, while it lives: one
# gradient often feeds several (``q @ k.mT`` sends its gradient to two products).
_PLAIN = IdTags()


def _as_plain(mt: MaskedTensor) -> torch.Tensor:
    s = mt._storage
    known = _PLAIN.get(mt)
    if known is not None and known[0] is s.values and known[1] == s.values._version:
        return known[2]
    plain = s.layout.to_torch(s, layouts.zero_unspecified(s.values, s.mask))
    _PLAIN.set(mt, (s.values, s.values._version, plain))
    return plain


def plain_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` on plain tensors (Note [Ops without a masked kernel in backward])."""
    args, kwargs = tree_map_only(MaskedTensor, _as_plain, (args, kwargs))
    return op(*args, **kwargs)
