"""Printing: ``--`` for masked-out positions, in the same text as ``torch.masked``."""

from __future__ import annotations

import torch

_FORMAT = "{0:8.4f}"
_SUMMARY_NUMEL = 10_000


def _fmt(x: object) -> str:
    return _FORMAT.format(x) if isinstance(x, float) else str(x)


def _nested(data: list, mask: list, dim: int) -> str:
    if dim == 1:
        if not data:
            return "[]"
        items = [_fmt(d) for d in data]
        width = max(8 if not m else len(s) for s, m in zip(items, mask))
        return "[" + ", ".join(s if m else "--".rjust(width) for s, m in zip(items, mask)) + "]"
    subs = [_nested(d, m, dim - 1) for d, m in zip(data, mask)]
    subs = ["\n".join("  " + line for line in s.split("\n")) for s in subs]
    return "[\n" + ",\n".join(subs) + "\n]"


def masked_repr(data: torch.Tensor, mask: torch.Tensor) -> str:
    """The text of a masked tensor given its dense data and mask.

    >>> print(masked_repr(torch.tensor([1., 2.]), torch.tensor([False, True])))
    MaskedTensor(
      [      --,   2.0000]
    )
    """
    if data.dim() == 0:
        specified = bool(mask)
        return f"MaskedTensor({_fmt(data.item()) if specified else '--'}, {specified})"
    body = _nested(data.tolist(), mask.tolist(), data.dim())
    return "MaskedTensor(\n" + "\n".join("  " + line for line in body.split("\n")) + "\n)"


def summary_repr(layout: str, shape: torch.Size, dtype: torch.dtype, nnz: int,
                 specified: int) -> str:
    """A one-line summary for tensors too large to print element by element."""
    return (f"MaskedTensor(layout={layout}, shape={tuple(shape)}, dtype={dtype}, "
            f"stored={nnz}, specified={specified})")
