"""Every op family on the device under test gives the CPU's answer: values, masks,
gradients.

``pytest --device cuda`` (``scripts/gpu_check.sh`` runs it) compares each op family x layout
x dtype x dim on CUDA against the same call on CPU tensors. On the CPU (the default) the
same comparison is the native kernels off against on -- the torch-op implementation CUDA
runs against the C kernels the CPU runs -- so CI exercises it; an absent device skips.

Both sides start from the same float64 numbers (drawn on the CPU) with ties (values are
multiples of 0.5), a specified NaN and +inf, NaN / inf under the mask, a fully masked row,
an empty row and an all-masked stored column. Results agree within float tolerance (the
CPU kernels sum in double, torch's kernels in the values' type); masks, argmax / median
indices and the devices of every output part exactly.
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

CPU = torch.device("cpu")
LAYOUTS = ["strided", "coo", "csr", "csc"]
DTYPES = {"f32": torch.float32, "f64": torch.float64}
FULL, DIMS = None, (0, 1, None)

#: op -> (call(mt, dim), the dims it takes, differentiable)
OPS = {
    "sum": (lambda x, d: x.sum() if d is None else x.sum(d), DIMS, True),
    "mean": (lambda x, d: x.mean() if d is None else x.mean(d), DIMS, True),
    "var": (lambda x, d: x.var() if d is None else x.var(d), DIMS, True),
    "amax": (lambda x, d: x.amax() if d is None else x.amax(d), DIMS, True),
    "amin": (lambda x, d: x.amin() if d is None else x.amin(d), DIMS, True),
    "prod": (lambda x, d: x.prod() if d is None else x.prod(d), DIMS, True),
    "logsumexp": (lambda x, d: x.logsumexp((0, 1) if d is None else d), DIMS, True),
    "softmax": (lambda x, d: x.softmax(d), (0, 1), True),
    "log_softmax": (lambda x, d: x.log_softmax(d), (0, 1), True),
    "argmax": (lambda x, d: x.argmax() if d is None else x.argmax(d), DIMS, False),
    "argmin": (lambda x, d: x.argmin() if d is None else x.argmin(d), DIMS, False),
    "max(dim)": (lambda x, d: x.max(d).values, (0, 1), True),
    "median": (lambda x, d: x.median() if d is None else x.median(d).values, DIMS, True),
    "median index": (lambda x, d: x.median(d).indices, (0, 1), False),
    "cumsum": (lambda x, d: x.cumsum(d), (0, 1), True),
    "norm": (lambda x, d: torch.linalg.vector_norm(x, dim=d), DIMS, True),
}
CASES = [(op, d) for op, (_, dims, _) in OPS.items() for d in dims]


def _numbers(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 data, mask and stored pattern of a 9 x 11 matrix, on the CPU."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    data = (torch.randn(9, 11, generator=g, dtype=torch.float64, device=CPU) * 4).round() / 2
    mask = torch.rand(9, 11, generator=g, device=CPU) < 0.65
    stored = mask | (torch.rand(9, 11, generator=g, device=CPU) < 0.3)
    mask[2] = False  # a fully masked row (stored in part)
    stored[6] = mask[6] = False  # an empty row
    stored[:, 8], mask[:, 8] = True, False  # an all-masked stored column
    mask[4, 1] = stored[4, 1] = True
    data[4, 1] = math.nan  # a specified NaN
    mask[7, 3] = stored[7, 3] = True
    data[7, 3] = math.inf  # a specified +inf
    junk = torch.where(torch.rand(9, 11, generator=g, device=CPU) < 0.5, math.nan, math.inf)
    return torch.where(mask, data, junk), mask, stored


def _masked(layout: str, dtype: torch.dtype, device: torch.device, seed: int) -> ms.MaskedTensor:
    data, mask, stored = _numbers(seed)
    data, mask, stored = data.to(dtype).to(device), mask.to(device), stored.to(device)
    if layout == "strided":
        return ms.masked_tensor(data, mask)
    idx = stored.nonzero().t()
    coo = ms.masked_tensor(
        torch.sparse_coo_tensor(idx, data[stored], data.shape, device=device).coalesce(),
        torch.sparse_coo_tensor(idx, mask[stored], mask.shape, device=device).coalesce())
    return {"coo": coo, "csr": coo.to_sparse_csr(), "csc": coo.to_sparse_csc()}[layout]


def _run(op: str, layout: str, dtype: torch.dtype, dim: int | None, device: torch.device,
         native: bool) -> tuple:
    """``(values, mask, device of every part, gradient values, gradient mask)``."""
    call, _, differentiable = OPS[op]
    leaf = _masked(layout, dtype, device, seed=dim or 0)
    if differentiable:
        leaf = leaf.requires_grad_()
    with contextlib.nullcontext() if native else layouts.native_disabled():
        out = call(leaf, dim)
        grad = None
        if differentiable:
            w = torch.linspace(0.5, 2.0, out.numel(), dtype=dtype, device=device)
            weights = ms.masked_tensor(w.reshape(out.shape), torch.ones(
                out.shape, dtype=torch.bool, device=device))
            if out.layout != torch.strided:
                weights = ms.to_layout(weights, out.layout)
            (grad,) = torch.autograd.grad(out, leaf, weights)
    s = out._storage
    devices = {t.device for t in (*s.index, s.values, s.mask)}
    values, mask = dense_of(out.detach())
    grads = (None, None) if grad is None else dense_of(grad)
    return values, mask, devices, *grads


@pytest.mark.parametrize(("op", "dim"), CASES, ids=[f"{op}-{d}" for op, d in CASES])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_device_gives_the_cpu_answer(op, dim, dtype, layout, device):
    if device.type == "cpu":  # the torch-op implementation (every other device's) vs C
        if not layouts.native_status().startswith("available"):
            pytest.skip(f"native kernels: {layouts.native_status()}")
        got = _run(op, layout, dtype, dim, CPU, native=False)
    else:
        got = _run(op, layout, dtype, dim, device, native=True)
    want = _run(op, layout, dtype, dim, CPU, native=True)
    values, mask, devices, grad, grad_mask = got
    assert devices == {device if device.index is not None or device.type == "cpu"
                       else torch.device(device.type, torch.cuda.current_device())}, devices
    assert torch.equal(mask.cpu(), want[1])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else \
        dict(rtol=1e-10, atol=1e-10)
    if values.is_floating_point():
        torch.testing.assert_close(torch.where(mask, values, 0).cpu(),
                                   torch.where(want[1], want[0], 0), equal_nan=True, **tol)
    else:  # indices: the same element, by the first-index rule
        assert torch.equal(torch.where(mask, values, 0).cpu(), torch.where(want[1], want[0], 0))
    if grad is not None:
        assert torch.equal(grad_mask.cpu(), want[4])
        torch.testing.assert_close(torch.where(grad_mask, grad, 0).cpu(),
                                   torch.where(want[4], want[3], 0), equal_nan=True, **tol)
