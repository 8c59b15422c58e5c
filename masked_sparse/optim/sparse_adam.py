"""``ms.optim.SparseAdam``: torch.optim.SparseAdam's numerics for every gradient form."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import functional as F
from ._base import MaskedOptimizer


class SparseAdam(MaskedOptimizer):
    """``torch.optim.SparseAdam`` -- its arguments, state and numbers -- for any gradient.

    The drop-in for ``torch.optim.SparseAdam`` (Note [Adam and SparseAdam]): ``eps`` is
    added before the bias correction, which matters when gradients are small next to
    ``eps``; ``ms.optim.Adam`` keeps dense Adam's formula instead. Gradients may be torch
    sparse COO (uncoalesced, hybrid), CSR / CSC / BSR, MaskedTensors of any layout, or
    dense (specified everywhere, where torch raises); only the specified entries of the
    parameter and of the moments are updated (Note [Lazy updates]). Parameters may be
    MaskedTensors. The state (``"step"`` an int, ``"exp_avg"``, ``"exp_avg_sq"``) is
    torch's, so state dicts move between the two classes.

    >>> import torch, masked_sparse as ms
    >>> emb = torch.nn.Embedding(10, 3, sparse=True)
    >>> opt = ms.optim.SparseAdam(emb.parameters(), lr=0.1)
    >>> emb(torch.tensor([2, 7])).sum().backward()
    >>> before = emb.weight.detach().clone()
    >>> opt.step()
    >>> (emb.weight != before).any(1).nonzero().flatten().tolist()   # only the rows looked up
    [2, 7]
    """

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False) -> None:
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("ms.optim.SparseAdam: Tensor lr must be 1-element")
        if not 0.0 < lr:
            raise ValueError(f"ms.optim.SparseAdam: invalid learning rate: {lr} (must be > 0)")
        if not 0.0 < eps:
            raise ValueError(f"ms.optim.SparseAdam: invalid epsilon value: {eps} (must be > 0)")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"ms.optim.SparseAdam: invalid beta parameter at index {i}: "
                                 f"{beta}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (``closure`` re-evaluates the loss)."""
        loss = self.run_closure(closure)
        for group in self.param_groups:
            params, grads, avgs, avg_sqs, steps = [], [], [], [], []
            for p, g, state in self._with_grads(group):
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = self.zeros(p)
                    state["exp_avg_sq"] = self.zeros(p)
                state["step"] += 1
                params.append(p)
                grads.append(g)
                avgs.append(state["exp_avg"])
                avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            beta1, beta2 = group["betas"]
            F.sparse_adam(params, grads, avgs, avg_sqs, steps, eps=group["eps"], beta1=beta1,
                          beta2=beta2, lr=float(group["lr"]), maximize=group["maximize"])
        return loss
