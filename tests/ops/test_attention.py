"""Masked attention over padded sequences, against SDPA with a boolean
``attn_mask`` and the dense ``-inf`` recipe: values where a query attends to something,
gradients of q, k, v, no NaN anywhere for fully masked (padding) queries, eager and under
``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from host_sync import native_off, no_host_sync  # noqa: F401  (native_off: a fixture)

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


def _compiled_equals_eager(attention) -> None:
    """``attention(q, k, v, mask)`` compiled with ``fullgraph=True``: eager's values and
    gradients of q, k and v."""
    q, k, v, mask = inputs(torch.float32)
    compiled = torch.compile(attention, fullgraph=True, dynamic=False, backend="aot_eager")
    got, want = compiled(q, k, v, mask), attention(q, k, v, mask)
    torch.testing.assert_close(got, want)
    w = weights(torch.float32)
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    g_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b)


def test_compiles_fullgraph_and_equals_eager():
    _compiled_equals_eager(lambda q, k, v, mask: masked_attention(q, k, v, mask).to_tensor(0))


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


def _forward_graph(fn, *args):
    """The forward graph AOTAutograd hands to Inductor for ``fn`` (compiled fullgraph)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep, bw_compiler=make_boxed_func,
                           decompositions=select_decomp_table())  # as Inductor's
    torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)(*args)
    return graphs[0]


def _full_size(node, shape):
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_floating_point() and \
        tuple(val.shape) == tuple(shape)


def test_compiled_graph_has_the_dense_recipes_passes():
    # Note [Fused masked softmax] under torch.compile: one zero fill of the softmax output,
    # which autograd saves and the product after it reads; no second (B, H, T, T) buffer.
    q, k, v, mask = inputs(torch.float32)

    def masked(q, k, v, mask):
        return masked_attention(q, k, v, mask).to_tensor(0)

    def dense(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v

    counts = {}
    for name, fn in (("masked", masked), ("dense", dense)):
        gm = _forward_graph(fn, q, k, v, mask)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        saved = [a for a in out.args[0][1:] if hasattr(a, "meta") and _full_size(a, mask.shape)]
        wheres = [n for n in gm.graph.nodes if n.target is torch.ops.aten.where.self
                  and _full_size(n, mask.shape)]
        counts[name] = (len(saved), len(wheres))
    assert counts["dense"] == (1, 1)
    # the same saved tensor; one more where: the zero fill of the softmax's output
    assert counts["masked"] == (1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int8, torch.uint8, torch.int32, torch.int64])
def test_fill_of_a_broadcast_mask_is_where_bit_for_bit(dtype):
    # Note [Fill of a broadcast mask]: an attention mask expanded over heads.
    import layouts

    g = torch.Generator().manual_seed(3)
    values = (torch.randn(3, 4, 40, 130, generator=g) * 50).to(dtype)
    if dtype.is_floating_point:
        values[0, 0, 0, :4] = torch.tensor([math.nan, -0.0, math.inf, -math.inf])
    mask = (torch.rand(3, 1, 40, 130, generator=g) < 0.5).expand(3, 4, 40, 130)
    fills = [0, -math.inf, -0.0, 2.5] if dtype.is_floating_point else [0, 7, 100]
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    for source in (values, values.transpose(-1, -2)):
        m = mask if source is values else mask.transpose(-1, -2)
        for fill in fills:
            got = layouts.fill_unspecified(source, m, fill)
            want = torch.where(m, source, torch.tensor(fill, dtype=dtype))
            assert got.dtype == dtype
            assert torch.equal(got.view(as_int), want.contiguous().view(as_int)), fill


