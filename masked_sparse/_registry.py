"""The two op tables of the core, filled by the modules in ``masked_sparse/ops``.

- ``FUNCTIONS`` maps Python-level callables (``torch.sum``, ``torch.Tensor.sum``, the
  ``layout`` property getter, ...) to handlers; ``__torch_function__`` consults it first. These
  handlers own masked semantics that must hold above autograd (reductions, ``where``,
  conversions): they compute with the layout kernels and add autograd on the values.
- ``ATEN`` maps exact aten overloads to kernels ``(func, args, kwargs) -> result``;
  ``__torch_dispatch__`` consults it. Ops tagged ``torch.Tag.pointwise`` need no entry: they
  fall to the one generic "apply to the values" kernel (and are cached here on first use).

Note [Two tables]
~~~~~~~~~~~~~~~~~
Pointwise ops go through the C++ dispatcher: autograd records its own formula on the
MaskedTensor (whose backward formulas are pointwise too, so masks keep matching) and the
kernel runs on the values below autograd. Ops whose gradient must carry the *input's*
mask (reductions, where, conversions, sparse shape ops) are intercepted above autograd,
where we can attach a backward that builds the gradient from the input's storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FUNCTIONS: dict[Any, Callable[..., Any]] = {}
ATEN: dict[Any, Callable[..., Any]] = {}


def implements(*funcs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a handler for Python-level functions: ``handler(*args, **kwargs)``.

    >>> import torch
    >>> @implements(torch.Tensor.numel)      # doctest: +SKIP
    ... def numel(mt): ...
    """

    def decorator(handler: Callable[..., Any]) -> Callable[..., Any]:
        for f in funcs:
            FUNCTIONS[f] = handler
        return handler

    return decorator


def implements_aten(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a kernel for exact aten overloads: ``kernel(func, args, kwargs)``."""

    def decorator(kernel: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            ATEN[op] = kernel
        return kernel

    return decorator
