"""Leaving and changing storage: ``get_data``, ``to_tensor`` and layout conversions.

All of them are differentiable; a gradient flowing back always reaches the MaskedTensor
as a MaskedTensor over its own storage (its mask, its index tensors).
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .. import _func
from .._autograd import grad_values, masked_grad, on_values
from .._memory import check_fits
from .._registry import implements, method
from .._tensor import MaskedTensor, is_wrapped_masked, requires_grad_of, unwrap_grad_tracking


class _GetData(_func.Function):
    @staticmethod
    def forward(mt: MaskedTensor) -> torch.Tensor:
        s = mt._storage
        return _data(s, s.values.detach())

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.storage = unwrap_grad_tracking(inputs[0])._storage

    @staticmethod
    def vmap(info: Any, in_dims: tuple, mt: MaskedTensor) -> tuple[torch.Tensor, Any]:
        return get_data(mt), in_dims[0]  # elementwise: the batch dim stays where it is

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> MaskedTensor:
        grad = unwrap_grad_tracking(grad)
        if isinstance(grad, MaskedTensor):
            return grad
        s = ctx.storage
        return masked_grad(s, grad_values(grad, s))


@method("get_data")
def get_data(mt: MaskedTensor) -> torch.Tensor:
    """The data of ``mt`` in its layout (see :meth:`MaskedTensor.get_data`).

    The function form also works inside ``torch.func`` transforms, where a MaskedTensor
    argument is wrapped in a plain-typed tensor that has no MaskedTensor methods.
    """
    if _plain_call(mt):  # Note [Accessors without autograd]
        s = mt._storage
        made = mt.__dict__.get("_data_of")  # Note [The data tensor is built once]
        if made is not None and made[0] is s and _untouched(made[1], made[2]):
            return made[1]
        out = _data(s, s.values)
        if s.index and not torch.is_inference_mode_enabled() and not out.is_inference():
            mt._data_of = (s, out, out._version)
        return out
    if _sparse_under_dynamo(mt):
        return _get_data_outside_graph(mt)
    if not isinstance(mt, MaskedTensor) or (torch.is_grad_enabled() and requires_grad_of(mt)):
        return _GetData.apply(_checked(mt, "get_data"))
    s = mt._storage
    return _data(s, s.values)


# Note [The data tensor is built once]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The data of a sparse MaskedTensor is a torch sparse tensor over its own index and values
# tensors (no copy), and torch's sparse constructor is most of the cost of ``get_data``
# (``benchmarks/bench_goals.py`` times a first and a repeated call).
# A MaskedTensor's storage never changes under it (an in-place op gives it a new storage
# object), so the plain call keeps the tensor it built with the storage it was built from
# and returns it again while that storage is the MaskedTensor's: the same tensor object,
# as the strided layout returns the values tensor itself. In-place writes to the values
# show through it, as they would through a fresh one; calls with autograd, inside
# torch.compile or torch.func build a new one each time. The caller owns what it got: once
# it changes the tensor itself (an in-place op on it -- ``zero_``, ``add_``, ``resize_`` --
# bumps its version) or asks for its gradient (``requires_grad_``), the next call builds a
# new one. A tensor built under ``torch.inference_mode`` is an inference tensor, which
# autograd refuses outside it: it is not kept.


def _untouched(data: torch.Tensor, version: int) -> bool:
    """True while the kept data tensor is as it was built (Note [The data tensor is built
    once])."""
    return data._version == version and not data.requires_grad


def _plain_call(mt: Any) -> bool:
    """True for an eager call on a MaskedTensor that needs no autograd node.

    Note [Accessors without autograd]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``get_data`` / ``to_tensor`` are called often and cost little more than building one
    torch tensor, so the common call -- a MaskedTensor that needs no gradient, outside
    torch.compile / torch.export (``is_compiling`` covers both) and torch.func (whose
    wrappers are not MaskedTensors) -- is recognised first, with one check each, and runs
    the kernel directly. Every other call takes the general route below it.
    """
    return (isinstance(mt, MaskedTensor) and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and requires_grad_of(mt)))


def _data(s: Storage, values: torch.Tensor) -> torch.Tensor:
    """The layout's ``get_data`` kernel, else its plain torch form (``to_torch``)."""
    own = s.layout.get_data
    out = own(s, values) if own is not None else NotImplemented
    if out is NotImplemented:
        _func.check_torch_result("get_data", s.layout, values)
        return s.layout.to_torch(s, values)
    return out


