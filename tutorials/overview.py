# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A tour of MaskedTensor
#
# A tensor with holes is common: padded sequences, missing ratings, sensor drop-outs, the
# parameters a sparse gradient did not touch. Plain tensors encode a hole with a sentinel
# (`0`, `nan`, `-inf`) and every later op has to remember what that sentinel meant.
# A `MaskedTensor` keeps the hole *next to* the data: a bool mask where `True` means
# "specified" and `False` means "unspecified". Every op then knows which elements are
# real, so the sentinel never leaks into a result.
#
# This tutorial covers building masked tensors, reading them back, printing, indexing,
# binary ops, reductions and the `nan*` comparison. It runs as a script
# (`python tutorials/overview.py`) or as a notebook (jupytext).

# %%
import numpy as np
import torch

import masked_sparse as ms
from masked_sparse import as_masked_tensor, masked_tensor

# %% [markdown]
# ## Building a masked tensor
#
# `masked_tensor(data, mask)` is the analogue of `torch.tensor`: it copies its inputs and
# returns a new autograd leaf. `as_masked_tensor(data, mask)` is the analogue of
# `torch.as_tensor`: no copy, and it stays connected to the graph of `data`, so a
# gradient flows back into `data` (carrying the mask).

# %%
data = torch.arange(24.0).reshape(3, 2, 4)
mask = data % 3 != 0
mt = masked_tensor(data, mask)
print("mt:\n", mt)

# %%
x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
view = as_masked_tensor(x * 10, torch.tensor([True, False, True]))
view.sum().backward()
print("x.grad through as_masked_tensor:\n", x.grad)

# %% [markdown]
# The gradient that reaches `x` is itself masked: the middle element was never part of
# the computation, so it has *no* gradient rather than a gradient of 0.
#
# ## Reading it back: `get_data`, `get_mask`, `to_tensor`
#
# `get_data()` returns the stored data, including whatever sits under the holes (the
# values there are arbitrary; do not rely on them). `get_mask()` returns the mask. When
# you need a plain tensor, `to_tensor(value)` fills the holes with a value *you* choose
# at that moment, which makes the choice visible in the code.

# %%
row = masked_tensor(torch.tensor([5.0, 6.0, 7.0, 8.0]), torch.tensor([True, False, False, True]))
print("get_data():", row.get_data())
print("get_mask():", row.get_mask())
print("to_tensor(0):", row.to_tensor(0))
print("to_tensor(nan):", row.to_tensor(float("nan")))

# %% [markdown]
# ## Printing
#
# Unspecified elements print as `--`, in any number of dimensions.

# %%
print("2-D:\n", mt[1])
print("3-D:\n", mt)

# %% [markdown]
# ## Indexing and slicing
#
# Indexing applies the same index to the data and to the mask, so an element keeps its
# specified/unspecified status wherever it moves. Indexing with the mask itself gathers
# exactly the specified elements into a 1-D masked tensor with no holes.

# %%
print("mt[0]:\n", mt[0])
print("mt[:, :, 2:4]:\n", mt[:, :, 2:4])
print("mt[torch.tensor([0, 2])]:\n", mt[torch.tensor([0, 2])])
print("mt[mt.get_mask()]:\n", mt[mt.get_mask()])

# %% [markdown]
# ## Elementwise ops and why masks must match
#
# A unary op runs on the specified elements and keeps the mask. A binary op between two
# masked tensors requires the same mask on both sides; otherwise it raises `ValueError`.

# %%
data = torch.arange(5.0)
mask = torch.tensor([True, True, False, True, False])
m0 = masked_tensor(data, mask)
m1 = masked_tensor(data, ~mask)
print("cos(m0):\n", torch.cos(m0))
print("m0 + m0:\n", m0 + m0)
try:
    m0 + m1
except ValueError as err:
    print("m0 + m1 raises ValueError:", err)

# %% [markdown]
# Why refuse instead of picking a rule? `numpy.ma` picks one: the result is masked
# wherever *either* operand is masked (the union of the holes). Reductions then stop
# being additive. Take two 2 x 5 arrays whose holes do not overlap (note that numpy's
# mask is inverted: `True` means *invalid* there):

