"""Properties, copies, casts and ``*_like`` factories: ops that keep the storage's pattern."""

from __future__ import annotations

from typing import Any

import torch

from layouts import Storage

from .._registry import implements
from .._tensor import MaskedTensor, _wrap
from .pointwise import align, read_plain

aten = torch.ops.aten


# -- properties answered from the storage (Note [Wrapper layout]) --------------------------
# Note [Layout seen by torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# While torch.compile / torch.export trace (``is_compiling()``) and the caller is torch's
# own machinery rather than traced user code (``not is_dynamo_compiling()``), these
# properties report the C++ wrapper's true layout, strided. Dynamo refuses to wrap a
# tensor that says it is sparse, but a sparse MaskedTensor is a strided wrapper over plain
# dense inner tensors (values, mask, index tensors) that it traces like any other
# subclass. The price: inside a compiled function ``mt.layout`` reads ``torch.strided``;
# ``ms.layout_of(mt)`` gives the storage's layout everywhere.
def _tracing() -> bool:
    return torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()


@implements(torch.Tensor.layout.__get__)
def _layout(op: Any, mt: MaskedTensor) -> torch.layout:
    if _tracing():
        return torch.strided
    return mt._storage.layout.torch_layout or torch.strided


@implements(torch.Tensor.is_sparse.__get__)
def _is_sparse(op: Any, mt: MaskedTensor) -> bool:
    """True for every layout that stores an index (COO, CSR, CSC, BSR, ...), as
    ``torch.masked.MaskedTensor.is_sparse`` answers (a plain torch tensor says True for COO
    only; ``mt.is_sparse_coo()`` / ``mt.layout`` tell the layouts apart)."""
    return bool(mt._storage.index) and not _tracing()


class LayoutFlag:
    """A bool that can also be called: ``mt.is_sparse_csr`` and ``mt.is_sparse_csr()``.

    Note [is_sparse_csr, property and method]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``torch.Tensor.is_sparse_csr`` is a property, which torch's own Python code reads as a
    bool; ``torch.masked.MaskedTensor.is_sparse_csr`` is a method, which its users call. A
    plain method would make every ``if t.is_sparse_csr:`` in torch true; a plain bool would
    break ``mt.is_sparse_csr()``. This small value answers both.

    >>> flag = LayoutFlag(False)
    >>> bool(flag), flag(), flag == False
    (False, False, True)
    """

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return self.value

    def __call__(self) -> bool:
        return self.value

    def __eq__(self, other: object) -> bool:
        return self.value == other

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


@implements(torch.Tensor.is_sparse_csr.__get__)
def _is_sparse_csr(op: Any, mt: MaskedTensor) -> LayoutFlag:
    return LayoutFlag(mt._storage.layout.torch_layout is torch.sparse_csr and not _tracing())


# -- same pattern, new values --------------------------------------------------------------
@implements(aten.detach.default, aten.alias.default)
def _share(op: Any, mt: MaskedTensor) -> MaskedTensor:
    if torch.is_inference_mode_enabled() and not mt.is_inference():
        # torch gives the view of a normal tensor its input's version counter, which an
        # inference tensor cannot take: build it as a normal tensor, as torch's views are
        with torch.inference_mode(False):
            return _wrap(mt._storage)
    return _wrap(mt._storage)


@implements(aten.clone.default, aten.ones_like.default, aten.zeros_like.default,
            aten.empty_like.default, aten.full_like.default, aten.rand_like.default,
            aten.randn_like.default, aten.randint_like.default,
            aten.randint_like.low_dtype)
