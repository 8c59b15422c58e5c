"""MaskedTensors inside ``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``, ``vmap``).

Note [MaskedTensors in torch.func]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A transform wraps every tensor it tracks in a C++ wrapper of plain type (torch strips
tensor subclasses), and runs torch's own derivative formulas on it: right for pointwise
ops, wrong for masked reductions (a masked ``mean`` divides by the count of specified
elements, not by ``numel``). So inside a transform the wrapping goes the other way round:
a MaskedTensor is built *over* the transform's tracked values -- its values tensor is the
wrapper, its mask and index tensors are plain -- and every masked op is the layout
kernel, plain differentiable torch ops on those values (Note [Autograd on the values]).
The transform differentiates (or batches) the kernels themselves: masked gradients on
every layout, MaskedTensor methods available, second derivatives for free.

Such MaskedTensors come from ``as_masked_tensor(x, mask)`` with a tracked ``x`` (no
autograd.Function in between), and from ``ms.lift`` (``_autograd.lift``), which turns a
MaskedTensor argument that the transform wrapped back into a MaskedTensor.

Sparse layouts keep plain tensors too (index, values, mask), so the same holds for them
once the tracked values are inside: ``as_masked_tensor(x, mask).to_sparse_csr()`` gathers
``x`` at the mask with plain ops, and every kernel after it runs on those values. What
torch cannot do under a transform is build a compressed sparse tensor over tracked values
(CSR / CSC / BSR results: :func:`check_torch_result`) or track a sparse input. ``lift``
takes sparse arguments: the gradient of a compressed one is built in COO, which torch can
build, and converted back (``_autograd.masked_grad``).

One routing detail: an op that reaches ``__torch_dispatch__`` (pointwise ops) goes down the
dispatcher, where functorch's layers would take the MaskedTensor for a constant and then pop
themselves before our kernel runs on their wrappers. :func:`dispatch_below` therefore
sends the call down with functorch's layers switched off, and ``__torch_dispatch__`` runs
the kernel with the caller's dispatch state restored (:func:`restored`), so the kernel's
ops on the tracked values meet the transform exactly as they would at the top.

This module holds the plumbing that needs no MaskedTensor: the state of the transforms, the
dispatch below them and the autograd :class:`Function` base of the core.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch._functorch.utils import unwrap_dead_wrappers

_FUNCTORCH_LAYERS = (torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode)
                     | torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchDynamicLayerBackMode))


class _Saved(threading.local):
    stack: list[tuple[Any, Any]]

    def __init__(self) -> None:
        self.stack = []


SAVED = _Saved()


def active() -> bool:
    """True while a ``torch.func`` transform runs (one C call)."""
    return torch._C._are_functorch_transforms_active()


def dispatch_below(func: Any, args: tuple, kwargs: dict | None) -> Any:
    """``func(*args, **kwargs)`` sent to ``__torch_dispatch__`` past functorch's layers,
    with the current dispatch state kept for :func:`restored` (Note [MaskedTensors in
    torch.func])."""
    SAVED.stack.append((torch._C._dispatch_tls_local_include_set(),
                         torch._C._dispatch_tls_local_exclude_set()))
    try:
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTORCH_LAYERS), DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))
    finally:
        SAVED.stack.pop()


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """The dispatch state the innermost :func:`dispatch_below` kept, while a kernel runs."""
    with torch._C._ForceDispatchKeyGuard(*SAVED.stack[-1]):
        pending, SAVED.stack = SAVED.stack, []  # ops of the kernel start afresh
        try:
            yield
        finally:
            SAVED.stack = pending


_DIFFERENTIATING = frozenset({"grad_and_value_impl", "_vjp_with_argnums", "_jvp_with_argnums"})


def under_grad_transform() -> bool:
    """True when an op reached ``__torch_dispatch__`` through functorch's layers (not routed
    by :func:`dispatch_below`) inside ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``jvp``.

    Such an op ran on a MaskedTensor *argument* that was not lifted, and the transform has
    recorded torch's dense derivative formula for it. The dispatcher has popped the layer,
    so the transform is found by its Python frame (``vmap`` alone batches correctly and is
    let through). Only reductions, softmax and the like ask (Note [Aten-level autograd]).
    """
    if SAVED.stack or not torch._C._dispatch_tls_local_exclude_set().has(
            torch._C.DispatchKey.FuncTorchDynamicLayerBackMode):
        return False
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _DIFFERENTIATING and "_functorch" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def innermost(t: torch.Tensor) -> torch.Tensor:
    """``t`` without the wrappers of every active ``torch.func`` transform."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


