"""The ``MaskedTensor`` type: a ``torch.Tensor`` subclass over a layout's :class:`Storage`.

Note [Wrapper layout]
~~~~~~~~~~~~~~~~~~~~~
The C++ wrapper of every MaskedTensor is a storage-less *strided* tensor of the logical
shape; the storage's layout is what ``mt.layout`` / ``mt.is_sparse`` report (answered in
``__torch_function__``). So autograd and the dispatcher treat sparse masked tensors exactly
like strided ones -- no sparse-specific C++ path ever sees them -- while users see the
storage's layout. Layouts registered without a ``torch.layout`` report ``torch.strided``;
``ms.layout_of(mt)`` gives the registered :class:`layouts.Layout` for any tensor.

Note [Index sharing]
~~~~~~~~~~~~~~~~~~~~
Ops that keep the sparsity pattern build their result with ``storage.with_values(...)``,
which keeps the very same index tensor objects. Binary ops compare masks by identity first
(free), and only compare tensor contents when the objects differ.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import warnings
from pathlib import Path
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

import layouts
from layouts import Storage

from . import _func, _registry
from ._device import missing_kernel
from ._mixed_layouts import storage_at_mask
from ._repr import storage_repr


def _run(handler: Any, func: Any, args: tuple, kwargs: dict | None) -> Any:
    """``handler(func, *args, **kwargs)``; where torch lacks a kernel on the operands'
    device, :func:`._device.missing_kernel`'s ``NotImplementedError`` instead of torch's
    message."""
    try:
        return handler(func, *args, **(kwargs or {}))
    except (NotImplementedError, RuntimeError) as exc:
        lacking = missing_kernel(func, args, exc)
        if lacking is None:
            raise
        raise lacking from exc


class MaskedTensor(torch.Tensor):
    """A tensor whose elements are either specified (mask True) or unspecified.

    Data and mask share one layout (strided, sparse COO, sparse CSR or any registered
    layout) and, for sparse layouts, one set of index tensors. Build one with
    :func:`masked_sparse.masked_tensor` or :func:`masked_sparse.as_masked_tensor`.

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    >>> (mt * 10).to_tensor(0)
    tensor([10.,  0.])
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, mask: torch.Tensor, requires_grad: bool = False):
        warn_if_requires_grad(data)
        return _wrap(storage_from_tensors(data, mask, "MaskedTensor"), requires_grad)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    # -- the public accessors (written with the conversions: ``ops/conversion.py``) -------
    def get_data(self) -> torch.Tensor:
        """The data, in the same layout; masked-out entries hold arbitrary values.

        Differentiable: the gradient reaching this tensor flows back as a MaskedTensor.
        It shares the MaskedTensor's values (a write to its elements shows in both). On a
        sparse layout, repeated calls without autograd return the same tensor until it is
        changed in place or asked for a gradient (Note [The data tensor is built once]).

        >>> import torch, masked_sparse as ms
        >>> mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
        >>> mt.get_data()
        tensor([1., 2.])
        """
        return _METHODS.get_data(self)

    def get_mask(self) -> torch.Tensor:
        """The bool mask (True = specified), in the same layout and with the same indices."""
        return _METHODS.get_mask(self)

    def to_tensor(self, value: Any) -> torch.Tensor:
        """A plain tensor with masked-out positions filled with ``value``.

        For sparse layouts and ``value == 0`` the result stays sparse with the same
        indices; any other fill value can only be expressed densely.
        """
        return _METHODS.to_tensor(self, value)

    def validate(self, full: bool = False) -> MaskedTensor:
        """Check the storage's invariants: O(1) by default, all of them with ``full=True``.

        Raises ``ValueError`` naming the broken invariant; returns ``self``.
        """
        s = self._storage
        s.layout.validate(s, full)
        if s.mask.dtype != torch.bool or s.mask.shape != s.values.shape:
            raise ValueError(f"MaskedTensor[{s.layout.name}]: mask must be bool with the shape "
                             f"of the values {tuple(s.values.shape)}, got {s.mask.dtype} "
                             f"{tuple(s.mask.shape)}")
        return self

    def is_sparse_coo(self) -> bool:
        """True if stored sparse COO (``torch.masked``'s method; see also ``mt.layout``)."""
        return self._storage.layout.torch_layout is torch.sparse_coo

    @property
    def masked_data(self) -> torch.Tensor:
        """The data tensor, as the first MaskedTensor prototype named it."""
        return self.get_data()

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        s = self._storage
        if torch.compiler.is_compiling():  # fake / traced values: print no data (no sync)
            return (f"MaskedTensor(layout={s.layout.name}, shape={tuple(s.shape)}, "
                    f"dtype={s.values.dtype})")
        if s.values.is_meta:  # no data to print, as torch prints ``tensor(..., device='meta')``
            return (f"MaskedTensor(..., layout={s.layout.name}, shape={tuple(s.shape)}, "
                    f"dtype={s.values.dtype}, device='meta')")
        with torch.no_grad():
            return storage_repr(self._storage, self.dtype)

    __str__ = __repr__

    # -- routing -------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Note [Export traces the aten level]: torch.export records only tensors made by
        # dispatched ops, so while exporting every op goes down to ``__torch_dispatch__``
        # (each Python-level handler has an aten kernel; properties then read the wrapper).
        # (the torch functions called here are bound once, below the class: Note [One
        # check per call] in layouts._native; Dynamo knows them by object, not by name)
        if _tracing_state() is not None:
            _refuse_jit_trace(func)
        if _dynamo_compiling():
            # Dynamo traces this code only after the op broke its graph (data-dependent
            # shapes of sparse kernels): run the whole op outside the graph, one clean
            # break, rather than resuming inside our Python.
            return _torch_function_outside_graph(func, args, kwargs)
        handler = _HANDLERS.get(func)
        if handler is not None and not _exporting():
            try:  # _run, inlined: one frame less on every call
                return handler(func, *args, **(kwargs or _NO_KWARGS))
            except (NotImplementedError, RuntimeError) as exc:
                lacking = missing_kernel(func, args, exc)
                if lacking is None:
                    raise
                raise lacking from exc
        if _grad_enabled():  # Note [Plain operands get plain gradients]
            for a in (*args, *kwargs.values()) if kwargs else args:
                if type(a) is not MaskedTensor and isinstance(a, torch.Tensor) and a.requires_grad:
                    lifted = _PLAIN_OPERANDS[0](func, args, kwargs)
                    if type(lifted) is MaskedTensor:  # the op itself, recorded as one
                        return lifted
                    if lifted is not None:
                        args, kwargs = lifted
                    break
            else:  # Note [A unary op as one node]
                recorded = _UNARY_NODE[0](func, args, kwargs)
                if recorded is not None:
                    return recorded
        if torch._C._are_functorch_transforms_active():  # Note [MaskedTensors in torch.func]
            return _func.dispatch_below(func, args, kwargs)
        with DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if torch._C._get_tracing_state() is not None:
            _refuse_jit_trace(func)
        handler = _ATEN.get(func)
        if handler is None:
            handler = _registry.resolve(func, args)
        if _func.SAVED.stack:  # Note [MaskedTensors in torch.func]
            with _func.restored():
                return _run(handler, func, args, kwargs)
        return _run(handler, func, args, kwargs)

    # -- torch.compile / serialization (``_serialize.py``) ---------------------------------
    def __reduce_ex__(self, proto: int) -> tuple:  # pickle, torch.save (weights_only=True)
        return _METHODS.reduce_ex(self, proto)

    def __deepcopy__(self, memo: dict) -> MaskedTensor:
        return _METHODS.deepcopy(self, memo)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: tuple[str, int],
                                            expected_type: type | None = None) -> Any:
        return _METHODS.coerce_tangent(self, expected_metadata, expected_type)

    def __tensor_flatten__(self) -> tuple[list[str], tuple[str, int]]:
        n = self._nindex
        return ["_values", "_mask"] + [f"_index{i}" for i in range(n)], (self._layout.name, n)

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: tuple[str, int],
                             outer_size: Any, outer_stride: Any) -> MaskedTensor:
        name, n = meta
        index = tuple(inner[f"_index{i}"] for i in range(n))
        storage = layouts.get_layout(name).build(index, inner["_values"], inner["_mask"],
                                                 outer_size)
        return _wrap(storage)

    def _stable_hash_for_caching(self) -> str:
        """The AOTAutograd cache key of this input: layout, inner tensors' metadata and the
        library's source digest (AOTAutograd traces our Python code but hashes only torch's
        own source: without it, an edited or upgraded masked_sparse would reuse graphs
        compiled from the old code)."""
        s = self._storage
        inner = [(tuple(t.shape), t.stride(), str(t.dtype), str(t.device))
                 for t in (s.values, s.mask, *s.index)]
        return f"MaskedTensor[{s.layout.name}]{tuple(s.shape)}{inner}{_source_digest()}"

    # Note [Storage attributes]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~
    # The storage lives in plain attributes: the inner tensors that ``__tensor_flatten__``
    # names (``_values``, ``_mask``, ``_index0``, ...) plus the layout and the shape. Eager
    # code reads one cached :class:`Storage` (``_cached``, no rebuilding per access). Under
    # torch.compile / torch.export the storage is rebuilt from the flattened attributes
    # instead, so that Dynamo sees the very tensors it lifted as the subclass's inner
    # tensors: reading a cached Python object would make Dynamo lift its tensors a second
    # time, as separate graph inputs (torch.export then bakes them in as constants).
    @property
    def _storage(self) -> Storage:
        if _compiling():
            index = tuple(getattr(self, f"_index{i}") for i in range(self._nindex))
            return Storage(self._layout, index, self._values, self._mask, self._shape)
        return self._cached

    @_storage.setter
    def _storage(self, storage: Storage) -> None:
        attrs = self.__dict__
        attrs.pop("_data_of", None)  # the old storage's data tensor: free it
        _set_storage(attrs, storage)