def _values_like(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> MaskedTensor:
    s = mt._storage
    kwargs = {k: v for k, v in kwargs.items() if k != "layout"}
    return _wrap(s.with_values(op(s.values, *args, **kwargs)))


@implements(torch.ones_like, torch.zeros_like)
def _values_like_above(op: Any, mt: MaskedTensor, *args: Any, requires_grad: bool = False,
                       **kwargs: Any) -> MaskedTensor:
    """``torch.ones_like(mt)`` / ``zeros_like``, answered in ``__torch_function__`` as the
    aten route answers it (:func:`_values_like`) without the dispatcher's round trip: a
    training step makes one per backward (``out.backward(torch.ones_like(out))``)."""
    s = mt._storage
    kwargs.pop("layout", None)
    return _wrap(s.with_values(op(s.values, *args, **kwargs)), requires_grad)


@implements(aten._to_copy.default)
def _to_copy(op: Any, mt: MaskedTensor, **kwargs: Any) -> MaskedTensor:
    s = mt._storage
    kwargs = {k: v for k, v in kwargs.items() if k != "layout"}
    return _with_values_on(s, op(s.values, **kwargs))


@implements(aten.to.dtype, aten.to.device, aten.to.dtype_layout)
def _to(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> MaskedTensor:
    """``mt.to(...)`` reaching the aten level whole (under ``torch.inference_mode`` it is
    not decomposed into ``_to_copy``): ``mt`` itself when nothing changes, as torch."""
    s = mt._storage
    kwargs = {k: v for k, v in kwargs.items() if k != "layout"}
    values = op(s.values, *args, **kwargs)
    return mt if values is s.values else _with_values_on(s, values)


def _with_values_on(s: Storage, values: torch.Tensor) -> MaskedTensor:
    """``s`` with new ``values``: index and mask moved to their device if it changed."""
    if values.device == s.values.device:
        return _wrap(s.with_values(values))
    dev = values.device
    if dev.type == "meta" and s.index:
        raise NotImplementedError(
            f"MaskedTensor[{s.layout.name}] to(device='meta'): a {s.layout.name} MaskedTensor "
            f"on the meta device is not supported (its ops read its indices); infer shapes "
            f"with mt.to_dense().to('meta')")
    return _wrap(s.layout.build(tuple(i.to(dev) for i in s.index), values, s.mask.to(dev),
                                s.shape))


@implements(aten.copy_.default)
def _copy_(op: Any, self: Any, src: Any, *args: Any, **kwargs: Any) -> MaskedTensor:
    if not isinstance(self, MaskedTensor):
        raise TypeError("copy_: cannot copy a MaskedTensor into a plain tensor (the mask would "
                        "be lost); use dst.copy_(mt.to_tensor(value))")
    if isinstance(src, MaskedTensor):
        mine, theirs = align(op, [self._storage, src._storage])
        self._storage = mine
        mine.values.copy_(theirs.values, *args, **kwargs)
    else:
        self._storage.values.copy_(read_plain(op, self._storage, src))
    return self


@implements(aten._local_scalar_dense.default)
def _item(op: Any, mt: MaskedTensor) -> Any:
    s = mt._storage
    if s.values.numel() != 1 or not bool(s.mask.reshape(-1)[0]):
        raise ValueError("item(): the element of this MaskedTensor is unspecified (masked out) "
                         "or it has more than one element; use mt.to_tensor(value).item()")
    return s.values.reshape(-1)[0].item()


@implements(aten.is_same_size.default)
def _is_same_size(op: Any, a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape


@implements(aten.new_empty_strided.default)
def _new_empty_strided(op: Any, mt: MaskedTensor, size: Any, stride: Any,
                       **kwargs: Any) -> MaskedTensor:
    # Note [Gradient layout contract]: autograd's AccumulateGrad gives a gradient the
    # parameter's strides with grad.new_empty_strided(param.shape, param.stride()).copy_(grad);
    # for the same shape this is empty_like with those strides (the pattern is kept).
    s = mt._storage
    size, stride = torch.Size(size), tuple(stride)
    if size != s.shape:
        raise NotImplementedError(
            f"MaskedTensor[{s.layout.name}] new_empty_strided: only the tensor's own shape "
            f"{tuple(s.shape)} is supported, got {tuple(size)}; build a new one with "
            f"masked_tensor(data, mask)")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "pin_memory")}
    if s.values.shape == size:
        values = op(s.values, size, stride, **kwargs)
    else:
        values = torch.empty_like(s.values, **kwargs)
    return _wrap(s.with_values(values))


@implements(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default,
            aten.new_full.default)
def _new_factory(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # A new tensor of a given size has no mask to inherit: it is a plain tensor with the
    # values' dtype and device (what torch.autograd.gradcheck allocates its Jacobians with).
    kwargs = {k: v for k, v in kwargs.items() if k not in ("layout", "pin_memory")}
    return op(mt._storage.values, *args, **kwargs)
