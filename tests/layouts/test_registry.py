"""The ``layouts`` package on its own: registry, primitives, conversions, invariants."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import layouts

BUILTIN = ["strided", "sparse_coo", "sparse_csr"]


def _dense_pair(seed=0, shape=(4, 5)):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(shape, generator=g)
    return data, torch.rand(shape, generator=g) > 0.5


def test_layouts_imports_nothing_of_masked_sparse():
    code = "import sys, layouts; print('masked_sparse' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_builtins_registered_by_name_and_torch_layout():
    names = [lay.name for lay in layouts.registered_layouts()]
    assert names[:3] == BUILTIN
    for name in BUILTIN:
        lay = layouts.get_layout(name)
        assert layouts.get_layout(lay.torch_layout) is lay
        assert layouts.get_layout(lay) is lay


def test_get_layout_unknown():
    with pytest.raises(NotImplementedError, match="no masked layout is registered for 'nope'"):
        layouts.get_layout("nope")


def test_register_requires_primitives():
    coo = layouts.get_layout("sparse_coo")
    broken = dataclasses.replace(coo, name="broken", torch_layout=None, gather=None)
    with pytest.raises(TypeError, match=r"missing required primitives \['gather'\]"):
        layouts.register_layout(broken)
    assert "broken" not in [lay.name for lay in layouts.registered_layouts()]


def test_register_refuses_taken_names():
    coo = layouts.get_layout("sparse_coo")
    with pytest.raises(ValueError, match="already registered"):
        layouts.register_layout(dataclasses.replace(coo, torch_layout=None))


@pytest.mark.parametrize("name", BUILTIN)
def test_from_strided_densify_round_trip(name):
    lay = layouts.get_layout(name)
    data, mask = _dense_pair()
    s = lay.from_strided(data, mask)
    lay.validate(s, full=True)
    assert torch.equal(s.densify(s.mask, False), mask)
    assert torch.equal(torch.where(mask, s.densify(), 0), torch.where(mask, data, 0))


@pytest.mark.parametrize("name", BUILTIN)
def test_with_values_keeps_index_objects(name):
    s = layouts.get_layout(name).from_strided(*_dense_pair())
    t = s.with_values(s.values * 2)
    assert t.same_index(s) and all(a is b for a, b in zip(t.index, s.index))
    assert t.mask is s.mask


@pytest.mark.parametrize("name", BUILTIN)
def test_gather_reads_dense_at_stored_positions(name):
    data, mask = _dense_pair(1)
    s = layouts.get_layout(name).from_strided(data, mask)
    other = torch.arange(20.0).reshape(4, 5)
    got = s.densify(s.layout.gather(s, other).expand_as(s.values), 0)
    assert torch.equal(torch.where(mask, got, 0), torch.where(mask, other, 0))


@pytest.mark.parametrize("source", BUILTIN)
@pytest.mark.parametrize("target", BUILTIN)
def test_convert_is_exact(source, target):
    data, mask = _dense_pair(2)
    s = layouts.get_layout(source).from_strided(data, mask)
    t = layouts.convert(s, target)
    assert t.layout is layouts.get_layout(target)
    t.layout.validate(t, full=True)
    assert torch.equal(t.densify(t.mask, False), mask)
    assert torch.equal(torch.where(mask, t.densify(), 0), torch.where(mask, data, 0))


def test_to_torch_builds_the_torch_layout():
    data, mask = _dense_pair(3)
    for name in BUILTIN:
        s = layouts.get_layout(name).from_strided(data, mask)
        t = s.layout.to_torch(s, s.values)
        assert t.layout == s.layout.torch_layout
        assert torch.equal(torch.where(mask, t.to_dense(), 0), torch.where(mask, data, 0))


def test_validate_catches_broken_invariants():
    coo = layouts.get_layout("sparse_coo")
    unsorted = coo.build((torch.tensor([[1, 0], [0, 0]]),), torch.ones(2),
                         torch.ones(2, dtype=torch.bool), (2, 2))
    coo.validate(unsorted)  # O(1) checks pass
    with pytest.raises(ValueError, match="not coalesced"):
        coo.validate(unsorted, full=True)
    for bad, shape in (([[5]], (2,)), ([[2]], (2,)), ([[-1]], (2,)),  # the edges too
                       ([[0, 1], [0, 3]], (2, 3)), ([[0, 2], [0, 0]], (2, 3))):
        with pytest.raises(ValueError, match="out of bounds"):
            n = len(bad[0])
            coo.validate(coo.build((torch.tensor(bad),), torch.ones(n),
                                   torch.ones(n, dtype=torch.bool), shape), full=True)
    csr = layouts.get_layout("sparse_csr")
    with pytest.raises(ValueError, match="must be 2-D"):
        csr.validate(csr.build((torch.tensor([0, 1]), torch.tensor([0])), torch.ones(1),
                               torch.ones(1, dtype=torch.bool), (1, 1, 1)))
    bad_crow = csr.build((torch.tensor([0, 2, 1]), torch.tensor([0])), torch.ones(1),
                         torch.ones(1, dtype=torch.bool), (2, 2))
    with pytest.raises(ValueError, match="crow_indices"):
        csr.validate(bad_crow, full=True)


def test_drop_unspecified():
    data, mask = _dense_pair(4)
    coo = layouts.get_layout("sparse_coo")
    full = coo.build((mask.new_ones(mask.shape).nonzero().t(),), data.reshape(-1),
                     mask.reshape(-1), mask.shape)
    dropped = layouts.drop_unspecified(full)
    assert dropped.values.numel() == int(mask.sum())
    assert bool(dropped.mask.all())
    assert torch.equal(dropped.densify(dropped.mask, False), mask)


ALL = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]


@pytest.mark.parametrize("source", ALL)
@pytest.mark.parametrize("like", ALL)
def test_read_at_any_layouts_and_patterns(source, like):
    g = torch.Generator().manual_seed(5)
    data = torch.randn(4, 6, generator=g)
    src_mask, like_mask = torch.rand(4, 6, generator=g) > 0.5, torch.rand(4, 6, generator=g) > 0.4
    options = {"blocksize": (2, 3)} if like == "sparse_bsr" else {}
    src = layouts.convert(layouts.get_layout("strided").from_strided(data, src_mask), source)
    dst = layouts.convert(layouts.get_layout("strided").from_strided(-data, like_mask), like,
                          **options)
    values, mask = layouts.read_at(src, dst)
    assert values.shape == dst.values.shape and mask.shape == dst.values.shape
    dense_values, dense_mask = dst.densify(values, 0), dst.densify(mask, False)
    stored = dst.densify(torch.ones_like(mask), False)
    # At like's stored positions: source's mask, and its value where specified.
    assert torch.equal(dense_mask, src_mask & stored)
    assert torch.equal(torch.where(dense_mask, dense_values, 0),
                       torch.where(src_mask & stored, data, 0))
