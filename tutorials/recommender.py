# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # A recommender: matrix factorisation over the ratings that exist
#
# A ratings matrix is mostly *missing*, not zero: a user who has not rated a film has not
# rated it 0. Matrix factorisation fits `R ~ U @ V.T` at the ratings that exist and predicts
# the others. Written with a masked tensor, that sentence is the code:
#
# - the ratings are a masked CSR tensor read from scipy (missing = unspecified);
# - the prediction is the product `U @ V.T` *sampled* at the specified positions
#   (`torch.sparse.sampled_addmm` on the masked ratings: O(nnz x rank), never the dense
#   users x items matrix);
# - the loss is `F.mse_loss(prediction, R)`: the mean over the specified ratings only;
# - `ms.optim.Adagrad` steps the factors, whatever layout their gradients come in.
#
# The usual PyTorch recipe gathers instead: `nn.Embedding(sparse=True)` for the users and
# items, a product per rating pair, and `SparseAdam`. We train both on the same data and
# compare their held-out error and their step time.

# %%
import time

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import masked_sparse as ms

USERS, ITEMS, RANK, STEPS = 600, 400, 8, 150


def ratings(seed: int = 0) -> tuple[sp.csr_array, sp.csr_array]:
    """A MovieLens-like ratings matrix (power-law user activity and item popularity; ratings
    1..5 from a rank-4 taste model plus noise), split into train and held-out test ratings."""
    rng = np.random.default_rng(seed)
    activity = 1.0 / np.arange(1, USERS + 1) ** 0.6
    popularity = 1.0 / np.arange(1, ITEMS + 1) ** 0.5
    counts = np.clip(np.round(activity / activity.sum() * 24_000), 5, ITEMS).astype(int)
    rows = np.repeat(np.arange(USERS), counts)
    cols = np.concatenate([rng.choice(ITEMS, c, replace=False, p=popularity / popularity.sum())
                           for c in counts])
    taste_u, taste_i = rng.normal(size=(USERS, 4)), rng.normal(size=(ITEMS, 4))
    score = (taste_u[rows] * taste_i[cols]).sum(1) / 2 + 3 + rng.normal(0, 0.5, rows.size)
    values = np.clip(np.round(score), 1, 5).astype(np.float32)
    test = rng.random(rows.size) < 0.1
    split = [sp.csr_array((values[k], (rows[k], cols[k])), shape=(USERS, ITEMS))
             for k in (~test, test)]
    return split[0], split[1]


