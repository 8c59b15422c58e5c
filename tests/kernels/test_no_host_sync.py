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
