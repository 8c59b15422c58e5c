# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Masked attention and a pruned MLP
#
# Two things people build first with masked tensors, written exactly as the math reads:
#
# 1. **Attention** with a causal mask and padding:
#    `softmax(as_masked_tensor(q @ k.mT / sqrt(d), mask), -1) @ v`. A query that may attend
#    to nothing (a padding position) gets an *unspecified* output row: the dense `-inf`
#    recipe gives NaN there, and `F.scaled_dot_product_attention` gives 0 -- a number that
#    looks like a result.
# 2. **A pruned MLP**: `nn.Linear` layers whose weights are sparse MaskedTensor parameters;
#    they train with `ms.optim`, and pruned weights stay pruned (they have no gradient).
#
# The semantics behind both: in a matrix product an unspecified element is *absent from the
# sum*, and an output element is specified iff at least one term exists.

# %%
import math

import torch
import torch.nn.functional as F

import masked_sparse as ms

torch.manual_seed(0)

# %% [markdown]
# ## Attention over a padded batch
#
# Two sequences of lengths 5 and 3, padded to 5, with 2 heads of dimension 4. A query at
# position `i` may attend to key `j` when `j <= i` (causal) and both positions are real
# tokens. Padding queries may attend to nothing.

# %%
B, H, T, D = 2, 2, 5, 4
lengths = torch.tensor([5, 3])
q = torch.randn(B, H, T, D, requires_grad=True)
k = torch.randn(B, H, T, D, requires_grad=True)
v = torch.randn(B, H, T, D, requires_grad=True)

real = torch.arange(T)[None, :] < lengths[:, None]           # (B, T): not padding
causal = torch.ones(T, T, dtype=torch.bool).tril()            # (T, T)
mask = causal & real[:, None, :, None] & real[:, None, None, :]  # (B, 1, T, T)
mask = mask.expand(B, H, T, T)

# %% [markdown]
# The masked version is the textbook formula. `as_masked_tensor` is differentiable with
# respect to the scores, `softmax` normalizes over the specified keys only, and `@ v` sums
# over the specified weights only; rows without a specified weight stay unspecified.

# %%
scores = q @ k.transpose(-2, -1) / math.sqrt(D)
probs = torch.softmax(ms.as_masked_tensor(scores, mask), -1)
out = probs @ v
print("masked attention, sequence 1, head 0:\n", out[1, 0])

# %% [markdown]
# `ms.attention` computes the same through PyTorch's fused kernel
# (`F.scaled_dot_product_attention` with the boolean mask): the same values and gradients,
# the same unspecified padding rows, without forming the `(B, H, T, T)` scores. Use it where
# speed matters; the written-out formula above is what it means.

# %%
fused = ms.attention(q, k, v, mask)
print("ms.attention == the formula:", torch.equal(fused.get_mask(), out.get_mask()),
      torch.allclose(fused.to_tensor(0), out.to_tensor(0), atol=1e-6))

# %% [markdown]
# The dense recipes give a number in the padding rows: NaN for `-inf` filling
# (`softmax` of a row of `-inf` is 0/0), 0 for SDPA.

# %%
dense = torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v
sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
print("dense -inf recipe, sequence 1, head 0:\n", dense[1, 0])
print("SDPA, sequence 1, head 0:\n", sdpa[1, 0])
defined = mask.any(-1)  # query rows that attend to something
print("max |masked - SDPA| where defined:",
      (out.to_tensor(0) - sdpa).abs()[defined].max().item())

# %% [markdown]
# ## Gradients
#
# The loss sums the specified outputs. Gradients reach `q`, `k` and `v` as plain tensors;
# padding rows contribute nothing. The dense `-inf` recipe cannot be differentiated even
# with its NaN rows dropped from the loss: `probs.mT @ grad` multiplies the NaN
# probabilities by 0 and poisons `v.grad`. SDPA's gradient is the reference where defined.

# %%
weights = torch.randn(B, H, T, D)


def grads_of(loss: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, (q, k, v), retain_graph=True))


masked_grads = grads_of((out.to_tensor(0) * weights).sum())
dense_grads = grads_of((torch.where(defined[..., None], dense, 0) * weights).sum())
sdpa_grads = grads_of((torch.where(defined[..., None], sdpa, 0) * weights).sum())
print("dense -inf recipe: NaN in q.grad, k.grad, v.grad:",
      [bool(g.isnan().any()) for g in dense_grads])
print("masked q.grad, sequence 1, head 0:\n", masked_grads[0][1, 0])
for name, got, ref in zip("qkv", masked_grads, sdpa_grads):
    print(f"max |{name}.grad - SDPA's|:", (got - ref).abs().max().item())

# %% [markdown]
# ## A pruned MLP
#
# Magnitude pruning keeps the largest half of each weight matrix. The pruned weights are
# MaskedTensor parameters -- the first layer in CSR, the second in COO -- so the layers
# compute with torch's sparse matmul on the kept weights only. Gradients have the weights'
# masks and layouts; `ms.optim.Adam` updates only the kept entries.

# %%
def prune(weight: torch.Tensor, layout: torch.layout) -> torch.nn.Parameter:
    keep = weight.abs() >= weight.abs().flatten().kthvalue(weight.numel() // 2 + 1).values
    return torch.nn.Parameter(ms.to_layout(ms.masked_tensor(weight.detach(), keep), layout))


mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
mlp[0].weight = prune(mlp[0].weight, torch.sparse_csr)
mlp[2].weight = prune(mlp[2].weight, torch.sparse_coo)
print("kept weights:", int(mlp[0].weight.get_mask().to_dense().sum()),
      int(mlp[2].weight.get_mask().to_dense().sum()))
masks_before = [mlp[i].weight.get_mask().to_dense() for i in (0, 2)]

x = torch.randn(64, 8)
y = x[:, :1] * 2 - x[:, 1:2]
opt = ms.optim.Adam(mlp.parameters(), lr=0.02)
losses = []
for step in range(60):
    opt.zero_grad()
    loss = ((mlp(x).to_tensor(0) - y) ** 2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("gradient layouts:", mlp[0].weight.grad.layout, mlp[2].weight.grad.layout)
print("loss at steps 0 and 59:", losses[0], losses[-1])
print("masks unchanged:", all(torch.equal(mlp[i].weight.get_mask().to_dense(), m)
                              for i, m in zip((0, 2), masks_before)))
