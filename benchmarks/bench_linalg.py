"""Matrix products: sparse masked @ dense, and masked attention on strided tensors.

Sizes: COO and CSR masked matrices with nnz 1e3 .. 1e6 at 1% density (square, half of the
stored entries masked out) times a dense ``(n, 64)`` matrix; the 200000 x 200000 COO with
2000 entries times a 200000 x 4 dense matrix (a huge, nearly empty operand); attention at
``(batch, heads, seq, dim) = (4, 8, 128, 64)`` and ``(4, 8, 1024, 64)`` with a causal and a
padding mask (sequence lengths between seq/2 and seq).

Baselines (ratio = masked_sparse / baseline; below 1 means masked_sparse is faster):

=================  ===========================================================================
case               baselines
=================  ===========================================================================
mt @ dense         ``floor``: ``torch.sparse.mm`` on the torch tensor of the same layout whose
                   masked-out values are already 0 (target 1.3x at nnz 1e6)
attention          ``floor``: ``softmax(scores.masked_fill(~mask, -inf), -1) @ v`` (NaN in
                   fully masked rows; target 1.3x); ``sdpa``:
                   ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` (0 there)
=================  ===========================================================================
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import masked_sparse as ms
from benchmarks.bench_core import sparse_pattern
from benchmarks.harness import Case

TITLE = "Matrix products and masked attention"
SPARSE_NNZ = (10**3, 10**4, 10**5, 10**6)
DENSITY = 0.01
COLUMNS = 64
ATTENTION = ((4, 8, 128, 64), (4, 8, 1024, 64))


def _torch_sparse(layout: str, idx: torch.Tensor, values: torch.Tensor,
                  shape: tuple[int, int]) -> torch.Tensor:
    coo = torch.sparse_coo_tensor(idx, values, shape, is_coalesced=True, check_invariants=False)
    return coo if layout == "coo" else coo.to_sparse_csr()


def sparse_cases(nnz: int, gen: torch.Generator, shape: tuple[int, int] | None = None,
                 columns: int = COLUMNS) -> list[Case]:
    """``mt @ dense`` for COO and CSR masked matrices with ``nnz`` stored entries."""
    if shape is None:
        idx, shape = sparse_pattern(nnz, DENSITY, gen)
    else:
        keys = torch.randint(0, shape[0] * shape[1], (nnz,), generator=gen).unique()
        idx = torch.stack([keys // shape[1], keys % shape[1]])
    values = torch.rand(idx.shape[1], generator=gen) + 0.1
    mask = torch.rand(idx.shape[1], generator=gen) < 0.5
    dense = torch.rand(shape[1], columns, generator=gen)
    zeroed = torch.where(mask, values, 0)
    out = []
    for layout in ("coo", "csr"):
        mt = ms.masked_tensor(_torch_sparse(layout, idx, values, shape),
                              _torch_sparse(layout, idx, mask, shape))
        plain = _torch_sparse(layout, idx, zeroed, shape)
        size = (f"{layout} nnz=1e{round(math.log10(nnz))}" if shape[0] < 10**5 else
                f"{layout} {shape[0]}x{shape[1]} nnz={nnz}")
        target = {"floor": 1.3} if nnz == max(SPARSE_NNZ) else {}
        out.append(Case(f"{size} mt @ dense ({columns} cols)", lambda mt=mt: mt @ dense,
                        {"floor": lambda p=plain: torch.sparse.mm(p, dense)}, target))
    return out


def attention_inputs(shape: tuple[int, int, int, int], gen: torch.Generator):
    """q, k, v and a causal + padding mask ``(B, H, T, T)`` (an expanded view over heads)."""
    b, h, t, _ = shape
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    lengths = torch.randint(t // 2, t + 1, (b,), generator=gen)
    real = torch.arange(t)[None] < lengths[:, None]
    mask = torch.ones(t, t, dtype=torch.bool).tril() & real[:, None, :, None] & real[:, None,
                                                                                     None, :]
    return q, k, v, mask.expand(b, h, t, t)


def attention_cases(shape: tuple[int, int, int, int], gen: torch.Generator) -> list[Case]:
    q, k, v, mask = attention_inputs(shape, gen)
    scale = 1 / math.sqrt(shape[-1])

    def masked():
        scores = q @ k.transpose(-2, -1) * scale
        return torch.softmax(ms.as_masked_tensor(scores, mask), -1) @ v

    def dense():
        scores = q @ k.transpose(-2, -1) * scale
        return torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    name = "attention strided " + "x".join(map(str, shape))
    return [Case(name, masked, {"floor": dense, "sdpa": sdpa}, {"floor": 1.3})]


def cases(quick: bool = False) -> list[Case]:
    """All cases of this module (``quick`` changes nothing: the harness shortens timing)."""
    gen = torch.Generator().manual_seed(0)
    out: list[Case] = []
    for nnz in SPARSE_NNZ:
        out += sparse_cases(nnz, gen)
    out += sparse_cases(2000, gen, shape=(200_000, 200_000), columns=4)
    for shape in ATTENTION:
        out += attention_cases(shape, gen)
    return out


def main() -> None:
    from benchmarks.harness import module_main

    module_main(__import__(__name__, fromlist=["cases"]))


if __name__ == "__main__":
    main()
