# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Writing your own storage layout
#
# A `MaskedTensor` does not care how its elements are stored. Strided, COO, CSR, CSC and
# BSR storage are all plugged in the same way: a module that describes the storage with
# a handful of functions on plain tensors, registered with `layouts.register_layout`.
# Nothing in `masked_sparse` knows any of them by name, so a layout you write in your
# own code gets every MaskedTensor op: elementwise math, mask checks, reductions,
# conversions, printing and autograd.
#
# This tutorial builds a small layout from scratch: **rows**. It keeps only the rows of
# a matrix that hold at least one specified element, each of them densely. That is the
# shape of many real workloads -- the gradient of an embedding table touches a few rows,
# a batch of sequences masks whole rows out -- and it is simple enough to write in a
# page.

# %%
import torch

import layouts
import masked_sparse as ms
from layouts import Layout, Storage

print("registered layouts:", [lay.name for lay in layouts.registered_layouts()])

# %% [markdown]
# ## What a layout stores
#
# Every masked tensor is held as a `layouts.Storage`, a named tuple of plain tensors:
#
# - `index`: a tuple of index tensors saying where the stored elements are;
# - `values`: the stored elements;
# - `mask`: a bool tensor with the *same shape as `values`* (True = specified);
# - `shape`: the logical shape.
#
# Data and mask share `index`. For the rows layout we choose:
#
# - `index = (row_ids,)`: the stored rows, sorted, distinct, int64;
# - `values` and `mask`: shape `(len(row_ids), *shape[1:])`.
#
# A row that is not stored is unspecified everywhere; inside a stored row, the mask
# says which elements are specified.
#
# Here is a COO storage, to see the idea on a layout that already exists:

# %%
data = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 11.0]])
mask = torch.tensor([[False, False, False], [True, False, True],
                     [False, False, False], [False, True, True]])
coo = layouts.get_layout("sparse_coo").from_strided(data, mask)
print("COO index:", coo.index[0].tolist())
print("COO values:", coo.values.tolist())

# %% [markdown]
# ## The primitives
#
# A layout provides eight functions. Each works on plain tensors and computes stored
# values with ordinary differentiable torch ops -- that is all autograd needs.
#
# | primitive | what it does |
# |---|---|
# | `from_strided(data, mask)` | compress a dense data/mask pair |
# | `from_torch(data, mask)` | build from user tensors of this layout's torch form |
# | `densify(storage, values, fill)` | dense tensor: `values` where stored, `fill` elsewhere |
# | `to_torch(storage, values)` | the plain-tensor form (what `get_data()` returns) |
# | `gather(storage, dense)` | read a dense operand at the stored positions |
# | `to_coo(storage)` / `from_coo(coo)` | conversion through the COO hub |
# | `validate(storage, full)` | cheap checks, or all invariants when `full=True` |
#
# We start with compression and its inverse. `from_strided` keeps the rows whose mask
# has any True; `densify` writes the stored rows into a tensor filled with `fill`.

