"""Building MaskedTensors from user tensors: ``masked_tensor`` and ``as_masked_tensor``."""

from __future__ import annotations

import warnings

import torch

import layouts
from layouts import Storage

from . import _func
from ._tensor import MaskedTensor, _wrap


def storage_from_tensors(data: torch.Tensor, mask: torch.Tensor, op: str) -> Storage:
    """Check user ``data`` and ``mask`` and build the storage of their layout.

    For sparse input the mask's pattern is authoritative: data stored elsewhere is dropped
    and mask positions where data stores nothing read as 0.
    """
    if isinstance(data, MaskedTensor) or not isinstance(data, torch.Tensor):
        raise TypeError(f"{op}: data must be a plain torch.Tensor, got {type(data).__name__}; "
                        f"use mt.get_data() to unwrap a MaskedTensor")
    if isinstance(mask, MaskedTensor) or not isinstance(mask, torch.Tensor):
        raise TypeError(f"{op}: mask must be a plain bool torch.Tensor, got "
                        f"{type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{op}: mask must have dtype torch.bool, got {mask.dtype}; "
                        f"pass mask.bool() or (mask != 0)")
    if data.shape != mask.shape:
        raise ValueError(f"{op}: data {tuple(data.shape)} and mask {tuple(mask.shape)} must "
                         f"have the same shape")
    if data.device != mask.device:
        raise ValueError(f"{op}: data is on {data.device} but mask is on {mask.device}; "
                         f"move them to one device")
    if data.layout != mask.layout:  # Note [The mask's layout wins]
        return _mixed_layouts(op, data, mask)
    if data.is_meta and data.layout != torch.strided:
        raise NotImplementedError(
            f"{op}: a {data.layout} MaskedTensor on the meta device is not supported: building "
            f"its storage reads its indices (checks, coalescing), which meta tensors do not "
            f"have; infer shapes with a strided meta MaskedTensor")
    if not torch.compiler.is_compiling():  # O(nnz) index checks (data-dependent: eager only)
        layouts.check_sparse_input(op, data=data, mask=mask)
    layout = layouts.get_layout(data.layout)
    storage = layout.from_torch(data, mask)
    layout.validate(storage)
    return storage


def _mixed_layouts(op: str, data: torch.Tensor, mask: torch.Tensor) -> Storage:
    """``data`` read at the stored positions of a ``mask`` of another layout."""
    from ._mixed_layouts import read_at_mask

    if (data.is_meta or mask.is_meta) and not torch.compiler.is_compiling():
        raise NotImplementedError(f"{op}: data ({data.layout}) and mask ({mask.layout}) of "
                                  f"different layouts on the meta device: reading one at the "
                                  f"other's positions needs their indices; use one layout")
    layouts.get_layout(mask.layout)  # an unregistered layout: its error, naming the others
    layouts.get_layout(data.layout)
    if not torch.compiler.is_compiling():
        layouts.check_sparse_input(op, data=data, mask=mask)
    return read_at_mask(data, mask)


def warn_if_requires_grad(data: object) -> None:
    """``torch.masked``'s warning for a new MaskedTensor built from data that requires grad."""
    if isinstance(data, torch.Tensor) and data.requires_grad:
        warnings.warn("It is not recommended to create a MaskedTensor with a tensor that "
                      "requires_grad. To avoid this, you can use data.detach().clone()",
                      UserWarning, stacklevel=3)


def masked_tensor(data: torch.Tensor, mask: torch.Tensor, *,
                  requires_grad: bool = False) -> MaskedTensor:
    """A new MaskedTensor leaf holding a copy of ``data`` where ``mask`` is True.

    Like ``torch.tensor``, it copies the data (and mask) and is not connected to the
    autograd graph of ``data``; see :func:`as_masked_tensor` for the differentiable view.
    ``data`` and ``mask`` must have the same shape and layout (strided, sparse COO, sparse
    CSR or any registered one).

    >>> import torch, masked_sparse as ms
    >>> ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    MaskedTensor(
      [  1.0000,       --]
    )
    """
    if isinstance(data, torch.Tensor) and not isinstance(data, MaskedTensor):
        warn_if_requires_grad(data)
        data = data.detach()
    storage = storage_from_tensors(data, mask, "masked_tensor")
    storage = storage.with_values(storage.values.clone(), storage.mask.clone())
    return _wrap(storage, requires_grad)


class _Box:
    """Hands a value from a Function's forward to its setup_context (not a pytree, so
    torch.func transforms pass it through unchanged).

    Note [as_masked_tensor's routes]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Eager: ``_AsMasked`` (its forward takes no ctx, the storage reaches ``setup_context`` in
    this box). Its gradient to ``data`` is a MaskedTensor, so derivative formulas run
    before ``data`` skip masked-out positions (PyTorch issue 4132), except for a plain leaf,
    which gets a plain ``.grad`` of its own layout, 0 where unspecified (Note [Plain
    gradients for plain leaves]): that is what gradcheck and optimizers take, and no
    formula is left to run. Reviewed for gradcheck / torch.func and kept: the alternatives
    (always plain, or always masked) lose either issue 4132 or gradcheck. Inside a
    torch.func transform the Function is not used at all: the MaskedTensor is built over
    the tracked data (Note [MaskedTensors in torch.func]).
    """

    value: Storage
    plain_grad: bool = False  # Note [Double backward]: the gradient of data stays plain


