"""``ms.optim.Adagrad``: torch.optim.Adagrad for dense, sparse and masked gradients."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import functional as F
from ._base import MaskedOptimizer, check_flags, check_nonnegative, check_switches


class Adagrad(MaskedOptimizer):
    """Adagrad with torch's arguments, for any gradient form (Note [Lazy updates]).

    Gradients may be dense, torch sparse COO (``nn.Embedding(sparse=True)``) or
    MaskedTensors of any layout; parameters may be MaskedTensors, of which only the
    specified entries are updated. Unlike ``torch.optim.Adagrad``, ``weight_decay`` works
    with sparse gradients: it decays the entries the gradient specifies (Note [Lazy weight
    decay]). Dense gradients take torch's own multi-tensor step (Note [Dense gradients]);
    ``foreach`` / ``fused`` choose it as in torch, ``differentiable`` is not supported.
    The state (``"step"``, ``"sum"``) has torch's keys, so state dicts move between the
    two classes.

    >>> import torch, masked_sparse as ms
    >>> emb = torch.nn.Embedding(10, 3, sparse=True)
    >>> opt = ms.optim.Adagrad(emb.parameters(), lr=0.1)
    >>> emb(torch.tensor([1, 1, 4])).sum().backward()
    >>> before = emb.weight.detach().clone()
    >>> opt.step()
    >>> (emb.weight != before).any(1).nonzero().flatten().tolist()   # only the rows looked up
    [1, 4]
    """

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-2,
                 lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10,
                 foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        check_nonnegative("Adagrad", lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                          initial_accumulator_value=initial_accumulator_value, eps=eps)
        check_flags("Adagrad", differentiable=differentiable)
        check_switches("Adagrad", foreach, fused)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=False, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group)

    def _init_state(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        state["step"] = self.new_step(p, group["fused"])
        state["sum"] = self.zeros(p, group["initial_accumulator_value"])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (``closure`` re-evaluates the loss)."""
        loss = self.run_closure(closure)
        for group in self.param_groups:
            params, grads, sums, steps = [], [], [], []
            for p, g, state in self._with_grads(group):
                if not state:
                    self._init_state(p, group)
                params.append(p)
                grads.append(g)
                sums.append(state["sum"])
                steps.append(state["step"])
            F.adagrad(params, grads, sums, steps, group["foreach"], group["fused"],
                      lr=group["lr"],
                      lr_decay=group["lr_decay"], weight_decay=group["weight_decay"],
                      eps=group["eps"], maximize=group["maximize"])
        return loss
