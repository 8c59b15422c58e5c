"""The layout registry and the layout protocol: what a storage layout must provide.

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
sparse_csc     ``(ccol, row)``         ``(nnz,)``             stored and ``mask`` True
sparse_bsr     ``(crow, col)``         ``(nnzb, bs0, bs1)``   stored and ``mask`` True
=============  ======================  =====================  ============================

The layout protocol
-------------------
A layout is a :class:`Layout` record registered with :func:`register_layout`. The core
(``masked_sparse``) never asks which layout it holds: it only calls the primitives below,
so a layout written outside both packages works with every MaskedTensor op.

*Required primitives* (registration raises ``TypeError`` if one is missing). All take and
return plain tensors or storages, and compute values with differentiable torch ops on
``values`` (the core differentiates through them, Note [Autograd on the values]):

- ``from_torch(data, mask)``: build from a user's torch tensors of ``torch_layout``; the
  mask's pattern is authoritative (data stored elsewhere is dropped, absent reads as 0).
- ``from_strided(data, mask)``: compress dense data and mask.
- ``densify(storage, values, fill)``: dense tensor, ``values`` at the stored positions.
- ``to_torch(storage, values)``: a plain torch tensor of this layout (what ``get_data``,
  ``get_mask`` and ``to_tensor(0)`` return), reusing the index tensors.
- ``gather(storage, dense)``: a dense tensor broadcastable to ``shape`` read at the stored
  positions, shaped like ``values`` (0-d tensors may be returned as they are).
- ``to_coo(storage)`` / ``from_coo(coo, **options)``: conversion through the COO hub (a
  coalesced, row-major ``sparse_coo`` storage). ``options`` are the keyword arguments a
  user passes to ``ms.to_layout(mt, layout, **options)`` (BSR's ``blocksize``).
- ``validate(storage, full=False)``: O(1) shape checks, or the O(nnz) invariants with
  ``full=True``; raise ``ValueError``.

*How a primitive knows its layout*: a primitive that takes a storage reads it from
``storage.layout`` and builds its results with ``storage.layout.build(...)``, never with a
module constant. The three that build a storage from plain tensors (``from_torch``,
``from_strided``, ``from_coo``) are written ``f(layout, ...)`` and marked with
:func:`takes_layout`: the record passes *itself*, so ``lay.from_coo(coo)`` builds a storage
of ``lay``, and a copy made with ``dataclasses.replace`` (registered under another name)
builds storages of the copy (Note [Primitives receive their layout]). Unmarked primitives
are called as they are (a layout written with its own constant still works, but a copy of
it then converts to the original, which :func:`layouts.convert` rejects).

*Optional entries*:

- ``format_options(storage) -> dict``: the ``from_coo`` options that rebuild a storage in
  the same format (``{"blocksize": (2, 3)}``); needed when ``from_coo`` takes options.
- ``group(storage, dims, keepdim) -> Grouping``: how the layout groups its stored values for
  a reduction (see :mod:`layouts._grouping`); without it reductions go through COO.
- ``lines(storage, dim) -> Lines``: the same for scans and sorts along one dim (see
  :mod:`layouts._lines`); without it they go through COO.
- ``refuses``: ``{op name: (reason, fix)}``, the ops the layout declines on purpose (a
  shape op that would store every broadcast copy, ...). The core raises
  ``NotImplementedError`` with that reason and fix, naming the layouts that do have the op.

*Kernel tables*, each keyed by exact aten overloads; an entry overrides the core's generic
derivation for this layout only (ARCHITECTURE.md, "one route for every op"):

=============  ==================================================  =========================
table          kernel                                              generic derivation
=============  ==================================================  =========================
``unary``      ``(storage, *args, **kwargs) -> Storage``           the op on ``values``
``binary``     ``(storage, other, *args, **kwargs) -> Storage``    the op on aligned values
``reduction``  ``(storage, dims, keepdim, *params) -> Storage``    through ``group`` / COO
``shape_ops``  ``(storage, *normalized_args) -> Storage``          rewrites of other ops
``linalg``     ``mm``: ``(storage, dense, transpose) -> Tensor``;  through the COO form
               ``any.dim``: ``(storage, dim) -> Tensor`` (lines
               with a specified element) -- :mod:`layouts._linalg`
=============  ==================================================  =========================

A kernel may return ``NotImplemented`` for a call it does not handle (say, a reduction
over other dims than the one it is fast for): the generic derivation then runs.
``binary`` kernels receive operands whose masks the core has already matched: ``other`` is a
storage sharing ``storage``'s index tensors (a plain tensor operand read at the stored
positions) or a Python scalar. ``reduction`` kernels receive normalized dims and the
op's parameters (listed in ``masked_sparse/ops/reductions.py``). ``shape_ops`` kernels get
normalized arguments (``masked_sparse/ops/shape.py``, Note [Shape op signatures]).
Two single kernels complete the set: ``to_tensor(storage, value) -> Tensor`` (masked-out
positions filled with ``value``) and ``get_data(storage, values) -> Tensor`` (the data as a
plain tensor of the layout); ``conversions`` holds direct paths keyed on the target
layout's name (the generic path goes through COO).

*Invariants every layout keeps*: ``values`` and ``mask`` have the same shape and the mask
is bool; the index tensors are shared by data and mask and never written in place;
``with_values`` keeps them (the same objects); a position that is not stored is
unspecified; ``to_coo`` returns a coalesced COO storage; conversions are exact (the
specified set and its values survive, unspecified positions stay unspecified).

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
from functools import partial
from typing import Any, NamedTuple

import torch

__all__ = ["Layout", "Storage", "register_layout", "unregister_layout", "get_layout",
           "registered_layouts", "takes_layout"]


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


def takes_layout(primitive: Kernel) -> Kernel:
    """Mark a primitive written as ``primitive(layout, *args)``: its Layout passes itself.

    >>> @takes_layout
    ... def from_strided(layout, data, mask):
    ...     return layout.build((), data, mask, data.shape)
    """
    primitive.takes_layout = True  # type: ignore[attr-defined]
    return primitive


@dataclass(frozen=True, eq=False)
class Layout:
    """A storage layout for masked tensors: required primitives plus kernel tables.

    The required primitives (``from_torch`` ... ``validate``: registration fails if one is
    missing), the optional entries and the kernel tables (``unary``, ``binary``,
    ``reduction``, ``shape_ops``, ``linalg`` keyed by exact aten overloads, ``to_tensor``,
    ``get_data``, ``conversions``) are described in the module docstring; ``index_names``
    name the index tensors and ``doc`` describes the layout (both printed by
    ``python -m masked_sparse``).
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
    linalg: Mapping[Any, Kernel] = field(default_factory=dict)
    to_tensor: Kernel | None = None
    get_data: Kernel | None = None
    conversions: Mapping[str, Kernel] = field(default_factory=dict)
    group: Kernel | None = None
    lines: Kernel | None = None
    refuses: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    format_options: Kernel | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        # Note [Primitives receive their layout]
        # A primitive marked with ``takes_layout`` is stored bound to this record. A copy made
        # with ``dataclasses.replace`` receives the bound primitives of the original: they
        # are unwrapped and bound to the copy, so each record builds storages of itself.
        for name in _REQUIRED + ("format_options",):
            primitive = getattr(self, name)
            if isinstance(primitive, partial) and getattr(primitive.func, "takes_layout", False):
                primitive = primitive.func
            if getattr(primitive, "takes_layout", False):
                object.__setattr__(self, name, partial(primitive, self))

    def __repr__(self) -> str:
        return f"Layout({self.name!r})"

    def build(self, index: tuple[torch.Tensor, ...], values: torch.Tensor, mask: torch.Tensor,
              shape: torch.Size | tuple[int, ...]) -> Storage:
        """A storage of this layout from its parts (no check; see ``validate``)."""
        return Storage(self, tuple(index), values, mask, torch.Size(shape))

    def options_of(self, storage: Storage) -> dict[str, Any]:
        """The conversion options that rebuild ``storage`` in its format (often ``{}``)."""
        return dict(self.format_options(storage)) if self.format_options is not None else {}

    def from_coo_like(self, coo: Storage, like: Storage) -> Storage:
        """``coo`` converted to this layout in the same format as ``like`` (e.g. blocksize).

        >>> import torch, layouts
        >>> s = layouts.get_layout("strided").from_strided(torch.ones(2), torch.ones(2).bool())
        >>> s.layout.from_coo_like(s.layout.to_coo(s), s).shape
        torch.Size([2])
        """
        return self.from_coo(coo, **self.options_of(like))