# %%
data0 = torch.arange(10.0).reshape(2, 5)
data1 = torch.arange(10.0).reshape(2, 5) + 10
invalid0 = torch.tensor([[True, True, False, False, False], [False, False, False, True, True]])
invalid1 = torch.tensor([[False, False, False, True, True], [True, True, False, False, False]])
npm0 = np.ma.masked_array(data0.numpy(), invalid0.numpy())
npm1 = np.ma.masked_array(data1.numpy(), invalid1.numpy())
print("numpy.ma (npm0 + npm1).sum(0):", (npm0 + npm1).sum(0))
print("numpy.ma npm0.sum(0) + npm1.sum(0):", npm0.sum(0) + npm1.sum(0))

# %% [markdown]
# Summing after adding loses every column but one, while adding the sums keeps all five:
# `(a + b).sum(0) != a.sum(0) + b.sum(0)`. With a MaskedTensor you state what a hole
# means in the addition. Here "a hole counts as 0 and the result is specified wherever
# either input is" -- and the identity holds again:

# %%
a = masked_tensor(data0, ~invalid0)
b = masked_tensor(data1, ~invalid1)
a_plus_b = masked_tensor(a.to_tensor(0) + b.to_tensor(0), a.get_mask() | b.get_mask())
print("(a + b).sum(0), holes as 0:\n", a_plus_b.sum(0))
print("a.sum(0) + b.sum(0):\n", a.sum(0) + b.sum(0))

# %% [markdown]
# ## Reductions along a dimension
#
# Reductions follow PyTorch RFC-0027: only specified elements take part, and a result
# element is specified if at least one element of its group was. So there is no need for
# an identity trick (0 for sum, +inf for min, ...) and no risk that the trick leaks into
# the answer: a row whose elements are all masked gives `--`, not `0` or `inf`.

# %%
gen = torch.Generator().manual_seed(0)
data = torch.randn(8, 3, generator=gen).mul(10).int().float()
mask = torch.rand(8, 3, generator=gen) > 0.4
mask[5] = False  # one row with nothing specified
print("data:\n", data)
print("mask:\n", mask)
m = masked_tensor(data, mask)
print("m:\n", m)

# %%
print("sum(m, 1):\n", torch.sum(m, 1))
print("mean(m, 1):\n", torch.mean(m, 1))
print("prod(m, 1):\n", torch.prod(m, 1))
print("amin(m, 1):\n", torch.amin(m, 1))
print("amax(m, 1):\n", torch.amax(m, 1))

# %% [markdown]
# Gradients of a reduction carry the input's mask: an unspecified element did not take
# part, so it gets no gradient.

# %%
leaf = masked_tensor(data[:2], mask[:2], requires_grad=True)
leaf.sum().backward()
print("leaf.grad after sum:\n", leaf.grad)

# %% [markdown]
# ## `nanmean` versus a masked mean
#
# `torch.nanmean` treats `nan` as "missing", which works as long as `nan` never means
# anything else. A masked mean says the same thing without borrowing a value: here we
# want the mean of `y` ignoring its zeros.

# %%
x = torch.arange(16).float()
y = x * x.fmod(4)
z = y.masked_fill(y == 0, float("nan"))
print("y:", y)
print("y.mean():", y.mean())
print("z.nanmean():", z.nanmean())
print("masked mean:", torch.mean(masked_tensor(y, y != 0)))

# %% [markdown]
# The same mask works for every reduction, including the ones with no `nan*` twin.
# `argmin` ignores the masked zeros and finds the smallest *specified* value:

# %%
print("plain argmin:", torch.argmin(y))
print("masked argmin:", torch.argmin(masked_tensor(y, y != 0)))

# %% [markdown]
# ## Reducing something fully masked
#
# If nothing is specified there is nothing to average. `nanmean` answers `nan`, which
# you cannot tell apart from a `nan` produced by bad arithmetic. The masked mean answers
# "unspecified", and so does the sum -- a 0-d masked tensor printed as `--`.

# %%
allnan = torch.full((16,), float("nan"))
print("torch.nanmean(all nan):", torch.nanmean(allnan))
print("masked mean, nothing specified:", torch.mean(masked_tensor(allnan, ~torch.isnan(allnan))))
empty = masked_tensor(torch.randn(2, 2, 3, generator=gen), torch.zeros(2, 2, 3, dtype=torch.bool))
print("masked sum, nothing specified:", torch.sum(empty))

# %% [markdown]
# The same semantics hold for every layout: `ms.masked_tensor` accepts sparse COO and
# CSR data and masks too, and all of the above runs on them without densifying. See
# `sparsity.py`.

# %%
print("sum(m, 1) from CSR storage:\n", torch.sum(m.to_sparse_csr(), 1))
print("layout of a CSR row sum:", ms.to_layout(m, torch.sparse_csr).sum(1).layout)
