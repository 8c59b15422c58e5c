"""What is specific to the CSC and BSR layouts (the generic suite covers the rest):
hand-built storages, blocksize as a conversion option, the authoritative mask across
blocksizes, invariant checks, and never densifying a huge matrix."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, make_masked

import layouts
import masked_sparse as ms

CSC = layouts.get_layout(torch.sparse_csc)
BSR = layouts.get_layout(torch.sparse_bsr)


def _bool(*xs):
    return torch.tensor(xs, dtype=torch.bool)


def test_csc_hand_built_storage_reads_column_major():
    # Column 0 stores row 1; column 2 stores rows 0 (masked out) and 1.
    s = CSC.build((torch.tensor([0, 1, 1, 3]), torch.tensor([1, 0, 1])),
                  torch.tensor([1.0, 2.0, 3.0]), _bool(True, False, True), (2, 3))
    CSC.validate(s, full=True)
    assert s.densify().tolist() == [[0.0, 0.0, 2.0], [1.0, 0.0, 3.0]]
    assert s.densify(s.mask, False).tolist() == [[False, False, False], [True, False, True]]
    coo = CSC.to_coo(s)  # row-major order in the hub
    assert coo.index[0].tolist() == [[0, 1, 1], [2, 0, 2]]
    assert coo.values.tolist() == [2.0, 1.0, 3.0]
    back = CSC.from_coo(coo)
    assert all(torch.equal(a, b) for a, b in zip(back.index, s.index))
    assert torch.equal(back.values, s.values) and torch.equal(back.mask, s.mask)


def test_csc_from_torch_matches_torch_conversion():
    mt, data, mask = make_masked((5, 4), torch.strided, seed=1)
    csc = mt.to_sparse_csc()
    ref = torch.where(mask, data, 0).to_sparse_csc()  # stores exactly the specified nonzeros
    got = csc.to_tensor(0)
    assert got.layout == torch.sparse_csc
    assert torch.equal(got.ccol_indices(), ref.ccol_indices())
    assert torch.equal(got.row_indices(), ref.row_indices())
    assert torch.equal(got.values(), ref.values())


def test_bsr_blocksize_is_a_conversion_option():
    mt, data, mask = make_masked((4, 6), torch.strided, seed=2)
    a = mt.to_sparse_bsr((2, 3))
    assert a.get_data().values().shape[1:] == (2, 3)
    assert a.to_sparse_bsr((2, 3)) is a  # same format: nothing to do
    assert ms.to_layout(a, torch.sparse_bsr) is a
    b = a.to_sparse_bsr((1, 2))  # re-blocking
    check_invariants(b, torch.sparse_bsr)
    assert b.get_data().values().shape[1:] == (1, 2)
    assert_masked_equal(b, data, mask)
    c = mt.to_sparse(layout=torch.sparse_bsr, blocksize=[2, 2])
    assert c.get_mask().values().shape[1:] == (2, 2)
    d = ms.to_layout(mt, "sparse_bsr", blocksize=(4, 6))
    assert d._storage.values.shape == (int(mask.any()), 4, 6)
    assert BSR.options_of(d._storage) == {"blocksize": (4, 6)}


def test_bsr_storage_matches_torch_blocks():
    mt, data, mask = make_masked((6, 4), torch.strided, seed=3, density=0.3)
    got = mt.to_sparse_bsr((3, 2)).to_tensor(0)
    # torch stores the blocks holding a nonzero; ours the blocks holding a specified element
    # (the data has no zero, so both are the same blocks).
    ref = torch.where(mask, data, 0).to_sparse_bsr((3, 2))
    assert got.layout == torch.sparse_bsr
    assert torch.equal(got.crow_indices(), ref.crow_indices())
    assert torch.equal(got.col_indices(), ref.col_indices())
    assert torch.equal(got.values(), ref.values())


@pytest.mark.parametrize("data_blocksize", [(1, 1), (2, 1), (4, 3), (2, 3)])
def test_bsr_mask_pattern_is_authoritative_across_blocksizes(data_blocksize):
    g = torch.Generator().manual_seed(4)
    data = torch.randn(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) < 0.4
    stored = mask.clone()
    stored[:2, :3] = True  # a stored block that is partly masked out
    t_mask = torch.sparse_coo_tensor(stored.nonzero().t(), mask[stored], (4, 6)).coalesce()
    t_mask = t_mask.to_sparse_bsr((2, 3))
    # The data stores other blocks (with other blocksizes): read it at the mask's elements.
    sparse_data = torch.where(torch.rand(4, 6, generator=g) < 0.7, data, 0)
    t_data = sparse_data.to_sparse_bsr(data_blocksize)
    mt = ms.masked_tensor(t_data, t_mask)
    check_invariants(mt, torch.sparse_bsr)
    assert mt._storage.values.shape[1:] == (2, 3)
    assert_masked_equal(mt, sparse_data, mask)


def test_bsr_options_errors():
    mt, _, _ = make_masked((4, 6), torch.strided, seed=5)
    default = ms.to_layout(mt, torch.sparse_bsr)  # Note [Default blocksize]
    assert default._storage.values.shape[1:] == (1, 1)
    assert_masked_equal(default, *make_masked((4, 6), torch.strided, seed=5)[1:])
    with pytest.raises(TypeError, match="pair of positive ints"):
        ms.to_layout(mt, torch.sparse_bsr, blocksize=3)
    with pytest.raises(TypeError, match="pair of positive ints"):
        ms.to_layout(mt, torch.sparse_bsr, blocksize=(0, 2))
    with pytest.raises(ValueError, match=r"not divisible by blocksize \(4, 4\)"):
        mt.to_sparse_bsr((4, 4))
    with pytest.raises(TypeError, match=r"to_layout\(sparse_csc\): unsupported conversion "
                                        r"options \['blocksize'\]"):
        ms.to_layout(mt, torch.sparse_csc, blocksize=(2, 2))
    with pytest.raises(ValueError, match="must be 2-D"):
        ms.to_layout(make_masked((2, 2, 2), torch.strided)[0], torch.sparse_bsr,
                     blocksize=(1, 1))
    with pytest.raises(ValueError, match="must be 2-D"):
        make_masked((2, 2, 2), torch.strided)[0].to_sparse_csc()
    with pytest.raises(NotImplementedError, match="no masked layout is registered for "
                                                  "torch.sparse_bsc"):
        mt.to_sparse_bsc((2, 2))


def test_validate_catches_broken_invariants():
    ones = torch.ones(2)
    unsorted = CSC.build((torch.tensor([0, 2]), torch.tensor([1, 0])), ones, _bool(1, 1), (2, 1))
    CSC.validate(unsorted)  # O(1) checks pass
    with pytest.raises(ValueError, match="sorted and distinct within each column"):
        CSC.validate(unsorted, full=True)
    with pytest.raises(ValueError, match="ccol_indices must start at 0"):
        CSC.validate(CSC.build((torch.tensor([0, 3]), torch.tensor([0, 1])), ones, _bool(1, 1),
                               (2, 1)), full=True)
    for row in (5, 2, -1):  # above, at and below the bounds
        with pytest.raises(ValueError, match="out of bounds"):
            CSC.validate(CSC.build((torch.tensor([0, 1]), torch.tensor([row])), torch.ones(1),
                                   _bool(1), (2, 1)), full=True)
    empty = CSC.build((torch.tensor([0, 0, 0]), torch.tensor([], dtype=torch.long)),
                      torch.ones(0), torch.zeros(0, dtype=torch.bool), (0, 2))
    CSC.validate(empty, full=True)  # no row index to be out of bounds of no rows
    with pytest.raises(ValueError, match="do not fit shape"):
        CSC.validate(CSC.build((torch.tensor([0, 1]), torch.tensor([0])), torch.ones(1),
                               _bool(1), (1, 3)))
    block = torch.ones(1, 2, 2)
    with pytest.raises(ValueError, match="not divisible by blocksize"):
        BSR.validate(BSR.build((torch.tensor([0, 1]), torch.tensor([0])), block,
                               block.bool(), (2, 3)))
    with pytest.raises(ValueError, match="values .* and mask"):
        BSR.validate(BSR.build((torch.tensor([0, 1]), torch.tensor([0])), block,
                               torch.ones(1, 2, 1, dtype=torch.bool), (2, 2)))
    with pytest.raises(ValueError, match="out of bounds"):
        BSR.validate(BSR.build((torch.tensor([0, 1]), torch.tensor([1])), block, block.bool(),
                               (2, 2)), full=True)
    twice = BSR.build((torch.tensor([0, 2]), torch.tensor([0, 0])), block.repeat(2, 1, 1),
                      block.repeat(2, 1, 1).bool(), (2, 4))
    with pytest.raises(ValueError, match="sorted and distinct within each block row"):
        BSR.validate(twice, full=True)


def test_bsr_binary_with_another_blocksize_is_refused_not_wrong():
    # Same specified set, different blocksizes: the formats differ, so the op refuses
    # (convert one operand with to_sparse_bsr) instead of guessing.
    mt, _, _ = make_masked((4, 6), torch.strided, seed=6)
    with pytest.raises(ValueError, match="add"):
        mt.to_sparse_bsr((2, 3)) + mt.to_sparse_bsr((1, 3))
    out = mt.to_sparse_bsr((2, 3)) + mt.to_sparse_bsr((1, 3)).to_sparse_bsr((2, 3))
    assert_masked_equal(out, mt.to_tensor(0) * 2, mt.get_mask())


@pytest.mark.parametrize("kind", ["csc", "bsr"])
def test_huge_matrix_never_densifies(kind):
    n, nnz = 100_000, 500
    g = torch.Generator().manual_seed(7)
    keys = torch.unique(torch.randint(0, n * n, (nnz,), generator=g))
    indices = torch.stack([keys // n, keys % n])
    data = torch.sparse_coo_tensor(indices, torch.rand(keys.numel(), generator=g) + 0.5,
                                   (n, n)).coalesce()
    mask = torch.sparse_coo_tensor(indices, torch.rand(keys.numel(), generator=g) > 0.2,
                                   (n, n)).coalesce()
    if kind == "csc":
        mt = ms.masked_tensor(data.to_sparse_csc(), mask.to_sparse_csc())
    else:
        mt = ms.masked_tensor(data.to_sparse_bsr((2, 4)), mask.to_sparse_bsr((2, 4)))
    # A dense (n, n) float tensor would need 40 GB: any densification fails loudly.
    out = (mt.exp() + mt) * torch.ones(n) / (mt + 1)
    assert out.to_tensor(0).layout == mt.layout
    specified = mask.values()
    ref = data.values()[specified]
    ref = (ref.exp() + ref) / (ref + 1)
    total = out.sum()
    torch.testing.assert_close(total.to_tensor(0), ref.sum())
    rows = out.sum(1)
    assert rows.layout == torch.sparse_coo
    torch.testing.assert_close(rows.to_tensor(0).coalesce().values().sum(), ref.sum())
