"""The layout registry: what a storage layout must provide, and where layouts are found.

A masked tensor in any layout is stored as a :class:`Storage`: zero or more *index*
tensors that say where the stored elements sit, a strided *values* tensor holding them,
a bool *mask* tensor of the same shape as ``values`` (True = specified) and the logical
``shape``. Data and mask share the index tensors by construction.

=============  ======================  =====================  ============================
layout         index                   values                 specified
=============  ======================  =====================  ============================
strided        ``()``                  the dense data         where ``mask`` is True
sparse_coo     ``(indices,)``          ``(nnz, *dense)``      stored and ``mask`` True
sparse_csr     ``(crow, col)``         ``(nnz,)``             stored and ``mask`` True
=============  ======================  =====================  ============================

A :class:`Layout` is a frozen record of the primitives the core needs (construction,
conversion through the strided and COO hubs, reading a dense operand at the stored
positions) plus kernel tables for the long tail of ops. Everything that only touches the
values -- unary ops, binary ops on operands with the same index tensors, ``to_tensor(0)`` --
is generic and needs no kernel: ``storage.with_values(new_values)`` keeps the index tensors
(the very same objects), which is what makes mask comparison free after any op.

Example
-------
>>> import torch, layouts
>>> coo = layouts.get_layout(torch.sparse_coo)
>>> data = torch.tensor([[0., 2.], [3., 0.]])
>>> s = coo.from_strided(data, data != 0)
>>> s.values
tensor([2., 3.])
>>> coo.densify(s, s.values, 0).tolist()
[[0.0, 2.0], [3.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

__all__ = ["Layout", "Storage", "register_layout", "get_layout", "registered_layouts"]


class Storage(NamedTuple):
    """A masked tensor's storage in one layout: plain tensors only.

    ``values`` and ``mask`` always have the same shape; ``index`` is shared by both.
    """

    layout: Layout
    index: tuple[torch.Tensor, ...]
    values: torch.Tensor
    mask: torch.Tensor
    shape: torch.Size

    def with_values(self, values: torch.Tensor, mask: torch.Tensor | None = None) -> Storage:
        """The same index tensors (the same objects) with new values (and optionally mask)."""
        return Storage(self.layout, self.index, values, self.mask if mask is None else mask,
                       self.shape)

    def densify(self, values: torch.Tensor | None = None, fill: Any = 0) -> torch.Tensor:
        """A dense tensor of ``shape``: ``values`` at the stored positions, ``fill`` elsewhere."""
        return self.layout.densify(self, self.values if values is None else values, fill)

    def same_index(self, other: Storage) -> bool:
        """True when both storages use the very same index tensor objects (O(1))."""
        return self.layout is other.layout and len(self.index) == len(other.index) and all(
            a is b for a, b in zip(self.index, other.index))


Kernel = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class Layout:
    """A storage layout for masked tensors: required primitives plus kernel tables.

    Required primitives (registration fails if one is missing):

    ``from_torch(data, mask) -> Storage``
        Build from user tensors of this layout; the mask's pattern is authoritative.
    ``from_strided(data, mask) -> Storage``
        Compress dense data and mask (the specified positions are stored).
    ``densify(storage, values, fill) -> Tensor``
        A dense tensor with ``values`` at the stored positions and ``fill`` elsewhere.
    ``to_torch(storage, values) -> Tensor``
        A plain tensor of this layout with the storage's index tensors and ``values``.
    ``gather(storage, dense) -> Tensor``
        Read a dense tensor (broadcastable to ``shape``) at the stored positions: the result
        has the shape of ``storage.values``.
    ``to_coo(storage) -> Storage`` / ``from_coo(storage) -> Storage``
        Conversions through the COO hub (coalesced, row-major order).
    ``validate(storage, full) -> None``
        O(1) checks, or O(nnz) invariants with ``full=True``; raise ValueError.

    Kernel tables map an op (an aten overload, or a name for the families the core calls
    by name such as reductions) to a function of plain tensors / storages.
    """

    name: str
    torch_layout: torch.layout | None
    index_names: tuple[str, ...]
    from_torch: Kernel
    from_strided: Kernel
    densify: Kernel
    to_torch: Kernel
    gather: Kernel
    to_coo: Kernel
    from_coo: Kernel
    validate: Kernel
    unary: Mapping[Any, Kernel] = field(default_factory=dict)
    binary: Mapping[Any, Kernel] = field(default_factory=dict)
    reduction: Mapping[Any, Kernel] = field(default_factory=dict)
    shape_ops: Mapping[Any, Kernel] = field(default_factory=dict)
    conversions: Mapping[str, Kernel] = field(default_factory=dict)
    doc: str = ""

    def __repr__(self) -> str:
        return f"Layout({self.name!r})"

    def build(self, index: tuple[torch.Tensor, ...], values: torch.Tensor, mask: torch.Tensor,
              shape: torch.Size | tuple[int, ...]) -> Storage:
        """A storage of this layout from its parts (no check; see ``validate``)."""
        return Storage(self, tuple(index), values, mask, torch.Size(shape))

    def kernel(self, table: str, op: Any) -> Kernel | None:
        """The kernel for ``op`` in one of the tables, or None."""
        return getattr(self, table).get(op)


_REQUIRED = ("from_torch", "from_strided", "densify", "to_torch", "gather", "to_coo",
             "from_coo", "validate")
_BY_KEY: dict[Any, Layout] = {}
_ORDER: list[Layout] = []


def register_layout(layout: Layout, *, replace: bool = False) -> Layout:
    """Register ``layout`` under its name and its ``torch.layout`` (if it has one).

    Raises ``TypeError`` if a required primitive is missing or not callable, and
    ``ValueError`` if the name or torch layout is taken (unless ``replace=True``).

    >>> import layouts
    >>> layouts.get_layout("sparse_csr").name
    'sparse_csr'
    """
    missing = [n for n in _REQUIRED if not callable(getattr(layout, n, None))]
    if missing:
        raise TypeError(f"register_layout({layout.name!r}): missing required primitives "
                        f"{missing}; see layouts.Layout for what each must do")
    keys = [layout.name] + ([layout.torch_layout] if layout.torch_layout is not None else [])
    for key in keys:
        if key in _BY_KEY and not replace:
            raise ValueError(f"register_layout: {key!r} is already registered "
                             f"(as {_BY_KEY[key]!r}); pass replace=True to override it")
    for key in keys:
        old = _BY_KEY.get(key)
        if old is not None and old in _ORDER:
            _ORDER.remove(old)
        _BY_KEY[key] = layout
    _ORDER.append(layout)
    return layout


def get_layout(key: Layout | torch.layout | str) -> Layout:
    """The registered layout for a ``torch.layout``, a name, or a Layout (returned as is)."""
    if isinstance(key, Layout):
        return key
    try:
        return _BY_KEY[key]
    except (KeyError, TypeError):
        known = ", ".join(lay.name for lay in _ORDER)
        raise NotImplementedError(f"no masked layout is registered for {key!r} (registered: "
                                  f"{known}); convert with .to_dense() / .to_sparse_coo(), or "
                                  f"register one with layouts.register_layout") from None


def registered_layouts() -> tuple[Layout, ...]:
    """All registered layouts, in registration order."""
    return tuple(_ORDER)
