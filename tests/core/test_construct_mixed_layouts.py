"""``ms.masked_tensor`` / ``ms.as_masked_tensor`` with data and mask of different layouts:
the data is read at the mask's stored positions and the result has the mask's layout and
index (Note [The mask's layout wins]); and every layout-mismatch error's suggested fix runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import masked_sparse as ms

SPARSE = {
    "coo": lambda t: t.to_sparse_coo(),
    "csr": lambda t: t.to_sparse_csr(),
    "csc": lambda t: t.to_sparse_csc(),
    "bsr": lambda t: t.to_sparse_bsr((2, 1)),
}
# The index tensors of a torch sparse tensor, by layout.
INDEX = {
    torch.sparse_coo: lambda t: (t._indices(),),
    torch.sparse_csr: lambda t: (t.crow_indices(), t.col_indices()),
    torch.sparse_csc: lambda t: (t.ccol_indices(), t.row_indices()),
    torch.sparse_bsr: lambda t: (t.crow_indices(), t.col_indices()),
}


def _data_and_mask(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(6, 4, generator=g, dtype=torch.float64).to(dtype)
    mask = torch.rand(6, 4, generator=g) < 0.5
    mask[1] = False  # a fully unspecified row
    return data, mask


def _dense(mt):
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def _sparse_mask(name, mask):
    """``mask`` in a sparse layout, with some stored False entries (stored, unspecified)."""
    sparse = SPARSE[name](mask)
    if name == "coo":  # store a False too: the mask's pattern, not its True set, is read
        extra = torch.zeros_like(mask)
        extra[0, 0] = True
        stored = mask | extra
        idx = stored.nonzero().t()
        sparse = torch.sparse_coo_tensor(idx, mask[stored], mask.shape).coalesce()
    return sparse


@pytest.mark.parametrize("build", ["masked_tensor", "as_masked_tensor"])
@pytest.mark.parametrize("mask_layout", list(SPARSE))
def test_dense_data_at_a_sparse_mask(mask_layout, build):
    data, mask = _data_and_mask()
    sparse_mask = _sparse_mask(mask_layout, mask)
    mt = getattr(ms, build)(data, sparse_mask)
    assert isinstance(mt, ms.MaskedTensor)
    assert mt.layout == sparse_mask.layout
    mt.validate(full=True)
    got, got_mask = _dense(mt)
    assert torch.equal(got_mask, mask)
    assert torch.equal(torch.where(mask, got, 0), torch.where(mask, data, 0))
    # the mask's index tensors, not copies of them (the same memory)
    ours, theirs = mt._storage.index, INDEX[sparse_mask.layout](sparse_mask)
    assert [t.data_ptr() for t in ours] == [t.data_ptr() for t in theirs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_layout", list(SPARSE))
def test_as_masked_tensor_gives_the_dense_data_a_plain_gradient(mask_layout, dtype):
    data, mask = _data_and_mask(1, dtype)
    u = data.clone().requires_grad_()
    ref_u = data.clone().requires_grad_()
    weights = torch.randn(6, 4, dtype=dtype)
    mt = ms.as_masked_tensor(u * 3, _sparse_mask(mask_layout, mask))
    (mt * weights).sum().backward()
    torch.where(mask, ref_u * 3, 0).mul(weights).sum().backward()
    assert type(u.grad) is torch.Tensor and u.grad.layout == torch.strided
    torch.testing.assert_close(u.grad, ref_u.grad)


def test_the_motivating_case_product_at_a_ratings_pattern():
    g = torch.Generator().manual_seed(2)
    ratings = ms.masked_tensor(torch.randn(8, 5, generator=g),
                               torch.rand(8, 5, generator=g) < 0.4).to_sparse_csr()
    u = torch.randn(8, 3, generator=g, requires_grad=True)
    v = torch.randn(5, 3, generator=g, requires_grad=True)
    pred = ms.as_masked_tensor(u @ v.T, ratings.get_mask())
    assert pred.layout == torch.sparse_csr
    loss = F.mse_loss(pred, ratings)
    loss.backward()
    mask = ratings.get_mask().to_dense()
    u2, v2 = (t.detach().clone().requires_grad_() for t in (u, v))
    ref = torch.where(mask, (u2 @ v2.T - ratings.to_dense().get_data()) ** 2, 0)
    (ref.sum() / mask.sum()).backward()
    torch.testing.assert_close(loss.item(), (ref.sum() / mask.sum()).item())
    torch.testing.assert_close(u.grad, u2.grad)
    torch.testing.assert_close(v.grad, v2.grad)


@pytest.mark.parametrize("data_layout", list(SPARSE))
def test_sparse_data_at_a_strided_mask_is_strided(data_layout):
    data, mask = _data_and_mask(3)
    stored = data * (torch.rand(6, 4, generator=torch.Generator().manual_seed(4)) < 0.7)
    sparse_data = SPARSE[data_layout](stored)
    for build in (ms.masked_tensor, ms.as_masked_tensor):
        mt = build(sparse_data, mask)
        assert mt.layout == torch.strided
        got, got_mask = _dense(mt)
        assert torch.equal(got_mask, mask)
        assert torch.equal(torch.where(mask, got, 0), torch.where(mask, stored, 0))


@pytest.mark.parametrize("data_layout", ["coo", "csr"])  # torch's autograd has these leaves
def test_sparse_data_gets_a_gradient_of_its_own_layout(data_layout):
    data, mask = _data_and_mask(5)
    sparse_data = SPARSE[data_layout](data).requires_grad_()
    for mask_like in (mask, mask.to_sparse_coo(), mask.to_sparse_csr()):
        sparse_data.grad = None
        mt = ms.as_masked_tensor(sparse_data, mask_like)
        assert mt.layout == mask_like.layout
        (mt * 2).sum().backward()
        assert sparse_data.grad.layout == sparse_data.layout
        assert torch.equal(sparse_data.grad.to_dense(), torch.where(mask, 2.0, 0.0).double())


@pytest.mark.parametrize("mask_layout", ["coo", "csr", "csc", "bsr"])
@pytest.mark.parametrize("data_layout", list(SPARSE))
def test_sparse_data_at_a_sparse_mask_of_another_layout(data_layout, mask_layout):
    if data_layout == mask_layout:
        pytest.skip("same layout: the ordinary route")
    data, mask = _data_and_mask(6)
    stored = data * (torch.rand(6, 4, generator=torch.Generator().manual_seed(7)) < 0.7)
    mt = ms.masked_tensor(SPARSE[data_layout](stored), SPARSE[mask_layout](mask))
    assert mt.layout == SPARSE[mask_layout](mask).layout
    got, got_mask = _dense(mt)
    assert torch.equal(got_mask, mask)
    assert torch.equal(torch.where(mask, got, 0), torch.where(mask, stored, 0))


def test_mixed_layouts_keep_the_other_checks():
    data, mask = _data_and_mask()
    with pytest.raises(ValueError, match="must have the same shape"):
        ms.masked_tensor(data[:3], mask.to_sparse_csr())
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        ms.masked_tensor(data, data.to_sparse_csr())
    with pytest.raises(NotImplementedError, match="no masked layout is registered"):
        ms.masked_tensor(data, mask.to_sparse_bsc((1, 1)))


# -- the fixes that layout-mismatch errors suggest run -----------------------------------------
def test_unregistered_layout_error_fix_runs():
    data = torch.eye(2).to_sparse_bsc((1, 1))
    with pytest.raises(NotImplementedError, match=r"\.to_sparse_coo\(\)") as err:
        ms.masked_tensor(data, data.bool())
    assert ".to_dense()" in str(err.value)
    mt = ms.masked_tensor(data.to_sparse_coo(), data.bool().to_sparse_coo())  # the fix
    assert torch.equal(mt.to_tensor(0).to_dense(), torch.eye(2))
    mt = ms.masked_tensor(data.to_dense(), data.bool().to_dense())  # the other one
    assert torch.equal(mt.to_tensor(0), torch.eye(2))


def test_masked_operands_of_two_layouts_error_fix_runs():
    data, mask = _data_and_mask(8)
    a = ms.masked_tensor(data, mask).to_sparse_csr()
    b = ms.masked_tensor(data * 2, mask).to_sparse_coo()
    with pytest.raises(ValueError, match=r"same shape and layout.*\.to_dense\(\) / "
                                         r"\.to_sparse_coo\(\)"):
        a + b
    for fix in (lambda: a.to_dense() + b.to_dense(),
                lambda: a.to_sparse_coo() + b.to_sparse_coo()):
        got, got_mask = _dense(fix())
        assert torch.equal(got_mask, mask)
        torch.testing.assert_close(torch.where(mask, got, 0), torch.where(mask, data * 3, 0))
    with pytest.raises(ValueError, match=r"same shape and layout"):
        F.mse_loss(a, b)  # the losses take the same rule
    assert F.mse_loss(a.to_sparse_coo(), b.to_sparse_coo()).get_mask()


@pytest.mark.parametrize("plain_layout", ["coo", "csr"])
@pytest.mark.parametrize("masked_layout", ["strided", "coo", "csr"])
def test_plain_sparse_operand_error_fixes_run(masked_layout, plain_layout):
    data, mask = _data_and_mask(9)
    mt = ms.masked_tensor(data, mask)
    mt = mt if masked_layout == "strided" else ms.to_layout(mt, masked_layout)
    t = SPARSE[plain_layout](data * 2)
    with pytest.raises(NotImplementedError,
                       match=r"wrap it with masked_tensor\(t, mask\) or pass t\.to_dense\(\)"):
        mt + t
    expected = torch.where(mask, data * 3, 0)
    for other in (ms.masked_tensor(t, mt.get_mask()), t.to_dense()):  # the two fixes
        got, got_mask = _dense(mt + other)
        assert torch.equal(got_mask, mask)
        torch.testing.assert_close(torch.where(mask, got, 0), expected)


def test_plain_sparse_factor_error_fix_runs():
    data, mask = _data_and_mask(10)
    mt = ms.masked_tensor(data, mask)
    t = torch.eye(4, dtype=torch.float64).to_sparse_csr()
    with pytest.raises(NotImplementedError, match=r"pass t\.to_dense\(\)"):
        mt @ t
    got, _ = _dense(mt @ t.to_dense())
    torch.testing.assert_close(torch.where(mask, got, 0), torch.where(mask, data, 0))
    masked_t = ms.masked_tensor(t, t.bool())  # the other fix: a masked factor
    assert (mt @ masked_t).shape == (6, 4)


def test_joining_and_where_layout_error_fixes_run():
    data, mask = _data_and_mask(12)
    a = ms.masked_tensor(data, mask).to_sparse_csr()
    b = ms.masked_tensor(data * 2, mask).to_sparse_coo()
    with pytest.raises(ValueError, match=r"share one layout.*\.to_dense\(\) / \.to_sparse_coo"):
        torch.cat([a, b])
    for fix in (lambda: torch.cat([a.to_dense(), b.to_dense()]),
                lambda: torch.cat([a.to_sparse_coo(), b.to_sparse_coo()])):
        got, got_mask = _dense(fix())
        assert torch.equal(got_mask, torch.cat([mask, mask]))
        assert torch.equal(torch.where(got_mask, got, 0),
                           torch.where(torch.cat([mask, mask]), torch.cat([data, data * 2]), 0))
    cond = torch.rand(6, 4, generator=torch.Generator().manual_seed(13)) < 0.5
    with pytest.raises(ValueError, match=r"same shape and layout.*\.to_dense\(\) / "
                                         r"\.to_sparse_coo"):
        torch.where(cond, a, b)
    got, got_mask = _dense(torch.where(cond, a.to_dense(), b.to_dense()))  # the fix
    assert torch.equal(got_mask, mask)
    assert torch.equal(torch.where(mask, got, 0),
                       torch.where(mask, torch.where(cond, data, data * 2), 0))
    got, got_mask = _dense(torch.where(cond.to_sparse_coo(), a.to_sparse_coo(),
                                       b.to_sparse_coo()))  # the other fix
    assert torch.equal(got_mask, mask)
