"""argmax / argmin follow torch's first-index rule on every device (Note [The arg-extreme
family] in ``layouts/kernels/arg_extreme.py``).

The reference is ``torch.masked.argmax`` / ``argmin`` itself (it fills the unspecified
elements with the identity, then takes torch's ``argmax``). Where its answer is a
specified element, ours is the same; where it names an unspecified element -- the extreme
is the identity itself, -inf for argmax, and an unspecified element comes first -- ours is
the first *specified* element reaching it (the one deliberate difference), and a group with
no specified element is unspecified. Both implementations run: the C kernels (CPU) and the
torch ops (``layouts.native_disabled()``: what CUDA runs -- a full argmax of that kind gave
1 where torch.masked gives 0 on an H200, the difference above).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from conftest import dense_of

import layouts
import masked_sparse as ms

pytestmark = pytest.mark.device_generic

INF = math.inf
LAYOUTS = ["strided", "coo", "csr", "csc"]


def _masked(data: torch.Tensor, mask: torch.Tensor, layout: str) -> ms.MaskedTensor:
    mt = ms.masked_tensor(data, mask)
    return mt if layout == "strided" else ms.to_layout(mt, {
        "coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc}[layout])


def _samples(device: torch.device):
    """Matrices with ties, NaN, +-inf and rows whose specified elements are all the
    identity, and their masks (every row of a 4 x 5 matrix a case)."""
    g = torch.Generator(device="cpu").manual_seed(11)
    for seed in range(12):
        data = torch.randint(-2, 3, (4, 5), generator=g, device="cpu").double()
        mask = torch.rand(4, 5, generator=g, device="cpu") < 0.6
        specials = torch.tensor([-INF, INF, math.nan], dtype=torch.float64)
        hits = torch.rand(4, 5, generator=g, device="cpu") < 0.25
        picks = torch.randint(0, 3, (4, 5), generator=g, device="cpu")
        data = torch.where(hits, specials[picks], data)
        if seed % 3 == 0:  # a row of identities: -inf specified, something before it not
            data[1] = torch.tensor([5.0, -INF, 3.0, -INF, INF])
            mask[1] = torch.tensor([False, True, False, True, False])
            data[2] = torch.tensor([-5.0, INF, INF, 1.0, INF])
            mask[2] = torch.tensor([False, True, False, False, True])
        if seed % 4 == 1:
            mask[3] = False  # nothing specified
        yield data.to(device), mask.to(device)


def _check(ours: ms.MaskedTensor, theirs: torch.Tensor, data: torch.Tensor,
           mask: torch.Tensor, dim: int | None, op: str) -> None:
    got, got_mask = dense_of(ours)
    assert got.device == data.device and got_mask.device == data.device
    flat = dim is None
    d = data.reshape(1, -1) if flat else (data if dim == 1 else data.t())
    m = mask.reshape(1, -1) if flat else (mask if dim == 1 else mask.t())
    got, got_mask, theirs = got.reshape(-1), got_mask.reshape(-1), theirs.reshape(-1).long()
    for row in range(d.shape[0]):
        if not bool(m[row].any()):
            assert not bool(got_mask[row])
            continue
        assert bool(got_mask[row])
        at = int(got[row])
        if bool(m[row, int(theirs[row])]):  # torch's answer is a specified element
            assert at == int(theirs[row]), (row, d[row], m[row])
            continue
        # torch names an unspecified element: ours is the first specified one reaching the
        # extreme (which is the identity, then)
        values = torch.where(m[row], d[row], -INF if op == "argmax" else INF)
        extreme = values.max() if op == "argmax" else values.min()
        hits = (m[row] & ((d[row] == extreme) | (d[row].isnan() & extreme.isnan()))).nonzero()
        assert at == int(hits[0]), (row, d[row], m[row])


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("dim", [None, 0, 1], ids=["all", "dim0", "dim1"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_arg_extremes_match_torch_masked(layout, op, dim, native, device):
    if native and (device.type != "cpu"
                   or not layouts.native_status().startswith("available")):
        pytest.skip("the C kernels serve the CPU, when built")
    for data, mask in _samples(device):
        theirs = getattr(torch.masked, op)(data.reshape(-1) if dim is None else data,
                                           0 if dim is None else dim,
                                           mask=mask.reshape(-1) if dim is None else mask)
        with contextlib.nullcontext() if native else layouts.native_disabled():
            mt = _masked(data, mask, layout)
            ours = getattr(torch, op)(mt) if dim is None else getattr(torch, op)(mt, dim)
        _check(ours, theirs, data, mask, dim, op)


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_one_difference_from_torch_masked(layout, native, device):
    """Every specified element is the identity, an unspecified one comes first: torch.masked
    answers 0 (unspecified), we answer 1 (the first specified element), on every device."""
    if native and (device.type != "cpu"
                   or not layouts.native_status().startswith("available")):
        pytest.skip("the C kernels serve the CPU, when built")
    data = torch.tensor([[5.0, -INF, -INF]], device=device)
    mask = torch.tensor([[False, True, True]], device=device)
    assert int(torch.masked.argmax(data.reshape(-1), 0, mask=mask.reshape(-1))) == 0
    with contextlib.nullcontext() if native else layouts.native_disabled():
        out = torch.argmax(_masked(data, mask, layout))
    assert out.device == data.device and out.get_mask().device == data.device
    assert int(out.to_tensor(0)) == 1 and bool(out.get_mask())
