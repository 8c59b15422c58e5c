# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Adagrad on sparse gradients, written with masked semantics
#
# `nn.Embedding(sparse=True)` produces gradients that are sparse COO tensors: only the
# rows a batch looked up are stored. For those gradients torch's Adagrad takes a separate
# code path whose meaning is *not* "the other entries are zero" -- with a zero gradient
# Adagrad would still touch every entry (add `0` to the state, divide by `std + eps`).
# It means "the other entries have no gradient this step: leave them alone". That is a
# masked semantic, expressed through a storage format, and the code has to juggle
# indices and values by hand to keep it.
#
# This tutorial puts torch's sparse Adagrad step next to the same step written with
# masked tensors, then runs masked_sparse's layout-agnostic Adagrad on strided, COO and
# CSR gradients.

# %%
import torch

import masked_sparse as ms
from masked_sparse import masked_tensor

eps = 1e-10
clr = 0.1  # the learning rate of the first step (no decay yet)

i = torch.tensor([[0, 1, 1], [2, 0, 2]])
v = torch.tensor([3.0, 4.0, 5.0])
grad = torch.sparse_coo_tensor(i, v, (2, 4))
print("gradient (dense view):\n", grad.to_dense())

# %% [markdown]
# ## torch's sparse Adagrad step
#
# This is the sparse branch of `torch.optim.adagrad` (reduced to one step). Note the
# helper that rebuilds a sparse tensor from raw indices and values, the private
# `_indices()` / `_values()` accessors, and `sparse_mask`, which reads the dense state at
# the gradient's indices.

# %%
def _make_sparse(grad, grad_indices, values):
    size = grad.size()
    if grad_indices.numel() == 0 or values.numel() == 0:
        return torch.empty_like(grad)
    return torch.sparse_coo_tensor(grad_indices, values, size)


param = torch.arange(8).reshape(2, 4).float()
state_sum = torch.full_like(param, 0.5)  # initial_accumulator_value

grad = grad.coalesce()  # the update is non-linear, so duplicate indices must be summed first
grad_indices = grad._indices()
grad_values = grad._values()
state_sum.add_(_make_sparse(grad, grad_indices, grad_values.pow(2)))
std = state_sum.sparse_mask(grad)
std_values = std._values().sqrt_().add_(eps)
param.add_(_make_sparse(grad, grad_indices, grad_values / std_values), alpha=-clr)

print("state_sum:\n", state_sum)
print("std:\n", std)
print("param (torch sparse code):\n", param)

# %% [markdown]
# Two details carry the masked meaning. `sparse_mask` restricts `std` to the
# gradient's pattern, and `eps` is added to the stored values only, so the division
# happens at those positions only. Neither follows from "sparse = zeros elsewhere": under
# that reading `add_(eps)` would have to densify. The code is also tied to COO; a CSR or
# block-sparse gradient would need its own copy of every line.
#
# ## The same step with a masked gradient
#
# Wrap the gradient in a masked tensor whose mask is the gradient's own pattern. Every
# operation then runs on the specified entries only, which is exactly the rule the code
# above enforces by hand. `to_tensor(0)` leaves the masked world where the state is
# updated ("no gradient" contributes nothing to a sum), and stays sparse for a sparse
# gradient.

# %%
mask = torch.sparse_coo_tensor(grad.indices(), torch.ones(grad._nnz(), dtype=torch.bool),
                               grad.shape)
masked_grad = masked_tensor(grad, mask)

param2 = torch.arange(8).reshape(2, 4).float()
state_sum2 = torch.full_like(param2, 0.5)

state_sum2 = state_sum2 + masked_grad.pow(2).to_tensor(0)
std2 = masked_tensor(state_sum2.to_sparse(), mask).sqrt().add(eps)
param2 = param2.add((masked_grad / std2).to_tensor(0), alpha=-clr)

print("state_sum2:\n", state_sum2)
print("std2:\n", std2)
print("param2 (masked code):\n", param2)