class _GetMask(_func.Function):
    @staticmethod
    def forward(mt: MaskedTensor) -> torch.Tensor:
        s = mt._storage
        return s.layout.to_torch(s, s.mask)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.mark_non_differentiable(output)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, mt: MaskedTensor) -> tuple[torch.Tensor, Any]:
        return get_mask(mt), in_dims[0]


@method("get_mask")
def get_mask(mt: MaskedTensor) -> torch.Tensor:
    """The bool mask of ``mt`` in its layout (see :meth:`MaskedTensor.get_mask`).

    >>> import torch, masked_sparse as ms
    >>> ms.get_mask(ms.masked_tensor(torch.ones(2), torch.tensor([True, False])))
    tensor([ True, False])
    """
    if _sparse_under_dynamo(mt):
        return _get_mask_outside_graph(mt)
    if isinstance(mt, MaskedTensor):
        s = mt._storage
        return s.layout.to_torch(s, s.mask)
    return _GetMask.apply(_checked(mt, "get_mask"))


def _sparse_under_dynamo(mt: Any) -> bool:
    """True while Dynamo traces a call whose result is a torch sparse tensor.

    Note [Sparse results under torch.compile]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A compiled graph cannot hold a torch sparse tensor (Dynamo refuses to wrap one, and
    fake CSR construction fails outright), so ``get_data`` / ``get_mask`` / ``to_tensor(0)``
    of a sparse MaskedTensor run outside the graph -- a graph break -- while the ops
    before and after them are compiled. Dynamo reaches them two ways: tracing our Python
    (then the call goes to a ``torch.compiler.disable``-d copy), or running a recorded
    method call on fake tensors (then we raise Dynamo's own graph-break signal).
    """
    if not (isinstance(mt, MaskedTensor) and torch.compiler.is_compiling()
            and mt._storage.index):
        return False
    if torch.compiler.is_dynamo_compiling():
        return True
    from torch._dynamo.exc import unimplemented

    unimplemented(gb_type="MaskedTensor with a sparse torch result",
                  context=mt._storage.layout.name,
                  explanation="get_data / get_mask / to_tensor(0) of a sparse MaskedTensor "
                              "return a torch sparse tensor, which a graph cannot hold",
                  hints=["the call runs eagerly; mt.to_tensor(value) with value != 0 or "
                         "mt.to_dense() stay in the graph"])
    return True  # unreachable: unimplemented raises


def _checked(t: Any, op: str) -> torch.Tensor:
    """``t`` if it is a MaskedTensor or a torch.func-wrapped one, else a TypeError."""
    if not (isinstance(t, MaskedTensor) or is_wrapped_masked(t)):
        raise TypeError(f"ms.{op}: expected a MaskedTensor, got {type(t).__name__}")
    return t


def _fill(s: Storage, value: Any) -> torch.Tensor:
    """The layout's ``to_tensor`` kernel, else the values filled and put in torch form."""
    own = s.layout.to_tensor
    out = own(s, value) if own is not None else NotImplemented
    if out is not NotImplemented:
        return out
    number = isinstance(value, (int, float, bool))
    if number and value == 0:
        # One pass, no ``~mask`` temporary: cheaper than ``masked_fill`` at every size (the
        # layouts' exact fill: one native pass on large CPU inputs; -0.0 fills -0.0). A
        # Python number (False for bool) keeps the values' dtype.
        filled = layouts.fill_unspecified(s.values, s.mask,
                                          False if s.values.dtype == torch.bool else value)
        if not s.index:
            return filled
        _func.check_torch_result("to_tensor(0)", s.layout, filled)
        return s.layout.to_torch(s, filled)
    if not s.index:
        # The value cast as masked_fill casts it, where it fits the dtype (masked_fill
        # refuses the others: float16's 1e10 raises there, it is not filled as inf).
        if (number and s.values.is_floating_point()
                and not abs(value) > torch.finfo(s.values.dtype).max):
            return layouts.fill_unspecified(s.values, s.mask, value)
        return s.values.masked_fill(~s.mask, value)
    check_fits(f"to_tensor({value!r}) of a {s.layout.name} MaskedTensor", "strided", s.shape,
               s.values.numel(), s.values.dtype, s.values.device,
               "to_tensor(0) stays sparse; or reduce or slice it before filling")
    return s.densify(s.values.masked_fill(~s.mask, value), value)


