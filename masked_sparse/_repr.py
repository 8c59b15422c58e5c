"""Printing: ``--`` for masked-out positions, in the same text as ``torch.masked``.

Small tensors print exactly as ``torch.masked`` prints them (``{:8.4f}`` floats, ``--``
right-aligned to 8 characters). What ``torch.masked`` lacks is taken from torch's own
printing (``torch.set_printoptions``):

- **number format**: the choice of scientific notation follows torch's ``_Formatter`` on
  the specified values shown (``1e-8`` prints ``1.0000e-08``, as in ``tensor([1e-8])``),
  ``precision`` and ``sci_mode`` are honoured;
- **summaries**: a tensor with more than ``threshold`` elements prints ``edgeitems``
  entries at each end of every dim, with ``...`` between them, as torch does; only those
  entries are read. A sparse one prints a summary line and its first stored entries
  instead (never densified).

Note [Printing never densifies]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A sparse tensor is densified for printing only when it has at most ``threshold`` elements
(the text then equals the strided one); a strided tensor is cut to its edges before any
conversion to Python numbers, so printing costs O(edgeitems ** ndim), not O(numel).

>>> import torch
>>> print(masked_repr(torch.tensor([1., 2.]), torch.tensor([False, True])))
MaskedTensor(
  [      --,   2.0000]
)
"""

from __future__ import annotations

import torch
from torch._tensor_str import PRINT_OPTS

from layouts import Storage

_ELLIPSIS = "..."


# -- numbers --------------------------------------------------------------------------------
def _sci_mode(values: torch.Tensor) -> bool:
    """Scientific notation, decided on ``values`` (the specified ones shown) as torch's
    ``_Formatter`` decides it for a tensor."""
    if PRINT_OPTS.sci_mode is not None:
        return bool(PRINT_OPTS.sci_mode)
    if not values.is_floating_point():
        return False
    v = values.detach().double()
    v = v[torch.isfinite(v) & (v != 0)].abs()
    if v.numel() == 0:
        return False
    lo, hi = float(v.min()), float(v.max())
    if bool((v == torch.ceil(v)).all()):  # integral values: torch never switches on small
        return hi / lo > 1000.0 or hi > 1.0e8
    return hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4


class _Numbers:
    """Formats the Python numbers of one printed tensor (one format for all of them)."""

    def __init__(self, specified: torch.Tensor) -> None:
        self.sci = _sci_mode(specified)
        self.precision = PRINT_OPTS.precision

    def __call__(self, x: object) -> str:
        if not isinstance(x, float):
            return str(x)
        if self.sci:
            return f"{x:.{self.precision}e}"
        return f"{x:8.{self.precision}f}"


# -- nested text ------------------------------------------------------------------------------
def _row(data: list, mask: list, fmt: _Numbers, cut: int | None) -> str:
    """One innermost row. ``--`` is right-aligned to the widest specified cell (at least 8),
    as ``torch.masked`` does; in scientific notation every cell is (as torch does)."""
    if not data:
        return "[]"
    width = max([8] + [len(fmt(d)) for d, m in zip(data, mask) if m])
    cells = [(fmt(d).rjust(width) if fmt.sci else fmt(d)) if m else "--".rjust(width)
             for d, m in zip(data, mask)]
    if cut is not None:
        cells.insert(cut, _ELLIPSIS)
    return "[" + ", ".join(cells) + "]"


def _nested(data: list, mask: list, dim: int, fmt: _Numbers, cuts: tuple[int | None, ...]
            ) -> str:
    """Text of nested lists ``data`` / ``mask`` of ``dim`` dims; ``cuts[d]`` is the position
    of a ``...`` in dim ``d`` (None: that dim is shown whole)."""
    if dim == 1:
        return _row(data, mask, fmt, cuts[0])
    subs = [_nested(d, m, dim - 1, fmt, cuts[1:]) for d, m in zip(data, mask)]
    if cuts[0] is not None:
        subs.insert(cuts[0], _ELLIPSIS)
    subs = ["\n".join("  " + line for line in s.split("\n")) for s in subs]
    return "[\n" + ",\n".join(subs) + "\n]"


def masked_repr(data: torch.Tensor, mask: torch.Tensor,
                cuts: tuple[int | None, ...] | None = None) -> str:
    """The text of a masked tensor given its (possibly summarized) dense data and mask.

    ``cuts[d]`` places a ``...`` in dim ``d`` before that index (see :func:`summarize`).

    >>> print(masked_repr(torch.tensor([1e-8, 2.]), torch.tensor([True, True])))
    MaskedTensor(
      [1.0000e-08, 2.0000e+00]
    )
    """
    fmt = _Numbers(data.reshape(-1)[mask.reshape(-1)])
    if data.dim() == 0:
        specified = bool(mask)
        return f"MaskedTensor({fmt(data.item()) if specified else '--'}, {specified})"
    body = _nested(data.tolist(), mask.tolist(), data.dim(), fmt,
                   cuts or (None,) * data.dim())
    return "MaskedTensor(\n" + "\n".join("  " + line for line in body.split("\n")) + "\n)"


# -- summaries ---------------------------------------------------------------------------------
def summarize(values: torch.Tensor, mask: torch.Tensor, edge: int
              ) -> tuple[torch.Tensor, torch.Tensor, tuple[int | None, ...]]:
    """The first and last ``edge`` entries of every longer dim (torch's summary), and the
    positions of the ``...`` marks."""
    cuts: list[int | None] = []
    for d, n in enumerate(values.shape):
        if n > 2 * edge:
            keep = torch.cat([torch.arange(edge), torch.arange(n - edge, n)]).to(values.device)
            values, mask = values.index_select(d, keep), mask.index_select(d, keep)
            cuts.append(edge)
        else:
            cuts.append(None)
    return values, mask, tuple(cuts)


def sparse_summary(s: Storage, dtype: torch.dtype) -> str:
    """A summary line and the first stored entries (index: value or ``--``)."""
    count = 2 * PRINT_OPTS.edgeitems
    coo = s.layout.to_coo(s)  # the COO layout returns the storage itself
    indices = coo.index[0][:, :count].t().tolist()
    values, mask = coo.values[:count], coo.mask[:count]
    fmt = _Numbers(values[mask])
    lines = []
    for where, v, m in zip(indices, values, mask):
        if v.dim() == 0:
            text = fmt(v.item()) if bool(m) else "--".rjust(8)
        else:
            text = _nested(v.tolist(), m.tolist(), v.dim(), fmt, (None,) * v.dim())
        lines.append(f"  {tuple(where)}: {text}")
    nnz = coo.values.shape[0]  # stored elements (a block layout's blocks, element by element)
    if nnz > count:
        lines.append(f"  ... ({nnz - count} more stored)")
    head = (f"MaskedTensor(layout={s.layout.name}, shape={tuple(s.shape)}, dtype={dtype}, "
            f"stored={nnz}, specified={int(s.mask.sum())}")
    return head + (",\n" + "\n".join(lines) + "\n)" if lines else ")")


def storage_repr(s: Storage, dtype: torch.dtype) -> str:
    """The text of the MaskedTensor over ``s`` (see the module docstring)."""
    numel = s.shape.numel()
    if numel <= PRINT_OPTS.threshold:
        return masked_repr(s.densify(s.values, 0), s.densify(s.mask, False))
    if s.index:
        return sparse_summary(s, dtype)
    values, mask, cuts = summarize(s.values, s.mask, PRINT_OPTS.edgeitems)
    return masked_repr(values, mask, cuts)
