"""Conversions between registered layouts, through the COO hub.

Every layout converts to and from COO, so any pair converts without a per-pair function;
a layout may add a direct path in its ``conversions`` table (keyed by the target's name).
Conversions are exact: specified positions and their values are kept, unspecified stay
unspecified. They are written with differentiable torch ops on the values.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from . import _native
from ._fill import zero_unspecified
from ._index import cached, linearize, lookup
from .registry import Layout, Storage, get_layout

_compiling = torch.compiler.is_compiling


def convert(storage: Storage, target: Layout | torch.layout | str, **options: Any) -> Storage:
    """``storage`` in the ``target`` layout; ``options`` go to the target's ``from_coo``.

    A storage already in ``target`` is returned as is, unless ``options`` ask for another
    format of it (e.g. a new ``blocksize``).

    >>> import torch, layouts
    >>> s = layouts.get_layout("strided").from_torch(torch.eye(2), torch.eye(2, dtype=torch.bool))
    >>> convert(s, torch.sparse_csr).index[0].tolist()
    [0, 1, 2]
    """
    target = get_layout(target)
    source = storage.layout
    if options:
        _check_options(target, options)
    if source is target and (not options or options == source.options_of(storage)):
        return storage
    direct = source.conversions.get(target.name) if source is not target else None
    if direct is not None:
        out = direct(storage, **options)
    else:
        out = target.from_coo(source.to_coo(storage), **options)
    if out.layout is not target:
        raise AssertionError(f"convert: {source.name} -> {target.name} produced a "
                             f"{out.layout.name} storage; a primitive builds with a fixed "
                             f"layout instead of the one it was called through "
                             f"(layouts.takes_layout, Note [Primitives receive their layout])")
    return out


def _check_options(target: Layout, options: dict[str, Any]) -> None:
    try:
        inspect.signature(target.from_coo).bind(None, **options)
    except TypeError:
        raise TypeError(f"to_layout({target.name}): unsupported conversion options "
                        f"{sorted(options)} for this layout") from None


def drop_unspecified(storage: Storage) -> Storage:
    """The same tensor with only its specified elements stored (sparse layouts)."""
    if not storage.index:
        return storage
    coo = storage.layout.to_coo(storage)
    keep = coo.mask if coo.mask.dim() == 1 else coo.mask.flatten(1).any(1)
    (indices,) = coo.index
    coo = coo.layout.build((indices[:, keep],), coo.values[keep], coo.mask[keep], coo.shape)
    return storage.layout.from_coo_like(coo, storage)


def read_at(source: Storage, like: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """``source``'s values and mask at ``like``'s stored positions, shaped like its values.

    Positions ``source`` does not store read as value 0, mask False. Works for any two
    layouts and patterns (no densification unless ``like`` is strided): free when both
    share their index tensors, else through COO keys in O(nnz log nnz). ``source`` may have
    a shape that broadcasts to ``like.shape`` (:func:`read_broadcast`).

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> a = coo.from_strided(torch.tensor([1., 2., 3.]), torch.tensor([True, False, True]))
    >>> b = coo.from_strided(torch.tensor([0., 5., 6.]), torch.tensor([False, True, True]))
    >>> [t.tolist() for t in read_at(b, a)]
    [[0.0, 6.0], [False, True]]
    """
    if source.shape != like.shape:
        return read_broadcast(source, like)
    if source.same_index(like) and source.values.shape == like.values.shape:
        return source.values, source.mask
    if not like.index:  # every position stored: read the dense form of ``source``
        return (like.layout.gather(like, source.densify(source.values, 0)).expand_as(like.values),
                like.layout.gather(like, source.densify(source.mask, False)).expand_as(
                    like.values))
    src = source.layout.to_coo(source)
    # The COO form of ``like`` with element ids as values maps COO order back to like's order.
    ids = torch.arange(like.values.numel(), device=like.values.device).view(like.values.shape)
    target = like.layout.to_coo(like.with_values(ids))
    sparse_shape = tuple(like.shape[: target.index[0].shape[0]])
    keys = linearize(src.index[0], sparse_shape)
    queries = linearize(target.index[0], sparse_shape)
    values, _ = lookup(keys, src.values, queries)
    mask, _ = lookup(keys, src.mask, queries, fill=False)
    flat_ids = target.values.reshape(-1)
    out_values = like.values.new_zeros(like.values.numel(), dtype=source.values.dtype)
    out_mask = torch.zeros(like.values.numel(), dtype=torch.bool, device=flat_ids.device)
    out_values[flat_ids] = values.expand(target.values.shape).reshape(-1)
    out_mask[flat_ids] = mask.expand(target.values.shape).reshape(-1)
    return out_values.view(like.values.shape), out_mask.view(like.values.shape)


def _gather_positions(storage: Storage, shape: torch.Size,
                      values_shape: torch.Size) -> torch.Tensor:
    """The flat position in a dense tensor of ``shape`` that the layout's ``gather`` reads
    for each of ``storage``'s values, in the values' shape ``values_shape`` (contiguous);
    cached per index tensor and shapes."""
    def positions() -> torch.Tensor:
        ids = torch.arange(math.prod(shape), device=storage.values.device).view(shape)
        return storage.layout.gather(storage, ids).expand(values_shape).contiguous()

    index = storage.index
    return cached(index[0], ("gather positions", tuple(shape), tuple(values_shape)), positions,
                  data=index[-1])


def read_stored(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    """``dense`` (broadcastable to ``storage.shape``) read at the stored positions, in the
    shape of ``storage.values``: the layout's ``gather``, expanded; for a sparse storage one
    ``take`` at the flat positions :func:`sum_back` sums back to (cached per index tensor),
    in place of the gather's steps on every call.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> s = coo.from_strided(torch.ones(2, 3), torch.tensor([[1, 0, 1], [0, 1, 0]]).bool())
    >>> read_stored(s, torch.tensor([[10.], [20.]])).tolist()
    [10.0, 10.0, 20.0]
    """
    if not storage.index or dense.dim() == 0 or _compiling():
        return storage.layout.gather(storage, dense).expand(storage.values.shape)
    flat = _gather_positions(storage, dense.shape, storage.values.shape)
    if flat.numel() <= _TAKE_UP_TO:  # one torch call (row-major, whatever the strides)
        return torch.take(dense, flat)
    return dense.reshape(-1).index_select(0, flat.view(-1)).view_as(flat)


def add_stored(storage: Storage, dense: torch.Tensor, op: str = "add") -> torch.Tensor:
    """``storage.values + read_stored(storage, dense)`` (``op`` ``"sub"``: ``values -
    read``, ``"rsub"``: ``read - values``), in the values' shape: the sum of a masked and a
    plain operand at the stored positions. On the CPU one native pass over the flat
    positions :func:`read_stored` reads (``_native.gather_add``: the same roundings), in
    place of a ``take`` and an ``add``.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> s = coo.from_strided(torch.ones(2, 3), torch.tensor([[1, 0, 1], [0, 1, 0]]).bool())
    >>> add_stored(s, torch.tensor([[10.], [20.]]), "rsub").tolist()
    [9.0, 9.0, 19.0]
    """
    if op not in _native.GATHER_OPS:
        raise ValueError(f"add_stored: op must be one of {sorted(_native.GATHER_OPS)}, got "
                         f"{op!r}")
    values = storage.values
    if storage.index and dense.dim() and values.is_cpu and not _compiling():
        # (CPU only: elsewhere no kernel applies, and read_stored finds the positions itself)
        flat = _gather_positions(storage, dense.shape, values.shape)
        out = _native.gather_add(values, dense, flat, op)
        if out is not None:
            return out
    read = read_stored(storage, dense)
    return values + read if op == "add" else values - read if op == "sub" else read - values


#: The most positions :func:`read_stored` reads with one ``take``: small reads are mostly
#: fixed costs, where one torch call beats three (``reshape``, ``index_select``,
#: ``view_as``: a GAT step at 300 nodes); past this ``index_select``'s loop is the faster
#: (``take`` measured 4-15% slower at 218,000 positions on an AVX2 CPU).
_TAKE_UP_TO = 1 << 15


def sum_back(storage: Storage, values: torch.Tensor, shape: torch.Size,
             mask: torch.Tensor | None = None) -> torch.Tensor:
    """The adjoint of the layout's ``gather``: ``values`` (one per stored element, shaped
    like ``storage.values``) summed onto a dense tensor of ``shape`` (which broadcasts to
    ``storage.shape``), each added at the position ``gather`` reads it from. The gradient
    of a plain operand read at the stored positions: O(nnz), one ``index_add``; the flat
    positions are built once per index tensor and ``shape`` (cached). With ``mask``
    (``values``' shape) only the values where it is True are summed, whatever the others
    hold (NaN, inf); on the CPU that is one native pass, which accumulates in double, in
    place of a fill and an ``index_add``.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> s = coo.from_strided(torch.ones(2, 3), torch.tensor([[1, 0, 1], [0, 1, 0]]).bool())
    >>> sum_back(s, torch.tensor([1., 2., 3.]), torch.Size([2, 1])).tolist()
    [[3.0], [3.0]]
    >>> sum_back(s, torch.tensor([1., float("nan"), 3.]), torch.Size([2, 1]),
    ...          mask=torch.tensor([True, False, True])).tolist()
    [[1.0], [3.0]]
    """
    if mask is not None and (not storage.index or not shape):
        values = zero_unspecified(values, mask)
    if not storage.index:  # every position stored: the values are the dense broadcast result
        return values.sum_to_size(shape)
    if not shape:
        return values.sum()
    numel = math.prod(shape)
    flat = _gather_positions(storage, shape, values.shape)  # (values' shape)
    if mask is not None:
        out = _native.scatter(_native.contiguous(values), _native.contiguous(mask), "sum",
                              flat, numel, shape)
        if out is not None:
            return out
        values = zero_unspecified(values, mask)
    return values.new_zeros(numel).index_add(0, flat.view(-1), values.reshape(-1)).view(*shape)


def element_coords(coo: Storage) -> torch.Tensor:
    """Coordinates ``(ndim, numel)`` of every element of a COO storage's values, in the
    order of ``coo.values.reshape(-1)`` (a hybrid tensor's dense dims are enumerated)."""
    (indices,) = coo.index
    dense = tuple(coo.values.shape[1:])
    if not dense:
        return indices
    inner = torch.arange(coo.values[0].numel(), device=indices.device)
    rows = [indices[d].repeat_interleave(inner.numel()) for d in range(indices.shape[0])]
    for n in reversed(dense):
        rows.insert(indices.shape[0], (inner % n).repeat(indices.shape[1]))
        inner = inner // n
    return torch.stack(rows)


def read_broadcast(source: Storage, like: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """``source``, whose shape broadcasts to ``like.shape``, read at ``like``'s positions.

    Returns values and mask shaped like ``like.values`` (for a strided ``like``, possibly
    shapes that broadcast to it; a mask that is True everywhere may come back as a
    broadcast view of one True). A sparse ``source`` whose dense form has no more
    elements than ``like``'s values (a ``keepdim`` reduction of ``like``: one value per
    line) is densified in O(source) and read by ``like``'s own coordinates in O(nnz), with
    no search or sort; a larger one is looked up by the element keys of its COO form in
    O(nnz log nnz) -- its size-1 dims read coordinate 0. ``source`` is never densified
    beyond its own shape.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> like = coo.from_strided(torch.ones(2, 3), torch.eye(2, 3).bool())
    >>> col = coo.from_strided(torch.tensor([[5.], [6.]]), torch.tensor([[True], [False]]))
    >>> [t.tolist() for t in read_broadcast(col, like)]
    [[5.0, 0.0], [True, False]]
    """
    if not like.index:
        return source.densify(source.values, 0), source.densify(source.mask, False)
    if not source.index:
        gather = like.layout.gather
        return (gather(like, source.values).expand_as(like.values),
                gather(like, source.mask).expand_as(like.values))
    if math.prod(source.shape) <= like.values.numel():
        # Note [Reading a reduced operand]: the dense form of ``source`` (a keepdim reduction
        # is one value per line) is no larger than ``like``'s values, so it is built in
        # O(source) and read by the coordinates ``like`` already stores, in O(nnz): no
        # search, no sort.
        gather = like.layout.gather
        values = gather(like, source.densify(source.values, 0)).expand_as(like.values)
        dense_mask = source.densify(source.mask, False)
        if (not torch._C._are_functorch_transforms_active()
                and bool(dense_mask.all())):  # a host read of the small operand: one gather
            return values, torch.ones((), dtype=torch.bool,
                                      device=like.mask.device).expand(like.values.shape)
        return values, gather(like, dense_mask).expand_as(like.values)
    src = source.layout.to_coo(source)
    ids = torch.arange(like.values.numel(), device=like.values.device).view(like.values.shape)
    target = like.layout.to_coo(like.with_values(ids))
    coords = element_coords(target)[len(like.shape) - len(source.shape):]
    sizes = torch.tensor(source.shape, device=coords.device)
    coords = torch.where((sizes == 1)[:, None], 0, coords)
    keys = linearize(element_coords(src), tuple(source.shape))
    queries = linearize(coords, tuple(source.shape))
    values, _ = lookup(keys, src.values.reshape(-1), queries)
    mask, _ = lookup(keys, src.mask.reshape(-1), queries, fill=False)
    flat_ids = target.values.reshape(-1)
    out_values = values.new_empty(like.values.numel()).index_put_((flat_ids,), values)
    out_mask = mask.new_empty(like.values.numel()).index_put_((flat_ids,), mask)
    return out_values.view(like.values.shape), out_mask.view(like.values.shape)


def expand_specified(storage: Storage, shape: tuple[int, ...]) -> Storage:
    """The specified elements of ``storage`` broadcast to ``shape``, as a coalesced
    fully sparse COO storage (O(output nnz log output nnz)).

    For a binary op where no operand has the result's shape (``(3, 1) + (1, 4)``): the
    expanded operand then plays the full-shape one.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> col = coo.from_strided(torch.tensor([[5.], [6.]]), torch.tensor([[True], [False]]))
    >>> expand_specified(col, (2, 3)).index[0].tolist()
    [[0, 0, 0], [0, 1, 2]]
    """
    coo = drop_unspecified(storage.layout.to_coo(storage))
    coords = element_coords(coo)
    values, mask = coo.values.reshape(-1), coo.mask.reshape(-1)
    lead = len(shape) - len(storage.shape)
    coords = torch.cat([coords.new_zeros(lead, coords.shape[1]), coords])
    for d, (had, n) in enumerate(zip((1,) * lead + tuple(storage.shape), shape)):
        if had == 1 and n != 1:
            coords = coords.repeat_interleave(n, dim=1)
            coords[d] = torch.arange(n, device=coords.device).repeat(values.numel())
            values, mask = values.repeat_interleave(n), mask.repeat_interleave(n)
    order = torch.argsort(linearize(coords, tuple(shape)))
    return get_layout("sparse_coo").build((coords[:, order],), values[order], mask[order], shape)


def stack_storages(storages: list[Storage]) -> Storage | None:
    """Storages of one shape stacked along a new dim 0 in one ``stack`` / ``cat`` per part.

    Dense storages (values of the full shape, no index) stack their values and their masks
    (one ``torch.stack`` each) in their own layout. Indexed storages become one COO storage:
    their COO forms' values and masks are concatenated once, and the index once, with the
    sample number as the new leading coordinate (each sample is coalesced, so the batch is).
    Returns None when the storages do not share one layout and shape, or a layout has no COO
    form (the caller then stacks them one by one). What ``DataLoader`` collation builds on.

    >>> import torch, layouts
    >>> coo = layouts.get_layout("sparse_coo")
    >>> a = coo.from_strided(torch.tensor([1., 2.]), torch.tensor([True, False]))
    >>> b = stack_storages([a, a])
    >>> b.index[0].tolist(), b.shape
    ([[0, 1], [0, 0]], torch.Size([2, 2]))
    """
    first = storages[0]
    layout, one_shape = first.layout, first.shape
    if not all(s.layout is layout for s in storages):
        return None
    shape = torch.Size((len(storages),) + tuple(one_shape))
    if not first.index:
        # A dense layout's values and mask have the logical shape, so torch.stack checks
        # the shapes of the others (a mismatch raises there: None).
        if first.values.shape != one_shape or first.mask.shape != one_shape:
            return None
        try:
            values = torch.stack([s.values for s in storages])
            mask = torch.stack([s.mask for s in storages])
        except RuntimeError:
            return None
        return Storage(layout, (), values, mask, shape)
    if not all(s.shape == one_shape for s in storages):
        return None
    coos = [s.layout.to_coo(s) for s in storages]
    if any(len(c.index) != 1 for c in coos):
        return None
    index = torch.cat([c.index[0] for c in coos], 1)
    counts = torch.tensor([c.index[0].shape[1] for c in coos], device=index.device)
    batch = torch.repeat_interleave(torch.arange(len(coos), device=index.device), counts,
                                    output_size=index.shape[1])
    return coos[0].layout.build((torch.cat([batch[None], index]),),
                                torch.cat([c.values for c in coos]),
                                torch.cat([c.mask for c in coos]), shape)
