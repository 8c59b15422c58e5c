"""The shortcuts taken for speed give the results of the general paths they skip.

- Note [Pointwise fast path]: one MaskedTensor alone, with a scalar / 0-d plain tensor, or
  with a MaskedTensor sharing its index and mask objects, skips ``align``; the result must
  equal the general path's (values, mask, layout, the same index objects).
- ``_equal_bool`` compares bool masks 8 bytes at a time; it must agree with ``torch.equal``.
- ``broadcasts_to`` replaces ``torch.broadcast_shapes`` (slow); it must give its answers.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import masked_sparse.ops.pointwise as pointwise
from tests.conftest import LAYOUT_IDS, LAYOUTS, check_invariants, make_masked

CALLS = {
    "sqrt": lambda a, b: torch.sqrt(a),
    "mt + mt (shared)": lambda a, b: a + b,
    "mt * python scalar": lambda a, b: a * 2.5,
    "mt - 0-d tensor": lambda a, b: a - torch.tensor(1.5),
    "pow(mt, mt)": lambda a, b: torch.pow(b, a),
    "frexp (tuple out)": lambda a, b: torch.frexp(a),
    "mt > mt (bool out)": lambda a, b: a > b,
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_fast_path_matches_general_path(layout, call, monkeypatch):
    a, _, _ = make_masked((5, 7), layout, torch.float64, seed=3)
    b = a.abs()  # shares a's index and mask objects
    fast = CALLS[call](a, b)
    monkeypatch.setattr(pointwise, "_fast_path", lambda func, args: None)
    general = CALLS[call](a, b)
    fast_t = fast if isinstance(fast, tuple) else (fast,)
    general_t = general if isinstance(general, tuple) else (general,)
    for f, g in zip(fast_t, general_t):
        fs, gs = f._storage, g._storage
        assert fs.layout is gs.layout and f.dtype == g.dtype and f.shape == g.shape
        assert all(x is y for x, y in zip(fs.index, a._storage.index))
        assert fs.mask is a._storage.mask
        torch.testing.assert_close(fs.values, gs.values, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(fs.mask, gs.mask)
        check_invariants(f, layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_fast_path_declines_distinct_masks(layout):
    a, _, _ = make_masked((4, 6), layout, seed=1)
    c, _, _ = make_masked((4, 6), layout, seed=2)  # another mask: must still raise
    with pytest.raises(ValueError, match="masks"):
        a + c


@pytest.mark.parametrize("n", [0, 1, 7, 8, 24, 1001, 4096])
@pytest.mark.parametrize("offset", [0, 1, 8])
def test_equal_bool_agrees_with_torch_equal(n, offset):
    g = torch.Generator().manual_seed(n + offset)
    base = torch.rand(n + offset, generator=g) < 0.5
    x = base[offset:]
    y = x.clone()
    assert pointwise._equal_bool(x, y) is torch.equal(x, y) is True
    if n:
        for pos in {0, n // 2, n - 1}:
            z = y.clone()
            z[pos] = ~z[pos]
            assert pointwise._equal_bool(x, z) is torch.equal(x, z) is False
    # non-contiguous operands take the plain comparison
    m = torch.rand(8, 2 * max(n, 1), generator=g) < 0.5
    assert pointwise._equal_bool(m[:, ::2], m[:, ::2].clone()) is True


def test_broadcasts_to_agrees_with_torch_broadcast_shapes():
    sizes = (0, 1, 2)
    for la, lb in itertools.product(range(4), range(4)):
        for a in itertools.product(sizes, repeat=la):
            for b in itertools.product(sizes, repeat=lb):
                try:
                    expected = torch.broadcast_shapes(a, b) == torch.Size(b)
                except RuntimeError:
                    expected = False
                assert pointwise.broadcasts_to(a, b) is expected, (a, b)
