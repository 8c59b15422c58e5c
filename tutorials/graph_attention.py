# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Graph attention (GAT) with masked adjacency
#
# A graph attention layer scores every edge `(i, j)` as
# `LeakyReLU(a_dst . Wh_i + a_src . Wh_j)`, normalizes the scores over each node's
# neighbours with a softmax and sums the neighbours' features with those weights. The
# usual code either builds a dense `N x N` matrix with `-inf` off the edges (O(N^2), and NaN
# for a node without neighbours) or gathers and scatters by hand over an edge list (what
# PyTorch Geometric does). With a masked adjacency it is the formula itself:
#
# - the adjacency is a masked sparse tensor: an edge is a specified element;
# - per-edge scores are per-node vectors *broadcast* at the edges (O(edges), no `N x N`);
# - the softmax over the neighbours is the masked softmax along a row;
# - the aggregation is the masked product, and a node with no neighbour gets the empty sum.
#
# The first layer has several heads over the same edges: a hybrid COO tensor `(N, N, H)`
# stores the index once and `H` values per edge.

# %%
import numpy as np
import torch
import torch.nn.functional as F

import masked_sparse as ms

HEADS, HIDDEN, CLASSES, FEATURES = 4, 8, 3, 16


def power_law_graph(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges of an undirected preferential-attachment graph (each new node links to 2
    earlier ones, chosen in proportion to their degree) with self-loops, except the last
    node, which has no edge at all; and each node's class (3 communities)."""
    rng = np.random.default_rng(seed)
    ends = [0, 1]
    src, dst = [0], [1]
    for node in range(2, n - 1):
        chosen = set(rng.choice(ends, size=min(2, len(set(ends))), replace=False).tolist())
        for t in chosen:
            src.append(node)
            dst.append(t)
            ends += [node, t]
    src, dst = np.array(src), np.array(dst)
    loops = np.arange(n - 1)
    rows = np.concatenate([src, dst, loops])
    cols = np.concatenate([dst, src, loops])
    edges = torch.from_numpy(np.unique(np.stack([rows, cols]), axis=1))
    return edges, torch.from_numpy(rng.integers(0, CLASSES, n))


def features(labels: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """Noisy features carrying the class."""
    g = torch.Generator().manual_seed(seed)
    signal = F.one_hot(labels, CLASSES).float().repeat(1, FEATURES // CLASSES + 1)
    return signal[:, :FEATURES] + 0.8 * torch.randn(len(labels), FEATURES, generator=g)


def parameters(seed: int = 2) -> dict[str, torch.Tensor]:
    """Both layers' weights: W, a_src, a_dst and a bias per layer (heads in layer 1)."""
    g = torch.Generator().manual_seed(seed)

    def init(*shape):
        return torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.3)

    return {"W1": init(FEATURES, HEADS * HIDDEN), "src1": init(HEADS, HIDDEN),
            "dst1": init(HEADS, HIDDEN), "b1": init(HEADS * HIDDEN),
            "W2": init(HEADS * HIDDEN, CLASSES), "src2": init(CLASSES), "dst2": init(CLASSES),
            "b2": init(CLASSES)}


def adjacency(edges: torch.Tensor, n: int) -> tuple[ms.MaskedTensor, ms.MaskedTensor]:
    """Zero-valued masked adjacencies (an edge = a specified element): the hybrid COO one of
    the heads (N, N, HEADS) and the 2-D CSR one of the output layer."""
    ones = torch.ones(edges.shape[1], HEADS, dtype=torch.bool)
    heads = ms.masked_tensor(
        torch.sparse_coo_tensor(edges, torch.zeros(edges.shape[1], HEADS), (n, n, HEADS),
                                check_invariants=True).coalesce(),
        torch.sparse_coo_tensor(edges, ones, (n, n, HEADS)).coalesce())
    single = ms.masked_tensor(torch.sparse_coo_tensor(edges, torch.zeros(edges.shape[1]),
                                                      (n, n), check_invariants=True),
                              torch.sparse_coo_tensor(edges, ones[:, 0], (n, n)))
    return heads, single.to_sparse_csr()


def gat(x: torch.Tensor, adj_heads: ms.MaskedTensor, adj: ms.MaskedTensor,
        p: dict[str, torch.Tensor]) -> torch.Tensor:
    """Two GAT layers: HEADS heads of HIDDEN features (concatenated, ELU), then one head."""
    n = x.shape[0]
    wh = (x @ p["W1"]).view(n, HEADS, HIDDEN)
    dst, src = (wh * p["dst1"]).sum(-1), (wh * p["src1"]).sum(-1)         # (N, HEADS) each
    scores = F.leaky_relu(adj_heads + dst[:, None, :] + src[None, :, :], 0.2)
    attention = scores.softmax(1)                       # over each node's neighbours, per head
    h = torch.einsum("ijh,jhf->ihf", attention, wh).to_tensor(0).reshape(n, -1) + p["b1"]
    wh2 = F.elu(h) @ p["W2"]
    scores2 = F.leaky_relu(adj + (wh2 @ p["dst2"])[:, None] + (wh2 @ p["src2"])[None, :], 0.2)
    return (scores2.softmax(1) @ wh2).to_tensor(0) + p["b2"]


# %% [markdown]
# ## The same layers on dense tensors, for a check
#
# On a small graph we run the dense `-inf` recipe with the same weights, as most code writes
# it, and with the attention set to 0 off the edges after the softmax (the careful recipe).

# %%
def gat_dense(x, edges, p, careful=False):
    n = x.shape[0]
    on = torch.zeros(n, n, dtype=torch.bool).index_put((edges[0], edges[1]), torch.tensor(True))
    wh = (x @ p["W1"]).view(n, HEADS, HIDDEN)
    dst, src = (wh * p["dst1"]).sum(-1), (wh * p["src1"]).sum(-1)
    e = F.leaky_relu(dst[:, None, :] + src[None, :, :], 0.2).masked_fill(~on[:, :, None],
                                                                        -torch.inf)
    a = torch.where(on[:, :, None], e.softmax(1), 0) if careful else e.softmax(1)
    h = torch.einsum("ijh,jhf->ihf", a, wh).reshape(n, -1) + p["b1"]
    wh2 = F.elu(h) @ p["W2"]
    e2 = F.leaky_relu((wh2 @ p["dst2"])[:, None] + (wh2 @ p["src2"])[None, :], 0.2)
    a2 = e2.masked_fill(~on, -torch.inf).softmax(1)
    return (torch.where(on, a2, 0) if careful else a2) @ wh2 + p["b2"]


small_edges, small_labels = power_law_graph(8)
x_small, params = features(small_labels), parameters()
with torch.no_grad():
    masked_out = gat(x_small, *adjacency(small_edges, 8), params)
    careful = gat_dense(x_small, small_edges, params, careful=True)
    naive = gat_dense(x_small, small_edges, params)
print("small graph output, node 0:", [round(v, 4) for v in masked_out[0].tolist()])
print(f"max |masked - careful dense|: {(masked_out - careful).abs().max().item():.1e}")
print("isolated node, masked:", [round(v, 4) for v in masked_out[-1].tolist()])
print("isolated node, output bias:", [round(v, 4) for v in params["b2"].tolist()])
print(f"nodes the -inf recipe gives NaN: {int(naive.isnan().any(1).sum())} of 8")

# %% [markdown]
# The isolated node aggregates nothing: its first layer gives `ELU(0 + b1)`, its output
# `0 + b2` -- the empty sum plus the bias. The `-inf` recipe's softmax over a row of `-inf`
# is NaN; in the next layer every node's sum meets it (`0 * NaN` is NaN), so the whole
# output is NaN, and so is any loss.
#
# ## Training on a larger graph

# %%
N = 600
edges, labels = power_law_graph(N)
x, params = features(labels), parameters()
adj_heads, adj = adjacency(edges, N)
train = torch.arange(N) % 2 == 0
opt = torch.optim.Adam(params.values(), lr=0.02)
for step in range(40):
    logits = gat(x, adj_heads, adj, params)
    loss = F.cross_entropy(logits[train], labels[train])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step in (0, 39):
        print(f"step {step}: loss {loss.item():.4f}")
with torch.no_grad():
    accuracy = (gat(x, adj_heads, adj, params).argmax(1) == labels)[~train].float().mean()
print(f"edges {edges.shape[1]}, held-out accuracy {accuracy.item():.3f}")
print("the weights' gradients are plain tensors:",
      all(type(t.grad) is torch.Tensor for t in params.values()))
