"""``F.embedding`` / ``F.embedding_bag`` with a MaskedTensor of ids, on
every layout, against torch's own ops on the flat specified ids: ``F.embedding_bag(flat_ids,
weight, offsets)`` and ``F.embedding`` of the specified ids, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import dense_of

import masked_sparse as ms

LAYOUTS = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
ROWS, DIM = 12, 5


def ids_of(layout, seed=0, shape=(4, 6)):
    """Masked ids with one empty bag (row 1); unspecified ids are -1 (out of range)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(ROWS, shape, generator=g)
    mask = torch.rand(shape, generator=g) < 0.6
    mask[1] = False
    mask[0, 0] = True
    data = torch.where(mask, ids, -1)
    mt = ms.masked_tensor(data, mask)
    if layout != "strided":
        mt = ms.to_layout(mt.to_sparse_coo(), layout)
    return mt, ids, mask


def reference_bags(ids, mask):
    """torch's inputs for the same bags: flat specified ids (row-major) and offsets."""
    counts = mask.sum(1)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
    return ids[mask], offsets


def weight_of(dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(ROWS, DIM, generator=g, dtype=dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_bag_matches_torch_on_the_flat_ids(layout, mode, dtype):
    mt, ids, mask = ids_of(layout)
    w = weight_of(dtype).requires_grad_()
    w_ref = w.detach().clone().requires_grad_()
    out = F.embedding_bag(mt, w, mode=mode)
    flat, offsets = reference_bags(ids, mask)
    ref = F.embedding_bag(flat, w_ref, offsets, mode=mode)
    assert type(out) is torch.Tensor and out.shape == (4, DIM)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.equal(out[1], torch.zeros(DIM, dtype=dtype))  # the empty bag: torch's zeros
    g = torch.randn(4, DIM, dtype=dtype, generator=torch.Generator().manual_seed(2))
    (out * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo", "sparse_csr"])
def test_embedding_bag_sparse_gradient_and_per_sample_weights(layout):
    mt, ids, mask = ids_of(layout, seed=3)
    psw = torch.rand(ids.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    w = weight_of().requires_grad_()
    w_ref = w.detach().clone().requires_grad_()
    out = F.embedding_bag(mt, w, mode="sum", sparse=True, per_sample_weights=psw)
    flat, offsets = reference_bags(ids, mask)
    ref = F.embedding_bag(flat, w_ref, offsets, mode="sum", sparse=True,
                          per_sample_weights=psw[mask])
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out.sum().backward()
    ref.sum().backward()
    assert w.grad.layout == torch.sparse_coo
    assert w.grad._nnz() == int(mask.sum())  # one gradient row per specified id, no more
    torch.testing.assert_close(w.grad.to_dense(), w_ref.grad.to_dense(), rtol=0, atol=0)


def test_embedding_bag_through_nn_embedding_bag():
    mt, ids, mask = ids_of("sparse_csr", seed=5)
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="mean", dtype=torch.float64)
    flat, offsets = reference_bags(ids, mask)
    torch.testing.assert_close(bag(mt), bag(flat, offsets), rtol=0, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_embedding_values_mask_and_gradient(layout):
    mt, ids, mask = ids_of(layout, seed=6)
    w = weight_of().requires_grad_()
    out = F.embedding(mt, w)
    assert isinstance(out, ms.MaskedTensor) and out.shape == (4, 6, DIM)
    data, got_mask = dense_of(out)
    assert torch.equal(got_mask, mask[..., None].expand(4, 6, DIM))
    ref = F.embedding(torch.where(mask, ids, 0), w.detach())
    torch.testing.assert_close(torch.where(got_mask, data, 0),
                               torch.where(got_mask, ref, 0), rtol=0, atol=0)
    if layout == "strided":
        assert out.layout == torch.strided
    else:  # hybrid COO: one stored row per specified id, none for the others
        assert out.layout == torch.sparse_coo
        s = out._storage
        assert s.values.shape == (int(mask.sum()), DIM)
        assert torch.equal(s.index[0], mask.nonzero().t())
    g = torch.randn(4, 6, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    (out.to_dense().to_tensor(0) * g).sum().backward()
    w_ref = w.detach().clone().requires_grad_()
    (F.embedding(ids[mask], w_ref) * g[mask]).sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad)


@pytest.mark.parametrize("layout", ["strided", "sparse_coo"])
def test_embedding_options_see_only_specified_ids(layout):
    # max_norm renormalizes only the rows looked up by specified ids; scale_grad_by_freq
    # counts only specified ids; padding_idx keeps its row's gradient at 0.
    mt, ids, mask = ids_of(layout, seed=8)
    w = weight_of() * 5
    w_ref = w.clone()
    F.embedding(mt, w, max_norm=1.0)
    F.embedding(ids[mask], w_ref, max_norm=1.0)
    assert torch.equal(w, w_ref)
    w = weight_of().requires_grad_()
    w_ref = w.detach().clone().requires_grad_()
    pad = int(ids[mask][0])
    out = F.embedding(mt, w, scale_grad_by_freq=True, padding_idx=pad)
    out.sum().backward()
    F.embedding(ids[mask], w_ref, scale_grad_by_freq=True, padding_idx=pad
                ).sum().backward()
    torch.testing.assert_close(w.grad.to_dense(), w_ref.grad.to_dense())


def test_embedding_under_nn_embedding_trains_with_ms_optim():
    mt, ids, mask = ids_of("strided", seed=9)
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True, dtype=torch.float64)
    ref = torch.nn.Embedding(ROWS, DIM, sparse=True, dtype=torch.float64)
    ref.weight.data.copy_(emb.weight.data)
    opt, opt_ref = ms.optim.SGD(emb.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(),
                                                                             lr=0.1)
    flat, offsets = reference_bags(ids, mask)
    for _ in range(3):
        opt.zero_grad()
        opt_ref.zero_grad()
        (emb(mt).sum(1) ** 2).sum().backward()
        (F.embedding_bag(flat, ref.weight, offsets, mode="sum", sparse=True) ** 2
         ).sum().backward()
        opt.step()
        opt_ref.step()
    torch.testing.assert_close(emb.weight, ref.weight)


def test_errors_name_the_op_and_the_fix():
    mt, _, _ = ids_of("strided")
    w = weight_of()
    with pytest.raises(ValueError, match="embedding_bag: .*offsets come from the mask"):
        F.embedding_bag(mt, w, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="embedding_bag: masked ids must be 2-D"):
        F.embedding_bag(mt.unsqueeze(0), w)
    with pytest.raises(TypeError, match="embedding: expected integer ids"):
        F.embedding(mt.double(), w)
    with pytest.raises(TypeError, match="embedding: the weight must be a plain tensor"):
        F.embedding(mt, ms.masked_tensor(w, torch.ones_like(w, dtype=torch.bool)))


@pytest.mark.parametrize("layout", ["strided", "sparse_csr"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_padding_idx_like_torch(layout, mode):
    mt, ids, mask = ids_of(layout, seed=10)
    w = weight_of()
    flat, offsets = reference_bags(ids, mask)
    for pad in (int(flat[0]), int(flat[0]) - ROWS):
        torch.testing.assert_close(F.embedding_bag(mt, w, mode=mode, padding_idx=pad),
                                   F.embedding_bag(flat, w, offsets, mode=mode, padding_idx=pad),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("all_specified", [False, True])
def test_stored_unspecified_ids_take_no_part(layout, all_specified):
    from conftest import make_masked

    _, ids, mask = ids_of("strided", seed=11)
    data = torch.where(mask, ids, -1)  # a stored unspecified id is out of range
    mt, _, _ = make_masked(ids.shape, layout, torch.int64, data=data, mask=mask,
                           stored_masked=0.0 if all_specified else 0.5, seed=12)
    s = mt._storage
    assert bool(s.mask.all()) == all_specified
    w = weight_of()
    flat, offsets = reference_bags(ids, mask)
    torch.testing.assert_close(F.embedding_bag(mt, w, mode="mean"),
                               F.embedding_bag(flat, w, offsets, mode="mean"), rtol=0, atol=0)
    out = F.embedding(mt, w)
    assert out._storage.values.shape == (int(mask.sum()), DIM)
    torch.testing.assert_close(dense_of(out)[0][mask], F.embedding(flat, w), rtol=0, atol=0)