_REQUIRED = ("from_torch", "from_strided", "densify", "to_torch", "gather", "to_coo",
             "from_coo", "validate")
_TABLES = ("unary", "binary", "reduction", "shape_ops", "linalg", "conversions", "refuses")
_OPTIONAL = ("format_options", "group", "lines", "to_tensor", "get_data")
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
    if not isinstance(layout, Layout):
        raise TypeError(f"register_layout: expected a layouts.Layout, got {type(layout).__name__}")
    if not isinstance(layout.name, str) or not layout.name:
        raise TypeError(f"register_layout: a layout needs a non-empty str name, got "
                        f"{layout.name!r}")
    if layout.torch_layout is not None and not isinstance(layout.torch_layout, torch.layout):
        raise TypeError(f"register_layout({layout.name!r}): torch_layout must be a torch.layout "
                        f"or None, got {layout.torch_layout!r}")
    missing = [n for n in _REQUIRED if not callable(getattr(layout, n, None))]
    if missing:
        raise TypeError(f"register_layout({layout.name!r}): missing required primitives "
                        f"{missing}; see layouts.Layout for what each must do")
    for n in _OPTIONAL:
        if getattr(layout, n) is not None and not callable(getattr(layout, n)):
            raise TypeError(f"register_layout({layout.name!r}): {n} must be callable or None")
    bad = [t for t in _TABLES if not isinstance(getattr(layout, t), Mapping)]
    if bad:
        raise TypeError(f"register_layout({layout.name!r}): kernel tables {bad} must be "
                        f"mappings (op -> kernel)")
    keys = [layout.name] + ([layout.torch_layout] if layout.torch_layout is not None else [])
    for key in keys:
        if key in _BY_KEY and not replace:
            raise ValueError(f"register_layout: {key!r} is already registered "
                             f"(as {_BY_KEY[key]!r}); pass replace=True to override it")
    displaced = list({id(_BY_KEY[k]): _BY_KEY[k] for k in keys if k in _BY_KEY}.values())
    slot = min((_ORDER.index(old) for old in displaced), default=len(_ORDER))
    for old in displaced:
        unregister_layout(old)  # a replaced layout leaves no stale key behind
    for key in keys:
        _BY_KEY[key] = layout
    _ORDER.insert(slot, layout)  # a replacement takes the replaced layout's place
    return layout


