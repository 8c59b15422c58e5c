"""``F.embedding_bag`` with masked ids on its two routes (Note [Bags without a host sync]):
the CPU selects the specified ids, every other device reorders all ids into the real bags
and bags that are dropped. Both against torch's op on the flat specified ids with their
offsets -- values bit for bit, gradients bit for bit on the CPU route and up to the order
of their sums on the device route (torch's backward sums each row's terms in an order set by
the whole id list, which holds the dropped bags' zero terms too) -- with the device route
run on the CPU (``compacts_on_host`` off) under a guard that raises on any op that would
sync a device.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked
from host_sync import forbid_host_sync

import layouts
import masked_sparse as ms
from masked_sparse.ops import embedding

ROWS, DIM = 15, 4
LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr]


@pytest.fixture(params=["cpu route", "cpu route, native off", "device route"])
def route(request, monkeypatch):
    """The CPU's selection (with its native one-pass compaction, and with the torch ops
    that replace it when the native kernels are off) and the device's reordering."""
    if request.param == "device route":
        monkeypatch.setattr(embedding, "compacts_on_host", lambda t: False)
    with layouts.native_disabled() if request.param.endswith("native off") else (
            contextlib.nullcontext()):
        yield request.param


def ids_of(layout, seed=0, shape=(5, 7), stored_masked=0.5):
    """Masked ids with an empty bag (row 2) and a full one (row 4); unspecified ids are out
    of range (-1), stored unspecified ones in the sparse layouts too."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(ROWS, shape, generator=g)
    mask = torch.rand(shape, generator=g) < 0.5
    mask[2] = False
    mask[4] = True
    data = torch.where(mask, ids, -1)
    if layout == torch.strided:
        return ms.masked_tensor(data, mask), ids, mask
    mt, _, _ = make_masked(shape, layout, torch.int64, data=data, mask=mask,
                           stored_masked=stored_masked, seed=seed)
    return mt, ids, mask


def flat_bags(ids, mask):
    counts = mask.sum(1)
    return ids[mask], torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])


def assert_grads_equal(grad, ref, route):
    if route.startswith("cpu route"):
        assert torch.equal(grad, ref)
    else:
        torch.testing.assert_close(grad, ref, rtol=1e-6, atol=1e-6)


def weight_of(dtype, seed=1):
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_and_gradients_equal_torch_on_the_flat_ids(layout, mode, sparse, route):
    if mode == "max" and sparse:
        pytest.skip("torch's embedding_bag has no sparse gradient in max mode")
    mt, ids, mask = ids_of(layout, seed=3)
    w = weight_of(torch.float32).requires_grad_()
    w_ref = w.detach().clone().requires_grad_()
    with forbid_host_sync() if route == "device route" else contextlib.nullcontext():
        out = F.embedding_bag(mt, w, mode=mode, sparse=sparse)
    flat, offsets = flat_bags(ids, mask)
    ref = F.embedding_bag(flat, w_ref, offsets, mode=mode, sparse=sparse)
    assert out.shape == ref.shape
    assert torch.equal(out, ref)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    (out * g).sum().backward()
    (ref * g).sum().backward()
    assert_grads_equal(w.grad.to_dense(), w_ref.grad.to_dense(), route)
    if sparse:  # rows the flat ids never name get no gradient entry
        named = set(flat.tolist())
        assert set(w.grad.coalesce().indices()[0].tolist()) <= named


@pytest.mark.parametrize("layout", LAYOUTS)
def test_options_on_both_routes(layout, route):
    mt, ids, mask = ids_of(layout, seed=5)
    flat, offsets = flat_bags(ids, mask)
    psw = torch.rand(mask.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    w = weight_of(torch.float64)
    cases = [(dict(mode="sum", per_sample_weights=psw), dict(per_sample_weights=psw[mask])),
             (dict(mode="mean", padding_idx=int(flat[0])), None),
             (dict(mode="max", max_norm=1.0), None),
             (dict(mode="mean", scale_grad_by_freq=True), None)]
    for kwargs, ref_kwargs in cases:
        ref_kwargs = {**kwargs, **(ref_kwargs or {})}
        w1, w2 = (w * 3).requires_grad_(), (w * 3).requires_grad_()
        out = F.embedding_bag(mt, w1, **kwargs)
        ref = F.embedding_bag(flat, w2, offsets, **ref_kwargs)
        assert torch.equal(out, ref), kwargs
        out.sum().backward()
        ref.sum().backward()
        assert_grads_equal(w1.grad, w2.grad, route)


def test_no_specified_id_at_all(route):
    mt = ms.masked_tensor(torch.full((3, 4), -1), torch.zeros(3, 4, dtype=torch.bool))
    w = weight_of(torch.float32)
    for mode in ("sum", "mean", "max"):
        assert torch.equal(F.embedding_bag(mt, w, mode=mode), torch.zeros(3, DIM))