# %%
def rows_from_strided(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    row_ids = mask.flatten(1).any(1).nonzero().flatten()
    return ROWS.build((row_ids,), data[row_ids], mask[row_ids], data.shape)


def rows_densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    return out.index_put(storage.index, values)


# %% [markdown]
# The layout has no `torch.layout` of its own, so we must decide what its plain-tensor
# form is. A hybrid sparse COO tensor (one sparse dim, dense rows) fits exactly: it is
# what `mt.get_data()`, `mt.get_mask()` and `mt.to_tensor(0)` will return, and it keeps
# the compression. `from_torch` reads such tensors back; the *mask's* rows decide what is
# stored, whatever the data holds.

# %%
def rows_to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    (row_ids,) = storage.index
    return torch.sparse_coo_tensor(row_ids[None], values, storage.shape, is_coalesced=True,
                                   check_invariants=False)


def rows_from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    if data.layout == torch.strided:
        return rows_from_strided(data, mask)
    mask = mask.coalesce()
    row_ids = mask.indices()[0]
    return ROWS.build((row_ids,), data.index_select(0, row_ids).to_dense(),
                      mask.index_select(0, row_ids).to_dense(), mask.shape)


# %% [markdown]
# `gather` is what lets a masked tensor meet a plain tensor: in `mt + bias` the bias is
# broadcast to the masked tensor's shape and read at the stored positions only. Indexing
# a broadcast view never materializes it, so a small operand stays small.

# %%
def rows_gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    if dense.dim() == 0:
        return dense
    return dense.expand(storage.shape)[storage.index[0]]


# %% [markdown]
# Conversions go through one hub, COO: if every layout can reach COO and come back,
# every pair of layouts converts, with no function per pair. `to_coo` must return a
# *coalesced* COO storage (row-major order, no duplicates); `from_coo` may receive any
# coalesced COO storage, including hybrid ones. A tensor a primitive builds follows its
# input's device (`new_ones`, `new_zeros`, `device=`), so the layout works on every device.

# %%
def rows_to_coo(storage: Storage) -> Storage:
    (row_ids,) = storage.index
    inner = storage.mask.new_ones(storage.shape[1:]).nonzero().t()  # row-major, same device
    n, per_row = row_ids.numel(), inner.shape[1]
    indices = torch.cat([row_ids.repeat_interleave(per_row)[None], inner.repeat(1, n)])
    return layouts.get_layout("sparse_coo").build(
        (indices,), storage.values.reshape(-1), storage.mask.reshape(-1), storage.shape)


def rows_from_coo(coo: Storage) -> Storage:
    (indices,) = coo.index
    row_ids, slot = torch.unique(indices[0], sorted=True, return_inverse=True)
    shape = (row_ids.numel(),) + tuple(coo.shape[1:])
    where = (slot,) + tuple(indices[1:])
    values = coo.values.new_zeros(shape).index_put(where, coo.values)
    mask = coo.mask.new_zeros(shape).index_put(where, coo.mask)
    return ROWS.build((row_ids,), values, mask, coo.shape)


# %% [markdown]
# Finally `validate`. Without `full` it only checks shapes (it runs on every
# construction); with `full=True` it checks the invariants that cost a pass over the
# index, and tests call it on every result.

# %%
def rows_validate(storage: Storage, full: bool = False) -> None:
    (row_ids,) = storage.index
    expected = (row_ids.numel(),) + tuple(storage.shape[1:])
    if row_ids.dim() != 1 or row_ids.dtype != torch.int64:
        raise ValueError("rows layout: row_ids must be a 1-D int64 tensor")
    if storage.values.shape != expected or storage.mask.shape != expected:
        raise ValueError(f"rows layout: values and mask must have shape {expected}")
    if full and row_ids.numel():
        if bool((row_ids[1:] <= row_ids[:-1]).any()):
            raise ValueError("rows layout: row_ids must be sorted and distinct")
        if row_ids[0] < 0 or row_ids[-1] >= storage.shape[0]:
            raise ValueError("rows layout: row_ids out of bounds")


# %% [markdown]
# ## A kernel-table entry: overriding a generic op
#
# The core derives every op from the functions above, but a layout often knows a
# shortcut. A row maximum of the rows layout is a maximum along dim 1 of the stored
# values: no COO form needed, and the result keeps the stored rows. A `reduction` entry
# keyed on the exact overload `aten.amax.default` says so. The core calls it with the
# storage and normalized arguments (`dims` is a sorted tuple; the kernel must leave
# unspecified elements out, as every kernel does); returning `NotImplemented` hands a
# call back to the generic route (here: anything but dim 1 of a matrix). The entry
# overrides the generic op for this layout only.

# %%
calls = []


def rows_amax(storage: Storage, dims: tuple[int, ...], keepdim: bool, op: str) -> Storage:
    if dims != (1,) or keepdim or len(storage.shape) != 2:
        return NotImplemented
    calls.append(dims)
    values = storage.values.masked_fill(~storage.mask, float("-inf")).amax(1)
    specified = storage.mask.any(1)
    return storage.layout.build(storage.index, values.masked_fill(~specified, 0), specified,
                                storage.shape[:1])


# %% [markdown]
# ## Registering it
#
# A `Layout` record ties the functions together under a name. Registration checks that
# every required primitive is there (try leaving one out: you get a `TypeError` that
# names it). Optional entries exist too: kernel tables keyed by exact aten overloads
# (`unary`, `binary`, `reduction`, `shape_ops`), the `to_tensor` / `get_data` kernels, a
# `group` builder for faster reductions than the COO route, direct `conversions`,
# `refuses` (ops the layout declines, with the reason and the fix) and `format_options`
# for layouts whose conversion takes options, like BSR's blocksize. We start without any:
# the core derives every op from the primitives, and we add a table entry below.

# %%
ROWS = Layout(
    name="rows",
    torch_layout=None,
    index_names=("row_ids",),
    from_torch=rows_from_torch,
    from_strided=rows_from_strided,
    densify=rows_densify,
    to_torch=rows_to_torch,
    gather=rows_gather,
    to_coo=rows_to_coo,
    from_coo=rows_from_coo,
    validate=rows_validate,
    reduction={torch.ops.aten.amax.default: rows_amax},
)
layouts.register_layout(ROWS)
print("registered layouts:", [lay.name for lay in layouts.registered_layouts()])

# %% [markdown]
# ## Using it
#
# `ms.to_layout` takes a layout by name. Only the two rows with a specified element are
# stored; printing shows the same tensor as in any other layout.

# %%
mt = ms.to_layout(ms.masked_tensor(data, mask), "rows")
print(mt)
print("stored rows:", mt._storage.index[0].tolist(), "values shape:",
      tuple(mt._storage.values.shape))

# %% [markdown]
# Elementwise ops run on the stored rows only and keep the very same index tensor, so a
# second operand built from the first is matched for free. A plain tensor broadcasts and
# takes the masked tensor's mask.

# %%
bias = torch.tensor([0.5, 1.0, 1.5])
out = mt.sqrt() * 2 + bias
print(out)
print("same index object:", out._storage.index[0] is mt._storage.index[0])

# %% [markdown]
# Reductions need no code in the layout: without a `reduction` kernel the core reduces
# the COO form, in time proportional to the stored elements. Only specified elements
# take part, and a row with none stays unspecified.

# %%
print("sum over columns:", mt.sum(1))
print("max over rows:", mt.amax(0))
print("max over columns:", mt.amax(1))
print("mean of everything:", mt.mean())

# %% [markdown]
# The maxima over columns, on the other hand, came from our kernel-table entry:
# `mt.amax(1)` ran `rows_amax`, while `mt.amax(0)` -- a call the entry hands back -- took
# the generic route. Both agree with the COO layout, which has no such entry:

# %%
print("rows_amax ran for:", calls)
coo_mt = mt.to_sparse_coo()
for d in (0, 1):
    assert torch.equal(torch.amax(mt, d).to_tensor(0).to_dense(),
                       torch.amax(coo_mt, d).to_tensor(0).to_dense())
print("amax over columns:", torch.amax(mt, 1))

# %% [markdown]
# Gradients carry the input's mask and come back in the rows layout.

# %%
x = mt.clone().requires_grad_()
(x * x).sum().backward()
print("grad layout:", ms.layout_of(x.grad).name)
print(x.grad)

# %% [markdown]
# Leaving the masked world: `to_tensor(0)` and `get_data()` return the layout's plain
# form (our hybrid COO tensor); any other fill value can only be expressed densely.
# Conversions to every registered layout are exact, both ways.

# %%
print(mt.to_tensor(0))
print(mt.to_tensor(-1.0))
for other in ["strided", "sparse_coo", "sparse_csr", "sparse_csc"]:
    back = ms.to_layout(ms.to_layout(mt, other), "rows")
    assert torch.equal(back.to_tensor(0).to_dense(), mt.to_tensor(0).to_dense())
blocked = mt.to_sparse_bsr((2, 3))  # options reach the target layout
print("via BSR:", ms.to_layout(blocked, "rows").to_tensor(0).to_dense().equal(
    mt.to_tensor(0).to_dense()))

# %% [markdown]
# ## Checking it
#
# Compare a few results with the same computation done densely with `torch.where`:

# %%
reference = torch.where(mask, data.sqrt() * 2 + bias, 0)
assert torch.allclose(out.to_tensor(0).to_dense(), reference)
assert torch.equal(mt.sum(1).to_tensor(0).to_dense(), torch.where(mask, data, 0).sum(1))
ROWS.validate(out._storage, full=True)
print("agrees with the dense reference")

# %% [markdown]
# For real coverage, run the project's generic layout suite on your layout. It is one
# test class, `LayoutSuite` in `tests/layouts/test_layout_suite.py`, that only needs a `layout`
# fixture; it checks construction, invariants, round trips with every registered layout,
# unary and binary ops, `to_tensor` / `get_data`, reductions, autograd and printing
# against dense references. In a test file of your own:
#
# ```python
# import pytest, layouts
# from test_layout_suite import LayoutSuite
# from my_project.rows import ROWS
#
# class TestRowsLayout(LayoutSuite):
#     SHAPES = ((5, 4), (3, 6))
#     OPTIONS = {"sparse_bsr": {"blocksize": (1, 2)}}   # how to reach BSR for round trips
#
#     @pytest.fixture(scope="class")
#     def layout(self):
#         yield layouts.register_layout(ROWS)
#         layouts.unregister_layout(ROWS)
# ```
#
# `tests/layouts/test_toy_layout.py` in this repository does exactly that.
#
# When you are done experimenting, unregister the layout; tensors that already use it
# keep working.

# %%
layouts.unregister_layout("rows")
print("registered layouts:", [lay.name for lay in layouts.registered_layouts()])
print("still usable:", (mt * 2).sum())
