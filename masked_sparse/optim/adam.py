"""``ms.optim.Adam`` and ``ms.optim.AdamW`` for dense, sparse and masked gradients."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import functional as F
from ._base import MaskedOptimizer, check_flags, check_nonnegative, check_switches


class Adam(MaskedOptimizer):
    """Adam with torch's arguments, for any gradient form; lazy like ``SparseAdam``.

    On sparse or masked gradients only the specified entries of the parameter and of
    the moments are updated (Note [Lazy updates]) -- what ``torch.optim.SparseAdam`` does
    for COO gradients only, and without ``weight_decay`` or ``amsgrad``, both supported
    here (Note [Lazy weight decay]). On dense gradients it is ``torch.optim.Adam``; Note
    [Adam and SparseAdam] gives the one difference from SparseAdam (where ``eps`` is added).
    ``decoupled_weight_decay=True`` is AdamW. Dense gradients take torch's own
    multi-tensor step (Note [Dense gradients]); ``foreach`` / ``fused`` choose it as in
    torch, ``capturable`` / ``differentiable`` are not supported. State keys are
    torch's (``"step"``, ``"exp_avg"``, ``"exp_avg_sq"``, ``"max_exp_avg_sq"``).

    >>> import torch, masked_sparse as ms
    >>> emb = torch.nn.Embedding(10, 3, sparse=True)
    >>> opt = ms.optim.Adam(emb.parameters(), lr=0.1)
    >>> emb(torch.tensor([2, 7])).sum().backward()
    >>> opt.step()
    >>> sorted(opt.state[emb.weight]["exp_avg"].abs().sum(1).nonzero().flatten().tolist())
    [2, 7]
    """

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False) -> None:
        name = type(self).__name__
        check_nonnegative(name, lr=lr, eps=eps, weight_decay=weight_decay)
        for i, beta in enumerate(betas):
            if not 0.0 <= float(beta) < 1.0:
                raise ValueError(f"ms.optim.{name}: invalid beta parameter at index {i}: {beta}")
        check_flags(name, capturable=capturable, differentiable=differentiable)
        check_switches(name, foreach, fused)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach, capturable=False,
                        differentiable=False, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (``closure`` re-evaluates the loss)."""
        loss = self.run_closure(closure)
        for group in self.param_groups:
            params, grads, avgs, avg_sqs, max_sqs, steps = [], [], [], [], [], []
            for p, g, state in self._with_grads(group):
                if not state:
                    state["step"] = self.new_step(p, group["fused"])
                    state["exp_avg"] = self.zeros(p)
                    state["exp_avg_sq"] = self.zeros(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = self.zeros(p)
                params.append(p)
                grads.append(g)
                avgs.append(state["exp_avg"])
                avg_sqs.append(state["exp_avg_sq"])
                if group["amsgrad"]:
                    max_sqs.append(state["max_exp_avg_sq"])
                steps.append(state["step"])
            beta1, beta2 = group["betas"]
            F.adam(params, grads, avgs, avg_sqs, max_sqs, steps, group["foreach"],
                   group["fused"], group["decoupled_weight_decay"], amsgrad=group["amsgrad"],
                   beta1=beta1, beta2=beta2, lr=group["lr"],
                   weight_decay=group["weight_decay"], eps=group["eps"],
                   maximize=group["maximize"])
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``'s arguments and defaults).

    With a sparse or masked gradient only the specified entries are decayed (Note [Lazy
    weight decay]).

    >>> import torch, masked_sparse as ms
    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> opt = ms.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> w.grad = torch.sparse_coo_tensor([[1]], [1.], (3,))
    >>> opt.step()
    >>> w.detach()
    tensor([1.0000, 0.8500, 1.0000])
    """

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