# %% [markdown]
# `std2` prints the same three numbers as torch's `std`, but as a masked tensor: the
# positions with no gradient are `--`, not a zero that a later division could trip on.
# Dividing two masked tensors with the same mask is defined (unspecified / unspecified
# is unspecified), so no private accessor is needed.
#
# `masked_tensor(state_sum2.to_sparse(), mask)` still converts the whole state.
# `ms.optim.read_at(dense, like)` reads a dense tensor at the positions where `like` is
# stored, in O(nnz), in any layout. With it the four lines contain nothing that depends
# on the layout, and they give the same parameters for a COO, a CSR and a strided
# masked gradient:

# %%
def masked_adagrad_step(param, state_sum, g):
    state_sum = state_sum + g.pow(2).to_tensor(0)
    std = ms.optim.read_at(state_sum, g).sqrt().add(eps)
    return param.add((g / std).to_tensor(0), alpha=-clr), state_sum


for name, g in [("strided", masked_grad.to_dense()), ("sparse_coo", masked_grad),
                ("sparse_csr", masked_grad.to_sparse_csr())]:
    p, _ = masked_adagrad_step(torch.arange(8).reshape(2, 4).float(),
                               torch.full((2, 4), 0.5), g)
    print(f"param ({name} masked gradient, four lines):\n", p)

# %% [markdown]
# ## `ms.optim.functional.adagrad`: one code path for every gradient
#
# masked_sparse's functional Adagrad has torch's signature and is written exactly like
# the four lines above. It accepts a plain dense gradient, a torch sparse COO gradient
# (coalesced or not) and masked gradients in any registered layout. A dense gradient is
# specified everywhere, so on it this is the ordinary dense algorithm.

# %%
gradients = {
    "dense Tensor": grad.to_dense(),
    "torch sparse_coo Tensor": grad,
    "masked strided": masked_grad.to_dense(),
    "masked sparse_coo": masked_grad,
    "masked sparse_csr": masked_grad.to_sparse_csr(),
}
for name, g in gradients.items():
    p = torch.arange(8).reshape(2, 4).float()
    s = torch.full_like(p, 0.5)
    ms.optim.functional.adagrad([p], [g], [s], [torch.tensor(0.0)], lr=clr, lr_decay=0.0,
                                weight_decay=0.0, eps=eps, maximize=False)
    print(f"param after ms.optim.functional.adagrad ({name}):\n", p)

# %% [markdown]
# ## The optimizer class
#
# `ms.optim.Adagrad` wraps the functional form in a `torch.optim.Optimizer` with
# torch's arguments. Here it trains a sparse embedding next to `torch.optim.Adagrad` for
# a few steps; since both update lazily, they agree. Rows that no batch touches keep
# their initial values in both.

# %%
torch.manual_seed(0)
emb_torch = torch.nn.Embedding(10, 3, sparse=True)
emb_masked = torch.nn.Embedding(10, 3, sparse=True)
emb_masked.load_state_dict(emb_torch.state_dict())
initial = emb_torch.weight.detach().clone()
opt_torch = torch.optim.Adagrad(emb_torch.parameters(), lr=0.1)
opt_masked = ms.optim.Adagrad(emb_masked.parameters(), lr=0.1)
batches = [torch.tensor([1, 2, 2]), torch.tensor([7, 1]), torch.tensor([2, 5])]
for ids in batches:
    for emb, opt in [(emb_torch, opt_torch), (emb_masked, opt_masked)]:
        opt.zero_grad()
        emb(ids).pow(2).sum().backward()
        opt.step()
diff = (emb_torch.weight - emb_masked.weight).abs().max().item()
print("max |torch - masked_sparse| after 3 steps:", diff)
untouched = torch.tensor([0, 3, 4, 6, 8, 9])
print("untouched rows unchanged:", torch.equal(emb_masked.weight[untouched], initial[untouched]))
