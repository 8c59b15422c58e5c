"""``torch.where`` on MaskedTensors in every layout, against the dense ``torch.where`` reference.

The reference applies ``torch.where`` separately to the dense data and to the dense masks
(``mask = where(cond, mask_a, mask_b)``); a plain operand takes the masked operand's mask.
Gradients are compared with plain autograd on the dense data, restricted to the positions
that receive a gradient (``mask_x & chosen``); the others must be masked out.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    cpu_only,
    dense_of,
    layout_params,
    make_masked,
)

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

SHAPE = (4, 5)


def same_pattern(mt: ms.MaskedTensor, data: torch.Tensor, mask: torch.Tensor,
                 requires_grad: bool = False) -> ms.MaskedTensor:
    """A MaskedTensor storing exactly ``mt``'s positions, with data and mask read from dense.

    Built from torch sparse tensors with *new* index tensors of equal contents.
    """
    if mt.layout == torch.strided:
        return ms.masked_tensor(data, mask, requires_grad=requires_grad)
    pattern = mt.get_mask()
    if mt.layout == torch.sparse_coo:
        idx = pattern.indices().clone()
        d = torch.sparse_coo_tensor(idx, data[tuple(idx)], mt.shape).coalesce()
        m = torch.sparse_coo_tensor(idx, mask[tuple(idx)], mt.shape).coalesce()
    else:
        crow, col = pattern.crow_indices().clone(), pattern.col_indices().clone()
        rows = torch.repeat_interleave(torch.arange(mt.shape[0]), crow.diff())
        d = torch.sparse_csr_tensor(crow, col, data[rows, col], mt.shape)
        m = torch.sparse_csr_tensor(crow, col, mask[rows, col], mt.shape)
    return ms.masked_tensor(d, m, requires_grad=requires_grad)


def stored_of(mt: ms.MaskedTensor) -> torch.Tensor:
    """Dense bool: the positions ``mt`` stores (all of them for strided)."""
    s = mt._storage
    return s.densify(torch.ones_like(s.mask), False)


def operands(layout, seed=0, requires_grad=False):
    """Two masked operands with one index pattern and different masks, plus references."""
    a, da, ma = make_masked(SHAPE, layout, torch.float64, seed=seed, stored_masked=0.4)
    g = torch.Generator().manual_seed(seed + 100)
    db = torch.rand(SHAPE, generator=g, dtype=torch.float64) + 2
    mb = (torch.rand(SHAPE, generator=g) < 0.6) & stored_of(a)
    b = same_pattern(a, db, mb, requires_grad)
    if requires_grad:
        a = same_pattern(a, da, ma, requires_grad)
    cond = torch.rand(SHAPE, generator=g) < 0.5
    return a, da, ma, b, db, mb, cond


@layout_params()
def test_masked_masked(layout):
    a, da, ma, b, db, mb, cond = operands(layout)
    out = torch.where(cond, a, b)
    check_invariants(out, layout)
    assert_masked_equal(out, torch.where(cond, da, db), torch.where(cond, ma, mb))
    # The result keeps the first operand's index tensors (the same objects).
    assert all(p is q for p, q in zip(out._storage.index, a._storage.index))
    assert_masked_equal(a.where(cond, b), torch.where(cond, da, db), torch.where(cond, ma, mb))


@pytest.mark.parametrize("side", ["plain_other", "plain_input", "scalar_other",
                                  "scalar_input", "broadcast_other", "zero_dim_other"])
@layout_params()
def test_plain_operand_takes_the_mask(side, layout):
    a, da, ma, _, db, _, cond = operands(layout, seed=1)
    other = {"plain_other": db, "plain_input": db, "scalar_other": -1.5,
             "scalar_input": -1.5, "broadcast_other": db[0], "zero_dim_other": db[0, 0]}[side]
    if side.endswith("input"):
        out, ref = torch.where(cond, other, a), torch.where(cond, other, da)
    else:
        out, ref = torch.where(cond, a, other), torch.where(cond, da, other)
    check_invariants(out, layout)
    assert_masked_equal(out, ref, ma)


@layout_params()
def test_broadcast_condition(layout):
    a, da, ma, b, db, mb, _ = operands(layout, seed=2)
    cond = torch.tensor([True, False, True, True, False])
    assert_masked_equal(torch.where(cond, a, b), torch.where(cond, da, db),
                        torch.where(cond, ma, mb))
    assert_masked_equal(torch.where(torch.tensor(False), a, b), db, mb)


@layout_params()
def test_masked_condition(layout):
    a, da, ma, b, db, mb, cond = operands(layout, seed=3)
    g = torch.Generator().manual_seed(7)
    cmask = (torch.rand(SHAPE, generator=g) < 0.7) & stored_of(a)
    mcond = same_pattern(a, cond, cmask)
    out = torch.where(mcond, a, b)
    check_invariants(out, layout)
    # Where the condition itself is unspecified, the result is unspecified.
    assert_masked_equal(out, torch.where(cond, da, db), torch.where(cond, ma, mb) & cmask)
    out = torch.where(mcond, 1.0, 0.0)  # only the condition is masked
    assert_masked_equal(out, torch.where(cond, 1.0, 0.0), cmask)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_sparse_plain_condition(layout):
    # A sparse bool condition (e.g. another tensor's get_mask()) is read at the stored
    # positions; positions it does not store read as False.
    a, da, ma, b, db, mb, _ = operands(layout, seed=4)
    out = torch.where(a.get_mask(), a, b)
    check_invariants(out, layout)
    assert_masked_equal(out, torch.where(ma, da, db), torch.where(ma, ma, mb))
    other = ms.masked_tensor(torch.eye(4, 5), torch.eye(4, 5).bool()).to_sparse_coo()
    cond = other.get_mask() if layout == torch.sparse_coo else other.get_mask().to_sparse_csr()
    eye = torch.eye(4, 5).bool()
    assert_masked_equal(torch.where(cond, a, b), torch.where(eye, da, db),
                        torch.where(eye, ma, mb))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@layout_params()
def test_dtypes_promote_like_torch(dtype, layout):
    a, da, ma = make_masked(SHAPE, layout, dtype, seed=5)
    cond = da != 0 if dtype != torch.bool else da
    out = torch.where(cond, a, 2.5)
    ref = torch.where(cond, da, 2.5)
    assert out.dtype == ref.dtype
    assert_masked_equal(out, ref, ma)


@layout_params()
def test_aten_where_self_forward(layout):
    # The overload that backward formulas (clamp, ...) call from C++.
    a, da, ma, b, db, mb, cond = operands(layout, seed=6)
    out = torch.ops.aten.where.self(cond, a, b)
    assert_masked_equal(out, torch.where(cond, da, db), torch.where(cond, ma, mb))
    out = torch.ops.aten.where.self(cond, a, torch.zeros((), dtype=torch.float64))
    assert_masked_equal(out, torch.where(cond, da, 0.0), ma)


@layout_params()
def test_where_inside_a_backward_formula(layout):
    # clamp's derivative is where(lo <= x <= hi, grad, 0): masks must survive it.
    x, dx, mx = make_masked(SHAPE, layout, torch.float64, seed=7)
    x = same_pattern(x, dx, mx, requires_grad=True)
    out = x.clamp(-0.5, 0.5).to_tensor(0)
    out = out if layout == torch.strided else out.to_dense()
    out.sum().backward()
    ref = dx.clone().requires_grad_()
    torch.where(mx, ref.clamp(-0.5, 0.5), 0).sum().backward()
    assert x.grad.layout == layout
    assert_masked_equal(x.grad, ref.grad, mx)


# -- gradients -----------------------------------------------------------------------------
@layout_params()
def test_gradients_reach_only_chosen_specified_entries(layout):
    a, da, ma, b, db, mb, cond = operands(layout, seed=8, requires_grad=True)
    out = torch.where(cond, a.exp(), b * 3)
    w = torch.arange(20, dtype=torch.float64).reshape(SHAPE)
    loss = (out * w).to_tensor(0)
    (loss if layout == torch.strided else loss.to_dense()).sum().backward()
    # Plain autograd on the same data gives the values; the masks are hand-derived.
    pa, pb = da.clone().requires_grad_(), db.clone().requires_grad_()
    (torch.where(cond, pa.exp(), pb * 3) * w).sum().backward()
    for x, ref, mask in [(a, pa.grad, ma & cond), (b, pb.grad, mb & ~cond)]:
        assert isinstance(x.grad, ms.MaskedTensor)
        assert x.grad.layout == layout
        check_invariants(x.grad, layout)
        assert_masked_equal(x.grad, ref, mask)
        assert all(p is q for p, q in zip(x.grad._storage.index, x._storage.index))


@layout_params()
def test_gradient_of_plain_operand_is_plain(layout):
    # Note [Plain operands get plain gradients]: 1 where t was chosen at a specified
    # element, 0 elsewhere.
    a, da, ma, _, db, _, cond = operands(layout, seed=9, requires_grad=True)
    t = db.clone().requires_grad_()
    out = torch.where(cond, a, t).to_tensor(0)
    (out if layout == torch.strided else out.to_dense()).sum().backward()
    assert type(t.grad) is torch.Tensor
    torch.testing.assert_close(t.grad, (ma & ~cond).double())
    assert_masked_equal(a.grad, torch.ones(SHAPE, dtype=torch.float64), ma & cond)


@layout_params()
def test_same_input_in_both_branches_accumulates(layout):
    # where(c, f(x), g(x)): the two narrowed gradients of x are summed (union of masks).
    x, dx, mx = make_masked(SHAPE, layout, torch.float64, seed=10)
    x = same_pattern(x, dx, mx, requires_grad=True)
    cond = dx > 0
    out = torch.where(cond, x.exp(), x * x).to_tensor(0)
    (out if layout == torch.strided else out.to_dense()).sum().backward()
    ref = dx.clone().requires_grad_()
    torch.where(cond, ref.exp(), ref * ref).sum().backward()
    assert x.grad.layout == layout
    assert_masked_equal(x.grad, ref.grad, mx)


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_sparse_operands_must_share_the_index_pattern(layout):
    a, _, _ = make_masked(SHAPE, layout, seed=11, stored_masked=0.0, density=0.5)
    b, _, _ = make_masked(SHAPE, layout, seed=12, stored_masked=0.0, density=0.5)
    with pytest.raises(ValueError, match="where: .*must store the same positions"):
        torch.where(torch.ones(SHAPE, dtype=torch.bool), a, b)


@layout_params()
def test_bad_arguments(layout):
    a, _, _ = make_masked(SHAPE, layout, seed=13)
    with pytest.raises(TypeError, match="where: condition must have dtype torch.bool"):
        torch.where(torch.ones(SHAPE), a, 0.0)
    with pytest.raises(ValueError, match="where: .*must broadcast"):
        torch.where(torch.ones(3, 3, dtype=torch.bool), a, 0.0)
    c, _, _ = make_masked((4, 4), layout, seed=14)
    with pytest.raises(ValueError, match="where: .*same shape"):
        torch.where(torch.ones(4, 4, dtype=torch.bool), c, a)
    with pytest.raises(NotImplementedError, match=r"MaskedTensor\[.*\] where\(condition\)"):
        torch.where(a > 0)


@cpu_only("numpy.ma reference through .numpy()")
def test_dense_of_where_matches_numpy_ma():
    np = pytest.importorskip("numpy")
    a, da, ma, b, db, mb, cond = operands(torch.strided, seed=15)
    na = np.ma.masked_array(da.numpy(), ~ma.numpy())
    nb = np.ma.masked_array(db.numpy(), ~mb.numpy())
    ref = np.ma.where(cond.numpy(), na, nb)
    data, mask = dense_of(torch.where(cond, a, b))
    assert (mask.numpy() == ~np.ma.getmaskarray(ref)).all()
    assert np.allclose(data.numpy()[mask.numpy()], ref.compressed())
