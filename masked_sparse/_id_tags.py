"""A table keyed weakly by tensor identity, read without building a weak reference per
lookup: what the core remembers about a tensor object (a fill already done, a mask with
nothing to fill, an optimizer state's pattern) is read by every op that could skip work.

``torch.utils.weak.WeakIdKeyDictionary`` builds a weak reference object for every lookup,
a few microseconds that a small op pays several times; here a lookup is a dict read and
one dereference. An entry dies with its tensor (the weak reference's callback), and a
reused ``id`` is told apart by the reference itself.

>>> import torch
>>> t, tags = torch.zeros(2), IdTags()
>>> tags.set(t, "tag"); tags.get(t), tags.get(torch.zeros(2))
('tag', None)
"""

from __future__ import annotations

import weakref
from typing import Any

import torch


class IdTags:
    """Tags keyed weakly by tensor identity (module docstring)."""

    def __init__(self) -> None:
        self._table: dict[int, tuple[weakref.ref, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._table)

    def get(self, t: torch.Tensor) -> Any:
        entry = self._table.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def set(self, t: torch.Tensor, value: Any) -> None:
        key, table = id(t), self._table
        entry = table.get(key)
        if entry is not None and entry[0]() is t:
            table[key] = (entry[0], value)
            return

        def forget(ref: weakref.ref, key: int = key, table: dict = table) -> None:
            if (table.get(key) or (None,))[0] is ref:
                del table[key]

        table[key] = (weakref.ref(t, forget), value)