def test_eager_attention_takes_no_where_over_the_scores():
    # The -inf fill of the softmax and the fill of the gradient flowing back into it read the
    # head-shared mask once per stored element (Note [Fill of a broadcast mask]): no
    # element-by-element ``where`` over the (B, H, T, T) scores, forward or backward.
    from torch.utils._python_dispatch import TorchDispatchMode

    g = torch.Generator().manual_seed(4)
    b, h, t, d = 2, 3, 48, 8  # above the size where one ``where`` call is cheapest
    q, k, v = (torch.randn(b, h, t, d, generator=g).requires_grad_() for _ in range(3))
    real = torch.arange(t)[None, :] < torch.tensor([t, 20])[:, None]
    mask = (real[:, None, :, None] & real[:, None, None, :]).expand(b, h, t, t)  # stride 0
    w = torch.randn(b, h, t, d, generator=g)
    scores_shape = tuple(mask.shape)
    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.where.self, torch.ops.aten.masked_fill.Scalar) and \
                    isinstance(out, torch.Tensor) and tuple(out.shape) == scores_shape:
                seen.append(func)
            return out

    with Count():
        out = masked_attention(q, k, v, mask)
        grads = torch.autograd.grad((out.to_tensor(0) * w).sum(), (q, k, v))
    assert seen == []
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    defined = mask.any(-1)[..., None]
    torch.testing.assert_close(out.to_tensor(0), torch.where(defined, ref, 0))
    refs = torch.autograd.grad((torch.where(defined, ref, 0) * w).sum(), (q, k, v))
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- ms.attention: the same through F.scaled_dot_product_attention ---------------------------
def _masks(kind):
    """A (B, H, T, T) pair mask, a (B, 1, 1, T) key-padding mask, or a MaskedTensor's mask."""
    q, k, v, mask = inputs(causal=kind == "causal pair")
    if kind == "key padding":
        mask = mask[:, :1, :1, :]  # queries of sequence 1 keep their 3 keys: no empty row
    return q, k, v, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["pair", "causal pair", "key padding"])
def test_attention_equals_the_masked_recipe(kind, dtype):
    q, k, v, mask = _masks(kind)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    got = ms.attention(q, k, v, mask)
    want = masked_attention(q, k, v, mask.expand(B, H, T, T))
    assert torch.equal(got.get_mask(), want.get_mask())
    assert not got.get_data().isnan().any()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(got.to_tensor(0), want.to_tensor(0), **tol)
    w = weights(dtype)
    g_got = torch.autograd.grad((got.to_tensor(0) * w).sum(), (q, k, v))
    g_want = torch.autograd.grad((want.to_tensor(0) * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_want):
        assert not a.isnan().any()
        torch.testing.assert_close(a, b, **tol)


def test_attention_leaves_fully_masked_queries_unspecified_and_their_gradient_zero():
    q, k, v, mask = inputs()
    mask = mask.clone()
    mask[0, 0, 2] = False  # one more query with no key
    out = ms.attention(q, k, v, mask)
    rows = mask.any(-1)
    assert torch.equal(out.get_mask(), rows[..., None].expand(B, H, T, D))
    assert torch.equal(out.to_tensor(0)[~rows], torch.zeros_like(out.to_tensor(0)[~rows]))
    (gq,) = torch.autograd.grad(out.to_tensor(0).sum(), q)
    assert torch.equal(gq[~rows], torch.zeros_like(gq[~rows]))


def test_attention_takes_the_mask_of_a_masked_tensor_and_a_scale():
    q, k, v, mask = inputs()
    scores = ms.as_masked_tensor(torch.zeros(B, H, T, T), mask)
    got = ms.attention(q, k, v, scores, scale=0.5)
    s = q @ k.transpose(-2, -1) * 0.5
    want = torch.softmax(ms.as_masked_tensor(s, mask), -1) @ v
    torch.testing.assert_close(got.to_tensor(0), want.to_tensor(0))


def test_attention_rejects_what_it_cannot_read():
    q, k, v, mask = inputs()
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        ms.attention(q, k, v, mask.float())
    with pytest.raises(TypeError, match="query must be a plain Tensor"):
        ms.attention(ms.masked_tensor(q.detach(), torch.ones_like(q, dtype=torch.bool)), k, v,
                     mask)


def test_attention_compiles_fullgraph_and_equals_eager():
    _compiled_equals_eager(lambda q, k, v, mask: ms.attention(q, k, v, mask).to_tensor(0))


def test_attention_never_syncs(native_off):  # noqa: F811
    q, k, v, mask = inputs(torch.float32)
    step = lambda: torch.autograd.grad(  # noqa: E731
        ms.attention(q, k, v, mask).to_tensor(0).sum(), (q, k, v))
    step()
    with no_host_sync():
        step()
