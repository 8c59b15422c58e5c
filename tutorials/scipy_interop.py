# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # From scipy.sparse and numpy.ma to masked tensors and back
#
# A user x item ratings matrix is the textbook case where "not stored" does not mean
# "zero": a missing rating is unknown, not a rating of 0. `scipy.sparse` stores only the
# known ratings, but its arithmetic treats the rest as zeros, so a plain row mean divides
# by the number of *items* instead of the number of ratings. `ms.from_scipy` turns the
# stored entries into the specified elements of a masked tensor, the masked reductions
# then use the known ratings only, and `ms.to_scipy` returns a matrix with the same
# pattern. Nothing is densified on the way.

# %%
import numpy as np
import scipy.sparse as sp

import masked_sparse as ms

# %% [markdown]
# ## A small ratings matrix
#
# Ratings are integers 1 to 5; about a third of the (user, item) pairs are rated, and
# one user (row 3) has not rated anything yet.

# %%
rng = np.random.default_rng(5)
ratings = sp.random(6, 8, density=0.3, format="csr", random_state=rng,
                    data_rvs=lambda n: rng.integers(1, 6, n).astype(np.float64))
print("stored ratings:", ratings.nnz)
print("ratings (0 = not rated):\n", ratings.toarray())

# %% [markdown]
# `ms.from_scipy` keeps the CSR structure (a CSR matrix becomes a `sparse_csr` masked
# tensor). Unrated pairs print as `--`.

# %%
mt = ms.from_scipy(ratings)
print("layout:", mt.layout)
print(mt)

# %% [markdown]
# ## Per-user mean rating
#
# scipy's `mean(axis=1)` averages over all 8 items, counting the unrated ones as zeros.
# The masked mean averages over the rated items only, and a user with no rating at all
# gets no mean (`--`) rather than `0`.

# %%
print("scipy ratings.mean(axis=1):", np.asarray(ratings.mean(axis=1)).ravel())
user_mean = mt.mean(1)
print("masked mean(1):\n", user_mean)
print("layout of the means:", user_mean.layout)

# %% [markdown]
# ## Centering each user's ratings
#
# Subtract each user's mean from that user's ratings. The means become a plain column
# (one number per user: O(users), not O(users x items)); a plain operand is read at the
# stored positions of the masked one only, so the result has exactly the ratings'
# pattern -- the same index tensors, in fact. Unrated pairs stay unrated instead of
# becoming `-mean`.

# %%
mean_column = user_mean.to_tensor(0).to_dense().unsqueeze(1)
centered = mt - mean_column
print("centered:\n", centered)

# %% [markdown]
# ## Back to scipy
#
# `ms.to_scipy` stores the specified elements: the result has the same `indptr` and
# `indices` as the input. A centered rating can be exactly 0 (a user who rated everything
# the same); it is kept as an explicit stored zero, because it *is* a value.

# %%
back = ms.to_scipy(centered)
print("type:", type(back).__name__)
print("stored entries:", back.nnz)
print("same pattern as the input:",
      np.array_equal(back.indptr, ratings.indptr) and np.array_equal(back.indices, ratings.indices))
print("centered ratings, row by row:")
for u in range(back.shape[0]):
    row = back.data[back.indptr[u]:back.indptr[u + 1]]
    print(f"  user {u}:", np.round(row, 4))

# %% [markdown]
# ## The same pipeline at scale
#
# 20,000 users x 10,000 items with 200,000 ratings: a dense copy would take 1.6 GB in
# float64; the masked pipeline works on the 200,000 stored values.

# %%
big = sp.random(20_000, 10_000, density=1e-3, format="csr", random_state=rng,
                data_rvs=lambda n: rng.integers(1, 6, n).astype(np.float64))
big_mt = ms.from_scipy(big)
big_mean = big_mt.mean(1)
big_back = ms.to_scipy(big_mt - big_mean.to_tensor(0).to_dense().unsqueeze(1))
print(big_mt)
print("big: stored entries before and after centering:", big.nnz, big_back.nnz)
print("big: first five user means:", big_mean[:5].to_tensor(float("nan")).to_dense())
print("big: users with no rating:", int((~big_mean.get_mask().to_dense()).sum()))

# %% [markdown]
# ## numpy.ma in and out
#
# `numpy.ma` masks the other way round (`True` = invalid). `ms.from_numpy` and
# `ms.to_numpy` flip the mask for you, so a masked array can go through torch code and
# come back as a masked array. Here: sensor readings with drop-outs, normalized per
# sensor with torch.

# %%
readings = np.ma.masked_array(
    [[20.5, 21.0, 0.0, 22.5], [0.0, 0.0, 0.0, 0.0], [19.0, 18.5, 18.0, 0.0]],
    mask=[[False, False, True, False], [True, True, True, True], [False, False, False, True]])
print("numpy.ma readings:\n", readings)
mr = ms.from_numpy(readings)
print("as a masked tensor:\n", mr)
sensor_mean = mr.mean(1)
print("per-sensor mean, masked tensor:", ms.to_numpy(sensor_mean))
print("per-sensor mean, numpy.ma:     ", readings.mean(axis=1))
spread = mr.amax(1) - mr.amin(1)
print("per-sensor range, back in numpy.ma:", ms.to_numpy(spread))
