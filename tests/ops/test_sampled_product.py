"""The masked sampled product: ``torch.sparse.sampled_addmm(R, U, V.T)`` on a MaskedTensor
``R`` of every layout, and ``ms.sampled_matmul(U, V.T, mask)`` from a bare mask, against the
dense reference ``torch.where(mask, alpha * (U @ V.T) + beta * R, 0)`` and its gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import FLOAT_DTYPES, make_masked

import masked_sparse as ms

LAYOUTS = ["strided", "coo", "csr", "csc", "bsr"]
SCALES = [(0.0, 1.0), (1.0, 1.0), (0.5, 2.0), (-1.0, 0.25)]  # (beta, alpha)


def _masked(shape, layout, dtype, seed=0, mask=None, data=None):
    """A MaskedTensor of ``layout`` (stored-but-unspecified entries included) and its dense
    reference."""
    base = "strided" if layout in ("strided", "csc", "bsr") else layout
    mt, d, m = make_masked(shape, getattr(torch, "sparse_" + base, torch.strided), dtype,
                           seed=seed, mask=mask, data=data)
    if layout == "csc":
        mt = ms.to_layout(mt, "sparse_csc")
    elif layout == "bsr":
        mt = ms.to_layout(mt, "sparse_bsr", blocksize=(2, 1))
    return mt, d, m


def _factors(m, n, k, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(m, k, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype)
    return u.requires_grad_(), v.requires_grad_()


def _dense(mt):
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("beta,alpha", SCALES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_and_gradients_match_the_dense_reference(layout, beta, alpha, dtype):
    mt, data, mask = _masked((6, 5), layout, dtype)
    mt.requires_grad_()
    u, v = _factors(6, 5, 3, dtype)
    out = torch.sparse.sampled_addmm(mt, u, v.T, beta=beta, alpha=alpha)
    assert out.layout == mt.layout
    s, r = out._storage, mt._storage
    assert s.mask is r.mask and all(a is b for a, b in zip(s.index, r.index))
    data_ref = data.clone().requires_grad_()
    u_ref, v_ref = (t.detach().clone().requires_grad_() for t in (u, v))
    ref = torch.where(mask, alpha * (u_ref @ v_ref.T) + beta * data_ref, 0)
    got, got_mask = _dense(out)
    assert torch.equal(got_mask, mask)
    torch.testing.assert_close(torch.where(mask, got, 0), ref, **_tol(dtype))

    weights = torch.randn(6, 5, dtype=dtype)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    assert type(u.grad) is torch.Tensor and type(v.grad) is torch.Tensor  # plain gradients
    torch.testing.assert_close(u.grad, u_ref.grad, **_tol(dtype))
    torch.testing.assert_close(v.grad, v_ref.grad, **_tol(dtype))
    grad_r, grad_mask = _dense(mt.grad)
    assert mt.grad.layout == mt.layout and torch.equal(grad_mask, mask)
    torch.testing.assert_close(torch.where(mask, grad_r, 0), data_ref.grad, **_tol(dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_beta_zero_does_not_read_the_values(layout):
    data = torch.full((4, 4), float("nan"))
    mt, _, mask = _masked((4, 4), layout, torch.float64, data=data.double())
    u, v = _factors(4, 4, 2, torch.float64)
    out = torch.sparse.sampled_addmm(mt, u, v.T, beta=0.0)
    got, _ = _dense(out)
    torch.testing.assert_close(got[mask], (u @ v.T)[mask])
    out.sum().backward()
    assert torch.isfinite(u.grad).all() and torch.isfinite(v.grad).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fully_masked_rows_and_columns(layout):
    mask = torch.rand(6, 4, generator=torch.Generator().manual_seed(3)) < 0.7
    mask[2] = False  # a fully unspecified row
    mask[:, 1] = False  # and column
    mt, data, mask = _masked((6, 4), layout, torch.float64, mask=mask)
    u, v = _factors(6, 4, 3, torch.float64)
    out = torch.sparse.sampled_addmm(mt, u, v.T, beta=0.0)
    got, got_mask = _dense(out)
    assert torch.equal(got_mask, mask)
    out.sum().backward()
    assert torch.equal(u.grad[2], torch.zeros(3, dtype=torch.float64))  # row 2 met nothing
    assert torch.equal(v.grad[1], torch.zeros(3, dtype=torch.float64))
    u_ref, v_ref = (t.detach().clone().requires_grad_() for t in (u, v))
    torch.where(mask, u_ref @ v_ref.T, 0).sum().backward()
    torch.testing.assert_close(u.grad, u_ref.grad)
    torch.testing.assert_close(v.grad, v_ref.grad)


@pytest.mark.parametrize("stored", [False, True], ids=["nothing_stored", "nothing_specified"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_mask(layout, stored):
    mask = torch.zeros(4, 3, dtype=torch.bool)
    mt, _, _ = _masked((4, 3), layout, torch.float32, mask=mask)
    if not stored:
        mt = ms.masked_tensor(torch.zeros(4, 3), mask) if layout == "strided" else \
            ms.to_layout(ms.masked_tensor(torch.zeros(4, 3), mask).to_sparse_coo(), mt.layout)
    u, v = _factors(4, 3, 2, torch.float32)
    out = torch.sparse.sampled_addmm(mt, u, v.T, beta=0.0)
    assert out.layout == mt.layout and not _dense(out)[1].any()
    out.sum().backward()
    assert torch.equal(u.grad, torch.zeros_like(u)) and torch.equal(v.grad, torch.zeros_like(v))


@pytest.mark.parametrize("mask_layout", ["strided", "coo", "csr", "csc", "bsr"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sampled_matmul_from_a_bare_mask(mask_layout, dtype):
    mask = torch.rand(6, 4, generator=torch.Generator().manual_seed(4)) < 0.5
    sparse = {"strided": mask, "coo": mask.to_sparse_coo(), "csr": mask.to_sparse_csr(),
              "csc": mask.to_sparse_csc(), "bsr": mask.to_sparse_bsr((2, 2))}[mask_layout]
    u, v = _factors(6, 4, 3, dtype)
    out = ms.sampled_matmul(u, v.T, sparse, alpha=3.0)
    assert isinstance(out, ms.MaskedTensor) and out.layout == sparse.layout
    got, got_mask = _dense(out)
    assert torch.equal(got_mask, mask)
    u_ref, v_ref = (t.detach().clone().requires_grad_() for t in (u, v))
    ref = torch.where(mask, 3.0 * (u_ref @ v_ref.T), 0)
    torch.testing.assert_close(torch.where(mask, got, 0), ref, **_tol(dtype))
    weights = torch.randn(6, 4, dtype=dtype)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(u.grad, u_ref.grad, **_tol(dtype))
    torch.testing.assert_close(v.grad, v_ref.grad, **_tol(dtype))


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_backward_needs_no_sort_after_the_first_step(layout):
    mt, _, _ = _masked((40, 30), layout, torch.float32)
    u, v = _factors(40, 30, 4, torch.float32)

    def step():
        torch.sparse.sampled_addmm(mt, u, v.T, beta=0.0).sum().backward()

    mask = mt.get_mask()

    def bare() -> None:
        ms.sampled_matmul(u, v.T, mask).sum().backward()

    for f in (step, bare):
        f()  # the patterns are computed once per index tensors, here
        with torch.profiler.profile() as prof:
            f()
        names = {e.key for e in prof.key_averages()}
        assert not names & {"aten::sort", "aten::argsort"}, names


def test_masked_mse_training_step_reduces_the_loss():
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(30, 20, generator=g) < 0.3
    ratings = ms.masked_tensor(torch.randint(1, 6, (30, 20), generator=g).float(),
                               mask).to_sparse_csr()
    u = torch.nn.Parameter(torch.randn(30, 4, generator=g) * 0.1)
    v = torch.nn.Parameter(torch.randn(20, 4, generator=g) * 0.1)
    opt = torch.optim.Adam([u, v], lr=0.05)
    losses = []
    for _ in range(30):
        pred = torch.sparse.sampled_addmm(ratings, u, v.T, beta=0.0)
        loss = torch.nn.functional.mse_loss(pred, ratings)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# -- bad input -------------------------------------------------------------------------------
def test_shapes_that_do_not_multiply():
    mt, _, _ = _masked((4, 3), "csr", torch.float32)
    with pytest.raises(ValueError, match=r"sampled_addmm\(\): shapes cannot be multiplied"):
        torch.sparse.sampled_addmm(mt, torch.ones(4, 2), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"mat1 @ mat2 is \(4, 5\) but the sampled pattern"):
        torch.sparse.sampled_addmm(mt, torch.ones(4, 2), torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"sampled_matmul\(\): shapes cannot be multiplied"):
        ms.sampled_matmul(torch.ones(4, 2), torch.ones(3, 3), mt.get_mask())


def test_factors_must_be_two_dimensional():
    mt, _, _ = _masked((4, 3), "coo", torch.float32)
    with pytest.raises(ValueError, match=r"mat1 must be 2-D"):
        torch.sparse.sampled_addmm(mt, torch.ones(4), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"mat2 must be 2-D"):
        ms.sampled_matmul(torch.ones(4, 2), torch.ones(2, 3, 1), mt.get_mask())


def test_pattern_must_be_two_dimensional():
    mt = ms.masked_tensor(torch.ones(2, 3, 4), torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"sampled pattern must be 2-D"):
        torch.sparse.sampled_addmm(mt, torch.ones(2, 1), torch.ones(1, 3))


def test_dtype_mismatch():
    mt, _, _ = _masked((4, 3), "csr", torch.float32)
    with pytest.raises(ValueError, match="same dtype"):
        torch.sparse.sampled_addmm(mt, torch.ones(4, 2, dtype=torch.float64),
                                   torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="same dtype"):
        ms.sampled_matmul(torch.ones(4, 2), torch.ones(2, 3, dtype=torch.float64),
                          mt.get_mask())


def test_masked_factor_error_suggests_a_fill_that_works():
    r, data, mask = _masked((4, 3), "csr", torch.float32)
    u_mt, u, u_mask = _masked((4, 2), "strided", torch.float32, seed=7)
    v = torch.ones(2, 3)
    with pytest.raises(NotImplementedError, match=r"mat1\.to_tensor\(0\)"):
        torch.sparse.sampled_addmm(r, u_mt, v)
    out = torch.sparse.sampled_addmm(r, u_mt.to_tensor(0), v)  # the fix it names
    ref = torch.where(mask, torch.where(u_mask, u, 0) @ v + data, 0)
    torch.testing.assert_close(torch.where(mask, _dense(out)[0], 0), ref)


def test_plain_input_with_a_masked_factor():
    u_mt, _, _ = _masked((4, 2), "strided", torch.float32)
    with pytest.raises(NotImplementedError, match="mat1 must be a plain strided tensor"):
        torch.sparse.sampled_addmm(torch.ones(4, 3).to_sparse_csr(), u_mt, torch.ones(2, 3))


def test_bad_masks_for_sampled_matmul():
    mt, _, _ = _masked((4, 3), "coo", torch.float32)
    with pytest.raises(TypeError, match=r"pass mt.get_mask\(\)"):
        ms.sampled_matmul(torch.ones(4, 2), torch.ones(2, 3), mt)
    with pytest.raises(TypeError, match="dtype torch.bool"):
        ms.sampled_matmul(torch.ones(4, 2), torch.ones(2, 3), torch.ones(4, 3))
    out = ms.sampled_matmul(torch.ones(4, 2), torch.ones(2, 3), mt.get_mask())  # the fix
    assert out.layout == torch.sparse_coo


def test_out_is_refused():
    mt, _, _ = _masked((4, 3), "csr", torch.float32)
    with pytest.raises(TypeError, match="out= is not supported"):
        torch.sparse.sampled_addmm(mt, torch.ones(4, 2), torch.ones(2, 3), out=mt)


def test_sampled_matmul_is_public():
    assert "sampled_matmul" in ms.__all__


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
def test_the_torch_op_route_gives_the_same_values_and_gradients(layout, monkeypatch):
    """The route of devices without torch's CSR kernels (and of torch.compile): the rows of
    both factors gathered and reduced, differentiated by torch."""
    from layouts import _sampled

    mt, data, mask = _masked((6, 5), layout, torch.float64)
    mt.requires_grad_()
    u, v = _factors(6, 5, 3, torch.float64)
    weights = torch.randn(6, 5, dtype=torch.float64)
    results = []
    for devices in (_sampled._CSR_DEVICES, frozenset()):
        monkeypatch.setattr(_sampled, "_CSR_DEVICES", devices)
        out = torch.sparse.sampled_addmm(mt, u, v.T, beta=0.5, alpha=2.0)
        (out * weights).sum().backward()
        results.append((_dense(out)[0], u.grad, v.grad, _dense(mt.grad)[0]))
        u.grad = v.grad = mt.grad = None
    (out_a, u_a, v_a, r_a), (out_b, u_b, v_b, r_b) = results
    torch.testing.assert_close(torch.where(mask, out_a, 0), torch.where(mask, out_b, 0))
    torch.testing.assert_close(torch.where(mask, r_a, 0), torch.where(mask, r_b, 0))
    torch.testing.assert_close(u_a, u_b)
    torch.testing.assert_close(v_a, v_b)
