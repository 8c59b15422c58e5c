"""Multi-head attention over one index: a hybrid COO masked tensor (N, N, H), values
(nnz, H), through broadcast scores, an activation, the softmax over each row's neighbours
and the per-head product ``einsum("ijh,jhf->ihf")`` (Note [One index for every head] in
``masked_sparse/ops/einsum.py``), forward and gradients, against the same computation on
dense tensors with ``torch.where`` (the unspecified entries left out), a loop over heads of
the 2-D masked computation, and refusals with the way out.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import masked_sparse as ms

N, F_OUT = 6, 3
DTYPES = [torch.float32, torch.float64]


def graph(heads: int, dtype: torch.dtype, seed: int = 0):
    """Edges (a random pattern with self-loops, node 5 isolated: no edge at all) and a
    per-head mask over them (some stored entries unspecified for some heads; row 4's
    entries all unspecified for head 0)."""
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(N, N, generator=g) < 0.4
    adj |= torch.eye(N, dtype=torch.bool)
    adj[5] = False
    index = adj.nonzero().T
    values = torch.randn(index.shape[1], heads, generator=g, dtype=dtype)
    mask = torch.rand(index.shape[1], heads, generator=g) < 0.8
    mask[index[0] == 4, 0] = False
    return index, values, mask


def hybrid(index, values, mask, requires_grad=False):
    shape = (N, N) + tuple(values.shape[1:])
    data = torch.sparse_coo_tensor(index, values, shape, check_invariants=True).coalesce()
    mt = ms.masked_tensor(data, torch.sparse_coo_tensor(index, mask, shape).coalesce())
    return mt.requires_grad_(requires_grad)


def dense(index, values, mask):
    """The (N, N, H) dense data (0 off the pattern) and mask (False off the pattern)."""
    shape = (N, N) + tuple(values.shape[1:])
    data = torch.zeros(shape, dtype=values.dtype).index_put((index[0], index[1]), values)
    full = torch.zeros(shape, dtype=torch.bool).index_put((index[0], index[1]), mask)
    return data, full


def reference(data, mask, d, s, x):
    """scores = data + d + s where specified; softmax over j of the specified scores (0 where
    none); out[i, h] = sum_j p[i, j, h] x[j, h]; the rows with no specified entry: out 0."""
    scores = torch.where(mask, data + d + s, -torch.inf)
    p = torch.where(mask, scores.softmax(1), 0)
    out = torch.einsum("ijh,jhf->ihf", p, x)
    specified = mask.any(1)
    return p, torch.where(specified[:, :, None], out, 0), specified


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [1, 4])
def test_attention_step_matches_the_dense_reference(heads, dtype):
    index, values, mask = graph(heads, dtype)
    g = torch.Generator().manual_seed(1)
    d0 = torch.randn(N, 1, heads, generator=g, dtype=dtype)
    s0 = torch.randn(1, N, heads, generator=g, dtype=dtype)
    x0 = torch.randn(N, heads, F_OUT, generator=g, dtype=dtype)
    weights = torch.randn(N, heads, F_OUT, generator=g, dtype=dtype)

    a = hybrid(index, values, mask, requires_grad=True)
    d, s, x = (t.clone().requires_grad_() for t in (d0, s0, x0))
    p = (a + d + s).softmax(1)
    out = torch.einsum("ijh,jhf->ihf", p, x)
    (out.to_tensor(0) * weights).sum().backward()

    data, full = dense(index, values, mask)
    data.requires_grad_()
    rd, rs, rx = (t.clone().requires_grad_() for t in (d0, s0, x0))
    ref_p, ref_out, specified = reference(data, full, rd, rs, rx)
    (ref_out * weights).sum().backward()

    assert out.layout == torch.strided and out.shape == (N, heads, F_OUT)
    assert torch.equal(out.get_mask(), specified[:, :, None].expand(N, heads, F_OUT))
    torch.testing.assert_close(out.to_tensor(0), ref_out)
    assert p.layout == torch.sparse_coo
    torch.testing.assert_close(p.to_tensor(0).to_dense(), ref_p)
    # gradients: the plain features and the masked values (read at the stored entries)
    torch.testing.assert_close(x.grad, rx.grad)
    assert isinstance(a.grad, ms.MaskedTensor) and a.grad.layout == torch.sparse_coo
    assert torch.equal(a.grad.get_mask().to_dense(), full)
    torch.testing.assert_close(a.grad.to_tensor(0).to_dense(), torch.where(full, data.grad, 0))
    for mine, ref in ((d.grad, rd.grad), (s.grad, rs.grad)):
        mine = mine.to_tensor(0) if isinstance(mine, ms.MaskedTensor) else mine
        torch.testing.assert_close(mine.to_dense() if mine.is_sparse else mine, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_head_is_the_two_dimensional_product(dtype):
    index, values, mask = graph(3, dtype, seed=2)
    x = torch.randn(N, 3, F_OUT, dtype=dtype)
    out = torch.einsum("ijh,jhf->ihf", hybrid(index, values, mask), x)
    for h in range(3):
        two_d = ms.masked_tensor(
            torch.sparse_coo_tensor(index, values[:, h], (N, N), check_invariants=True),
            torch.sparse_coo_tensor(index, mask[:, h], (N, N))).to_sparse_csr()
        per_head = two_d @ x[:, h]
        torch.testing.assert_close(out[:, h].to_tensor(0), per_head.to_tensor(0))
        assert torch.equal(out[:, h].get_mask(), per_head.get_mask())


def test_transposed_contraction_and_output_order():
    """Summing over the first sparse dim (``A.T @ x`` per head) and a permuted output."""
    index, values, mask = graph(2, torch.float64, seed=3)
    x = torch.randn(N, 2, F_OUT, dtype=torch.float64)
    a = hybrid(index, values, mask)
    data, full = dense(index, values, mask)
    ref = torch.einsum("ijh,ihf->jhf", torch.where(full, data, 0), x)
    got = torch.einsum("ijh,ihf->hjf", a, x)
    torch.testing.assert_close(got.to_tensor(0), ref.permute(1, 0, 2)
                               * full.any(0).T[:, :, None])
    torch.testing.assert_close(torch.einsum("jhf,ijh->ihf", x, a).to_tensor(0),
                               torch.einsum("ijh,jhf->ihf", a, x).to_tensor(0))


def test_reductions_keep_the_heads():
    """A masked sum over the neighbour dim of a hybrid tensor keeps the head dim."""
    index, values, mask = graph(2, torch.float64, seed=4)
    a = hybrid(index, values, mask)
    data, full = dense(index, values, mask)
    got = a.sum(1)
    torch.testing.assert_close(got.to_tensor(0).to_dense() if got.to_tensor(0).is_sparse
                               else got.to_tensor(0), torch.where(full, data, 0).sum(1))


def test_unsupported_forms_say_the_way_out():
    index, values, mask = graph(2, torch.float32)
    a = hybrid(index, values, mask)
    with pytest.raises(NotImplementedError, match="plain operand"):
        torch.einsum("ijh,jhf->ihf", a, ms.masked_tensor(torch.ones(N, 2, 1),
                                                         torch.ones(N, 2, 1, dtype=torch.bool)))
    with pytest.raises(NotImplementedError, match="ijh,jhf->ihf"):
        torch.einsum("ijh,jf->ihf", a, torch.ones(N, 1))  # the heads are not a batch label
    with pytest.raises(ValueError, match="to_sparse_coo"):  # hybrid CSR: COO is the form
        dense_data = torch.ones(N, N, 2)
        ms.masked_tensor(dense_data.to_sparse_csr(dense_dim=1),
                         (dense_data > 0).to_sparse_csr(dense_dim=1))


def test_activation_on_the_scores_then_softmax():
    """LeakyReLU on the per-edge scores (GAT), then the softmax: forward equals dense."""
    index, values, mask = graph(2, torch.float64, seed=5)
    a = hybrid(index, values, mask)
    data, full = dense(index, values, mask)
    got = F.leaky_relu(a, 0.2).softmax(1).to_tensor(0).to_dense()
    ref = torch.where(full, torch.where(full, F.leaky_relu(data, 0.2), -torch.inf).softmax(1),
                      0)
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("create_graph", [False, True])
def test_product_gradients_of_both_operands_and_a_second_derivative(create_graph):
    """The per-head product's gradients of the hybrid values and the plain features, and
    (``create_graph``) a gradient of the features' gradient, against ``einsum`` on the
    dense data where the unspecified entries are 0 (the plain values as the leaf)."""
    index, values, mask = graph(3, torch.float64, seed=6)
    g = torch.Generator().manual_seed(7)
    x0 = torch.randn(N, 3, F_OUT, generator=g, dtype=torch.float64)
    w = torch.randn(N, 3, F_OUT, generator=g, dtype=torch.float64)

    a = hybrid(index, values, mask, requires_grad=True)
    x = x0.clone().requires_grad_()
    loss = (torch.einsum("ijh,jhf->ihf", a, x).to_tensor(0) * w).sum()

    leaf = torch.where(mask, values, 0).requires_grad_()
    rx = x0.clone().requires_grad_()
    data = torch.zeros(N, N, 3, dtype=torch.float64).index_put((index[0], index[1]), leaf)
    ref = (torch.einsum("ijh,jhf->ihf", data, rx) * w).sum()
    if create_graph:
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        (gx ** 2).sum().backward()
        (rgx,) = torch.autograd.grad(ref, rx, create_graph=True)
        (rgx ** 2).sum().backward()
        torch.testing.assert_close(gx, rgx)
    else:
        loss.backward()
        ref.backward()
        torch.testing.assert_close(x.grad, rx.grad)
    assert isinstance(a.grad, ms.MaskedTensor) and a.grad.layout == torch.sparse_coo
    grad = a.grad.to_tensor(0).coalesce()
    assert torch.equal(grad.indices(), index)
    torch.testing.assert_close(grad.values(), torch.where(mask, leaf.grad, 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_one_head_softmax_is_the_matrix_softmax(op, dtype, monkeypatch):
    """One value per stored entry ((N, N, 1), values (nnz, 1)): the softmax over each row's
    neighbours reads each row's entries as one line (the native kernel is given line
    offsets, not group ids), as the 2-D COO matrix of those values does (its row
    pointers), and both give the same bits, forward and backward; the reference is the 2-D
    masked softmax, itself tested against the dense one."""
    from layouts import _native

    calls = []
    native_softmax = _native.softmax

    def recording(values, mask, log, offsets=None, which=None, index=None, n=0):
        calls.append("lines" if offsets is not None else "groups")
        return native_softmax(values, mask, log, offsets, which, index, n)

    monkeypatch.setattr(_native, "softmax", recording)
    g = torch.Generator().manual_seed(3)
    n = 40
    adj = torch.rand(n, n, generator=g) < 0.3
    adj[7] = False  # a row with no entry
    index = adj.nonzero().T
    values = torch.randn(index.shape[1], 1, generator=g, dtype=dtype) * 30
    mask = torch.rand(index.shape[1], 1, generator=g) < 0.8

    def coo(v, m, shape):
        return ms.masked_tensor(torch.sparse_coo_tensor(index, v, shape).coalesce(),
                                torch.sparse_coo_tensor(index, m, shape).coalesce())

    hyb = coo(values, mask, (n, n, 1)).requires_grad_()
    flat = coo(values[:, 0], mask[:, 0], (n, n)).requires_grad_()
    out_h, out_f = getattr(hyb, op)(1), getattr(flat, op)(1)
    got, want = out_h.to_tensor(0).to_dense().squeeze(-1), out_f.to_tensor(0).to_dense()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    seed = torch.randn(n, n, dtype=dtype, generator=g)
    (got * seed).sum().backward()
    (want * seed).sum().backward()
    torch.testing.assert_close(hyb.grad.to_tensor(0).to_dense().squeeze(-1),
                               flat.grad.to_tensor(0).to_dense(), rtol=0, atol=0)
    if _native.available():
        assert calls == ["lines", "lines"], calls
