"""ms.optim.clip_grad_norm_ / clip_grad_value_ against torch's on the dense equivalents.

Every gradient form (dense, torch sparse COO -- uncoalesced, hybrid --, CSR, CSC, BSR,
MaskedTensors of every layout with NaN under the mask) is clipped in place, and the
result must be what ``torch.nn.utils`` gives on the dense gradients with 0 at the
unspecified entries (Note [Clipping the specified entries]).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_masked

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

SHAPE = (6, 4)
FORMS = ["dense", "coo uncoalesced", "coo hybrid", "csr", "csc", "bsr", "masked strided",
         "masked coo", "masked csr", "masked csc", "masked bsr"]


def make_grad(form: str, seed: int, scale: float = 1.0) -> tuple[object, torch.Tensor]:
    """``(grad, dense equivalent)``: a gradient in ``form`` and its values, 0 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(SHAPE, generator=g) * scale
    mask = torch.rand(SHAPE, generator=g) < 0.5
    dense = torch.where(mask, data, 0.0)
    if form == "dense":
        return data.clone(), data.clone()
    if form == "coo uncoalesced":  # each specified value split into two duplicates
        idx = mask.nonzero().t()
        vals = data[mask]
        grad = torch.sparse_coo_tensor(torch.cat([idx, idx], 1), torch.cat([vals * 0.25,
                                                                            vals * 0.75]), SHAPE)
        assert not grad.is_coalesced()
        return grad, torch.sparse_coo_tensor(idx, vals, SHAPE).to_dense()
    if form == "coo hybrid":
        rows = mask.any(1)
        grad = torch.sparse_coo_tensor(rows.nonzero().t(), data[rows], SHAPE)
        return grad, torch.where(rows[:, None], data, 0.0)
    if not form.startswith("masked"):
        sparse = dense.to_sparse()
        grad = {"csr": lambda: sparse.to_sparse_csr(), "csc": lambda: sparse.to_sparse_csc(),
                "bsr": lambda: dense.to_sparse_bsr((2, 2))}[form]()
        return grad, dense
    nan_data = data.masked_fill(~mask, float("nan"))
    layout = form.split()[1]
    if layout in ("strided", "coo", "csr"):
        torch_layout = {"strided": torch.strided, "coo": torch.sparse_coo,
                        "csr": torch.sparse_csr}[layout]
        return make_masked(SHAPE, torch_layout, data=nan_data, mask=mask, seed=seed)[0], dense
    strided = ms.masked_tensor(nan_data, mask)
    if layout == "csc":
        return ms.to_layout(strided, torch.sparse_csc), dense
    return ms.to_layout(strided, torch.sparse_bsr, blocksize=(2, 2)), dense


def dense_of(grad) -> torch.Tensor:
    if ms.is_masked_tensor(grad):
        out = grad.to_tensor(0.0)
        return out if out.layout == torch.strided else out.to_dense()
    return grad if grad.layout == torch.strided else grad.to_dense()


