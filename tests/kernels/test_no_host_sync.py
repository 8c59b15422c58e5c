"""The device path never syncs with the host (docs/design.md; ``host_sync.py``).

With the native kernels off (the torch-op implementation: the path of every other device)
a warm call -- the index facts of its index tensor already built by a first call, which
may sync to size its result (the number of non-empty groups) -- of every kernel family, on
every layout, along each dim and over all of them, forward and backward, runs no
``.item()``, ``nonzero``, ``torch.equal``, ``unique``, ``masked_select``, ``bincount``,
``repeat_interleave`` without ``output_size`` or bool-mask indexing. With ``--device cuda``
the same calls run under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import _to_layout
from host_sync import native_off, no_host_sync  # noqa: F401  (native_off: a fixture)

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

LAYOUTS = ["strided", "coo", "csr", "csc"]
FAMILIES = {
    # reduce
    "sum": lambda x, d: x.sum() if d is None else x.sum(d),
    "amax": lambda x, d: x.amax() if d is None else x.amax(d),
    "prod": lambda x, d: x.prod() if d is None else x.prod(d),
    "norm": lambda x, d: torch.linalg.vector_norm(x, dim=d),
    # moments
    "mean": lambda x, d: x.mean() if d is None else x.mean(d),
    "var": lambda x, d: x.var() if d is None else x.var(d),
    # logsumexp
    "logsumexp": lambda x, d: x.logsumexp((0, 1) if d is None else d),
    # softmax (over dim 1 for "all dims": a softmax takes one dim)
    "softmax": lambda x, d: x.softmax(1 if d is None else d),
    "log_softmax": lambda x, d: x.log_softmax(1 if d is None else d),
    # arg extremes
    "argmax": lambda x, d: x.argmax() if d is None else x.argmax(d),
    "max(dim)": lambda x, d: x.amin() if d is None else x.max(d).values,
    # cumsum (along dim 1 for "all dims")
    "cumsum": lambda x, d: x.cumsum(1 if d is None else d),
}


def _operand(layout: str, device: torch.device) -> ms.MaskedTensor:
    """A 7 x 9 masked tensor with an empty row, an all-masked stored column, and NaN / inf
    under the mask."""
    g = torch.Generator().manual_seed(4)
    data = torch.randn(7, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(7, 9, generator=g) < 0.6
    stored = mask | (torch.rand(7, 9, generator=g) < 0.3)
    stored[3] = mask[3] = False
    stored[:, 5], mask[:, 5] = True, False
    data = torch.where(mask, data, torch.where(stored, math.nan, math.inf))
    data, mask, stored = data.to(device), mask.to(device), stored.to(device)
    if layout == "strided":
        return ms.masked_tensor(data, mask)
    coo = ms.masked_tensor(_to_layout(data, stored, torch.sparse_coo),
                           _to_layout(mask, stored, torch.sparse_coo))
    return {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout]


def _step(op: str, mt: ms.MaskedTensor, dim: int | None, grad: bool) -> None:
    out = FAMILIES[op](mt, dim)
    if grad and out.requires_grad:
        torch.autograd.grad(out, mt, torch.ones_like(out))


@pytest.mark.usefixtures("native_off")
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("dim", [0, 1, None], ids=["dim0", "dim1", "all"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", list(FAMILIES))
def test_a_warm_call_never_syncs(op, layout, dim, grad, device):
    mt = _operand(layout, device)
    if grad:
        mt = mt.requires_grad_()
    _step(op, mt, dim, grad)  # the first call builds the index facts
    with no_host_sync(device):
        _step(op, mt, dim, grad)


def test_the_check_can_fail(native_off):  # noqa: F811
    mt = _operand("csr", torch.device("cpu"))
    with pytest.raises(AssertionError, match="nonzero"):
        with no_host_sync():
            mt.to_tensor(0).to_dense().nonzero()
    with pytest.raises(AssertionError, match="item"):
        with no_host_sync():
            mt.sum().to_tensor(0).item()


@pytest.mark.usefixtures("native_off")
@pytest.mark.parametrize("heads", [1, 3])
def test_a_graph_attention_step_never_syncs(heads, device):
    """The GAT layer of ``tutorials/graph_attention.py`` -- per-edge scores from two plain
    node vectors broadcast at the edges (Note [A sum with a plain operand]), LeakyReLU,
    the softmax over each row's neighbours (Note [A sparse softmax as one node]), the
    per-head product -- forward and backward, warm, without a host sync."""
    g = torch.Generator().manual_seed(5)
    n, feats = 8, 4
    keep = torch.rand(n, n, generator=g) < 0.4
    keep[2] = False  # a node without neighbours
    edges = keep.nonzero().t().to(device)
    shape = (n, n, heads)
    zeros = torch.zeros(edges.shape[1], heads, device=device)
    on = torch.ones(edges.shape[1], heads, dtype=torch.bool, device=device)
    a0 = ms.masked_tensor(torch.sparse_coo_tensor(edges, zeros, shape).coalesce(),
                          torch.sparse_coo_tensor(edges, on, shape).coalesce())
    wh = torch.randn(n, heads, feats, generator=g).to(device).requires_grad_()
    e_dst, e_src = (torch.randn(n, heads, generator=g).to(device).requires_grad_()
                    for _ in range(2))

    def step() -> None:
        scores = torch.nn.functional.leaky_relu(a0 + e_dst[:, None, :] + e_src[None, :, :], 0.2)
        out = torch.einsum("ijh,jhf->ihf", scores.softmax(1), wh).to_tensor(0)
        torch.autograd.grad(out.sum(), (wh, e_dst, e_src))

    step()  # the first call builds the index facts
    with no_host_sync(device):
        step()
