"""Matrix products with masked operands on every layout, against a dense reference.

The reference is written from the semantics alone: unspecified elements are filled with 0
(``torch.where``) and the product is an ordinary matmul; the output mask is the product of
the 0/1 masks (a plain operand's mask is all True) being > 0. Gradients are compared with
the same dense computation differentiated by torch, read at the specified positions.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FLOAT_DTYPES, check_invariants, dense_of, make_masked
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ALL = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]
SPARSE = ALL[1:]


def make(shape, layout, dtype=torch.float64, seed=0, density=0.5, grad=False):
    """A MaskedTensor in ``layout`` (stored-but-masked entries included) and its dense form."""
    base = torch.strided if layout == "strided" else torch.sparse_coo
    mt, data, mask = make_masked(shape, base, dtype, density=density, seed=seed)
    if layout not in ("strided", "sparse_coo"):
        opts = {"blocksize": (2, 2)} if layout == "sparse_bsr" else {}
        mt = ms.to_layout(mt, layout, **opts)
    if grad:
        mt = mt.detach().requires_grad_()
    return mt, data, mask


def plain(shape, dtype=torch.float64, seed=1, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype).requires_grad_(grad)


def ref_product(a, ma, b, mb):
    """Dense reference: values of the zero-filled product, and its term-exists mask."""
    ma = torch.ones_like(a, dtype=torch.bool) if ma is None else ma
    mb = torch.ones_like(b, dtype=torch.bool) if mb is None else mb
    values = torch.matmul(torch.where(ma, a, 0), torch.where(mb, b, 0))
    mask = torch.matmul(ma.double(), mb.double()) > 0
    return values, mask


def assert_product(out, values, mask):
    assert isinstance(out, ms.MaskedTensor)
    check_invariants(out)
    got, got_mask = dense_of(out)
    assert torch.equal(got_mask, mask)
    torch.testing.assert_close(torch.where(mask, got, 0), torch.where(mask, values, 0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("case", ["masked@plain", "plain@masked", "masked@masked",
                                  "masked@strided_masked"])
def test_mm_matches_dense_reference(case, layout, dtype):
    a, da, ma = make((6, 4), layout, dtype, seed=3)
    b, db, mb = make((4, 6), layout, dtype, seed=4)
    if case == "masked@plain":
        b, mb = db, None
    elif case == "plain@masked":
        a, ma = da, None
    elif case == "masked@strided_masked":
        b = make((4, 6), "strided", dtype, seed=4)[0]
    out = torch.mm(a, b)
    assert_product(out, *ref_product(da, ma, db, mb))
    expect = layout if case == "masked@masked" and layout != "sparse_bsr" else "sparse_coo"
    if case != "masked@masked" or layout == "strided":
        expect = "strided"
    assert ms.layout_of(out).name == expect


def test_fully_masked_row_is_unspecified_not_nan():
    data = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]])
    mask = torch.tensor([[False, False], [True, False]])
    for layout in ALL:
        a = ms.to_layout(ms.masked_tensor(data, mask), layout)
        out = a @ torch.ones(2, 3)
        got, got_mask = dense_of(out)
        assert got_mask.tolist() == [[False] * 3, [True] * 3], layout
        assert got[1].tolist() == [2.0] * 3, layout


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("case", ["masked@plain", "plain@masked", "masked@masked"])
def test_mm_gradients_match_dense_reference(case, layout):
    a, da, ma = make((6, 4), layout, seed=5, grad=case != "plain@masked")
    b, db, mb = make((4, 6), layout, seed=6, grad=case != "masked@plain")
    if case == "masked@plain":
        b, mb = plain((4, 6), grad=True), None
        db = b.detach()
    if case == "plain@masked":
        a, ma = plain((6, 4), grad=True), None
        da = a.detach()
    weight = plain((6, 6), seed=7)
    out = a @ b
    (out.to_tensor(0).to_dense() * weight).sum().backward()

    ra, rb = da.clone().requires_grad_(), db.clone().requires_grad_()
    values, mask = ref_product(ra, ma, rb, mb)
    (torch.where(mask, values, 0) * weight).sum().backward()
    for x, ref, m in ((a, ra.grad, ma), (b, rb.grad, mb)):
        if m is None:  # the plain operand: A_filled_with_0.T @ G, G = 0 where unspecified
            torch.testing.assert_close(x.grad, ref)
            continue
        assert ms.layout_of(x.grad) is ms.layout_of(x)
        got, got_mask = dense_of(x.grad)
        assert torch.equal(got_mask, m)
        torch.testing.assert_close(torch.where(m, got, 0), torch.where(m, ref, 0))


def test_sparse_gradient_keeps_indices():
    a, _, _ = make((6, 4), "sparse_csr", grad=True)
    (a @ plain((4, 3))).to_tensor(0).sum().backward()
    assert all(x is y for x, y in zip(a.grad._storage.index, a._storage.index))


@pytest.mark.parametrize("layout", ALL)
def test_mv_and_vector_matmul(layout):
    a, da, ma = make((6, 4), layout, seed=8)
    v = plain((4,))
    values, mask = ref_product(da, ma, v[:, None], None)
    assert_product(torch.mv(a, v), values[:, 0], mask[:, 0])
    assert_product(a @ v, values[:, 0], mask[:, 0])
    w = plain((6,))
    values, mask = ref_product(w[None], None, da, ma)
    assert_product(w @ a, values[0], mask[0])
    assert_product(torch.matmul(w, a), values[0], mask[0])


@pytest.mark.parametrize("layout", ALL)
def test_matmul_broadcasts_batch_dims_around_a_2d_operand(layout):
    a, da, ma = make((6, 4), layout, seed=9)
    x = plain((2, 3, 4, 5))
    assert_product(a @ x, *ref_product(da, ma, x, None))
    y = plain((2, 5, 6))
    assert_product(y @ a, *ref_product(y, None, da, ma))


def test_batched_strided_ops():
    a, da, ma = make((3, 5, 4), "strided", seed=10)
    b, db, mb = make((3, 4, 2), "strided", seed=11)
    assert_product(torch.bmm(a, b), *ref_product(da, ma, db, mb))
    assert_product(torch.bmm(a, db), *ref_product(da, ma, db, None))
    assert_product(a @ db[0], *ref_product(da, ma, db[0], None))  # broadcast batch
    c = plain((3, 5, 2))
    values, mask = ref_product(da, ma, db, mb)
    out = torch.baddbmm(c, a, b, beta=0.5, alpha=2.0)
    assert_product(out, 0.5 * c + 2.0 * values, mask)


@pytest.mark.parametrize("layout", ALL)
def test_addmm_adds_input_to_specified_outputs(layout):
    a, da, ma = make((6, 4), layout, seed=12)
    b, bias = plain((4, 3)), plain((3,), seed=2)
    values, mask = ref_product(da, ma, b, None)
    assert_product(torch.addmm(bias, a, b), bias + values, mask)
    assert_product(torch.addmm(bias, a, b, beta=2, alpha=0.5), 2 * bias + 0.5 * values, mask)
    nan_input = torch.full((6, 3), float("nan"))
    assert_product(torch.addmm(nan_input, a, b, beta=0), values, mask)


@pytest.mark.parametrize("layout", ALL)
@pytest.mark.parametrize("masked", ["weight", "input", "both"])
def test_linear_with_masked_input_or_weight(layout, masked):
    w, dw, mw = make((6, 4), layout, seed=13)
    x, dx, mx = make((4, 4), "strided", seed=14)
    bias = plain((6,), seed=3)
    if masked == "input":
        w, mw = dw, None
    elif masked == "weight":
        x, mx = dx, None
    values, mask = ref_product(dx, mx, dw.t(), None if mw is None else mw.t())
    assert_product(F.linear(x, w, bias), values + bias, mask)
    assert_product(F.linear(x, w), values, mask)


@pytest.mark.parametrize("layout", ALL)
def test_linear_layer_on_a_batch_of_sequences(layout):
    w, dw, mw = make((6, 4), layout, seed=15)
    x = plain((2, 3, 4))
    values, mask = ref_product(x, None, dw.t(), mw.t())
    assert_product(F.linear(x, w), values, mask)


@pytest.mark.parametrize("equation", ["ij,jk->ik", "ik,jk->ij", "ij,j->i", "ij,jk", "ij,kj->ki"])
@pytest.mark.parametrize("layout", ["strided", "sparse_coo", "sparse_csr"])
def test_einsum_2d_contractions(equation, layout):
    a, da, ma = make((6, 4), layout, seed=16)
    shapes = {"ij,jk->ik": (4, 3), "ik,jk->ij": (5, 4), "ij,j->i": (4,), "ij,jk": (4, 3),
              "ij,kj->ki": (5, 4)}
    b = plain(shapes[equation])
    out = torch.einsum(equation, a, b)
    values = torch.einsum(equation, torch.where(ma, da, 0), b)
    mask = torch.einsum(equation, ma.double(), torch.ones_like(b)) > 0
    assert_product(out, values, mask)


@pytest.mark.parametrize("equation", ["bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...ij,...jk->...ik",
                                      "bij,bjk->bik", "ijx,jk->ik"])
def test_einsum_batched_strided(equation):
    shapes = {"bhqd,bhkd->bhqk": ((2, 3, 5, 4), (2, 3, 6, 4)),
              "bhqk,bhkd->bhqd": ((2, 3, 5, 4), (2, 3, 4, 6)),
              "...ij,...jk->...ik": ((2, 5, 4), (2, 4, 3)),
              "bij,bjk->bik": ((2, 5, 4), (2, 4, 3)),
              "ijx,jk->ik": ((5, 4, 2), (4, 3))}
    sa, sb = shapes[equation]
    a, da, ma = make(sa, "strided", seed=17)
    b, db, mb = make(sb, "strided", seed=18)
    out = torch.einsum(equation, a, b)
    values = torch.einsum(equation, torch.where(ma, da, 0), torch.where(mb, db, 0))
    mask = torch.einsum(equation, ma.double(), mb.double()) > 0
    assert_product(out, values, mask)


@given(m=st.integers(1, 7), k=st.integers(1, 7), n=st.integers(1, 5),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16),
       layout=st.sampled_from(["strided", "sparse_coo", "sparse_csr", "sparse_csc"]),
       both=st.booleans())
def test_random_products(m, k, n, density, seed, layout, both):
    a, da, ma = make((m, k), layout, seed=seed, density=density)
    if both:
        b, db, mb = make((k, n), layout, seed=seed + 1, density=density)
    else:
        b, mb = plain((k, n), seed=seed), None
        db = b
    assert_product(a @ b, *ref_product(da, ma, db, mb))


def test_bad_shapes_and_dtypes_name_the_op():
    a, _, _ = make((6, 4), "sparse_coo")
    with pytest.raises(ValueError, match=r"mm\(\).*\(6, 4\).*\(5, 3\)"):
        torch.mm(a, torch.ones(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"matmul\(\).*inner"):
        a @ torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="same dtype"):
        a @ torch.ones(4, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"bmm\(\).*3-D"):
        torch.bmm(a, torch.ones(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"linear\(\).*\(6, 4\)"):
        F.linear(torch.ones(2, 5, dtype=torch.float64), a)
    b, _, _ = make((2, 4, 3), "sparse_coo")
    with pytest.raises(NotImplementedError, match="sparse_coo MaskedTensor operand must be 2-D"):
        torch.bmm(make((2, 5, 4), "strided")[0], b)
    with pytest.raises(NotImplementedError, match="einsum.*3 operands"):
        torch.einsum("ij,jk,kl->il", a, torch.ones(4, 3), torch.ones(3, 2))


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
@pytest.mark.parametrize("layout", ALL)
def test_pruned_linear_trains_like_dense_reference(layout, optimizer):
    """nn.Linear with a masked weight vs a dense Linear whose masked-out weights are frozen."""
    weight, dw, mw = make((6, 4), layout, dtype=torch.float32, seed=19)
    layer = torch.nn.Linear(4, 6)
    ref = torch.nn.Linear(4, 6)
    with torch.no_grad():
        ref.weight.copy_(torch.where(mw, dw, 0))
        ref.bias.copy_(layer.bias)
    layer.weight = torch.nn.Parameter(weight)
    opt = getattr(ms.optim, optimizer)(layer.parameters(), lr=0.05)
    ref_opt = getattr(torch.optim, optimizer)(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 6, generator=g)
        opt.zero_grad()
        ((layer(x).to_tensor(0) - y) ** 2).sum().backward()
        assert ms.layout_of(layer.weight.grad) is ms.layout_of(weight)
        assert torch.equal(dense_of(layer.weight.grad)[1], mw)
        opt.step()
        ref_opt.zero_grad()
        specified = mw.any(1)  # an output whose weight row is fully masked is unspecified
        ((torch.where(specified, ref(x), 0) - y) ** 2).sum().backward()
        ref.weight.grad *= mw  # the reference's masked-out weights stay frozen
        ref_opt.step()
    got, got_mask = dense_of(layer.weight)
    assert torch.equal(got_mask, mw)
    torch.testing.assert_close(torch.where(mw, got, 0), ref.weight.detach())
    torch.testing.assert_close(layer.bias, ref.bias)


@pytest.mark.parametrize("layout", SPARSE)
def test_huge_sparse_operand_never_densifies(layout):
    """A dense 200000 x 200000 tensor would need 160 GB: any densification fails loudly."""
    n, nnz = 200_000, 2000
    g = torch.Generator().manual_seed(8)
    keys = torch.unique(torch.randint(0, n * n, (nnz,), generator=g))
    indices = torch.stack([keys // n, keys % n])
    values = torch.rand(keys.numel(), generator=g, dtype=torch.float64)
    specified = torch.rand(keys.numel(), generator=g) > 0.3
    mt = ms.masked_tensor(torch.sparse_coo_tensor(indices, values, (n, n)).coalesce(),
                          torch.sparse_coo_tensor(indices, specified, (n, n)).coalesce())
    opts = {"blocksize": (2, 4)} if layout == "sparse_bsr" else {}
    mt = ms.to_layout(mt, layout, **opts).requires_grad_()
    ref = torch.sparse_coo_tensor(indices, torch.where(specified, values, 0), (n, n))
    dense = plain((n, 4), seed=9)
    rows = torch.zeros(n, dtype=torch.bool).index_fill_(0, indices[0][specified], True)
    cols = torch.zeros(n, dtype=torch.bool).index_fill_(0, indices[1][specified], True)
    left = plain((3, n), seed=10)
    with torch.no_grad():  # the forward-only kernels (COO: hypersparse, no row pointer)
        torch.testing.assert_close((mt @ dense).to_tensor(0),
                                   torch.sparse.mm(ref, dense) * rows[:, None])
        torch.testing.assert_close((left @ mt).to_tensor(0),
                                   torch.sparse.mm(ref.t(), left.t()).t() * cols)
    out = mt @ dense
    assert torch.equal(out.get_mask(), rows[:, None].expand(n, 4))
    torch.testing.assert_close(out.to_tensor(0), torch.sparse.mm(ref, dense) * rows[:, None])
    out.to_tensor(0).sum().backward()
    assert ms.layout_of(mt.grad) is ms.layout_of(mt)
    grad = ms.to_layout(mt.grad, "sparse_coo")._storage  # sampled: dense[col].sum() per entry
    at = grad.index[0][:, grad.mask]
    assert torch.equal(at, indices[:, specified])
    torch.testing.assert_close(grad.values[grad.mask], dense.detach()[at[1]].sum(1))
    torch.testing.assert_close((left @ mt).to_tensor(0), (torch.sparse.mm(ref.t(), left.t()).t())
                               * cols)


@pytest.mark.parametrize("layout", ALL)
def test_linear_gradients_match_dense_reference(layout):
    """Both operands masked, the weight used transposed (the path nn.Linear takes)."""
    w, dw, mw = make((6, 4), layout, seed=20, grad=True)
    x, dx, mx = make((2, 3, 4), "strided", seed=21, grad=True)
    weight = plain((2, 3, 6), seed=22)
    (F.linear(x, w).to_tensor(0) * weight).sum().backward()
    rx, rw = dx.clone().requires_grad_(), dw.clone().requires_grad_()
    values, mask = ref_product(rx, mx, rw.t(), mw.t())
    (torch.where(mask, values, 0) * weight).sum().backward()
    for got, ref, m in ((x.grad, rx.grad, mx), (w.grad, rw.grad, mw)):
        got_values, got_mask = dense_of(got)
        assert torch.equal(got_mask, m)
        torch.testing.assert_close(torch.where(m, got_values, 0), torch.where(m, ref, 0))


def test_known_zero_fill_is_dropped_by_an_in_place_write():
    """softmax's output is known to hold 0 under its mask (Note [Known zero fill]) until its
    values are written: garbage written there later must not reach the product."""
    scores, _, mask = make((4, 5), "strided", dtype=torch.float32, seed=23)
    probs = torch.softmax(scores, -1)
    v = plain((5, 3), dtype=torch.float32)
    expected = torch.where(mask, dense_of(probs)[0], 0) @ v
    probs._storage.values.masked_fill_(~mask, float("nan"))  # in place, under the mask only
    got = probs @ v
    torch.testing.assert_close(got.to_tensor(0), torch.where(mask.any(1, keepdim=True),
                                                             expected, 0))
