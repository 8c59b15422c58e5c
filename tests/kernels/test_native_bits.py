"""The CPU results of the native kernels are pinned: float sums accumulate in double and
round once (Note [Native reductions]), so on values whose float32 sums lose bits the
masked sum, mean and extreme equal a float64 dense ``torch.where`` reference rounded once,
bit for bit, along the stored lines, across them and over everything, with and without
autograd. A strided sum along a dim keeps torch's own float32 accumulation (Note [Fused
masked sum]): it equals torch's sum of the filled values, bit for bit. (A change of the
kernels' accumulation, or of the route to them, shows here.)
"""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_only, dense_of

import layouts
import masked_sparse as ms

pytestmark = cpu_only("the native kernels serve the CPU")
LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
           "csc": torch.sparse_csc}


def _operand(layout: str):
    """A 40 x 30 float32 matrix: one large value per line and ones, whose float32
    running sums drop every 1 (2**24 + 1 rounds to 2**24), exact in double."""
    g = torch.Generator().manual_seed(2)
    data = torch.ones(40, 30, dtype=torch.float64)
    data[:, 0] = 2.0**24
    data[0, :] = 2.0**24
    data = data * torch.where(torch.rand(40, 30, generator=g) < 0.5, 1.0, 3.0)
    mask = torch.rand(40, 30, generator=g) < 0.7
    mask[:, 0] = mask[0, :] = True
    mt = ms.masked_tensor(data.float(), mask)
    if layout != "strided":
        mt = ms.to_layout(mt, LAYOUTS[layout])
    return mt, data, mask


def _reference(op: str, data: torch.Tensor, mask: torch.Tensor, dim, layout: str):
    dims = (0, 1) if dim is None else dim
    total = torch.where(mask, data, 0).sum(dims)  # float64: exact here
    if layout == "strided" and dim is not None and op != "amax":  # torch's float32 sum
        total = torch.where(mask, data.float(), 0).sum(dims)
    if op == "sum":
        return total.float()
    if op == "mean":  # the kernels: the sum rounded to float32, then / count in float32
        return total.float() / mask.sum(dims).float()
    return torch.where(mask, data, -torch.inf).amax(dims).float()


@pytest.mark.skipif(not layouts.native_status().startswith("available"),
                    reason=f"native kernels: {layouts.native_status()}")
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("dim", [0, 1, None], ids=["dim0", "dim1", "all"])
@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_results_are_the_double_sum_rounded_once(layout, op, dim, grad):
    mt, data, mask = _operand(layout)
    if grad:
        mt = mt.requires_grad_()
    out = getattr(torch, op)(mt) if dim is None else getattr(torch, op)(mt, dim)
    got, got_mask = dense_of(out.detach())
    want = _reference(op, data, mask, dim, layout)
    assert got_mask.all()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got - want).abs().max()
    # and the float32 accumulation of torch's own sum would not be (the test can fail)
    if op == "sum" and dim == 1 and layout != "strided":
        assert not torch.equal(torch.where(mask, data.float(), 0).sum(1).view(torch.int32),
                               want.view(torch.int32))