class _ToTensor(_func.Function):
    @staticmethod
    def forward(mt: MaskedTensor, value: Any) -> torch.Tensor:
        s = mt._storage
        values = s.values  # (detached where they require grad: no torch call otherwise)
        return _fill(s if not values.requires_grad else s.with_values(values.detach()), value)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.storage = unwrap_grad_tracking(inputs[0])._storage

    @staticmethod
    def vmap(info: Any, in_dims: tuple, mt: MaskedTensor, value: Any) -> tuple[torch.Tensor, Any]:
        return to_tensor(mt, value), in_dims[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[MaskedTensor, None]:
        s = ctx.storage
        return masked_grad(s, grad_values(grad, s)), None


@method("to_tensor")
def to_tensor(mt: MaskedTensor, value: Any) -> torch.Tensor:
    """``mt`` with masked-out positions filled with ``value`` (:meth:`MaskedTensor.to_tensor`).

    The function form also works inside ``torch.func`` transforms (see :func:`get_data`).

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    >>> torch.func.vmap(lambda x: ms.to_tensor(x * 10, 0))(mt)
    tensor([10.,  0.])
    """
    if _plain_call(mt):  # Note [Accessors without autograd]
        return _fill(mt._storage, value)
    if type(mt) is MaskedTensor and not (torch.compiler.is_compiling() or _func.active()):
        return _TO_TENSOR_APPLY(mt, value)  # eager autograd: the node, with nothing around it
    if torch.compiler.is_exporting():  # Note [Export traces the aten level]
        return torch.ops.masked_sparse.to_tensor(mt, float(value))
    if _sparse_under_dynamo(mt) and isinstance(value, (int, float, bool)) and value == 0:
        return _to_tensor_outside_graph(mt, value)
    if not isinstance(mt, MaskedTensor) or (torch.is_grad_enabled() and requires_grad_of(mt)):
        return _ToTensor.apply(_checked(mt, "to_tensor"), value)
    return _fill(mt._storage, value)


_TO_TENSOR_APPLY = super(torch.autograd.Function, _ToTensor).apply  # _FunctionBase.apply
_get_data_outside_graph = torch.compiler.disable(get_data)
_get_mask_outside_graph = torch.compiler.disable(get_mask)
_to_tensor_outside_graph = torch.compiler.disable(to_tensor)


# ``to_tensor`` as an operator, for torch.export: it reaches ``__torch_dispatch__`` (the only
# level export records), where the kernel below fills the values.
@torch.library.custom_op("masked_sparse::to_tensor", mutates_args=())
def _to_tensor_op(mt: torch.Tensor, value: float) -> torch.Tensor:
    raise TypeError(f"masked_sparse::to_tensor: expected a MaskedTensor, got "
                    f"{type(mt).__name__}")


@_to_tensor_op.register_fake
def _(mt: torch.Tensor, value: float) -> torch.Tensor:
    return torch.empty_like(mt)


@implements(torch.ops.masked_sparse.to_tensor.default)
def _to_tensor_kernel(op: Any, mt: MaskedTensor, value: float) -> torch.Tensor:
    if not mt.dtype.is_floating_point and not mt.dtype.is_complex and value == int(value):
        value = int(value)
    return _fill(mt._storage, value)


def _convert(storages: list[Storage], target: Any, options: dict[str, Any]) -> Storage:
    return layouts.convert(storages[0], target, **options)


def to_layout(mt: MaskedTensor, layout: Any, **options: Any) -> MaskedTensor:
    """``mt`` in another registered layout: exact, differentiable, O(nnz) between sparse ones.

    ``layout`` is a ``torch.layout``, a registered layout's name or a
    :class:`layouts.Layout`; ``options`` are passed to that layout's conversion (for
    example a block layout's ``blocksize=(2, 2)``, as torch's ``to_sparse_bsr`` takes it).

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> ms.to_layout(mt, torch.sparse_csr).layout
    torch.sparse_csr
    >>> mt.to_sparse_bsr((1, 2)).get_data().values().shape
    torch.Size([2, 1, 2])
    """
    target = layouts.get_layout(layout)
    s = mt._storage
    if s.layout is target and (not options or options == target.options_of(s)):
        return mt
    if s.values.is_meta:
        raise NotImplementedError(
            f"converting a {s.layout.name} MaskedTensor on the meta device to {target.name}: "
            f"which elements another layout stores depends on the mask's values, which meta "
            f"tensors do not have; infer shapes in {s.layout.name}, or convert on a real "
            f"device")
    if s.index:  # from a sparse layout, the result may grow with the shape (Note [Memory rule])
        check_fits(f"converting a {s.layout.name} MaskedTensor to {target.name}", target.name,
                   s.shape, s.values.numel(), s.values.dtype, s.values.device,
                   f"keep it in {s.layout.name} (its ops never densify; to_tensor(0) stays "
                   f"sparse), or reduce or slice it first", options)
    return on_values(_convert, [mt], target, options)


@implements(torch.Tensor.to_dense)
def _to_dense(op: Any, mt: MaskedTensor, dtype: Any = None, *,
              masked_grad: Any = None) -> MaskedTensor:
    out = to_layout(mt, torch.strided)
    return out if dtype is None else out.to(dtype)


def _options(**given: Any) -> dict[str, Any]:
    """The conversion options a torch method was given (those left at None are absent)."""
    return {k: (tuple(v) if k == "blocksize" else v) for k, v in given.items() if v is not None}


@implements(torch.Tensor.to_sparse)
def _to_sparse(op: Any, mt: MaskedTensor, sparse_dim: Any = None, *, layout: Any = None,
               blocksize: Any = None, dense_dim: Any = None) -> MaskedTensor:
    if sparse_dim is not None and sparse_dim != mt.dim():
        raise NotImplementedError(f"MaskedTensor to_sparse(sparse_dim={sparse_dim}): only "
                                  f"sparse_dim == ndim ({mt.dim()}) is supported; convert with "
                                  f".to_sparse() and keep dense dims out of the mask")
    return to_layout(mt, torch.sparse_coo if layout is None else layout,
                     **_options(blocksize=blocksize, dense_dim=dense_dim))


# Torch's own conversion methods, one generic handler each: the target layout and the
# options reach the registered layout unchanged (a layout that is not registered raises
# NotImplementedError in get_layout, naming the registered ones).
@implements(torch.Tensor.to_sparse_coo)
def _to_sparse_coo(op: Any, mt: MaskedTensor) -> MaskedTensor:
    return to_layout(mt, torch.sparse_coo)


# Positional parameters of torch's compressed-format conversion methods (torch's API).
_TORCH_COMPRESSED = {"to_sparse_csr": ("dense_dim",), "to_sparse_csc": ("dense_dim",),
                     "to_sparse_bsr": ("blocksize", "dense_dim"),
                     "to_sparse_bsc": ("blocksize", "dense_dim")}


@implements(*(getattr(torch.Tensor, name) for name in _TORCH_COMPRESSED))
def _to_compressed(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> MaskedTensor:
    name = op.__name__
    params = _TORCH_COMPRESSED[name]
    if len(args) > len(params) or set(kwargs) - set(params):
        raise TypeError(f"{name}: expected arguments {params}, got {args} {kwargs}")
    given = dict(zip(params, args), **kwargs)
    target = getattr(torch, name.removeprefix("to_"))  # to_sparse_csr -> torch.sparse_csr
    return to_layout(mt, target, **_options(**given))


@method("coerce_tangent")
def coerce_tangent(mt: MaskedTensor, expected_metadata: tuple[str, int] | None,
                   expected_type: type | None = None) -> torch.Tensor | None:
    """``mt``, a gradient reaching a compiled graph's output, in the form that graph's
    backward was traced for, or None where it cannot be (torch then raises).

    Note [Tangents of compiled graphs]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    AOTAutograd traces a graph's backward before it runs, guessing every output's tangent
    to be a tensor like the output: a MaskedTensor of the same layout (its
    ``__tensor_flatten__`` metadata: layout name and number of index tensors). The gradient
    that arrives at run time can differ -- eager code after a graph break (or a user's
    ``out.backward(grad)``) may send a COO gradient to a CSR output, a masked gradient to a
    plain output. Then torch asks the gradient to coerce itself
    (``__coerce_same_metadata_as_tangent__``): to a MaskedTensor of the expected layout,
    converted exactly (the same specified elements), or, for a plain output, to a plain
    tensor with 0 where unspecified (the gradient of the elements nothing read).
    """
    if expected_type is not None and expected_type is not MaskedTensor:
        if not issubclass(expected_type, torch.Tensor) or expected_type.__torch_dispatch__ \
                is not torch.Tensor.__torch_dispatch__:
            return None  # (another subclass: nothing to convert to)
        return to_tensor(mt.to_dense(), 0) if mt._storage.index else to_tensor(mt, 0)
    name, nindex = expected_metadata
    s = mt._storage
    if s.layout.name == name and len(s.index) == nindex:
        return mt
    try:
        out = to_layout(mt, name)
    except (NotImplementedError, TypeError, ValueError):  # (a block layout: no blocksize)
        return None
    return out if len(out._storage.index) == nindex else None
