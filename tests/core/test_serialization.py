"""Persistence of MaskedTensors: torch.save/torch.load(weights_only=True), pickle, deepcopy.

Every round trip must give back the very same storage -- layout (the registered object),
index tensors, values and mask, stored-but-masked entries included -- compared with the
original's plain tensors; shared index tensors must stay shared.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from conftest import check_invariants, dense_of, layout_params, make_masked

import layouts
import masked_sparse as ms
from masked_sparse._serialize import _rebuild_masked

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64]


def save_load(obj, **kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True, **kwargs)


def pickle_round_trip(obj, protocol=pickle.HIGHEST_PROTOCOL):
    return pickle.loads(pickle.dumps(obj, protocol=protocol))


ROUND_TRIPS = {"torch.save": save_load, "pickle": pickle_round_trip,
               "pickle2": lambda o: pickle_round_trip(o, 2), "deepcopy": copy.deepcopy}


def assert_same_storage(got, want, layout) -> None:
    """``got`` stores exactly what ``want`` stores (compared as plain tensors)."""
    assert type(got) is ms.MaskedTensor
    check_invariants(got, layout)
    g, w = got._storage, want._storage
    assert g.layout is layouts.get_layout(layout) and g.shape == w.shape
    assert got.dtype == want.dtype and got.requires_grad == want.requires_grad
    assert len(g.index) == len(w.index)
    for a, b in zip(g.index, w.index):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(g.values, w.values) and torch.equal(g.mask, w.mask)
    for a, b in zip(dense_of(got), dense_of(want)):
        assert torch.equal(a, b)


@layout_params()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", list(ROUND_TRIPS))
def test_round_trip_every_layout(layout, dtype, how):
    mt, _, _ = make_masked((4, 5), layout, dtype, seed=7)
    if dtype.is_floating_point or dtype.is_complex:
        mt.requires_grad_()
    out = ROUND_TRIPS[how](mt)
    assert_same_storage(out, mt, layout)
    assert out.is_leaf
    assert all(a is not b for a, b in zip(out._storage.index, mt._storage.index))
    assert out._storage.values is not mt._storage.values


@layout_params()
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 3)])
def test_empty_and_all_masked(layout, shape):
    mt = ms.to_layout(ms.masked_tensor(torch.ones(shape), torch.zeros(shape, dtype=torch.bool)),
                      layout)
    for how in ROUND_TRIPS.values():
        assert_same_storage(how(mt), mt, layout)


@layout_params()
@pytest.mark.parametrize("how", ["torch.save", "pickle", "deepcopy"])
def test_index_and_mask_sharing_survives(layout, how):
    a, _, _ = make_masked((5, 6), layout, torch.float32, seed=1)
    b = a * 2  # pointwise ops share the index tensors and the mask object
    assert a._storage.same_index(b._storage) and a._storage.mask is b._storage.mask
    out = ROUND_TRIPS[how]({"a": a, "b": b})
    a2, b2 = out["a"], out["b"]
    assert a2._storage.same_index(b2._storage) and a2._storage.mask is b2._storage.mask
    assert_same_storage(b2, b, layout)
    assert_same_storage(ms.to_layout(a2 + b2, layout), a + b, layout)  # masks align in O(1)


@layout_params()
def test_state_dict_with_masked_tensors(layout):
    mt, _, _ = make_masked((3, 4), layout, torch.float32, seed=2)
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(mt.clone())
    module.register_buffer("scale", mt.clone() * 3)
    state = module.state_dict()
    loaded = save_load({"model": state, "epoch": 3})
    assert loaded["epoch"] == 3
    for name in ("weight", "scale"):
        assert_same_storage(loaded["model"][name], state[name], layout)
    fresh = torch.nn.Module()
    fresh.weight = torch.nn.Parameter(mt.clone() * 0)
    fresh.register_buffer("scale", mt.clone() * 0)
    fresh.load_state_dict(loaded["model"])
    for name in ("weight", "scale"):
        got, want = getattr(fresh, name), getattr(module, name)
        assert torch.equal(got.to_tensor(0).to_dense(), want.to_tensor(0).to_dense())
    assert isinstance(fresh.weight, torch.nn.Parameter) and fresh.weight.requires_grad


@layout_params()
def test_parameter_and_extra_attributes(layout):
    mt, _, _ = make_masked((3, 4), layout, torch.float64, seed=4)
    p = torch.nn.Parameter(mt.clone())
    p.tag = "embedding"
    for how in ROUND_TRIPS.values():
        out = how(p)
        assert isinstance(out, torch.nn.Parameter) and out.requires_grad and out.tag == "embedding"
        assert_same_storage(out, p, layout)


@layout_params()
def test_deepcopy_copies_grad_and_does_not_alias(layout):
    mt, _, _ = make_masked((3, 4), layout, torch.float32, seed=5)
    a = mt.clone().requires_grad_()
    a.to_tensor(0).to_dense().sum().backward()
    c = copy.deepcopy(a)
    assert_same_storage(c, a, layout)
    assert_same_storage(c.grad, a.grad, layout)
    with torch.no_grad():
        c._storage.values.add_(1)
    assert not torch.equal(c._storage.values, a._storage.values)
    with pytest.raises(RuntimeError, match="leaves"):
        copy.deepcopy(a * 2)


def test_loaded_tensor_is_differentiable():
    mt, data, mask = make_masked((3, 4), torch.strided, torch.float32, seed=6)
    out = save_load(mt.requires_grad_())
    out.to_tensor(0).sum().backward()  # d/d(specified) = 1, no gradient where masked out
    assert isinstance(out.grad, ms.MaskedTensor) and torch.equal(out.grad.get_mask(), mask)
    assert torch.equal(out.grad.to_tensor(0), mask.float())


def test_weights_only_needs_no_allow_listing():
    # Only the rebuild function is allow-listed (at import), not the class: no user action.
    names = {getattr(g, "__qualname__", None) for g in torch.serialization.get_safe_globals()}
    assert "_rebuild_masked" in names and "MaskedTensor" not in names


def test_rebuild_rejects_invalid_input():
    good = (torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), torch.tensor([True, True]))
    out = _rebuild_masked("sparse_coo", (2, 2), good[:1], *good[1:], False, {})
    assert torch.equal(out.to_tensor(0).to_dense(), torch.tensor([[0.0, 1.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="out of bounds"):
        _rebuild_masked("sparse_coo", (2, 2), (torch.tensor([[0, 5], [1, 0]]),), *good[1:],
                        False, {})
    with pytest.raises(ValueError, match="coalesced"):
        _rebuild_masked("sparse_coo", (2, 2), (torch.tensor([[1, 0], [0, 1]]),), *good[1:],
                        False, {})
    with pytest.raises(TypeError, match="bool"):
        _rebuild_masked("sparse_coo", (2, 2), good[:1], good[1], good[2].long(), False, {})
    with pytest.raises(NotImplementedError, match="no_such_layout"):
        _rebuild_masked("no_such_layout", (2, 2), good[:1], *good[1:], False, {})
