"""A graph attention (GAT) training step: masked_sparse against the gather / scatter recipe.

The graph is citation-like and generated (no download): ``N`` nodes, about ``10 N``
power-law edges (preferential targets, fixed seed) plus a self-loop at every node. One step
is a 2-layer GAT (``heads`` heads of 8 features, ELU, then one head over the classes), a
cross-entropy over the nodes, backward and one Adam step:

- **masked_sparse**: the adjacency is a hybrid COO masked tensor ``(N, N, heads)`` of zeros
  on the edges (the index stored once for every head); the per-edge scores are
  ``A0 + e_dst[:, None] + e_src[None, :]`` (broadcast at the edges), a LeakyReLU, the masked
  softmax over each row's neighbours (``softmax(1)``) and ``einsum("ijh,jhf->ihf")``;
- **gather** (the recipe PyTorch Geometric's ``GATConv`` uses, written with torch ops):
  ``index_select`` of the node scores at the edge endpoints, the softmax of
  ``torch_geometric.utils.softmax`` (a ``scatter_reduce`` amax of the *detached* scores,
  ``exp``, an ``index_add`` sum plus ``1e-16``), and an ``index_add`` aggregation.

Both start from the same weights; ``agreement`` measures how far their outputs and gradients differ.
Targets: the masked step <= 0.5x the gather recipe at 20,000 nodes and <= 1.2x at 300.
Run by hand: ``python -m benchmarks.bench_graph [--device cuda] [--quick]``; one thread,
medians of paired rounds (benchmarks/harness.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # ``python benchmarks/bench_graph.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import masked_sparse as ms  # noqa: E402
from benchmarks import harness  # noqa: E402

TITLE = "GAT training step (2 layers, power-law graph): masked_sparse vs gather / scatter"
FEATURES, HIDDEN, CLASSES, SLOPE = 32, 8, 7, 0.2
TARGETS = {20_000: 0.5, 300: 1.2}
MIN_RUN_TIME = 0.5
SAFE = ("gather",)


def power_law_edges(nodes: int, per_node: int = 10, seed: int = 0) -> torch.Tensor:
    """``(2, E)`` edges ``(dst, src)``: each node sends ``per_node`` edges to targets drawn
    with probability proportional to a power law of their rank, plus one self-loop per node;
    duplicates removed, sorted by (dst, src) (a coalesced COO index)."""
    g = torch.Generator().manual_seed(seed)
    weight = 1.0 / torch.arange(1, nodes + 1, dtype=torch.float64) ** 0.8
    src = torch.arange(nodes).repeat_interleave(per_node)
    dst = torch.multinomial(weight, src.numel(), replacement=True, generator=g)
    dst = torch.randperm(nodes, generator=g)[dst]
    loops = torch.arange(nodes)
    keys = torch.cat([dst * nodes + src, loops * nodes + loops]).unique()
    return torch.stack([keys // nodes, keys % nodes])


class Weights:
    """The two layers' parameters (plain tensors), copied for each recipe."""

    def __init__(self, heads: int, device: torch.device, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)

        def p(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(device)

        self.tensors = [p(FEATURES, heads * HIDDEN), p(heads, HIDDEN), p(heads, HIDDEN),
                        p(heads * HIDDEN).mul(0), p(heads * HIDDEN, CLASSES), p(1, CLASSES),
                        p(1, CLASSES), p(CLASSES).mul(0)]

    def copy(self) -> list[torch.Tensor]:
        return [t.clone().requires_grad_() for t in self.tensors]


def _masked_layer(a0: ms.MaskedTensor, x: torch.Tensor, w, a_dst, a_src, bias, heads: int):
    wh = (x @ w).view(x.shape[0], heads, -1)                        # (N, H, F)
    e_dst, e_src = (wh * a_dst).sum(-1), (wh * a_src).sum(-1)       # (N, H)
    scores = a0 + e_dst[:, None, :] + e_src[None, :, :]             # at the edges only
    scores = F.leaky_relu(scores, SLOPE)
    out = torch.einsum("ijh,jhf->ihf", scores.softmax(1), wh)       # (N, H, F), masked
    return out.to_tensor(0).reshape(x.shape[0], -1) + bias


def _gather_layer(edges: torch.Tensor, x: torch.Tensor, w, a_dst, a_src, bias, heads: int):
    n = x.shape[0]
    dst, src = edges[0], edges[1]
    wh = (x @ w).view(n, heads, -1)
    e_dst, e_src = (wh * a_dst).sum(-1), (wh * a_src).sum(-1)
    e = F.leaky_relu(e_dst.index_select(0, dst) + e_src.index_select(0, src), SLOPE)  # (E, H)
    # PyG's softmax: the maximum of the detached scores (it cancels in value and gradient)
    top = e.new_full((n, heads), -torch.inf).scatter_reduce(
        0, dst[:, None].expand_as(e), e.detach(), "amax", include_self=True)
    p = (e - top.index_select(0, dst)).exp()
    total = p.new_zeros(n, heads).index_add(0, dst, p) + 1e-16
    att = p / total.index_select(0, dst)
    out = wh.new_zeros(wh.shape).index_add(0, dst, att[:, :, None] * wh.index_select(0, src))
    return out.reshape(n, -1) + bias


def model(layer: Callable, graph, x: torch.Tensor, params: list, heads: int) -> torch.Tensor:
    h = F.elu(layer(graph[0], x, *params[:4], heads))
    return layer(graph[1], h, *params[4:], 1)


def graphs(nodes: int, heads: int, device: torch.device):
    edges = power_law_edges(nodes).to(device)

    def a0(h: int) -> ms.MaskedTensor:
        shape = (nodes, nodes, h)
        zeros = torch.zeros(edges.shape[1], h, device=device)
        on = torch.ones(edges.shape[1], h, dtype=torch.bool, device=device)
        return ms.masked_tensor(torch.sparse_coo_tensor(edges, zeros, shape, is_coalesced=True),
                                torch.sparse_coo_tensor(edges, on, shape, is_coalesced=True))

    return edges, (a0(heads), a0(1))


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def step(layer: Callable, graph, x, labels, weights: Weights, heads: int,
         device: torch.device) -> Callable[[], None]:
    params = weights.copy()
    opt = torch.optim.Adam(params, lr=1e-2)
    sync = _sync(device)

    def run() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(layer, graph, x, params, heads), labels).backward()
        opt.step()
        sync()

    return run