def unregister_layout(key: Layout | torch.layout | str) -> Layout:
    """Remove a registered layout (its name and torch layout); returns it.

    Storages that already use it keep working; new lookups by name fail. Meant for tests
    and notebooks that register a layout temporarily.

    >>> import dataclasses, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> tmp = layouts.register_layout(dataclasses.replace(coo, name="tmp", torch_layout=None))
    >>> layouts.unregister_layout("tmp") is tmp
    True
    """
    layout = get_layout(key)
    if layout not in _ORDER:
        raise ValueError(f"unregister_layout: {layout!r} is not registered")
    for k in [k for k, v in _BY_KEY.items() if v is layout]:
        del _BY_KEY[k]
    _ORDER.remove(layout)
    return layout


#: Short names accepted wherever a layout name is (scipy's format names, ``to_dense``'s
#: word): each stands for the registered layout of the full name. A layout registered under
#: one of these names itself takes precedence.
ALIASES: Mapping[str, str] = {"coo": "sparse_coo", "csr": "sparse_csr", "csc": "sparse_csc",
                              "bsr": "sparse_bsr", "dense": "strided"}


def get_layout(key: Layout | torch.layout | str) -> Layout:
    """The registered layout for a ``torch.layout``, a name, or a Layout (returned as is).

    A name may be a registered layout's name or one of its short names (:data:`ALIASES`:
    ``"coo"``, ``"csr"``, ``"csc"``, ``"bsr"``, ``"dense"``).

    >>> get_layout("csr") is get_layout("sparse_csr") is get_layout(torch.sparse_csr)
    True
    """
    if isinstance(key, Layout):
        return key
    try:
        return _BY_KEY[key]
    except (KeyError, TypeError):
        alias = ALIASES.get(key) if isinstance(key, str) else None
        if alias in _BY_KEY:
            return _BY_KEY[alias]
        known = ", ".join(lay.name for lay in _ORDER)
        short = ", ".join(f"{a!r}" for a, full in ALIASES.items() if full in _BY_KEY)
        raise NotImplementedError(f"no masked layout is registered for {key!r} (registered: "
                                  f"{known}; short names: {short}); convert with "
                                  f".to_dense() / .to_sparse_coo(), or register one with "
                                  f"layouts.register_layout") from None


def registered_layouts() -> tuple[Layout, ...]:
    """All registered layouts, in registration order."""
    return tuple(_ORDER)