def params_with(grads: list) -> list[torch.Tensor]:
    """Parameters whose ``.grad`` is each of ``grads`` (torch refuses a CSR/CSC/BSR
    ``.grad`` on a dense parameter, so those get a parameter of the gradient's layout)."""
    out = []
    for grad in grads:
        layout = torch.strided if ms.is_masked_tensor(grad) else grad.layout
        p = torch.zeros(grad.shape)
        if layout not in (torch.strided, torch.sparse_coo):
            p = p.to_sparse(layout=layout, blocksize=(2, 2) if layout == torch.sparse_bsr
                            else None)
        p.grad = grad
        out.append(p)
    return out


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, math.inf])
@pytest.mark.parametrize("form", FORMS)
def test_clip_grad_norm_matches_torch_on_dense_equivalents(form, norm_type):
    grads, refs = zip(*[make_grad(f, seed) for seed, f in enumerate([form, "dense", form])])
    params = params_with(list(grads))
    ref_params = [torch.zeros(SHAPE, requires_grad=True) for _ in refs]
    for p, r in zip(ref_params, refs):
        p.grad = r.clone()
    total = ms.optim.clip_grad_norm_(params, max_norm=0.5, norm_type=norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(ref_params, max_norm=0.5, norm_type=norm_type)
    assert ref_total > 0.5  # the clipping scales
    torch.testing.assert_close(total, ref_total)
    for p, r, grad in zip(params, ref_params, grads):
        assert p.grad is grad  # in place: the same gradient object, layout kept
        torch.testing.assert_close(dense_of(p.grad), r.grad)


def test_clip_grad_norm_does_not_scale_small_gradients_and_handles_no_entries():
    grad, ref = make_grad("coo hybrid", 0, scale=1e-3)
    (p,) = params_with([grad])
    before = grad.coalesce().values().clone()
    total = ms.optim.clip_grad_norm_(p, max_norm=1.0)
    torch.testing.assert_close(total, torch.linalg.vector_norm(ref))
    torch.testing.assert_close(p.grad.coalesce().values(), before)
    empty = ms.masked_tensor(torch.ones(SHAPE), torch.zeros(SHAPE, dtype=torch.bool))
    (q,) = params_with([empty])
    assert float(ms.optim.clip_grad_norm_([q], 1.0)) == 0.0
    assert float(ms.optim.clip_grad_norm_([], 1.0)) == 0.0


@pytest.mark.parametrize("form", ["coo uncoalesced", "masked csr"])
def test_clip_grad_norm_nonfinite(form):
    grad, _ = make_grad(form, 0)
    values = grad._values() if not ms.is_masked_tensor(grad) else grad._storage.values
    values[0] = float("inf")
    (p,) = params_with([grad])
    with pytest.raises(RuntimeError, match="non-finite"):
        ms.optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    ref = torch.zeros(SHAPE, requires_grad=True)
    ref.grad = dense_of(grad).clone()
    total = ms.optim.clip_grad_norm_([p], 1.0)
    assert torch.equal(total, torch.nn.utils.clip_grad_norm_([ref], 1.0))  # inf, as torch


def test_unspecified_nan_is_not_part_of_the_norm():
    data = torch.tensor([[3.0, float("nan")], [float("nan"), 4.0]])
    mt = ms.masked_tensor(data, ~data.isnan()).to_sparse_csr()
    (p,) = params_with([mt])
    assert float(ms.optim.clip_grad_norm_([p], 100.0, error_if_nonfinite=True)) == 5.0


@pytest.mark.parametrize("form", FORMS)
def test_clip_grad_value_matches_torch_on_dense_equivalents(form):
    grads, refs = zip(*[make_grad(f, seed) for seed, f in enumerate([form, "dense"])])
    params = params_with(list(grads))
    ref_params = [torch.zeros(SHAPE, requires_grad=True) for _ in refs]
    for p, r in zip(ref_params, refs):
        p.grad = r.clone()
    assert ms.optim.clip_grad_value_(params, clip_value=0.4) is None
    torch.nn.utils.clip_grad_value_(ref_params, clip_value=0.4)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(dense_of(p.grad), r.grad)
    assert float(dense_of(params[0].grad).abs().max()) == pytest.approx(0.4)


def test_dense_gradients_are_torchs_functions_exactly():
    grads = [make_grad("dense", s)[0] for s in range(3)]
    mine = params_with([g.clone() for g in grads])
    ref = params_with([g.clone() for g in grads])
    for norm_type in (2.0, math.inf):
        assert torch.equal(ms.optim.clip_grad_norm_(mine, 1.0, norm_type),
                           torch.nn.utils.clip_grad_norm_(ref, 1.0, norm_type))
    ms.optim.clip_grad_value_(mine, 0.1)
    torch.nn.utils.clip_grad_value_(ref, 0.1)
    for p, q in zip(mine, ref):
        assert torch.equal(p.grad, q.grad)