def factors(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The initial user and item factors (the same for every recipe below)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(USERS, RANK, generator=g) * 0.3, torch.randn(ITEMS, RANK, generator=g) * 0.3


train, test = ratings()
print(f"ratings: {train.nnz} train, {test.nnz} test, density {train.nnz / (USERS * ITEMS):.4f}")

# %% [markdown]
# ## The masked route
#
# `ms.from_scipy` keeps the CSR pattern: the stored ratings are the specified elements.
# Predicting the global mean everywhere is the baseline any model must beat.

# %%
R = ms.from_scipy(train)
T = ms.from_scipy(test)
mean = R.sum() / R.get_mask().sum()  # the masked mean: the mean of the ratings that exist
baseline = torch.sqrt(((T - mean) ** 2).mean())
print(f"global mean {mean.to_tensor(0).item():.4f}, baseline test RMSE "
      f"{baseline.to_tensor(0).item():.4f}")

U, V = (torch.nn.Parameter(f) for f in factors())
opt = ms.optim.Adagrad([U, V], lr=0.3)


def masked_step() -> torch.Tensor:
    prediction = torch.sparse.sampled_addmm(R, U, V.T, beta=0.0)  # U @ V.T at R's ratings
    loss = F.mse_loss(prediction, R)  # the mean over the specified ratings
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def rmse(u: torch.Tensor, v: torch.Tensor, ratings: ms.MaskedTensor) -> float:
    """The root mean squared error at the specified ratings."""
    with torch.no_grad():
        error = torch.sparse.sampled_addmm(ratings, u, v.T, beta=0.0) - ratings
        return torch.sqrt((error ** 2).mean()).to_tensor(0).item()


first = masked_step()
print(f"masked route, first loss: {first.to_tensor(0).item():.4f}")
start = time.perf_counter()
for _ in range(STEPS - 1):
    masked_step()
masked_time = (time.perf_counter() - start) / (STEPS - 1)
masked_rmse = rmse(U, V, T)
print(f"masked route, test RMSE after {STEPS} steps: {masked_rmse:.4f}")

# %% [markdown]
# `U` and `V` are plain tensors, so their gradients are plain tensors (zero for a user with
# no rating), and `ms.optim.Adagrad` takes torch's own dense step for them. Adagrad leaves
# an entry alone when its gradient is zero, so this is the step torch's sparse Adagrad
# takes on the gathered recipe's sparse gradients: the two give the same numbers.
#
# ## The gather recipe
#
# The same model as most PyTorch recommenders write it: look up the factors of every rating
# pair, multiply, sum over the rank.

# %%
users = torch.from_numpy(train.tocoo().row.astype(np.int64))
items = torch.from_numpy(train.tocoo().col.astype(np.int64))
target = torch.from_numpy(train.tocoo().data)


def gather_recipe(optimizer: type[torch.optim.Optimizer], **kwargs) -> tuple:
    u0, v0 = factors()
    p = torch.nn.Embedding.from_pretrained(u0, freeze=False, sparse=True)
    q = torch.nn.Embedding.from_pretrained(v0, freeze=False, sparse=True)
    gather_opt = optimizer([p.weight, q.weight], **kwargs)

    def step() -> None:
        F.mse_loss((p(users) * q(items)).sum(-1), target).backward()
        gather_opt.step()
        gather_opt.zero_grad()

    step()
    start = time.perf_counter()
    for _ in range(STEPS - 1):
        step()
    return p.weight.detach(), q.weight.detach(), (time.perf_counter() - start) / (STEPS - 1)


u_ada, v_ada, ada_time = gather_recipe(torch.optim.Adagrad, lr=0.3)
print(f"gather + sparse Adagrad, test RMSE: {rmse(u_ada, v_ada, T):.4f}")
print(f"largest factor difference to the masked route: "
      f"{max((u_ada - U).abs().max().item(), (v_ada - V).abs().max().item()):.1e}")

u_adam, v_adam, adam_time = gather_recipe(torch.optim.SparseAdam, lr=0.05)
print(f"gather + SparseAdam, test RMSE: {rmse(u_adam, v_adam, T):.4f}")

# %% [markdown]
# The SparseAdam recipe reaches about the same held-out error by another path (another
# optimizer). The step times, the masked route over each recipe's (one run, this machine;
# `benchmarks/bench_recommender.py` measures the full-size step with paired rounds):

# %%
print(f"step time, masked / gather + sparse Adagrad: {masked_time / ada_time:.2f}x")
print(f"step time, masked / gather + SparseAdam: {masked_time / adam_time:.2f}x")

# %% [markdown]
# ## What the mask buys
#
# The dense workaround computes the whole `U @ V.T` and multiplies the error by a 0/1 matrix:
# users x items memory and time however few ratings exist, and the mean must divide by the
# count of ratings, not by the matrix's size -- a classic slip (`((U @ V.T - R) ** 2 *
# M).mean()` is the mean over *every* cell). With the masked ratings the mean is over the
# ratings because the others are unspecified, and the product never leaves the pattern:
# the prediction has R's CSR index, shared, not copied.

# %%
prediction = torch.sparse.sampled_addmm(R, U.detach(), V.detach().T, beta=0.0)
print("prediction layout:", prediction.layout, "| shares R's column index:",
      prediction.get_data().col_indices().data_ptr() == R.get_data().col_indices().data_ptr())
