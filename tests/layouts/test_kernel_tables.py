"""Every kernel table of the layout protocol is read, and an entry overrides the generic
derivation for its own layout only.

Each test gives a copy of a built-in layout (``dataclasses.replace``) one table entry that
records its call and returns a result the generic path would never produce; a tensor of
the copy must get that result, a tensor of the original layout the generic one. The copy's
storages are built by hand (``layout.build``) from the original's, so these tests do not
depend on how the layout's own functions name their layout.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_masked_equal, make_masked

import layouts
import masked_sparse as ms
from masked_sparse._tensor import _wrap

aten = torch.ops.aten


def _with_table(name: str, **tables):
    """A copy of layout ``name`` with ``tables`` and a MaskedTensor factory for it."""
    original = layouts.get_layout(name)
    copy = dataclasses.replace(original, name=f"probe_{name}", torch_layout=None, **tables)

    def make(mt: ms.MaskedTensor) -> ms.MaskedTensor:
        s = mt._storage
        return _wrap(copy.build(s.index, s.values, s.mask, s.shape))

    return original, copy, make


@pytest.fixture
def calls():
    return []


@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr"])
def test_unary_entry(name, calls):
    def sqrt(s, *args):
        calls.append(args)
        return s.with_values(torch.full_like(s.values, 42.0))

    original, copy, make = _with_table(name, unary={aten.sqrt.default: sqrt})
    mt, data, mask = make_masked((4, 6), original.torch_layout, seed=1)
    out = torch.sqrt(make(mt))
    assert calls == [()] and ms.layout_of(out) is copy
    assert_masked_equal(out, torch.full_like(data, 42.0), mask)
    assert_masked_equal(torch.sqrt(mt), data.sqrt(), mask)  # the original: generic path
    assert len(calls) == 1
    assert_masked_equal(torch.exp(make(mt)), data.exp(), mask)  # other ops: generic path


@pytest.mark.parametrize("name", ["strided", "sparse_coo"])
def test_binary_entry(name, calls):
    def add(a, b, alpha=1):
        calls.append(type(b))
        other = b.values if isinstance(b, layouts.Storage) else b
        return a.with_values(a.values * 100 + other)

    original, copy, make = _with_table(name, binary={aten.add.Tensor: add})
    mt, data, mask = make_masked((4, 6), original.torch_layout, seed=2)
    x = make(mt)
    assert_masked_equal(x + x, data * 101, mask)
    plain = torch.rand(6)
    assert_masked_equal(x + plain, data * 100 + plain, mask)  # plain read at the positions
    assert calls == [layouts.Storage, layouts.Storage]
    assert_masked_equal(mt + mt, data * 2, mask)
    assert_masked_equal(x * x, data * data, mask)
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr"])
def test_reduction_entry(name, calls):
    def amax(s, dims, keepdim, op):
        calls.append((dims, keepdim, op))
        if dims != (1,):
            return NotImplemented  # the generic derivation runs for this call
        dense = s.layout.densify(s, s.values, 0)
        out = torch.full(dense.sum(dims, keepdim=keepdim).shape, -7.0)
        return layouts.get_layout("strided").build((), out, torch.ones_like(out, dtype=torch.bool),
                                                   out.shape)

    original, copy, make = _with_table(name, reduction={aten.amax.default: amax})
    mt, data, mask = make_masked((4, 6), original.torch_layout, seed=3)
    out = torch.amax(make(mt), 1)
    assert calls == [((1,), False, "amax")]
    assert out.to_tensor(0).tolist() == [-7.0] * 4
    reference = torch.where(mask, data, -torch.inf).amax(1)
    assert_masked_equal(torch.amax(mt, 1), torch.where(mask.any(1), reference, 0), mask.any(1))
    torch.sum(make(mt), 1)  # other reductions: generic path
    assert len(calls) == 1
    reference = torch.where(mask, data, -torch.inf).amax(0)
    assert_masked_equal(torch.amax(make(mt), 0), torch.where(mask.any(0), reference, 0),
                        mask.any(0))
    assert calls[1] == ((0,), False, "amax")


@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr"])
def test_to_tensor_and_get_data_entries(name, calls):
    def to_tensor(s, value):
        calls.append(("to_tensor", value))
        return torch.full(s.shape, 5.0)

    def get_data(s, values):
        calls.append(("get_data",))
        return torch.full(s.shape, 6.0)

    original, copy, make = _with_table(name, to_tensor=to_tensor, get_data=get_data)
    mt, data, mask = make_masked((4, 6), original.torch_layout, seed=4)
    x = make(mt)
    assert torch.equal(x.to_tensor(1.5), torch.full((4, 6), 5.0))
    assert torch.equal(x.get_data(), torch.full((4, 6), 6.0))
    assert calls == [("to_tensor", 1.5), ("get_data",)]
    assert torch.equal(mt.to_tensor(1.5).to_dense(), torch.where(mask, data, 1.5))
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr"])
def test_shape_ops_entry(name, calls):
    def transpose(s, dim0, dim1):
        calls.append((dim0, dim1))
        dense = s.layout.densify(s, s.values, 0).transpose(dim0, dim1)
        return layouts.get_layout("strided").build((), dense * 0 - 1, torch.ones_like(
            dense, dtype=torch.bool), dense.shape)

    original = layouts.get_layout(name)
    _, copy, make = _with_table(name, shape_ops={**original.shape_ops,
                                                 aten.transpose.int: transpose})
    mt, data, mask = make_masked((4, 6), original.torch_layout, seed=5)
    out = make(mt).transpose(0, 1)
    assert calls == [(0, 1)]
    assert out.to_tensor(0).tolist() == [[-1.0] * 4] * 6
    assert_masked_equal(mt.transpose(0, 1), data.t(), mask.t())
    assert len(calls) == 1


def test_refused_op_names_the_layouts_that_have_it():
    """A layout's ``refuses`` entry gives the error; a missing kernel suggests only layouts
    that have the op (never the layout at hand)."""
    original, copy, make = _with_table(
        "sparse_coo", refuses={"flip": ("it is refused for this test", "use something else")})
    mt, _, _ = make_masked((4, 6), torch.sparse_coo, seed=6)
    with pytest.raises(NotImplementedError, match=r"probe_sparse_coo\] flip: it is refused for "
                                                  r"this test; use something else"):
        make(mt).flip(0)
    with pytest.raises(NotImplementedError, match=r"sparse_coo\] unfold: no sparse kernel") as e:
        mt.unfold(0, 2, 1)
    assert "to_sparse_coo" not in str(e.value)
    with pytest.raises(NotImplementedError, match="no kernel for this op") as e:
        torch.trace(mt)
    assert "to_sparse_coo" not in str(e.value)