_tracing_state = torch._C._get_tracing_state
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_exporting = torch.compiler.is_exporting
_compiling = torch.compiler.is_compiling
_HANDLERS = _registry.FUNCTIONS  # (the dicts ``implements`` fills)
_ATEN = _registry.ATEN
_METHODS = _registry.METHODS
_PLAIN_OPERANDS = _registry.PLAIN_OPERANDS
_UNARY_NODE = _registry.UNARY_NODE
_grad_enabled = torch.is_grad_enabled
_NO_KWARGS: dict = {}  # (never written: ``**`` copies it)


def _set_storage(attrs: dict, storage: Storage) -> None:
    """Write ``storage`` into a MaskedTensor's ``__dict__`` (Note [Storage attributes]):
    none of these names is a data descriptor of ``torch.Tensor``, so this is what setting
    each attribute does, without the attribute lookups (``_wrap`` runs it for every op)."""
    index = storage.index
    attrs["_cached"] = storage
    attrs["_layout"] = storage.layout
    attrs["_shape"] = storage.shape
    attrs["_values"] = storage.values
    attrs["_mask"] = storage.mask
    attrs["_nindex"] = len(index)
    if len(index) > len(_INDEX_NAMES):
        for i, t in enumerate(index):
            attrs[f"_index{i}"] = t
        return
    for name, t in zip(_INDEX_NAMES, index):
        attrs[name] = t


