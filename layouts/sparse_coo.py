"""The sparse COO layout: one coalesced index tensor shared by data and mask.

Invariants
----------
- ``index == (indices,)`` with ``indices`` an int64 ``(sparse_dim, nnz)`` tensor, coalesced:
  its row-major linear keys are strictly increasing (sorted, no duplicates).
- ``values`` has shape ``(nnz, *shape[sparse_dim:])`` (hybrid tensors keep dense trailing
  dims, as ``nn.Embedding(sparse=True)`` gradients do); ``mask`` has the same shape, bool.
- A position is specified iff it is stored and its mask value is True; every position
  that is not stored is unspecified.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ._index import coalesce_coo, linearize, lookup
from ._linalg import coo_mask_any as _mask_any
from ._linalg import coo_mm as _mm
from ._lines import sparse_lines
from ._reduce_sparse import coo_grouping
from ._shape_coo import SHAPE_OPS as _SHAPE_OPS
from ._validate import first_unsorted
from .kernels.arg_extreme import masked_arg
from .registry import Layout, Storage, register_layout, takes_layout


def _sparse_shape(storage: Storage) -> tuple[int, ...]:
    return tuple(storage.shape[: storage.index[0].shape[0]])


@takes_layout
# Note [Torch sparse tensors stay outside graphs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's fake tensors cannot read a sparse tensor's parts (a CSR's ``crow_indices()``
# has no fake kernel), and Dynamo cannot wrap the parts as graph inputs either (they
# alias the sparse tensor without strides of their own). Building a storage from a torch
# sparse tensor therefore never enters a graph: Dynamo runs it eagerly (a graph break
# where it is called from compiled code; the storage it returns holds plain tensors, which
# the rest of the graph takes as inputs).
@torch.compiler.disable
def _from_torch(layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
    same = data is mask  # e.g. an optimizer reading a gradient's own pattern: coalesce once
    mask = coalesce_coo(mask)
    data = mask if same else coalesce_coo(data)
    if data.sparse_dim() != mask.sparse_dim():
        raise ValueError(f"masked_tensor(sparse_coo): data has sparse_dim {data.sparse_dim()} "
                         f"but mask has {mask.sparse_dim()}; build both with the same sparse_dim")
    indices, mvals = mask._indices(), mask._values()
    dindices, dvals = data._indices(), data._values()
    if mvals.shape[1:] != dvals.shape[1:]:
        mvals = mvals.expand((mvals.shape[0],) + tuple(dvals.shape[1:]))
    if dindices.shape == indices.shape and torch.equal(dindices, indices):
        values = dvals
    else:
        # The mask's pattern is authoritative: read the data at the mask's indices.
        shape = tuple(mask.shape[: mask.sparse_dim()])
        values, _ = lookup(linearize(dindices, shape), dvals, linearize(indices, shape))
    return layout.build((indices,), values, mvals, mask.shape)


@takes_layout
def _from_strided(layout: Layout, data: torch.Tensor, mask: torch.Tensor) -> Storage:
    indices = mask.nonzero().t()
    return layout.build((indices,), data[mask], mask.new_ones(indices.shape[1]), mask.shape)


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    if storage.index[0].shape[0] == 0:  # no sparse dims: at most one stored (dense) block
        return values[0] if values.shape[0] else out
    return out.index_put(tuple(storage.index[0]), values)


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    return torch.sparse_coo_tensor(storage.index[0], values, storage.shape, is_coalesced=True,
                                   check_invariants=False)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    if dense.dim() == 0:
        return dense
    (index,) = storage.index
    shape, k = storage.shape, index.shape[0]
    sizes = (1,) * (len(shape) - dense.dim()) + tuple(dense.shape)
    # Only the sparse dims the operand varies along are read: a per-row vector (a keepdim
    # reduction, a broadcast score) is one index_select by its coordinate. A small operand
    # is never expanded to the full shape.
    varies = [d for d in range(k) if sizes[d] != 1]
    inner = sizes[k:]
    if len(varies) == 1:
        d = varies[0]
        if math.prod(inner) == 1:  # (a 1-D index_select is the fastest)
            out = dense.reshape(-1).index_select(0, index[d]).view((-1,) + inner)
        else:
            out = dense.reshape((sizes[d],) + inner).index_select(0, index[d])
    elif varies:
        at = dense.reshape(sizes)[tuple(slice(None) if d in varies else 0 for d in range(k))]
        out = at[tuple(index[d] for d in varies)]
    else:
        out = dense.reshape((1,) + inner)
    return out.expand((index.shape[1],) + tuple(shape[k:]))


def _coords(storage: Storage, i: int) -> list[int]:
    """The coordinates of stored element ``i``."""
    return storage.index[0][:, i].tolist()


def _to_coo(storage: Storage) -> Storage:
    return storage  # already the hub form


@takes_layout
def _from_coo(layout: Layout, storage: Storage) -> Storage:
    return storage if storage.layout is layout else layout.build(*storage[1:])


def _validate(storage: Storage, full: bool = False) -> None:
    (indices,) = storage.index
    shape, values, mask = storage.shape, storage.values, storage.mask
    if indices.dim() != 2 or indices.dtype != torch.int64 or indices.shape[0] > len(shape):
        raise ValueError(f"sparse_coo masked tensor: indices must be an int64 (sparse_dim, nnz) "
                         f"tensor with sparse_dim <= {len(shape)}, got {indices.dtype} "
                         f"{tuple(indices.shape)}")
    expected = (indices.shape[1],) + tuple(shape[indices.shape[0]:])
    if tuple(values.shape) != expected or tuple(mask.shape) != expected:
        raise ValueError(f"sparse_coo masked tensor: values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must have shape {expected}")
    if full and indices.numel():
        for row, size in zip(indices, _sparse_shape(storage)):
            low, high = torch.aminmax(row)
            if int(low) < 0 or int(high) >= size:
                raise ValueError(f"sparse_coo masked tensor: indices out of bounds for "
                                 f"{tuple(shape)}")
        if first_unsorted(indices, _sparse_shape(storage)) is not None:
            raise ValueError("sparse_coo masked tensor: indices are not coalesced (sorted and "
                             "unique); call .coalesce() on the input first")


_DENSE = "use .to_dense() first"
#: Ops this layout declines (op -> (reason, fix)); the core builds the error from them.
REFUSES = {
    **dict.fromkeys(("expand", "expand_as", "broadcast_to", "repeat", "tile"),
                    ("it would store every broadcast/repeated copy", _DENSE)),
    **dict.fromkeys(("unfold", "gather", "take"), ("no sparse kernel", _DENSE)),
    "setitem": ("indexing a sparse storage builds new tensors, so a write into them would be "
                "lost", "assign into mt.to_dense() (or build a new masked tensor) instead"),
}

register_layout(Layout(
    name="sparse_coo",
    torch_layout=torch.sparse_coo,
    index_names=("indices",),
    from_torch=_from_torch,
    from_strided=_from_strided,
    densify=_densify,
    to_torch=_to_torch,
    gather=_gather,
    to_coo=_to_coo,
    from_coo=_from_coo,
    validate=_validate,
    linalg={torch.ops.aten.any.dim: _mask_any, torch.ops.aten.mm.default: _mm},
    reduction={torch.ops.aten.argmax.default: partial(masked_arg, coords=_coords),
               torch.ops.aten.argmin.default: partial(masked_arg, coords=_coords)},
    group=coo_grouping,
    lines=sparse_lines,
    shape_ops=_SHAPE_OPS,
    refuses=REFUSES,
    doc=__doc__ or "",
))
