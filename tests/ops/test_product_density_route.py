"""A sparse weight multiplies through its sparse kernels below its device's density threshold
and as a dense buffer above it (Note [Products chosen per device and density] in
``layouts/_dense_operand.py``): both routes give the values, masks and gradients of the
dense reference ``F.linear(x, W * M, b)``, on every sparse layout, with fully masked rows;
the buffer is kept per weight and rewritten only when the weight's values change; neither
route syncs with the host."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import _to_layout
from host_sync import native_off, no_host_sync  # noqa: F401  (native_off: a fixture)

import layouts
import masked_sparse as ms
from layouts import _dense_operand

pytestmark = pytest.mark.device_generic

SPARSE = [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr]
ROUTES = {"sparse kernels": 2.0, "dense buffer": 0.0}


@pytest.fixture
def threshold(request, device):
    """Force one route for the test's device type, restored afterwards."""
    kind = device.type if device.type in layouts.PRODUCT_DENSITY_THRESHOLDS else "other"
    old = layouts.PRODUCT_DENSITY_THRESHOLDS[kind]

    def use(value: float) -> None:
        layouts.set_product_density_threshold(kind, value)

    yield use
    layouts.set_product_density_threshold(kind, old)


def weight(layout, dtype, device, stored_unspecified=True, seed=0):
    """A 6 x 8 weight: row 2 fully masked, some stored positions unspecified (NaN there)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(6, 8, generator=g, dtype=dtype)
    mask = torch.rand(6, 8, generator=g) < 0.5
    mask[2] = False
    stored = mask | (torch.rand(6, 8, generator=g) < 0.3) if stored_unspecified else mask
    if layout == torch.sparse_bsr:  # 2 x 2 blocks: store whole blocks
        stored = stored.view(3, 2, 4, 2).any(3).any(1)
        stored = stored.repeat_interleave(2, 0).repeat_interleave(2, 1)
    data = torch.where(mask, w, torch.where(stored, float("nan"), 0.0))
    data, mask, stored = data.to(device), mask.to(device), stored.to(device)
    if layout == torch.sparse_bsr:
        mt = ms.masked_tensor(data.to_sparse_bsr((2, 2)), (mask & stored).to_sparse_bsr((2, 2)))
    else:
        mt = ms.masked_tensor(_to_layout(data, stored, layout), _to_layout(mask, stored, layout))
    return torch.nn.Parameter(mt), w.to(device), mask


def dense_of(mt):
    t = mt.to_tensor(0)
    return t.to_dense() if t.layout != torch.strided else t


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", SPARSE, ids=lambda x: str(x).split(".")[-1])
def test_linear_on_both_routes_equals_the_dense_reference(layout, dtype, route, threshold,
                                                         device):
    threshold(ROUTES[route])
    w, w_dense, mask = weight(layout, dtype, device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=g, dtype=dtype).to(device).requires_grad_()
    b = torch.randn(6, generator=g, dtype=dtype).to(device).requires_grad_()
    out = F.linear(x, w, b)
    rows = mask.any(1)
    assert torch.equal(out.get_mask(), rows.expand(5, 6))
    xr, br = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    wr = w_dense.clone().requires_grad_()
    ref = torch.where(rows, F.linear(xr, wr * mask, br), 0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out.to_tensor(0), ref, **tol)
    up = torch.randn(5, 6, generator=g, dtype=dtype).to(device)
    (out.to_tensor(0) * up).sum().backward()
    (ref * up).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, **tol)
    torch.testing.assert_close(b.grad, br.grad, **tol)
    assert w.grad.layout == w.layout
    assert torch.equal(dense_of(ms.masked_tensor(w.grad.get_mask(), w.grad.get_mask())),
                       mask)
    torch.testing.assert_close(dense_of(w.grad), wr.grad * mask, **tol)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("layout", SPARSE[:3], ids=lambda x: str(x).split(".")[-1])
def test_sparse_left_and_right_products_on_both_routes(layout, route, threshold, device):
    threshold(ROUTES[route])
    w, w_dense, mask = weight(layout, torch.float64, device, stored_unspecified=False)
    d = torch.randn(8, 3, dtype=torch.float64, device=device, requires_grad=True)
    out = w @ d  # sparse on the left
    ref = (w_dense * mask) @ d
    torch.testing.assert_close(out.to_tensor(0), torch.where(mask.any(1)[:, None], ref, 0))
    (gd,) = torch.autograd.grad(out.to_tensor(0).sum(), d)
    (rd,) = torch.autograd.grad(torch.where(mask.any(1)[:, None], ref, 0).sum(), d)
    torch.testing.assert_close(gd, rd)
    e = torch.randn(4, 6, dtype=torch.float64, device=device)
    right = e @ w  # sparse on the right
    torch.testing.assert_close(right.to_tensor(0),
                               torch.where(mask.any(0), e @ (w_dense * mask), 0))


def test_the_buffer_is_kept_and_rewritten_only_when_the_values_change(threshold, device):
    threshold(0.0)
    w, w_dense, mask = weight(torch.sparse_csr, torch.float64, device, stored_unspecified=False)
    x = torch.randn(3, 8, dtype=torch.float64, device=device)
    values = w._storage.values
    F.linear(x, w).to_tensor(0).sum().backward()
    buffer, version = _dense_operand._BUFFERS[values][1], values._version
    F.linear(x, w).to_tensor(0).sum().backward()  # same values: no write, same buffer
    assert _dense_operand._BUFFERS[values][1] is buffer and buffer._version == 1
    with torch.no_grad():
        values.mul_(2)  # an optimizer step
    assert values._version != version
    out = F.linear(x, w)
    assert _dense_operand._BUFFERS[values][1] is buffer
    torch.testing.assert_close(out.to_tensor(0),
                               torch.where(mask.any(1), x @ (2 * w_dense * mask).T, 0))


def test_a_weight_used_twice_in_one_graph_gets_both_gradients(threshold, device):
    threshold(0.0)
    w, w_dense, mask = weight(torch.sparse_csr, torch.float64, device, stored_unspecified=False)
    x = torch.randn(3, 8, dtype=torch.float64, device=device)
    h = F.linear(x, w).to_tensor(0)
    F.linear(torch.cat([h, h[:, :2]], 1), w).to_tensor(0).sum().backward()
    wr = w_dense.clone().requires_grad_()
    hr = torch.where(mask.any(1), x @ (wr * mask).T, 0)
    torch.where(mask.any(1), torch.cat([hr, hr[:, :2]], 1) @ (wr * mask).T, 0).sum().backward()
    torch.testing.assert_close(dense_of(w.grad), wr.grad * mask)


@pytest.mark.usefixtures("native_off")
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr],
                         ids=["coo", "csr"])
def test_linear_forward_and_backward_never_sync(layout, route, threshold, device):
    threshold(ROUTES[route])
    w, _, _ = weight(layout, torch.float32, device)
    x = torch.randn(5, 8, device=device, requires_grad=True)
    b = torch.zeros(6, device=device, requires_grad=True)

    def step() -> None:
        F.linear(x, w, b).to_tensor(0).sum().backward()

    step()  # the first call builds the index facts
    with no_host_sync(device):
        step()


def test_thresholds_are_checked_and_restored():
    with pytest.raises(ValueError, match="device_type must be one of"):
        ms.set_product_density_threshold("tpu", 0.1)
    with pytest.raises(ValueError, match="a number >= 0"):
        ms.set_product_density_threshold("cpu", -1)
    default = layouts.PRODUCT_DENSITY_THRESHOLDS["cpu"]
    ms.set_product_density_threshold("cpu", 0.5)
    assert layouts.PRODUCT_DENSITY_THRESHOLDS["cpu"] == 0.5
    ms.set_product_density_threshold("cpu", None)
    assert layouts.PRODUCT_DENSITY_THRESHOLDS["cpu"] == default


def test_the_environment_variable_sets_thresholds(monkeypatch):
    saved = dict(layouts.PRODUCT_DENSITY_THRESHOLDS)
    try:
        monkeypatch.setenv("MASKED_SPARSE_PRODUCT_DENSITY", "cpu=0.25, cuda=0.5")
        _dense_operand._read_env()
        assert layouts.PRODUCT_DENSITY_THRESHOLDS["cpu"] == 0.25
        assert layouts.PRODUCT_DENSITY_THRESHOLDS["cuda"] == 0.5
        monkeypatch.setenv("MASKED_SPARSE_PRODUCT_DENSITY", "gpu=0.1")
        with pytest.raises(ValueError, match="MASKED_SPARSE_PRODUCT_DENSITY"):
            _dense_operand._read_env()
    finally:
        layouts.PRODUCT_DENSITY_THRESHOLDS.update(saved)


def test_the_route_follows_the_stored_fraction():
    csr = layouts.get_layout("sparse_csr")
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[0, :2] = True  # 2 of 20 stored: 10%
    s = csr.from_strided(torch.ones(4, 5), mask)
    assert layouts.dense_operand(s, threshold=0.1) is not None
    assert layouts.dense_operand(s, threshold=0.11) is None
    assert torch.equal(layouts.dense_operand(s, threshold=0.0), mask.float())


@pytest.mark.usefixtures("native_off")
def test_strided_masked_linear_forward_and_backward_never_sync(device):
    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(6, 8, generator=g) < 0.5).to(device)
    w = torch.nn.Parameter(ms.masked_tensor(torch.randn(6, 8, generator=g).to(device), mask))
    x = torch.randn(5, 8, device=device, requires_grad=True)
    b = torch.zeros(6, device=device, requires_grad=True)

    def step() -> None:
        F.linear(x, w, b).to_tensor(0).sum().backward()

    step()
    with no_host_sync(device):
        step()