_INDEX_NAMES = tuple(f"_index{i}" for i in range(8))


@torch.compiler.disable
def _torch_function_outside_graph(func: Any, args: tuple, kwargs: dict | None) -> Any:
    return MaskedTensor.__torch_function__(func, (), args, kwargs)


def _refuse_jit_trace(func: Any) -> None:
    """torch.jit.trace records only the C++ wrapper (no data): say what works instead."""
    name = getattr(func, "__name__", None) or str(func)
    raise NotImplementedError(
        f"MaskedTensor {name}: torch.jit.trace / torch.jit.script cannot trace a MaskedTensor "
        f"(TorchScript does not know tensor subclasses); use torch.compile(fn) to compile or "
        f"torch.export.export(module, (mt,)) to export, which trace through the data and mask")


@_registry.aten_autograd_check
def check_aten_autograd(func: Any, args: tuple) -> None:
    """Note [Aten-level autograd]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Eager code differentiates a reduction, softmax, ``where``, a shape op, ... in
    ``__torch_function__`` (``on_values``: gradients carry the input's mask). The same op
    reaching ``__torch_dispatch__`` first -- called from TorchScript (``torch.jit.script``,
    which has no ``__torch_function__``) or as ``torch.ops.aten.*`` -- is recorded by
    autograd above us with torch's *dense* derivative formula: a masked ``mean`` would get
    ``1 / numel`` instead of ``1 / count``. So such a call on a MaskedTensor that requires
    grad is refused, outside a backward pass (backward formulas of pointwise ops call these
    ops on gradients legitimately) and outside torch.compile / torch.export (AOTAutograd
    traces through the masked autograd at this level). Inside ``torch.func.grad`` / ``vjp``
    / ``jacrev``, the same happens to a MaskedTensor argument that was not lifted
    (``_func.under_grad_transform``): refused too, pointing to ``ms.lift``.
    """
    name = getattr(func, "__name__", None) or str(func)
    if _func.under_grad_transform():
        raise NotImplementedError(
            f"MaskedTensor {name} inside torch.func.grad / vjp / jacrev on a MaskedTensor "
            f"argument: torch.func strips the MaskedTensor type and would differentiate "
            f"with torch's dense formula; call x = ms.lift(x) first (Note [MaskedTensors in "
            f"torch.func])")
    if (torch._C._current_graph_task_id() != -1 or torch.compiler.is_compiling()
            or not any(isinstance(a, MaskedTensor) and requires_grad_of(a) for a in args)):
        return
    message = (f"MaskedTensor {name}: this op reached the aten level directly "
               f"(torch.jit.script, or torch.ops.aten) on a MaskedTensor that requires grad, "
               f"where autograd would use torch's dense derivative formula, not the masked "
               f"one; TorchScript does not support MaskedTensors: use torch.compile(fn) to "
               f"compile or torch.export.export(module, (mt,)) to export, or call the torch.* "
               f"function")
    # The TorchScript interpreter re-raises a RuntimeError without our message: say it here.
    warnings.warn(message, UserWarning, stacklevel=3)
    raise NotImplementedError(message)


