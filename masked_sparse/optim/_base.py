"""What the optimizer classes share: argument checks, state tensors, the step loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from .._tensor import MaskedTensor
from ._same_pattern import mark_zero
from ._scatter import target_of


def scalar_dtype() -> torch.dtype:
    """The dtype torch.optim uses for ``state["step"]``."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def check_flags(name: str, **flags: Any) -> None:
    """Refuse the torch.optim implementation switches that change what a step computes."""
    for flag, value in flags.items():
        if value:
            raise NotImplementedError(f"ms.optim.{name}: {flag}=True is not supported "
                                      f"(sparse and masked gradients have one lazy code "
                                      f"path); leave it unset")


def check_switches(name: str, foreach: bool | None, fused: bool | None) -> None:
    """torch's rule for the two implementation switches (Note [Dense gradients])."""
    if foreach and fused:
        raise RuntimeError(f"ms.optim.{name}: `fused` and `foreach` cannot be `True` together.")


def check_nonnegative(name: str, **values: Any) -> None:
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"ms.optim.{name}: Tensor {key} must be 1-element")
            value = float(value)
        if not 0.0 <= value:
            raise ValueError(f"ms.optim.{name}: invalid {key} value: {value}")


class MaskedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose parameters may be MaskedTensors and whose
    gradients may be dense, torch sparse or MaskedTensors (see :mod:`.functional`)."""

    def _with_grads(self, group: dict[str, Any]) -> list[tuple[torch.Tensor, Any, dict]]:
        """``(param, grad, state)`` for the parameters of ``group`` that have a gradient.

        Read without ``__torch_function__``: ``p.grad`` and the state's key (the tensor's
        hash) have no masked meaning, and a MaskedTensor parameter would otherwise take a
        round trip through the subclass for each (``benchmarks/bench_training.py`` times
        the step)."""
        state = self.state
        with DisableTorchFunctionSubclass():
            return [(p, g, state[p]) for p in group["params"] if (g := p.grad) is not None]

    @staticmethod
    def zeros(p: torch.Tensor, value: float = 0.0) -> torch.Tensor:
        """A state tensor for ``p``: shaped like its target (Note [Lazy updates]); a zero
        state of a masked parameter is known to be 0 at its unspecified entries (Note
        [Gradients over the parameter's pattern])."""
        state = torch.full_like(target_of(p), value, memory_format=torch.preserve_format)
        if value == 0 and isinstance(p, MaskedTensor):
            mark_zero(state)
        return state

    @staticmethod
    def new_step(p: torch.Tensor, fused: bool | None) -> torch.Tensor:
        """``state["step"]`` as torch.optim makes it (float32 on the device when fused)."""
        if fused:
            return torch.zeros((), dtype=torch.float32, device=p.device)
        return torch.tensor(0.0, dtype=scalar_dtype())

    @staticmethod
    def run_closure(closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
