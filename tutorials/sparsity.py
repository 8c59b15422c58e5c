# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sparse storage for masked tensors
#
# When most elements of a masked tensor are unspecified, there is no reason to store
# them. masked_sparse stores a masked tensor in sparse COO or CSR form: one set of
# indices, shared by the data and the mask, plus a values tensor and a bool mask-values
# tensor. A position is specified if it is stored *and* its mask value is `True`;
# positions that are not stored are unspecified.
#
# The point of the split: with torch's own sparse tensors, "not stored" silently means
# "zero", so sparsity is forced to double as a semantic ("this entry does not exist") and
# as a compression ("this entry is zero"). A masked tensor keeps the two apart. The layout
# is only storage; every result below is the one the strided layout gives.

# %%
import torch
from torch.masked import masked_tensor as torch_masked_tensor

import masked_sparse as ms
from masked_sparse import masked_tensor


def indices_of(mt):
    """The index tensors of a masked tensor's storage (an internal record, for display)."""
    return mt._storage.index


# %% [markdown]
# ## COO: data and mask sharing indices
#
# Build the data and the mask as torch sparse COO tensors with the same indices. One
# stored entry, `(1, 0)`, has mask value `False`: it is stored but unspecified (think of
# a rating that was withdrawn). It prints as `--`, like the positions that are not stored.

# %%
i = torch.tensor([[0, 0, 1, 2], [1, 3, 0, 2]])
data = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0, 4.0]), (3, 4))
mask = torch.sparse_coo_tensor(i, torch.tensor([True, True, False, True]), (3, 4))
coo = masked_tensor(data, mask)
print("coo:\n", coo)
print("coo layout:", coo.layout)
print("get_data():\n", coo.get_data())

# %% [markdown]
# The mask's pattern is authoritative. If the data stores other positions, it is read
# at the mask's positions only: data outside the mask is dropped, and a mask position
# with no data reads as 0. There is never a question of which of the two patterns wins.

# %%
other = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 1]]), torch.tensor([7.0, 8.0]), (3, 4))
print("data on another pattern:\n", masked_tensor(other, mask))

# %% [markdown]
# ## Ops keep the indices
#
# A unary op, or a binary op between masked tensors with the same pattern, only touches
# the stored values: O(nnz) work and the *same* index tensor objects in the result, so no
# index is copied, sorted or compared.

# %%
out = torch.exp(coo) * 2 + coo
print("exp(coo) * 2 + coo:\n", out)
print("same index objects:", indices_of(out)[0] is indices_of(coo)[0])
print("shared with get_data():",
      out.get_data().indices().data_ptr() == coo.get_data().indices().data_ptr())

# %% [markdown]
# A plain dense operand broadcasts to the masked one and is read at the stored positions
# only; the result keeps the sparse pattern.

# %%
bias = torch.tensor([10.0, 20.0, 30.0, 40.0])
print("coo + dense row:\n", coo + bias)
print("coo + dense row layout:", (coo + bias).layout)

# %% [markdown]
# ## `to_tensor(0)` stays sparse
#
# Filling the holes with 0 is exactly what torch's sparse tensors mean by "not stored",
# so `to_tensor(0)` returns a torch sparse tensor on the same indices (the stored but
# unspecified entry becomes a stored 0). Any other fill value can only be expressed
# densely, so `to_tensor(v)` with `v != 0` returns a strided tensor -- the one place where
# you ask for densification explicitly.

# %%
zero_filled = coo.to_tensor(0)
print("to_tensor(0):\n", zero_filled)
print("to_tensor(0) layout:", zero_filled.layout)
print("to_tensor(-1) layout:", coo.to_tensor(-1).layout)

# %% [markdown]
# ## CSR
#
# CSR works the same way: data and mask share `crow_indices` and `col_indices`.

# %%
crow = torch.tensor([0, 2, 3, 4])
col = torch.tensor([1, 3, 0, 2])
csr_data = torch.sparse_csr_tensor(crow, col, torch.tensor([1.0, 2.0, 3.0, 4.0]), (3, 4))
csr_mask = torch.sparse_csr_tensor(crow, col, torch.tensor([True, True, False, True]), (3, 4))
csr = masked_tensor(csr_data, csr_mask)
print("csr:\n", csr)
sq = csr.sqrt() / csr
print("sqrt(csr) / csr:\n", sq)
print("same crow/col objects:",
      all(a is b for a, b in zip(indices_of(sq), indices_of(csr))))

# %% [markdown]
# ## Converting between layouts
#
# Conversions are exact in every direction: specified elements keep their values and
# unspecified ones stay unspecified (a stored-but-unspecified entry may be dropped on the
# way, which changes storage, not meaning). Converting a plain sparse tensor to dense and
# back cannot do that: a stored 0 and a missing entry look the same once densified.

# %%
nan = float("nan")
print("coo -> csr equals csr:",
      torch.allclose(coo.to_sparse_csr().to_tensor(nan), csr.to_tensor(nan), equal_nan=True))
strided = coo.to_dense()
print("coo.to_dense():\n", strided, strided.layout)
back = strided.to_sparse_coo()
print("round trip strided -> coo:\n", back, back.layout)
print("stored entries after the round trip:", indices_of(back)[0].shape[1])
print("ms.to_layout(csr, 'sparse_coo').layout:", ms.to_layout(csr, "sparse_coo").layout)

# %% [markdown]
# ## Reductions along a dimension, without densifying
#
# Reductions use only specified elements (RFC-0027 semantics); on sparse input they run
# as segment reductions over the stored values and return a sparse result: COO for a
# 1-D result, CSR for a 2-D `keepdim=True` result from CSR. A row with nothing specified
# is unspecified in the result.

# %%
print("coo.sum(0):\n", coo.sum(0))
print("coo.amax(1):\n", coo.amax(1))
print("csr.mean(1):\n", csr.mean(1), csr.mean(1).layout)
kept = csr.sum(1, keepdim=True)
print("csr.sum(1, keepdim=True):\n", kept, kept.layout)
print("coo.sum():", coo.sum())

# %% [markdown]
# `torch.masked` cannot reduce a sparse masked tensor along a dimension (it supports full
# reductions only); here is what it does with the same input:

# %%
try:
    torch_masked_tensor(data.coalesce(), mask.coalesce()).sum(0)
    print("torch.masked sum(0): ok")
except Exception as err:  # noqa: BLE001 -- show whatever torch.masked raises
    print("torch.masked sum(0) fails with", type(err).__name__)

# %% [markdown]
# ## At scale
#
# Since nothing densifies, shapes far beyond memory are fine as long as the number of
# stored entries is small. A 1,000,000 x 1,000,000 masked matrix with 1,000 stored
# entries (its dense form would need 4 TB) reduces in milliseconds. Large sparse masked
# tensors print a one-line summary instead of their elements.

# %%
n = 1_000_000
gen = torch.Generator().manual_seed(0)
idx = torch.randint(n, (2, 1000), generator=gen)
big = masked_tensor(torch.sparse_coo_tensor(idx, torch.rand(1000, generator=gen), (n, n)),
                    torch.sparse_coo_tensor(idx, torch.ones(1000, dtype=torch.bool), (n, n)))
print(big)
row_max = big.to_sparse_csr().amax(1)
print("row maxima:", row_max)
print("total of the row maxima:", row_max.sum())