def agreement(nodes: int = 60, heads: int = 4, device: str = "cpu") -> float:
    """The largest difference between the two recipes' outputs and gradients (float64)."""
    dev = torch.device(device)
    edges, (a_h, a_1) = graphs(nodes, heads, dev)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(nodes, FEATURES, generator=g).to(dev)
    labels = torch.randint(0, CLASSES, (nodes,), generator=g).to(dev)
    w = Weights(heads, dev)
    worst = 0.0
    outs = []
    for layer, graph in ((_masked_layer, (a_h, a_1)), (_gather_layer, (edges, edges))):
        params = w.copy()
        out = model(layer, graph, x, params, heads)
        F.cross_entropy(out, labels).backward()
        outs.append([out.detach()] + [p.grad for p in params])
    for mine, ref in zip(*outs):
        worst = max(worst, (mine - ref).abs().max().item())
    return worst


def cases(quick: bool = False, device: str = "cpu") -> list[tuple]:
    dev = torch.device(device)
    out = []
    for nodes in ((300, 2_000) if quick else (300, 20_000)):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(nodes, FEATURES, generator=g).to(dev)
        labels = torch.randint(0, CLASSES, (nodes,), generator=g).to(dev)
        for heads in (1, 8):
            edges, masked_graph = graphs(nodes, heads, dev)
            w = Weights(heads, dev)
            target = TARGETS.get(nodes)
            out.append((f"GAT step, {nodes} nodes, {edges.shape[1]} edges, {heads} heads, "
                        f"{dev.type}",
                        step(_masked_layer, masked_graph, x, labels, w, heads, dev),
                        {"gather": step(_gather_layer, (edges, edges), x, labels, w, heads,
                                        dev)},
                        {"gather": target} if target else {}))
    return out


def main() -> None:
    harness.module_main(sys.modules[__name__])


if __name__ == "__main__":
    main()