def _wrap(storage: Storage, requires_grad: bool = False) -> MaskedTensor:
    """A MaskedTensor over ``storage`` (no copy, no check)."""
    if _dynamo_compiling():
        # Dynamo traces a masked op's Python code only after a graph break in it (sparse
        # kernels with data-dependent shapes); it cannot trace _make_wrapper_subclass, so
        # the wrapper is built outside the graph, whole (never half-built across a break).
        return _wrap_outside_graph(storage, requires_grad)
    values = storage.values
    out = _make_wrapper_subclass(
        MaskedTensor, storage.shape, strides=None if storage.index else values.stride(),
        dtype=values.dtype, device=values.device, requires_grad=requires_grad)
    _set_storage(out.__dict__, storage)  # a new wrapper: no old data tensor to free
    return out


_wrap_outside_graph = torch.compiler.disable(_wrap, recursive=True)
_make_wrapper_subclass = torch.Tensor._make_wrapper_subclass  # (bound once: every op wraps)


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
        return storage_at_mask(op, data, mask)
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


def warn_if_requires_grad(data: object, stacklevel: int = 3) -> None:
    """``torch.masked``'s warning for a new MaskedTensor built from data that requires grad."""
    if isinstance(data, torch.Tensor) and data.requires_grad:
        warnings.warn("It is not recommended to create a MaskedTensor with a tensor that "
                      "requires_grad. To avoid this, you can use data.detach().clone()",
                      UserWarning, stacklevel=stacklevel)


