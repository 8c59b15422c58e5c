# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # "No gradient" is not "gradient 0", and neither is NaN
#
# A plain tensor has two ways to say that an element did not take part in a computation:
# a gradient of `0` (indistinguishable from a genuine zero) or `nan` (indistinguishable
# from a numerical failure, and contagious: `0 * nan` is `nan`). Several long-standing
# PyTorch issues come from that ambiguity. A masked tensor has a third answer, the one
# that was meant: *unspecified*, printed `--`.
#
# Each section below shows the plain-Tensor computation from an issue and the same
# computation on masked tensors, with both results printed.

# %%
import torch

from masked_sparse import as_masked_tensor, masked_tensor

# %% [markdown]
# ## `torch.where` after `exp` (PyTorch issue 10729)
#
# `where` picks `exp(x)` for negative `x` and 1 elsewhere. The forward pass is fine, but
# `exp` was evaluated everywhere, overflowed to `inf` for large `x`, and the backward
# pass multiplies that `inf` by the 0 that `where` sends to the unchosen branch:
# `inf * 0 = nan`.

# %%
x = torch.tensor([-10.0, -5, 0, 5, 10, 50, 60, 70, 80, 90, 100], requires_grad=True)
y = torch.where(x < 0, torch.exp(x), torch.ones_like(x))
y.sum().backward()
print("plain x.grad (10729):", x.grad)

# %% [markdown]
# With masked tensors each branch is only specified where it is chosen. Whatever `exp`
# computes at the unchosen elements (even `inf`) is unspecified, so it never meets the
# zero that `where` sends back, and the gradient of each branch is specified exactly
# where that branch was used.

# %%
x = torch.tensor([-10.0, -5, 0, 5, 10, 50, 60, 70, 80, 90, 100])
mask = x < 0
mx = masked_tensor(x, mask, requires_grad=True)
my = masked_tensor(torch.ones_like(x), ~mask, requires_grad=True)
y = torch.where(mask, torch.exp(mx), my)
y.sum().backward()
print("masked mx.grad:\n", mx.grad)
print("masked my.grad:\n", my.grad)

# %% [markdown]
# ## `where` that never picks `a / 0` (PyTorch issue 52248)
#
# The condition is `False`, so the result is `c` and does not depend on `a` at all. The
# plain gradient with respect to `a` is nevertheless `nan`, leaked from the discarded
# `a / 0` branch. The masked answer is "no gradient".

# %%
gen = torch.Generator().manual_seed(0)
a = torch.randn((), generator=gen, requires_grad=True)
b = torch.tensor(False)
c = torch.ones(())
print("plain where(b, a/0, c):", torch.where(b, a / 0, c))
print("plain gradient wrt a:", torch.autograd.grad(torch.where(b, a / 0, c), a))

# %%
a = masked_tensor(torch.randn((), generator=gen), torch.tensor(True), requires_grad=True)
print("masked where(b, a/0, c):", torch.where(b, a / 0, c))
print("masked gradient wrt a:", torch.autograd.grad(torch.where(b, a / 0, c), a))

# %% [markdown]
# ## The gradient of `nansum` (PyTorch issue 67180)
#
# `nansum` skips the `nan` in the forward pass, but the backward pass of the product
# before it still sees it: the gradient with respect to `b` is `nan`. Masking the
# missing value instead of encoding it as `nan` gives the expected `1 + 2 = 3`, as a plain
# gradient: `b` is a plain tensor (plain tensors get plain gradients).

# %%
a = torch.tensor([1.0, 2.0, float("nan")])
b = torch.tensor(1.0, requires_grad=True)
(bgrad,) = torch.autograd.grad(torch.nansum(a * b), b)
print("plain d nansum(a * b) / db:", bgrad)

ma = masked_tensor(a, ~torch.isnan(a))
b = torch.tensor(1.0, requires_grad=True)
(bgrad,) = torch.autograd.grad(torch.sum(ma * b), b)
print("masked d sum(a * b) / db:", bgrad)

# %% [markdown]
# ## Selecting after dividing by zero (PyTorch issue 4132)
#
# Indexing `y[mask]` drops the `inf` from the forward pass, yet the backward pass of
# `x / div` still produces `nan` for the dropped element. `as_masked_tensor` keeps the
# graph to `x` and states which elements count: the dropped one gets no gradient.

# %%
x = torch.tensor([1.0, 1.0], requires_grad=True)
div = torch.tensor([0.0, 1.0])
y = x / div
keep = div != 0
y[keep].sum().backward()
print("plain x.grad (4132):", x.grad)

x = torch.tensor([1.0, 1.0], requires_grad=True)
y = x / div
as_masked_tensor(y, keep).sum().backward()
print("masked x.grad (4132):\n", x.grad)

# %% [markdown]
# ## Safe softmax along a dimension
#
# Padding for a softmax is usually written as `-inf`. A slice whose elements are all
# padding (an empty sequence, a fully masked attention column) then computes
# `exp(-inf) / sum(exp(-inf)) = 0 / 0 = nan`, which spreads into the loss and the
# gradients. A masked softmax normalizes over the specified elements only; a slice with
# none is unspecified, and so is its gradient.

# %%
data = torch.randn(3, 3, generator=gen)
mask = torch.tensor([[True, False, False], [True, False, True], [False, False, False]])
print("data:\n", data)
print("mask:\n", mask)
weights = torch.arange(9.0).reshape(3, 3)

x = data.masked_fill(~mask, float("-inf")).requires_grad_()
probs = x.softmax(0)
print("plain softmax(0):\n", probs)
print("plain gradient:\n", torch.autograd.grad((probs * weights).sum(), x)[0])

# %%
mt = masked_tensor(data, mask, requires_grad=True)
mprobs = mt.softmax(0)
print("masked softmax(0):\n", mprobs)
print("masked gradient:\n", torch.autograd.grad((mprobs * weights).sum(), mt)[0])

# %% [markdown]
# The masked softmax works the same on sparse storage (`mt.to_sparse_csr().softmax(0)`),
# where the unspecified elements are not even stored.

# %%
print("softmax(0) from CSR storage:\n", masked_tensor(data, mask).to_sparse_csr().softmax(0))
