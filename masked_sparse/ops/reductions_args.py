"""Argument parsing for reductions and softmax: the ``torch.x(mt, ...)``, ``mt.x(...)`` and
aten forms all bind to one Python signature per op family.

- ``dim``: ``None``, ``()`` and ``[]`` reduce every dim (torch's convention); an int or a
  sequence of ints, negative dims wrap; out of range raises ``IndexError`` and a repeated
  dim ``RuntimeError``, as torch does. A 0-d tensor accepts dims ``0`` / ``-1`` and reduces
  nothing.
- numpy-style aliases ``axis`` / ``keepdims`` are accepted as torch accepts them.
- result dtypes (and dtype errors such as ``mean`` of an int tensor) come from running the
  same torch op on a one-element ``meta`` tensor, so they follow torch's rules exactly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from .._tensor import MaskedTensor

_ALIASES = {"axis": "dim", "keepdims": "keepdim", "self": "input", "x": "input", "A": "input"}


class _Binder:
    """One signature, read once: what ``inspect.Signature.bind`` needs for the common calls.

    Note [Binding once per signature]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``inspect.Signature.bind`` costs as much per call as the whole reduction kernel on a
    small tensor. The names, their order and the defaults of a
    signature never change, so they are read once; a call binds with a few dict operations.
    A call the fast path does not settle (too many positional arguments, an unknown or
    repeated keyword, a missing required argument) goes to ``inspect`` itself, so every
    error message is exactly the one ``inspect`` gives.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.signature = inspect.signature(fn)
        params = self.signature.parameters.values()
        self.positional = tuple(p.name for p in params
                                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.names = frozenset(p.name for p in params)
        self.defaults = {p.name: p.default for p in params
                         if p.default is not inspect.Parameter.empty}

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any] | None:
        """The bound arguments with defaults applied, or None to let ``inspect`` decide."""
        if len(args) > len(self.positional):
            return None
        if not kwargs:  # the common call: positional arguments only
            out = self.defaults.copy()
            out.update(zip(self.positional, args))
            return out if len(out) == len(self.names) else None
        given = dict(zip(self.positional, args))
        for k, v in kwargs.items():
            k = _ALIASES.get(k, k)
            if k in given or k not in self.names:
                return None
            given[k] = v
        out = {**self.defaults, **given}  # (a missing required argument: one name short)
        return out if len(out) == len(self.names) else None


_BINDERS: dict[Callable[..., Any], _Binder] = {}


def bind(sig: Callable[..., Any], args: tuple, kwargs: dict, op: str) -> dict[str, Any]:
    """Bind ``args``/``kwargs`` to the signature of ``sig`` (defaults applied).

    Raises ``TypeError`` for an unknown or missing argument, an ``out=`` tensor, or an
    input that is not a MaskedTensor (Note [Binding once per signature]).

    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.ones(2), torch.ones(2).bool())
    >>> bind(sig_sum, (mt, 0), {"keepdims": True}, "sum")["keepdim"]
    True
    """
    binder = _BINDERS.get(sig)
    if binder is None:
        binder = _BINDERS[sig] = _Binder(sig)
    out = binder.bind(args, kwargs)
    if out is None:
        kwargs = {_ALIASES.get(k, k): v for k, v in kwargs.items()}
        try:
            bound = binder.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{op}(): {e}") from None
        bound.apply_defaults()
        out = dict(bound.arguments)
    if out.pop("out", None) is not None:
        raise TypeError(f"{op}(): out= is not supported with a MaskedTensor input; use the "
                        f"returned MaskedTensor")
    if not isinstance(out["input"], MaskedTensor):
        raise TypeError(f"{op}(): expected a MaskedTensor input, got "
                        f"{type(out['input']).__name__}")
    return out


def normalize_dims(dim: Any, ndim: int, op: str) -> tuple[int, ...]:
    """Sorted non-negative dims to reduce (every dim for ``None`` / empty).

    >>> normalize_dims(-1, 3, "sum"), normalize_dims(None, 2, "sum"), normalize_dims(0, 0, "sum")
    ((2,), (0, 1), ())
    """
    if dim is None:
        return tuple(range(ndim))
    if type(dim) is int and 0 <= dim < ndim:  # the common call, settled at once
        return (dim,)
    if isinstance(dim, bool) or isinstance(dim, str):
        raise TypeError(f"{op}(): dim must be an int or a tuple of ints, got {dim!r} (named "
                        f"dims are not supported for MaskedTensor)")
    if isinstance(dim, int):
        dims = [dim]
    elif isinstance(dim, (tuple, list, torch.Size)):
        dims = list(dim)
        if not dims:
            return tuple(range(ndim))
    else:
        raise TypeError(f"{op}(): dim must be an int or a tuple of ints, got "
                        f"{type(dim).__name__}")
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    out: list[int] = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"{op}(): dim must contain ints, got {d!r}")
        if d < lo or d > hi:
            raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], "
                             f"but got {d})")
        if ndim == 0:
            continue
        d %= ndim
        if d in out:
            raise RuntimeError(f"{op}(): dim {d} appears multiple times in the list of dims")
        out.append(d)
    return tuple(sorted(out))


def one_dim(dim: Any, ndim: int, op: str) -> tuple[int, ...]:
    """A single int dim, normalized (``()`` for a 0-d input)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}(): dim must be an int, got {dim!r}")
    return normalize_dims(dim, ndim, op)


def result_dtype(fn: Callable[..., torch.Tensor], input_dtype: torch.dtype, *args: Any,
                 **kwargs: Any) -> torch.dtype:
    """The dtype ``fn`` returns for an ``input_dtype`` input (raising torch's dtype errors).

    Probed once per ``(fn, input_dtype, args, kwargs)``; an error is not remembered, so it
    is raised again on every call.
    """
    key = (fn, input_dtype, args, tuple(kwargs.items()))
    dtype = _RESULT_DTYPES.get(key)
    if dtype is None:
        # A two-element CPU probe: meta tensors would import torch's refs (seconds) on first
        # use.
        probe = torch.zeros((2,), dtype=input_dtype)
        try:
            dtype = fn(probe, *args, **kwargs).dtype
        except NotImplementedError:
            dtype = input_dtype
        if len(_RESULT_DTYPES) < 4096:  # bounded: a NaN argument never finds its entry
            _RESULT_DTYPES[key] = dtype
    return dtype


_RESULT_DTYPES: dict[tuple, torch.dtype] = {}


def check_dtype(dtype: Any, op: str) -> torch.dtype | None:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{op}(): dtype must be a torch.dtype, got {dtype!r}")
    return dtype


def check_bool(value: Any, name: str, op: str) -> bool:
    if not isinstance(value, (bool, int)):
        raise TypeError(f"{op}(): {name} must be a bool, got {value!r}")
    return bool(value)


# -- signatures (names follow torch; only used for binding) -------------------------------
def sig_sum(input, dim=None, keepdim=False, *, dtype=None, out=None): ...


def sig_amax(input, dim=(), keepdim=False, *, out=None): ...


def sig_dim(input, dim=None, keepdim=False, *, out=None): ...


def sig_count_nonzero(input, dim=None): ...


def sig_norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None): ...


def sig_vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None, out=None): ...


def sig_var(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None): ...


def sig_logsumexp(input, dim, keepdim=False, *, out=None): ...


def sig_minmax(input, dim=None, keepdim=False, *, out=None): ...


def sig_softmax(input, dim, dtype=None): ...


def sig_functional_softmax(input, dim=None, _stacklevel=3, dtype=None): ...


def sig_aten_softmax(input, dim, half_to_float): ...
