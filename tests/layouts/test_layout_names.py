"""Short layout names -- ``'coo'``, ``'csr'``, ``'csc'``, ``'bsr'`` and ``'dense'`` -- are
accepted wherever a layout name is, as ``to_scipy``'s ``format`` takes scipy's names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import assert_masked_equal, make_masked

import layouts
import masked_sparse as ms

SHORT = {"coo": torch.sparse_coo, "csr": torch.sparse_csr, "csc": torch.sparse_csc,
         "bsr": torch.sparse_bsr, "dense": torch.strided}


@pytest.mark.parametrize("name", list(SHORT))
def test_get_layout_takes_short_names(name):
    assert layouts.get_layout(name) is layouts.get_layout(SHORT[name])


@pytest.mark.parametrize("name", list(SHORT))
def test_to_layout_takes_short_names(name):
    mt, data, mask = make_masked((4, 6), torch.strided, seed=1)
    out = ms.to_layout(mt, name)
    assert out.layout == SHORT[name]
    assert_masked_equal(out.to_dense(), data, mask)


@pytest.mark.parametrize("name", list(SHORT))
def test_from_scipy_takes_short_names(name):
    a = sp.random_array((4, 6), density=0.4, format="csr", rng=np.random.default_rng(0))
    mt = ms.from_scipy(a, layout=name)
    assert mt.layout == SHORT[name]
    dense = torch.from_numpy(a.toarray())
    assert torch.equal(mt.to_dense().to_tensor(0), dense)
    assert torch.equal(mt.to_dense().get_mask(), torch.from_numpy(a.toarray() != 0))


@pytest.mark.parametrize("name", ["coo", "csr", "csc", "bsr"])
def test_to_scipy_and_back_by_the_same_name(name):
    mt, data, mask = make_masked((4, 6), torch.sparse_csr, seed=2)
    back = ms.from_scipy(ms.to_scipy(mt, format=name), layout=name)
    assert back.layout == SHORT[name]
    assert_masked_equal(back.to_dense(), data, mask)


def test_layouts_convert_takes_short_names():
    mt, _, _ = make_masked((4, 6), torch.sparse_coo, seed=3)
    s = layouts.convert(mt._storage, "csc")
    assert s.layout is layouts.get_layout(torch.sparse_csc)


def test_unknown_name_lists_the_accepted_names():
    with pytest.raises(NotImplementedError, match=r"no masked layout is registered for 'cs' "
                                                  r"\(registered: strided, sparse_coo, .*; "
                                                  r"short names: 'coo', 'csr', 'csc', 'bsr', "
                                                  r"'dense'\)"):
        layouts.get_layout("cs")


def test_a_layout_registered_under_a_short_name_takes_precedence():
    coo = layouts.get_layout("sparse_coo")
    mine = layouts.register_layout(dataclasses.replace(coo, name="csc", torch_layout=None))
    try:
        assert layouts.get_layout("csc") is mine
    finally:
        layouts.unregister_layout(mine)
    assert layouts.get_layout("csc") is layouts.get_layout(torch.sparse_csc)
