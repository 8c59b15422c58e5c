"""``ms.optim.SGD``: torch.optim.SGD for dense, sparse and masked gradients."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import functional as F
from ._base import MaskedOptimizer, check_flags, check_nonnegative, check_switches


class SGD(MaskedOptimizer):
    """SGD (momentum, dampening, Nesterov, weight decay) for any gradient form.

    With a sparse or masked gradient the step is lazy (Note [Lazy updates]): the momentum
    buffer is dense but read and written only where the gradient is specified, so an entry
    the gradient skips keeps its buffer -- torch's SGD instead grows a sparse buffer that
    decays everywhere it was ever touched. Without momentum both give the same parameters.
    The state key is torch's ``"momentum_buffer"``. Dense gradients take torch's own
    multi-tensor step (Note [Dense gradients]); ``foreach`` / ``fused`` choose it as in
    torch, ``differentiable`` is not supported.

    >>> import torch, masked_sparse as ms
    >>> w = torch.nn.Parameter(torch.ones(4))
    >>> opt = ms.optim.SGD([w], lr=0.5, momentum=0.9)
    >>> w.grad = torch.sparse_coo_tensor([[0, 0, 2]], [1., 1., 4.], (4,))
    >>> opt.step()
    >>> w.detach()
    tensor([ 0.,  1., -1.,  1.])
    """

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 momentum: float = 0, dampening: float = 0, weight_decay: float = 0,
                 nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        check_nonnegative("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_flags("SGD", differentiable=differentiable)
        check_switches("SGD", foreach, fused)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("ms.optim.SGD: Nesterov momentum requires a momentum and zero "
                             "dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=False, fused=fused)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (``closure`` re-evaluates the loss)."""
        loss = self.run_closure(closure)
        for group in self.param_groups:
            found = self._with_grads(group)
            params = [p for p, _, _ in found]
            grads = [g for _, g, _ in found]
            momentum = group["momentum"]
            # As torch: the state is only looked at when there is a momentum buffer.
            buffers = ([st.get("momentum_buffer") for _, _, st in found] if momentum != 0
                       else [None] * len(params))
            F.sgd(params, grads, buffers, group["foreach"], group["fused"],
                  weight_decay=group["weight_decay"], momentum=momentum, lr=group["lr"],
                  dampening=group["dampening"], nesterov=group["nesterov"],
                  maximize=group["maximize"])
            if momentum != 0:
                for (_, _, st), buf in zip(found, buffers):
                    st["momentum_buffer"] = buf
        return loss
