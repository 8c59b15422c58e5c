"""Masked attention over padded sequences (issue 30, item 3), against SDPA with a boolean
``attn_mask`` and the dense ``-inf`` recipe: values where a query attends to something,
gradients of q, k, v, no NaN anywhere for fully masked (padding) queries, eager and under
``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import masked_sparse as ms

B, H, T, D = 2, 2, 6, 4


def inputs(dtype=torch.float64, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_()
               for _ in range(3))
    real = torch.arange(T)[None, :] < torch.tensor([T, 3])[:, None]
    mask = real[:, None, :, None] & real[:, None, None, :]
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool).tril()
    return q, k, v, mask.expand(B, H, T, T)


def masked_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(ms.as_masked_tensor(scores, mask), -1) @ v


def weights(dtype):
    return torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(5), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_values_and_gradients_equal_sdpa(dtype, causal):
    q, k, v, mask = inputs(dtype, causal)
    out = masked_attention(q, k, v, mask)
    defined = mask.any(-1)  # queries that attend to something
    data, got_mask = out.to_tensor(0), out.get_mask()
    assert torch.equal(got_mask, defined[..., None].expand(B, H, T, D))
    assert not data.isnan().any()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(data, torch.where(defined[..., None], ref, 0), **tol)
    w = weights(dtype)
    grads = torch.autograd.grad((data * w).sum(), (q, k, v))
    refs = torch.autograd.grad((torch.where(defined[..., None], ref, 0) * w).sum(), (q, k, v))
    for got, want in zip(grads, refs):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, **tol)


def test_softmax_of_fully_masked_rows_is_masked_and_not_nan():
    q, k, v, mask = inputs()
    scores = (q @ k.transpose(-2, -1)).detach().requires_grad_()
    probs = torch.softmax(ms.as_masked_tensor(scores, mask), -1)
    values, got = probs.get_data(), probs.get_mask()
    assert torch.equal(got, mask)
    assert not values.isnan().any()
    ref = torch.softmax(scores.masked_fill(~mask, -math.inf), -1)
    rows = mask.any(-1, keepdim=True)
    torch.testing.assert_close(torch.where(mask, values, 0),
                               torch.where(mask & rows, ref, 0))
    (probs.to_tensor(0) * torch.rand_like(scores)).sum().backward()
    assert not scores.grad.isnan().any()
    assert torch.equal(scores.grad[~mask], torch.zeros_like(scores.grad[~mask]))


def test_compiles_fullgraph_and_equals_eager():
    q, k, v, mask = inputs(torch.float32)

    def attention(q, k, v, mask):
        return masked_attention(q, k, v, mask).to_tensor(0)

    compiled = torch.compile(attention, fullgraph=True, dynamic=False, backend="aot_eager")
    got = compiled(q, k, v, mask)
    want = attention(q, k, v, mask)
    torch.testing.assert_close(got, want)
    w = weights(torch.float32)
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    g_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b)


def test_forward_fills_nothing_after_the_softmax(monkeypatch):
    # Note [Fused masked softmax]: under autograd the softmax output is zero filled in place
    # inside the softmax, and the product after it reads the zero-fill tag through
    # autograd's detached aliases: no separate fill pass over the (B, H, T, T) weights.
    import masked_sparse.ops.linalg as linalg_ops
    import masked_sparse.ops.softmax as softmax_ops

    def refuse(values, mask):
        raise AssertionError(f"an extra zero fill of {tuple(values.shape)}")

    q, k, v, mask = inputs()
    monkeypatch.setattr(softmax_ops, "zero_fill", refuse)
    monkeypatch.setattr(linalg_ops, "zero_fill", refuse)
    out = masked_attention(q, k, v, mask)
    monkeypatch.undo()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    defined = mask.any(-1)[..., None]
    torch.testing.assert_close(out.to_tensor(0), torch.where(defined, ref, 0))
