"""Masked losses (``torch.nn.functional``) on every layout, the input, the target or both
masked, against the dense reference: torch's loss with ``reduction='none'`` on the dense
data, then ``torch.where(mask, loss, 0).sum() / mask.sum()`` (or ``.sum()``), and its
gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms

LAYOUTS = ["strided", "coo", "csr", "csc", "bsr"]
WHICH = ["input", "target", "both"]
REDUCTIONS = ["mean", "sum", "none"]
SHAPE = (6, 4)
#: layout x masked operand x dtype: every operand choice on strided, COO and CSR (the three
#: routes: dense, scatter groups, compressed lines) in float64; CSC and BSR (the compressed
#: route again, and the generic one) with both operands masked; float32 on two layouts.
GRID = ([(layout, which, torch.float64) for layout in ("strided", "coo", "csr")
         for which in WHICH]
        + [(layout, "both", torch.float64) for layout in ("csc", "bsr")]
        + [(layout, "both", torch.float32) for layout in ("strided", "csr")])


def _as(mt, layout):
    """``mt`` (strided) in ``layout`` (BSR with 1 x 1 blocks: any pattern)."""
    if layout == "strided":
        return mt
    return ms.to_layout(mt, "sparse_" + layout, **({"blocksize": (1, 1)} if layout == "bsr"
                                                    else {}))


def _masked(data, mask, layout):
    if layout in ("coo", "csr"):  # with stored-but-unspecified entries
        mt, _, _ = make_masked(tuple(data.shape), getattr(torch, "sparse_" + layout),
                               data.dtype, data=data, mask=mask, seed=11)
        return mt
    return _as(ms.masked_tensor(data, mask), layout)


def _dense(mt):
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def _tol(dtype):
    return {"rtol": 2e-5, "atol": 2e-5} if dtype == torch.float32 else {}


def _grad_of(x):
    """A gradient as a dense tensor (a MaskedTensor's unspecified positions as 0), and its
    mask (None for a plain gradient)."""
    if isinstance(x, ms.MaskedTensor):
        values, mask = _dense(x)
        return torch.where(mask, values, 0), mask
    return x, None


# -- the elementwise losses ------------------------------------------------------------------
def _sigmoid01(t):
    return torch.sigmoid(t)


#: name -> (F function, kwargs, operand transform (input, target), extra tensors)
ELEMENTWISE = {
    "mse_loss": (F.mse_loss, {}, None),
    "mse_loss_weight": (F.mse_loss, {"weight": "w"}, None),
    "l1_loss": (F.l1_loss, {}, None),
    "l1_loss_weight": (F.l1_loss, {"weight": "w"}, None),
    "smooth_l1_loss": (F.smooth_l1_loss, {"beta": 0.5}, None),
    "huber_loss": (F.huber_loss, {"delta": 0.7}, None),
    "huber_loss_weight": (F.huber_loss, {"delta": 0.7, "weight": "w"}, None),
    "binary_cross_entropy": (F.binary_cross_entropy, {}, "probabilities"),
    "binary_cross_entropy_weight": (F.binary_cross_entropy, {"weight": "w"}, "probabilities"),
    "binary_cross_entropy_with_logits": (F.binary_cross_entropy_with_logits, {}, "targets"),
    "binary_cross_entropy_with_logits_weights": (
        F.binary_cross_entropy_with_logits, {"weight": "w", "pos_weight": "pw"}, "targets"),
}
_BY_WEIGHT = {"mse_loss_weight", "l1_loss_weight"}  # torch's mean divides by sum(weight)


def _elementwise_operands(name, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=g, dtype=torch.float64)
    t = torch.randn(SHAPE, generator=g, dtype=torch.float64)
    kind = ELEMENTWISE[name][2]
    if kind == "probabilities":
        x, t = torch.sigmoid(x), torch.rand(SHAPE, generator=g, dtype=torch.float64)
    elif kind == "targets":
        t = torch.rand(SHAPE, generator=g, dtype=torch.float64)
    extra = {"w": torch.rand(SHAPE, generator=g, dtype=torch.float64) + 0.5,
             "pw": torch.rand(SHAPE[1], generator=g, dtype=torch.float64) + 0.5}
    mask = torch.rand(SHAPE, generator=g) < 0.6
    return x.to(dtype), t.to(dtype), {k: v.to(dtype) for k, v in extra.items()}, mask


def _reference(fn, kwargs, x, t, mask, reduction, by_weight):
    per = torch.where(mask, fn(x, t, reduction="none", **kwargs), 0)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    if by_weight:
        return per.sum() / torch.where(mask, kwargs["weight"], 0).sum()
    return per.sum() / mask.sum()


@pytest.mark.parametrize("layout,which,dtype", GRID)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_loss_matches_the_dense_reference(name, reduction, layout, which, dtype):
    fn, spec, _ = ELEMENTWISE[name]
    x, t, extra, mask = _elementwise_operands(name, dtype)
    kwargs = {k: extra[v] if isinstance(v, str) else v for k, v in spec.items()}
    inp = _masked(x, mask, layout) if which in ("input", "both") else x.clone()
    tgt = _masked(t, mask, layout) if which in ("target", "both") else t.clone()
    inp.requires_grad_()
    tgt.requires_grad_()
    out = fn(inp, tgt, reduction=reduction, **kwargs)
    xr, tr = x.clone().requires_grad_(), t.clone().requires_grad_()
    ref = _reference(fn, kwargs, xr, tr, mask, reduction, name in _BY_WEIGHT)

    assert isinstance(out, ms.MaskedTensor)
    got, got_mask = _dense(out)
    if reduction == "none":
        masked = inp if which != "target" else tgt
        assert out.layout == masked.layout
        assert out._storage.mask is masked._storage.mask or which == "both"
        assert torch.equal(got_mask, mask)
        torch.testing.assert_close(torch.where(mask, got, 0), ref, **_tol(dtype))
        weights = torch.randn(SHAPE, dtype=dtype)
        (out * weights).sum().backward()
        (ref * weights).sum().backward()
    else:
        assert out.dim() == 0 and bool(got_mask)
        torch.testing.assert_close(got, ref, **_tol(dtype))
        out.backward()
        ref.backward()
    for ours, theirs in ((inp, xr), (tgt, tr)):
        grad, grad_mask = _grad_of(ours.grad)
        if isinstance(ours, ms.MaskedTensor):
            assert ours.grad.layout == ours.layout and torch.equal(grad_mask, mask)
            theirs_grad = torch.where(mask, theirs.grad, 0)
        else:
            assert type(ours.grad) is torch.Tensor  # a plain gradient
            theirs_grad = theirs.grad
        torch.testing.assert_close(grad, theirs_grad, **_tol(dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["mse_loss_weight", "huber_loss_weight"])
def test_plain_weights_get_plain_gradients(name, layout):
    # (torch differentiates these weights; binary_cross_entropy's it refuses, as here)
    fn, _, _ = ELEMENTWISE[name]
    x, t, extra, mask = _elementwise_operands(name, torch.float64, seed=1)
    ours, theirs = (extra["w"].clone().requires_grad_() for _ in range(2))
    fn(_masked(x, mask, layout), t, weight=ours).backward()
    _reference(fn, {"weight": theirs}, x, t, mask, "mean", name in _BY_WEIGHT).backward()
    assert type(ours.grad) is torch.Tensor
    torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_broadcast_target_is_read_at_the_specified_positions(layout):
    x, _, _, mask = _elementwise_operands("mse_loss", torch.float64, seed=2)
    row = torch.randn(1, SHAPE[1], dtype=torch.float64, requires_grad=True)
    out = F.mse_loss(_masked(x, mask, layout), row)
    row2 = row.detach().clone().requires_grad_()
    ref = torch.where(mask, (x - row2) ** 2, 0).sum() / mask.sum()
    ref.backward()
    out.backward()
    torch.testing.assert_close(out.item(), ref.item())
    torch.testing.assert_close(row.grad, row2.grad)


# -- nll_loss and cross_entropy --------------------------------------------------------------
N, C = 7, 5


def _class_operands(dtype, seed=0, partial=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, C, (N,), generator=g)
    y[3] = -100  # ignored by default
    rows = torch.rand(N, generator=g) < 0.75
    rows[0] = True
    mask = rows[:, None].expand(N, C).clone()
    if partial:  # some classes of the specified rows unspecified too
        mask &= torch.rand(N, C, generator=g) < 0.8
        mask[0] = True
    weight = (torch.rand(C, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    tmask = torch.rand(N, generator=g) < 0.7
    tmask[0] = True
    return x, y, weight, mask, tmask


def _logp_reference(x, mask):
    """log_softmax over the specified classes of each row (the others absent)."""
    return x.masked_fill(~mask, -math.inf).log_softmax(1)


def _index_reference(x, y, mask, tmask, weight, eps, reduction, ignore=-100, log=True):
    """The documented semantics, by hand: a sample counts iff its target is specified, not
    ignored and its class specified in the input; eps spread over the specified classes."""
    logp = _logp_reference(x, mask) if log else x
    valid = tmask & (y != ignore)
    y0 = torch.where(valid, y, 0)
    hit = valid & mask.gather(1, y0[:, None]).squeeze(1)
    w = torch.ones(C, dtype=x.dtype) if weight is None else weight
    zero = torch.zeros((), dtype=x.dtype)
    picked = torch.where(hit, logp.gather(1, y0[:, None]).squeeze(1), zero)
    loss = -w[y0] * picked
    if eps:
        smooth = -torch.where(mask, logp * w, zero).sum(1)
        loss = (1 - eps) * loss + eps * smooth / mask.sum(1).clamp(min=1)
    loss = torch.where(hit, loss, zero)
    if reduction == "none":
        return loss, hit
    if reduction == "sum":
        return loss.sum(), hit
    return loss.sum() / torch.where(hit, w[y0], zero).sum(), hit


CLASS_CASES = {
    "nll": (F.nll_loss, {}),
    "nll_weight": (F.nll_loss, {"weight": "w"}),
    "nll_ignore_1": (F.nll_loss, {"ignore_index": 1}),
    "ce": (F.cross_entropy, {}),
    "ce_weight": (F.cross_entropy, {"weight": "w"}),
    "ce_smoothing": (F.cross_entropy, {"label_smoothing": 0.2}),
    "ce_weight_smoothing_ignore": (F.cross_entropy, {"weight": "w", "label_smoothing": 0.1,
                                                     "ignore_index": 2}),
}


@pytest.mark.parametrize("layout,which,dtype", GRID)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", list(CLASS_CASES))
def test_class_index_loss_matches_the_reference(case, reduction, layout, which, dtype):
    fn, spec = CLASS_CASES[case]
    x, y, w, mask, tmask = _class_operands(dtype, partial=(layout == "csr"))
    kwargs = {k: w if v == "w" else v for k, v in spec.items()}
    y[3] = kwargs.get("ignore_index", -100)  # one ignored sample
    if fn is F.nll_loss:
        x = _logp_reference(x, mask).masked_fill(~mask, 0) if which != "target" else \
            x.log_softmax(1)
    input_masked = which in ("input", "both")
    mask_in = mask if input_masked else torch.ones(N, C, dtype=torch.bool)
    tmask_in = tmask if which in ("target", "both") else torch.ones(N, dtype=torch.bool)
    inp = _masked(x, mask, layout) if input_masked else x.clone()
    tgt_layout = layout if layout in ("strided", "coo") else "coo"  # a 1-D target
    tgt = _masked(y, tmask, tgt_layout) if which != "input" else y
    inp.requires_grad_()
    out = fn(inp, tgt, reduction=reduction, **kwargs)

    xr = x.clone().requires_grad_()
    ref, hit = _index_reference(xr, y, mask_in, tmask_in, kwargs.get("weight"),
                                kwargs.get("label_smoothing", 0.0), reduction,
                                kwargs.get("ignore_index", -100), log=fn is F.cross_entropy)
    got, got_mask = _dense(out)
    if reduction == "none":
        assert out.shape == (N,)
        assert torch.equal(got_mask, hit)
        torch.testing.assert_close(torch.where(hit, got, 0), ref, **_tol(dtype))
        if which == "target":
            assert out.layout == tgt.layout
        weights = torch.randn(N, dtype=dtype)
        (out * weights).sum().backward()
        (ref * weights).sum().backward()
    else:
        torch.testing.assert_close(got, ref, **_tol(dtype))
        out.backward()
        ref.backward()
    grad, grad_mask = _grad_of(inp.grad)
    expected = torch.where(mask_in, xr.grad, 0)
    if input_masked:
        assert torch.equal(grad_mask, mask)
    else:
        assert type(inp.grad) is torch.Tensor
    torch.testing.assert_close(grad, expected, **_tol(dtype))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", list(CLASS_CASES))
def test_class_index_loss_with_every_class_specified_is_torchs(case, reduction):
    fn, spec = CLASS_CASES[case]
    x, y, w, mask, _ = _class_operands(torch.float64, seed=3)
    kwargs = {k: w if v == "w" else v for k, v in spec.items()}
    y[3] = kwargs.get("ignore_index", -100)  # one ignored sample
    rows = mask[:, 0]
    out = fn(ms.masked_tensor(x, mask).to_sparse_csr(), y, reduction=reduction, **kwargs)
    ref_none = fn(x, y, reduction="none", **kwargs)
    ignore = kwargs.get("ignore_index", -100)
    counted = rows & (y != ignore)
    ref = torch.where(counted, ref_none, 0)
    if reduction == "mean":
        wy = (w if "weight" in kwargs else torch.ones(C, dtype=x.dtype))[torch.where(
            counted, y, 0)]
        ref = ref.sum() / torch.where(counted, wy, 0).sum()
    elif reduction == "sum":
        ref = ref.sum()
    got, got_mask = _dense(out)
    torch.testing.assert_close(torch.where(got_mask, got, 0), ref)


@pytest.mark.parametrize("layout,which,dtype", GRID)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kwargs", [{}, {"weight": True}, {"label_smoothing": 0.3}],
                         ids=["plain", "weight", "smoothing"])
def test_cross_entropy_with_probabilities(kwargs, reduction, layout, which, dtype):
    x, _, w, mask, _ = _class_operands(dtype, seed=4, partial=True)
    probs = torch.rand(N, C, generator=torch.Generator().manual_seed(5),
                       dtype=torch.float64).to(dtype)
    probs = probs / probs.sum(1, keepdim=True)
    kw = {"weight": w} if "weight" in kwargs else dict(kwargs)
    inp = _masked(x, mask, layout) if which != "target" else x.clone()
    tgt = _masked(probs, mask, layout) if which != "input" else probs
    inp.requires_grad_()
    out = F.cross_entropy(inp, tgt, reduction=reduction, **kw)

    xr = x.clone().requires_grad_()
    input_mask = mask if which != "target" else torch.ones(N, C, dtype=torch.bool)
    logp = _logp_reference(xr, input_mask)
    eps = kw.get("label_smoothing", 0.0)
    t = probs * (1 - eps) + eps / mask.sum(1, keepdim=True).clamp(min=1)
    term = -t * logp * (w if "weight" in kw else 1)
    per = torch.where(mask, term, 0).sum(1)
    rows = mask.any(1)
    ref = {"none": per, "sum": per.sum(), "mean": per.sum() / rows.sum()}[reduction]
    got, got_mask = _dense(out)
    if reduction == "none":
        assert torch.equal(got_mask, rows)
        torch.testing.assert_close(torch.where(rows, got, 0), ref, **_tol(dtype))
        weights = torch.randn(N, dtype=dtype)
        (out * weights).sum().backward()
        (ref * weights).sum().backward()
    else:
        torch.testing.assert_close(got, ref, **_tol(dtype))
        out.backward()
        ref.backward()
    grad, _ = _grad_of(inp.grad)
    torch.testing.assert_close(grad, torch.where(input_mask, xr.grad, 0), **_tol(dtype))


def test_cross_entropy_over_a_class_dim_with_extra_dims():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, C, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (3, 4), generator=g)
    mask = (torch.rand(3, 1, 4, generator=g) < 0.7).expand(3, C, 4).clone()
    out = F.cross_entropy(ms.masked_tensor(x, mask).to_sparse_coo(), y, reduction="none")
    ref = F.cross_entropy(x, y, reduction="none")
    got, got_mask = _dense(out)
    assert torch.equal(got_mask, mask[:, 0])
    torch.testing.assert_close(torch.where(got_mask, got, 0), torch.where(mask[:, 0], ref, 0))


def test_unbatched_input():
    x = torch.randn(C, dtype=torch.float64)
    mask = torch.tensor([True, True, False, True, True])
    out = F.cross_entropy(ms.masked_tensor(x, mask), torch.tensor(1))
    ref = -_logp_reference(x[None], mask[None])[0, 1]
    torch.testing.assert_close(out.item(), ref.item())


# -- what no element specified gives --------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_loss_of_nothing_is_unspecified(layout):
    x, t, _, _ = _elementwise_operands("mse_loss", torch.float64)
    inp = _masked(x, torch.zeros(SHAPE, dtype=torch.bool), layout).requires_grad_()
    for reduction in ("mean", "sum"):
        out = F.mse_loss(inp, t, reduction=reduction)
        assert out.dim() == 0 and not out.get_mask()  # unspecified, not NaN
        out.backward()
        grad, _ = _grad_of(inp.grad)
        assert torch.equal(grad, torch.zeros(SHAPE, dtype=torch.float64))
    assert not _dense(F.mse_loss(inp, t, reduction="none"))[1].any()
    logits = _masked(torch.randn(N, C, dtype=torch.float64),
                     torch.zeros(N, C, dtype=torch.bool), layout)
    out = F.cross_entropy(logits, torch.zeros(N, dtype=torch.long))
    assert out.dim() == 0 and not out.get_mask()


@given(st.integers(0, 2 ** 16), st.sampled_from(LAYOUTS), st.sampled_from([0.0, 0.5, 1.0]))
def test_random_masks_empty_and_full(seed, layout, density):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g, dtype=torch.float64)
    t = torch.randn(N, C, generator=g, dtype=torch.float64)
    mask = torch.rand(N, C, generator=g) < density
    out = F.mse_loss(_masked(x, mask, layout), t)
    assert bool(out.get_mask()) == bool(mask.any())
    if mask.any():
        ref = torch.where(mask, (x - t) ** 2, 0).sum() / mask.sum()
        torch.testing.assert_close(out.item(), ref.item())
    y = torch.randint(0, C, (N,), generator=g)
    out = F.cross_entropy(_masked(x, mask, layout), y, reduction="sum")
    ref, hit = _index_reference(x, y, mask, torch.ones(N, dtype=torch.bool), None, 0.0, "sum")
    assert bool(out.get_mask()) == bool(hit.any())
    torch.testing.assert_close(out.to_tensor(0), ref)


# -- modules, the aten level, bad input, the way-out messages --------------------------------
@pytest.mark.parametrize("layout", ["strided", "csr"])
def test_loss_modules_route_here(layout):
    x, t, _, mask = _elementwise_operands("mse_loss", torch.float64)
    inp = _masked(x, mask, layout)
    torch.testing.assert_close(torch.nn.MSELoss()(inp, t).item(), F.mse_loss(inp, t).item())
    logits = _masked(x, mask[:, :1].expand(SHAPE).clone(), layout)
    y = torch.zeros(SHAPE[0], dtype=torch.long)
    torch.testing.assert_close(torch.nn.CrossEntropyLoss()(logits, y).item(),
                               F.cross_entropy(logits, y).item())


@pytest.mark.parametrize("layout", ["strided", "coo"])
def test_aten_overloads_compute_the_same_forward(layout):
    x, t, _, mask = _elementwise_operands("mse_loss", torch.float64)
    inp = _masked(x, mask, layout)
    aten = torch.ops.aten
    torch.testing.assert_close(aten.mse_loss.default(inp, t, 1).item(),
                               F.mse_loss(inp, t).item())
    torch.testing.assert_close(aten.huber_loss.default(inp, t, 2, 0.5).item(),
                               F.huber_loss(inp, t, reduction="sum", delta=0.5).item())
    logits = _masked(x.log_softmax(1), mask[:, :1].expand(SHAPE).clone(), layout)
    y = torch.zeros(SHAPE[0], dtype=torch.long)
    out, total = aten.nll_loss_forward.default(logits, y, None, 2, -100)
    torch.testing.assert_close(out.item(), F.nll_loss(logits, y, reduction="sum").item())
    assert total.item() == mask[:, 0].sum().item()


def test_masks_of_two_masked_operands_must_match():
    x, t, _, mask = _elementwise_operands("mse_loss", torch.float64)
    a = ms.masked_tensor(x, mask)
    b = ms.masked_tensor(t, ~mask)
    with pytest.raises(ValueError, match="mse_loss: the masks of MaskedTensor operands must "
                                         "match"):
        F.mse_loss(a, b)
    probs = ms.masked_tensor(torch.full(SHAPE, 0.25, dtype=torch.float64), ~mask)
    with pytest.raises(ValueError, match="cross_entropy: the masks"):
        F.cross_entropy(a, probs)


def test_bad_class_operands():
    x, y, w, mask, _ = _class_operands(torch.float64)
    mt = ms.masked_tensor(x, mask)
    with pytest.raises(TypeError, match="nll_loss.*class indices.*use F.cross_entropy"):
        F.nll_loss(mt, torch.rand(N, C, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expected a target of shape \(7,\)"):
        F.cross_entropy(mt, y[:3])
    with pytest.raises(ValueError, match=r"input's shape \(7, 5\)"):
        F.cross_entropy(mt, torch.rand(N, C - 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="weight must be a plain tensor"):
        F.cross_entropy(mt, y, weight=ms.masked_tensor(w, w > 0.7))
    with pytest.raises(ValueError, match=r"weight must have shape \(5,\)"):
        F.cross_entropy(mt, y, weight=w[:2])
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        F.cross_entropy(mt, torch.where(y == -100, 9, y))
    with pytest.raises(ValueError, match="label_smoothing must be between"):
        F.cross_entropy(mt, y, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"'avg' is not a valid value for reduction"):
        F.mse_loss(mt, x, reduction="avg")


def test_an_unspecified_target_out_of_range_is_not_read():
    x, y, _, mask, tmask = _class_operands(torch.float64)
    target = ms.masked_tensor(torch.where(tmask, y, 99), tmask)
    F.cross_entropy(ms.masked_tensor(x, mask), target)  # 99 sits under the mask only


def test_losses_without_a_kernel_suggest_no_fill():
    x, t, _, mask = _elementwise_operands("mse_loss", torch.float64)
    for layout in LAYOUTS:
        mt = _masked(x, mask, layout)
        with pytest.raises(NotImplementedError, match="soft_margin_loss: no kernel") as err:
            F.soft_margin_loss(mt, t)
        message = str(err.value)
        assert "to_tensor" not in message
        assert "d = mt.to_dense(); d.get_data()[d.get_mask()]" in message
        d = mt.to_dense()  # the suggested way out runs, and means what the masked mean means
        got = F.soft_margin_loss(d.get_data()[d.get_mask()], t[d.get_mask()])
        ref = torch.where(mask, F.soft_margin_loss(x, t, reduction="none"), 0).sum() / mask.sum()
        torch.testing.assert_close(got, ref)


def test_the_way_out_of_an_aggregating_op_suggests_no_fill():
    from masked_sparse._registry import aggregates, way_out

    aten = torch.ops.aten
    assert aggregates(aten.sum.dim_IntList) and aggregates(aten.soft_margin_loss.default)
    assert aggregates(F.kl_div) and not aggregates(aten.trace.default)
    assert "to_tensor" not in way_out(lambda lay: False, fill=False)
    assert "to_tensor(value)" in way_out(lambda lay: False)  # elementwise: a fill is exact


def test_plain_sparse_operand_error_fixes_run():
    x, y, _, mask, tmask = _class_operands(torch.float64, seed=7)
    y = torch.where(y < 0, 0, y)
    logits = ms.masked_tensor(x, mask)
    sparse_y = y.to_sparse_coo()
    with pytest.raises(NotImplementedError, match=r"pass target\.to_dense\(\), or wrap it with "
                                                  r"ms\.masked_tensor\(target, mask\)"):
        F.cross_entropy(logits, sparse_y)
    dense = F.cross_entropy(logits, sparse_y.to_dense())  # the first fix
    torch.testing.assert_close(dense.item(), F.cross_entropy(logits, y).item())
    wrapped = F.cross_entropy(logits, ms.masked_tensor(sparse_y, tmask.to_sparse_coo()))
    ref, _ = _index_reference(x, y, mask, tmask, None, 0.0, "mean")
    torch.testing.assert_close(wrapped.item(), ref.item())
    with pytest.raises(NotImplementedError, match=r"wrap it with masked_tensor\(t, mask\) or "
                                                  r"pass t\.to_dense\(\)"):
        F.mse_loss(logits, x.to_sparse_csr())
    torch.testing.assert_close(F.mse_loss(logits, x.to_sparse_csr().to_dense()).item(), 0.0)
