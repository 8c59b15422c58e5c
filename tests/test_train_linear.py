"""Training an MLP with masked weights against the dense workaround ``F.linear(x, W * M, b)``.

The workaround is the reference (what ``torch.nn.utils.prune`` computes): on every row of a
weight that keeps at least one entry the two forward passes are the same sums, so losses,
the gradients at the kept entries, the biases' gradients and the parameters after several
optimizer steps (``ms.optim.Adam`` against ``torch.optim.Adam`` on the dense weights, whose
masked-out entries get a zero gradient and so never move) agree to 1e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import masked_sparse as ms

SIZES = (20, 16, 12, 5)
LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr}
TOL = dict(rtol=1e-5, atol=1e-5)


def _dense(t: torch.Tensor) -> torch.Tensor:
    if ms.is_masked_tensor(t):
        t = t.to_tensor(0)
    return t.to_dense() if t.layout != torch.strided else t


def _model(seed: int):
    g = torch.Generator().manual_seed(seed)
    weights, masks, biases = [], [], []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        weights.append(torch.randn(n_out, n_in, generator=g) / n_in ** 0.5)
        masks.append(torch.rand(n_out, n_in, generator=g) < 0.5)
        biases.append(torch.randn(n_out, generator=g) * 0.1)
    assert all(m.any(1).all() for m in masks)  # no fully pruned neuron: outputs agree
    return weights, masks, biases


def _forward(x, weights, biases, masks=None):
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w if masks is None else w * masks[i], b)
        if i < len(weights) - 1:
            h = torch.relu(h)
    return h if masks is not None else h.to_tensor(0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mlp_training_matches_dense_workaround(layout):
    weights, masks, biases = _model(0)
    mine_w = [torch.nn.Parameter(ms.to_layout(ms.masked_tensor(w.clone(), m), LAYOUTS[layout]))
              for w, m in zip(weights, masks)]
    mine_b = [torch.nn.Parameter(b.clone()) for b in biases]
    ref_w = [torch.nn.Parameter(w.clone()) for w in weights]
    ref_b = [torch.nn.Parameter(b.clone()) for b in biases]
    opt = ms.optim.Adam(mine_w + mine_b, lr=0.01)
    ref_opt = torch.optim.Adam(ref_w + ref_b, lr=0.01, foreach=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(32, SIZES[0], generator=g), torch.randint(SIZES[-1], (32,), generator=g)
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = F.cross_entropy(_forward(x, mine_w, mine_b), y)
        ref_loss = F.cross_entropy(_forward(x, ref_w, ref_b, masks), y)
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, **TOL)
        for w, rw, m in zip(mine_w, ref_w, masks):
            assert ms.is_masked_tensor(w.grad) and w.grad.layout == LAYOUTS[layout]
            torch.testing.assert_close(_dense(w.grad)[m], rw.grad[m], **TOL)
        for b, rb in zip(mine_b, ref_b):
            assert not ms.is_masked_tensor(b.grad)  # a plain parameter, a plain gradient
            torch.testing.assert_close(b.grad, rb.grad, **TOL)
        opt.step()
        ref_opt.step()
    for w, rw, m, w0 in zip(mine_w, ref_w, masks, weights):
        got = _dense(w.detach())
        torch.testing.assert_close(got[m], rw.detach()[m], **TOL)
        assert not torch.equal(got[m], w0[m])
        assert torch.equal(rw.detach()[~m], w0[~m])  # the reference's pruned entries held
    for b, rb in zip(mine_b, ref_b):
        torch.testing.assert_close(b.detach(), rb.detach(), **TOL)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("transpose", [False, True], ids=["x@W.T", "x@W"])
def test_sparse_weight_product_gradients_in_float64(layout, transpose):
    """Both gradients of ``x @ W.T`` and ``x @ W`` (the transposed pattern of Note
    [Transposed pattern]) against the dense product, float64."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(7, 9, generator=g, dtype=torch.float64)
    m = torch.rand(7, 9, generator=g) < 0.4
    m[:, 0] = True
    m[0, :] = True  # every row and column has an entry
    x = torch.randn(5, 7 if transpose else 9, generator=g, dtype=torch.float64)
    grad_out = torch.randn(5, 9 if transpose else 7, generator=g, dtype=torch.float64)
    mt = ms.to_layout(ms.masked_tensor(w.clone(), m), LAYOUTS[layout]).requires_grad_()
    xm = x.clone().requires_grad_()
    out = (xm @ mt) if transpose else F.linear(xm, mt)
    out.to_tensor(0).backward(grad_out)
    wd = w.clone().requires_grad_()
    xd = x.clone().requires_grad_()
    ref = (xd @ (wd * m)) if transpose else F.linear(xd, wd * m)
    ref.backward(grad_out)
    torch.testing.assert_close(out.to_tensor(0), ref.detach())
    torch.testing.assert_close(xm.grad, xd.grad)
    torch.testing.assert_close(_dense(mt.grad)[m], wd.grad[m])