class _AsMasked(_func.Function):
    @staticmethod
    def forward(data: torch.Tensor, mask: torch.Tensor, box: _Box) -> MaskedTensor:
        storage = storage_from_tensors(data.detach(), mask, "as_masked_tensor")
        box.value = storage
        return _wrap(storage)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: MaskedTensor) -> None:
        # Note [Functions for torch.func] in _autograd.py: under a transform ``output`` is
        # a functorch wrapper, so the storage comes through ``box``.
        ctx.storage = inputs[2].value
        ctx.to_plain_leaf = inputs[0].grad_fn is None or inputs[2].plain_grad

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        s = ctx.storage
        if torch.compiler.is_compiling():
            # Note [as_masked_tensor under torch.compile]: AOTAutograd fixes the type of
            # every gradient in the graph from the forward, where ``data`` is plain, so the
            # compiled gradient of ``data`` is a plain tensor: the masked gradient with 0
            # at unspecified positions (what eager gives after ``.to_tensor(0)``).
            return s.densify(_masked_values(s, grad), 0), None, None
        if ctx.to_plain_leaf:
            # Note [Plain gradients for plain leaves]: the gradient leaves the masked world
            # here. A leaf's ``.grad`` must have the leaf's own type and layout (gradcheck,
            # optimizers, torch.func), so it is the masked gradient with 0 where unspecified,
            # over the leaf's own index. No derivative formula runs after it, so no 0 * inf
            # can form; a non-leaf ``data`` instead gets the MaskedTensor, which keeps
            # unspecified positions out of the formulas before the leaf (PyTorch issue 4132).
            return s.layout.to_torch(s, _masked_values(s, grad)), None, None
        # The gradient reaching ``data`` carries the mask, as in torch.masked.
        if not isinstance(grad, MaskedTensor):
            from ._autograd import grad_on, masked_grad

            grad = masked_grad(s, grad_on(grad, s)[0])
        return grad, None, None


def _masked_values(s: Storage, grad: torch.Tensor) -> torch.Tensor:
    """The incoming gradient read at ``s``'s stored positions, 0 where unspecified."""
    from ._autograd import grad_values

    values = grad_values(grad, s)  # Note [Double backward]
    return layouts.zero_unspecified(values, s.mask)


def as_masked_tensor(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """A MaskedTensor over ``data`` (no copy), differentiable with respect to ``data``.

    The gradient that reaches ``data`` is a MaskedTensor carrying ``mask``; when ``data``
    is itself a leaf, its ``.grad`` is a plain tensor of its layout, 0 where unspecified
    (Note [Plain gradients for plain leaves]).

    >>> import torch, masked_sparse as ms
    >>> x = torch.tensor([1., 1.], requires_grad=True)
    >>> ms.as_masked_tensor(x * 2, torch.tensor([False, True])).sum().backward()
    >>> x.grad
    MaskedTensor(
      [      --,   2.0000]
    )
    """
    if _func.active() and torch._C._functorch.is_functorch_wrapped_tensor(data):
        # Note [MaskedTensors in torch.func]: over the transform's own tracked data.
        if data.layout != torch.strided:
            raise NotImplementedError(_func.sparse_refusal("as_masked_tensor", str(data.layout)))
        return _wrap(storage_from_tensors(data, mask, "as_masked_tensor"))
    if (isinstance(data, torch.Tensor) and isinstance(mask, torch.Tensor)
            and data.layout != mask.layout and not isinstance(data, MaskedTensor)):
        from ._mixed_layouts import as_masked  # Note [The mask's layout wins]

        storage_from_tensors(data.detach(), mask, "as_masked_tensor")  # the checks
        return as_masked(data, mask)
    if torch.is_grad_enabled() and isinstance(data, torch.Tensor) and data.requires_grad:
        return _AsMasked.apply(data, mask, _Box())
    return _wrap(storage_from_tensors(data, mask, "as_masked_tensor"))


def masked_over(data: torch.Tensor, mask: torch.Tensor) -> MaskedTensor:
    """``as_masked_tensor`` for gradients built inside a backward (Note [Double backward]):
    the gradient reaching ``data`` is plain, 0 where unspecified, as for a leaf, so torch's
    formulas of the backward's own ops (broadcasts included) never meet a MaskedTensor."""
    box = _Box()
    box.plain_grad = True
    return _AsMasked.apply(data, mask, box)


# Note [Construction under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo cannot trace ``_make_wrapper_subclass``. Both constructors are therefore opaque
# calls in Dynamo's graph (``allow_in_graph``): AOTAutograd then runs them on fake tensors,
# where building the wrapper is ordinary Python, and traces the ops they do on the data.
torch.compiler.allow_in_graph(masked_tensor)
torch.compiler.allow_in_graph(as_masked_tensor)
