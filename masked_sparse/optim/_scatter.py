"""Masked access to dense optimizer state: three public helpers, and the positions they share.

- :func:`as_masked_grad` turns any gradient form (dense tensor, torch sparse tensor of a
  registered layout -- uncoalesced COO included --, MaskedTensor) into one MaskedTensor,
  specified where the gradient is given. It is the only place that looks at the form.
- :func:`read_at` reads a dense tensor (parameter, state) where a MaskedTensor is stored:
  ``masked_tensor(dense, like's mask)`` without densifying anything.
- :func:`add_at_` adds the specified entries of a MaskedTensor into a dense tensor, in
  place, leaving every other entry untouched.

With them an optimizer is a few masked ops between one read and one write per state tensor:
O(nnz) for a sparse gradient, in any layout, with no per-layout code (``tutorials/adagrad.py``
writes Adagrad so). The built-in optimizers hand the gathered entries to torch's own steps
instead (Note [Lazy steps on gathered entries] in ``_entries.py``), on the positions kept
here.

Note [Flat positions]
~~~~~~~~~~~~~~~~~~~~~
``read_at`` / ``add_at_`` on a sparse storage need the position of each stored value in
the dense tensor. They are derived once per sparsity pattern from the layout's ``to_coo``
primitive (the COO hub every layout provides) and cached on the identity of the index
tensors (which ops keep, Note [Index sharing]), so the reads and writes of one step share
them. When ``to_coo`` hands the values tensor back unchanged (COO, CSR), its order is the
storage's own and the positions are row-major keys of the COO indices: one key per stored
row of values, and the dense tensor is read with ``index_select`` and written with
``index_add_`` on a ``(-1, dense_numel)`` view -- the same primitives torch's sparse
Adagrad ends in, without its ``sparse_mask`` search. Any other layout (CSC, BSR, ... whose
``to_coo`` reorders or splits the values) is asked once for the COO form of a tensor of
value ids, which maps every stored element to its flat position. Positions are unique
(the COO form is coalesced), so ``index_add_`` never adds twice to one element.

Note [Aliasing in read_at]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Like ``as_masked_tensor``, ``read_at`` does not copy where it need not: for a storage that
holds every position (strided) the result's data *is* ``dense``. Compute what you need
from a read before writing into the same tensor with ``add_at_``.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import torch

import layouts
from layouts import Storage, linearize

from .._tensor import MaskedTensor, _wrap

__all__ = ["add_at_", "as_masked_grad", "gather_at", "on_cpu", "positions", "read_at",
           "target_of"]


def as_masked_grad(grad: Any, where: str = "as_masked_grad") -> MaskedTensor:
    """``grad`` as a MaskedTensor, specified exactly where the gradient is given.

    A dense tensor is specified everywhere; a torch sparse tensor (of any registered
    layout) at its stored entries, duplicates of an uncoalesced COO tensor summed; a
    MaskedTensor is returned as is. Anything else raises ``TypeError``.

    >>> import torch, masked_sparse as ms
    >>> g = torch.sparse_coo_tensor([[1, 0, 1]], [1., 2., 3.], (3,))   # uncoalesced
    >>> ms.optim.as_masked_grad(g).to_tensor(0).to_dense()
    tensor([2., 4., 0.])
    """
    if isinstance(grad, MaskedTensor):
        return grad
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"{where}: unsupported gradient of type {type(grad).__name__}; "
                        f"expected a torch.Tensor (dense or sparse) or a MaskedTensor")
    try:
        layout = layouts.get_layout(grad.layout)
    except NotImplementedError:
        raise TypeError(f"{where}: unsupported gradient layout {grad.layout} (no masked layout "
                        f"is registered for it); pass grad.to_sparse_coo() or grad.to_dense(), "
                        f"or register the layout with layouts.register_layout") from None
    # The gradient's own pattern: its stored entries are the specified ones.
    s = layout.from_torch(grad, grad)
    return _wrap(s.with_values(s.values, layouts.all_true(s.values)))


def on_cpu(t: torch.Tensor) -> bool:
    """True for a tensor on the CPU, where reading a value on the host or an output size
    that only the data knows costs no device sync. The one switch between the CPU's
    shortcuts and the device path of this package's optimizers (Note [No host sync in a
    step]); the tests turn it off to run the device path on the CPU."""
    return t.device.type == "cpu"


def target_of(param: torch.Tensor) -> torch.Tensor:
    """The plain tensor an optimizer updates (and shapes its state like) for ``param``.

    A plain parameter is its own target; a MaskedTensor parameter is updated through its
    stored values, so its state has the shape of those values.
    """
    return param._storage.values if isinstance(param, MaskedTensor) else param


# -- flat positions (Note [Flat positions]) ------------------------------------------------
class _Positions(NamedTuple):
    flat: torch.Tensor  # int64: the row of ``dense.view(-1, width)`` of each row of values
    width: int          # elements per row: values are read as ``values.view(-1, width)``
    ordered: bool       # ``flat`` ascends (the storage's values are in row-major order)


_CACHE: list[tuple[tuple[Any, ...], torch.Size, torch.Size, _Positions]] = []
_CACHE_SIZE = 4


def _compute_positions(s: Storage) -> _Positions:
    coo = s.layout.to_coo(s)
    (indices,) = coo.index
    sparse_shape = tuple(s.shape[: indices.shape[0]])
    keys = linearize(indices, sparse_shape)
    if keys._base is not None:  # a view of the indices: the cache must not keep them alive
        keys = keys.clone()
    if coo.values is s.values:
        return _Positions(keys, math.prod(s.values.shape[1:]), True)
    # The layout reorders or splits its values on the way to COO: follow value ids.
    n = s.values.numel()
    ids = torch.arange(n, device=s.values.device).view(s.values.shape)
    coo = s.layout.to_coo(s.with_values(ids))
    inner = math.prod(coo.values.shape[1:])
    elems = keys[:, None] * inner + torch.arange(inner, device=keys.device)
    flat = torch.zeros(n, dtype=torch.long, device=keys.device)
    flat[coo.values.reshape(-1)] = elems.reshape(-1)
    return _Positions(flat, 1, False)


def _positions(s: Storage) -> _Positions:
    """The flat positions of ``s``'s values (Note [Flat positions]), cached per pattern."""
    for refs, shape, vshape, pos in _CACHE:
        if (shape == s.shape and vshape == s.values.shape and len(refs) == len(s.index)
                and all(r() is t for r, t in zip(refs, s.index))):
            return pos
    pos = _compute_positions(s)
    refs = tuple(weakref.ref(t, _evict) for t in s.index)
    _CACHE.insert(0, (refs, s.shape, s.values.shape, pos))
    del _CACHE[_CACHE_SIZE:]
    return pos