class Function(torch.autograd.Function):
    """A ``torch.autograd.Function`` with ``setup_context`` (what torch.func transforms
    need: Note [Functions for torch.func]) whose ``apply`` outside a transform skips torch's
    per-call binding of the arguments to ``forward``'s signature (``inspect.signature``, a
    fixed cost of every masked op in a training step). The binding only fills in defaults,
    so ``forward`` here must take none (checked once, when the class is defined).

    >>> class Twice(Function):
    ...     @staticmethod
    ...     def forward(x): return 2 * x
    ...     @staticmethod
    ...     def setup_context(ctx, inputs, output): pass
    ...     @staticmethod
    ...     def backward(ctx, grad): return 2 * grad
    >>> x = torch.ones(2, requires_grad=True)
    >>> Twice.apply(x).sum().backward(); x.grad.tolist()
    [2.0, 2.0]
    """

    _traced: type[torch.autograd.Function]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_is_traced_twin"):
            return
        # Note [Functions under Dynamo]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # Dynamo traces an autograd.Function's ``apply`` only as torch defines it: it
        # inlines an overridden one (ours, below) and then fails on its ``super()`` call
        # (``AutogradFunctionVariable() is not a constant``). So every Function has a twin
        # with torch's own ``apply`` (the same forward, setup_context and backward), which
        # ``apply`` calls while Dynamo traces: a graph then records the Function as torch's.
        cls._traced = type(cls.__name__, (cls,), {
            "_is_traced_twin": True, "apply": torch.autograd.Function.__dict__["apply"],
            "__module__": cls.__module__, "__qualname__": cls.__qualname__ + "._traced"})
        params = inspect.signature(cls.forward).parameters.values()
        if any(p.default is not p.empty for p in params):
            raise TypeError(f"{cls.__name__}.forward: a masked_sparse Function takes no "
                            "default arguments (its apply does not bind them)")

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if _dynamo_compiling():  # Note [Functions under Dynamo]
            return cls._traced.apply(*args)
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)  # torch.func's custom_function_call
        # torch._C._FunctionBase's apply, as torch's own does after the binding (kept as
        # torch writes it: torch.compile traces this line)
        return super(torch.autograd.Function, cls).apply(*unwrap_dead_wrappers(args))


_dynamo_compiling = torch.compiler.is_dynamo_compiling


def builds_under_transforms(layout: Any) -> bool:
    """True when torch can build ``layout``'s torch form over values a transform tracks:
    strided and COO tensors; not the compressed ones ("Sparse CSR tensors do not have
    strides"). Layouts with no torch form are not asked."""
    return layout.torch_layout in (None, torch.strided, torch.sparse_coo)


def sparse_refusal(op: str, layout: str) -> str:
    """Why a sparse MaskedTensor cannot be tracked this way by a transform, and what works."""
    return (f"{op}: a {layout} tensor cannot be tracked inside torch.func.grad / vjp / "
            f"jacrev / vmap (torch builds no compressed sparse tensor, and no tracked "
            f"sparse input, under these transforms); track the strided data instead and "
            f"convert inside the function, ms.as_masked_tensor(x, mask).to_sparse_csr() "
            f"(any layout), lift a sparse MaskedTensor argument with ms.lift, or "
            f"differentiate with torch.autograd (backward(), torch.autograd.grad)")


def check_torch_result(op: str, layout: Any, values: torch.Tensor) -> None:
    """Refuse a torch compressed sparse result over values a transform tracks.

    Inside ``torch.func`` transforms torch cannot build a CSR / CSC / BSR tensor over its
    tracked values ("Sparse CSR tensors do not have strides"): ``to_tensor(0)`` /
    ``get_data()`` of such a MaskedTensor names the routes that work instead.
    """
    if (not builds_under_transforms(layout) and active()
            and torch._C._functorch.is_functorch_wrapped_tensor(values)):
        raise NotImplementedError(
            f"{op}: the result would be a torch {layout.name} tensor over values that "
            f"torch.func tracks, which torch cannot build inside grad / vjp / jacrev / vmap; "
            f"take a strided result, mt.to_dense().to_tensor(0) (or .get_data()), or a "
            f"sparse_coo one, mt.to_sparse_coo().to_tensor(0)")
