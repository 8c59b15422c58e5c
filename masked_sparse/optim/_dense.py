"""Which gradients go to torch's own multi-tensor optimizers, and with which switches.

Note [Dense gradients]
~~~~~~~~~~~~~~~~~~~~~~
A dense gradient of a plain parameter is specified everywhere, so the lazy step of
:mod:`.functional` is the ordinary algorithm there. Those parameters are handed, all at
once, to torch's functional optimizer (``torch.optim.adam.adam``, ``...sgd.sgd``,
``...adagrad.adagrad``): the same numerics as ``torch.optim`` -- the tests compare
bitwise -- without a masked op per parameter, so a whole model can use ``ms.optim``. With
``foreach`` and ``fused`` both left unset they run on torch's ``foreach`` (multi-tensor)
path, which on CPU computes exactly what the per-tensor loop that ``torch.optim``
defaults to there computes, in fewer Python steps (``benchmarks/bench_optim.py``); a
Tensor ``lr`` keeps the per-tensor loop, as torch requires. ``foreach=False`` or
``fused=True`` are passed through as given. Every other parameter -- a sparse or masked
gradient, a MaskedTensor parameter -- takes the lazy masked path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._tensor import MaskedTensor


def is_dense_pair(param: torch.Tensor, grad: Any) -> bool:
    """True for a plain parameter with a plain strided gradient (Note [Dense gradients])."""
    return (not isinstance(param, MaskedTensor) and isinstance(grad, torch.Tensor)
            and not isinstance(grad, MaskedTensor) and grad.layout == torch.strided
            and grad.shape == param.shape)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def split(params: Sequence[torch.Tensor], grads: Sequence[Any]) -> tuple[list[int], list[int]]:
    """``(dense, lazy)``: the positions of the dense pairs and of all the others."""
    dense: list[int] = []
    lazy: list[int] = []
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        # The first test is a shortcut for the usual case (a model's plain parameters).
        if (type(g) is torch.Tensor and type(p) in _PLAIN and g.layout == torch.strided
                and g.shape == p.shape) or is_dense_pair(p, g):
            dense.append(i)
        else:
            lazy.append(i)
    return dense, lazy


def pick(items: Sequence[Any], positions: list[int]) -> list[Any]:
    """``items`` at ``positions`` (``items`` itself when that is all of them)."""
    if len(positions) == len(items):
        return list(items) if not isinstance(items, list) else items
    return [items[i] for i in positions]


def switches(foreach: bool | None, fused: bool | None, lr: Any) -> dict[str, Any]:
    """``foreach`` / ``fused`` for torch's functional optimizer (Note [Dense gradients])."""
    if foreach is None and not fused:
        foreach = not isinstance(lr, torch.Tensor)
    return {"foreach": foreach, "fused": fused}


def has_complex(params: Sequence[torch.Tensor]) -> bool:
    return any(torch.is_complex(p) for p in params)