def _evict(dead: weakref.ref) -> None:
    """Drop the positions of a pattern whose index tensors are gone (frees them at once)."""
    _CACHE[:] = [e for e in _CACHE if not any(r is dead for r in e[0])]


positions = _positions


def gather_at(dense: torch.Tensor, s: Storage) -> torch.Tensor:
    """``dense`` read at the stored positions of ``s``, shaped like ``s.values`` (for a
    storage of every position, ``s.layout.gather``: ``dense`` itself)."""
    if not s.index:
        return s.layout.gather(s, dense)
    pos = _positions(s)
    return dense.reshape(-1, pos.width).index_select(0, pos.flat).view(s.values.shape)


def _all_specified(mask: torch.Tensor) -> bool:
    """True when ``mask`` is True everywhere, read on the host where that is free (the CPU;
    elsewhere False: the caller fills, which is exact either way)."""
    if not on_cpu(mask):
        return False
    if mask.numel() == 0:
        return True
    if all(st == 0 for st in mask.stride()):
        return bool(mask[(0,) * mask.dim()])
    return bool(mask.view(torch.uint8).min())


def read_at(dense: torch.Tensor, like: MaskedTensor) -> MaskedTensor:
    """``dense`` as a MaskedTensor with the mask (and storage pattern) of ``like``.

    O(nnz) for a sparse ``like``: ``dense`` is read at its stored positions only. The
    result shares index and mask objects with ``like``, so ops between the two are free of
    mask checks. For a strided ``like`` the data is ``dense`` itself (Note [Aliasing in
    read_at]).

    >>> import torch, masked_sparse as ms
    >>> g = ms.optim.as_masked_grad(torch.sparse_coo_tensor([[0, 2]], [1., 1.], (3,)))
    >>> ms.optim.read_at(torch.tensor([5., 6., 7.]), g)
    MaskedTensor(
      [  5.0000,       --,   7.0000]
    )
    """
    s = like._storage
    if dense.shape != s.shape:
        raise ValueError(f"read_at: a tensor of shape {tuple(dense.shape)} cannot be read at the "
                         f"positions of a MaskedTensor of shape {tuple(s.shape)}")
    return _wrap(s.with_values(gather_at(dense, s)))


def add_at_(dense: torch.Tensor, update: MaskedTensor, alpha: float = 1.0) -> torch.Tensor:
    """``dense += alpha * update`` at the specified entries of ``update``; in place, O(nnz).

    Unspecified entries of ``update`` (whatever their stored value, NaN included) leave
    ``dense`` unchanged.

    >>> import torch, masked_sparse as ms
    >>> g = ms.optim.as_masked_grad(torch.sparse_coo_tensor([[0, 2]], [1., 1.], (3,)))
    >>> ms.optim.add_at_(torch.zeros(3), g * 2, alpha=-1)
    tensor([-2.,  0., -2.])
    """
    if not isinstance(update, MaskedTensor):
        raise TypeError(f"add_at_: update must be a MaskedTensor, got {type(update).__name__}; "
                        f"wrap it with ms.optim.as_masked_grad")
    s = update._storage
    if dense.shape != s.shape:
        raise ValueError(f"add_at_: a MaskedTensor of shape {tuple(s.shape)} cannot be added into "
                         f"a tensor of shape {tuple(dense.shape)}")
    values = s.values
    if not _all_specified(s.mask):
        values = layouts.zero_unspecified(values, s.mask)
    if alpha != 1:
        values = values * alpha
    values = values.to(dense.dtype)
    if not s.index:
        return dense.add_(s.layout.densify(s, values, 0))
    pos = _positions(s)
    work = dense if dense.is_contiguous() else dense.contiguous()
    work.view(-1, pos.width).index_add_(0, pos.flat, values.reshape(-1, pos.width))
    return dense if work is dense else dense.copy_(work)