_STORAGE_ATTRS = frozenset({"_storage", "_cached", "_layout", "_shape", "_values", "_mask",
                            "_nindex", "_data_of"})  # _data_of: Note [The data tensor is
#                                                    built once] in ops/conversion.py


def is_storage_attr(name: str) -> bool:
    """True for the attributes that hold the storage (Note [Storage attributes]): they are
    not user state (pickling and deepcopy rebuild them from the storage)."""
    return name in _STORAGE_ATTRS or (name.startswith("_index") and name[6:].isdigit())


def is_wrapped_masked(t: Any) -> bool:
    """True for a MaskedTensor that a ``torch.func`` transform wrapped (plain-typed)."""
    return (isinstance(t, torch.Tensor) and not isinstance(t, MaskedTensor)
            and torch._C._functorch.is_functorch_wrapped_tensor(t)
            and isinstance(_func.innermost(t), MaskedTensor))


def unwrap_grad_tracking(t: Any) -> Any:
    """``t`` without the wrappers of ``torch.func.grad`` / ``vjp`` / ``jacrev``.

    Note [Functions for torch.func]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Inside a torch.func transform a MaskedTensor is wrapped in a plain-typed tensor: its
    methods and ``__torch_function__`` handlers are out of reach, and torch ops reach
    ``__torch_dispatch__`` below the transform's autograd. The autograd Functions of the
    core (``as_masked_tensor``, ``get_data`` / ``to_tensor``, ``where``, ``on_values``)
    therefore take no ``ctx`` in ``forward`` (what the transforms require; state for
    ``setup_context`` travels in a ``box`` list argument), and their ``setup_context`` /
    ``backward`` read the storage and the incoming gradient through this function. The
    gradient they return is then a value of the level below the transform: right for one
    level of transform, so nested transforms (hessians) raise NotImplementedError. This is
    the route of a MaskedTensor *argument* that is not lifted; MaskedTensors built inside a
    transform, or lifted, are tracked through their values (Note [MaskedTensors in
    torch.func] in ``_func.py``) and support every op at any depth.
    """
    while isinstance(t, torch.Tensor) and torch._C._functorch.is_gradtrackingtensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def requires_grad_of(t: torch.Tensor) -> bool:
    """``t.requires_grad`` without the ``__torch_function__`` round trip.

    Property reads on a MaskedTensor go through ``__torch_function__``; this one has no
    masked meaning, so hot paths (``get_data``, ``to_tensor``) read it directly.
    """
    with DisableTorchFunctionSubclass():
        return t.requires_grad


def ndim_of(mt: MaskedTensor) -> int:
    """``mt.dim()`` read from the storage, without the ``__torch_function__`` round trip."""
    return len(mt._storage.shape)


def dtype_of(mt: MaskedTensor) -> torch.dtype:
    """``mt.dtype`` read from the storage, without the ``__torch_function__`` round trip."""
    return mt._storage.values.dtype


def is_masked_tensor(obj: Any) -> bool:
    """True if ``obj`` is a MaskedTensor.

    >>> import torch, masked_sparse as ms
    >>> ms.is_masked_tensor(torch.zeros(2))
    False
    """
    return isinstance(obj, MaskedTensor)


def layout_of(t: torch.Tensor) -> layouts.Layout:
    """The registered layout of a MaskedTensor or a plain tensor."""
    if isinstance(t, MaskedTensor):
        return t._storage.layout
    return layouts.get_layout(t.layout)


@functools.cache
def _source_digest() -> str:
    """A digest of the ``.py`` sources of ``masked_sparse`` and ``layouts`` (read once)."""
    digest = hashlib.blake2b(digest_size=16)
    spec = importlib.util.find_spec("layouts")  # the core reads only layouts' public API
    for package in (Path(__file__).parent, Path(spec.origin if spec else __file__).parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()

