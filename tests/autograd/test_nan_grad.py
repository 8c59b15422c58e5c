"""The classic NaN-gradient reports, plain ``torch.Tensor`` and MaskedTensor side by side.

Each test first pins down the plain-Tensor behaviour that the report complains about (a NaN,
or a zero that cannot be told from a real zero), then runs the MaskedTensor version in the
strided, sparse COO and sparse CSR layouts and checks the hand-derived gradient: its values,
its mask ("no gradient" is masked out, never NaN) and its type/layout.
Sparse inputs store every position of the example (masked-out ones included, NaN too), so
all three layouts run the same numbers; CSR examples are reshaped to one row.
"""

from __future__ import annotations

import pytest
import torch
from conftest import LAYOUT_IDS, LAYOUTS, check_invariants, dense_of

import masked_sparse as ms
from masked_sparse import as_masked_tensor, masked_tensor

pytestmark = pytest.mark.device_generic


def stored_all(t: torch.Tensor, layout) -> torch.Tensor:
    """``t`` in ``layout``, storing every position (zeros and NaNs included)."""
    if layout == torch.strided:
        return t
    idx = torch.ones(t.shape, dtype=torch.bool).nonzero().t()
    coo = torch.sparse_coo_tensor(idx, t[tuple(idx)], t.shape).coalesce()
    return coo if layout == torch.sparse_coo else coo.to_sparse_csr()


def shaped(t: torch.Tensor, layout) -> torch.Tensor:
    """CSR is 2-D only: examples run on one row there."""
    return t.reshape(1, -1) if layout == torch.sparse_csr else t


def mt_of(data, mask, layout, requires_grad=False):
    return masked_tensor(stored_all(shaped(data, layout), layout),
                         stored_all(shaped(mask, layout), layout), requires_grad=requires_grad)


def expect(grad, values, mask, layout=None):
    """``grad`` is a MaskedTensor with exactly ``mask`` specified, equal to ``values`` there."""
    assert isinstance(grad, ms.MaskedTensor), type(grad)
    if layout is not None:
        assert grad.layout == layout
        check_invariants(grad, layout)
    data, got_mask = dense_of(grad)
    assert torch.equal(got_mask, mask.reshape(got_mask.shape))
    values = values.reshape(data.shape)
    torch.testing.assert_close(data[got_mask], values[got_mask])
    assert not torch.isnan(data[got_mask]).any()


layouts = pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
X = [-10.0, -5, 0, 5, 10, 50, 60, 70, 80, 90, 100]


# -- PyTorch issue 10729: torch.where with exp --------------------------------------------
def test_10729_plain_where_exp_gives_nan():
    x = torch.tensor(X, requires_grad=True)
    torch.where(x < 0, torch.exp(x), torch.ones_like(x)).sum().backward()
    # exp overflows at 90 and 100; where's zero gradient times inf is NaN.
    assert torch.isnan(x.grad).tolist() == [False] * 9 + [True, True]


@layouts
def test_10729_masked_where_exp(layout):
    x = torch.tensor(X)
    mask = x < 0
    mx = mt_of(x, mask, layout, requires_grad=True)
    my = mt_of(torch.ones_like(x), ~mask, layout, requires_grad=True)
    y = torch.where(shaped(mask, layout), torch.exp(mx), my)
    expect(y, torch.where(mask, x.exp(), 1.0), torch.ones(11, dtype=torch.bool), layout)
    y.sum().backward()
    # d exp(x)/dx = exp(x) on the chosen subset; the rest gets no gradient (masked out).
    expect(mx.grad, x.exp(), mask, layout)
    expect(my.grad, torch.ones(11), ~mask, layout)


# -- PyTorch issue 52248: where(b, a / 0, c) -----------------------------------------------
def test_52248_plain_where_of_division_by_zero_gives_nan():
    a = torch.randn((), requires_grad=True)
    b, c = torch.tensor(False), torch.ones(())
    assert torch.where(b, a / 0, c).item() == 1.0
    (grad,) = torch.autograd.grad(torch.where(b, a / 0, c), a)
    assert torch.isnan(grad)


@layouts
def test_52248_masked_where_of_division_by_zero(layout):
    shape = {torch.strided: (), torch.sparse_coo: (1,), torch.sparse_csr: (1, 1)}[layout]
    value = torch.randn(shape)
    a = masked_tensor(stored_all(value, layout), stored_all(torch.ones(shape, dtype=torch.bool),
                                                            layout), requires_grad=True)
    b, c = torch.tensor(False), torch.ones(())
    out = torch.where(b, a / 0, c)
    expect(out, torch.ones(shape), torch.ones(shape, dtype=torch.bool), layout)
    (grad,) = torch.autograd.grad(torch.where(b, a / 0, c), a)
    # a was not chosen: no gradient at all (masked out), instead of 0 * inf = NaN.
    expect(grad, torch.zeros(shape), torch.zeros(shape, dtype=torch.bool), layout)
    (grad,) = torch.autograd.grad(torch.where(~b, a / 2, c), a)  # chosen: 1/2
    expect(grad, torch.full(shape, 0.5), torch.ones(shape, dtype=torch.bool), layout)


# -- PyTorch issue 67180: nansum / nanmean gradients ---------------------------------------
A = [1.0, 2.0, float("nan")]


@pytest.mark.parametrize("nan_op", [torch.nansum, torch.nanmean])
def test_67180_plain_nan_reductions_give_nan_gradient(nan_op):
    a = torch.tensor(A)
    b = torch.tensor(1.0, requires_grad=True)
    (grad,) = torch.autograd.grad(nan_op(a * b), b)
    assert torch.isnan(grad)


@pytest.mark.parametrize("op, expected", [(torch.sum, 3.0), (torch.mean, 1.5)])
@layouts
def test_67180_masked_reductions(op, expected, layout):
    a = torch.tensor(A)
    b = torch.tensor(1.0, requires_grad=True)
    mt = mt_of(a, ~torch.isnan(a), layout)  # the NaN is stored, but masked out
    c = mt * b
    total = op(c)
    expect(total, torch.tensor(expected), torch.tensor(True))
    (grad,) = torch.autograd.grad(total, b)
    # d/db sum(a_i * b) over the specified a_i = 1 + 2; for the mean, (1 + 2) / 2: a plain
    # gradient for the plain b (Note [Plain operands get plain gradients]), no NaN.
    assert type(grad) is torch.Tensor
    torch.testing.assert_close(grad, torch.tensor(expected))


# -- PyTorch issue 4132: x / 0 under a mask ------------------------------------------------
def test_4132_plain_indexing_after_division_by_zero_gives_nan():
    x = torch.tensor([1.0, 1.0], requires_grad=True)
    div = torch.tensor([0.0, 1.0])
    y = x / div
    y[div != 0].backward()
    assert torch.isnan(x.grad[0]) and x.grad[1] == 1.0


@layouts
def test_4132_masked_division_by_zero(layout):
    x = shaped(torch.tensor([1.0, 1.0]), layout).requires_grad_()
    div = shaped(torch.tensor([0.0, 1.0]), layout)
    y = x / div  # [inf, 1]
    mask = div != 0
    if layout != torch.strided:  # torch's own conversions; the mask stores only True
        to = "to_sparse_coo" if layout == torch.sparse_coo else "to_sparse_csr"
        y, mask = getattr(y, to)(), getattr(mask, to)()
    loss = as_masked_tensor(y, mask)
    loss.sum().backward()
    # The masked-out inf gets no gradient: x.grad prints [--, 1.0000], as in torch.masked.
    expect(x.grad, torch.tensor([0.0, 1.0]), torch.tensor([False, True]), layout)
    if layout == torch.strided:
        assert "[      --,   1.0000]" in repr(x.grad)


# -- sum of a fully masked tensor ----------------------------------------------------------
@pytest.mark.parametrize("nan_op, plain_grad", [(torch.nansum, 0.0), (torch.nanmean, "nan")])
def test_plain_reduction_of_all_nan(nan_op, plain_grad):
    x = torch.full((4, 3), float("nan"), requires_grad=True)
    nan_op(x).backward()
    # nansum: a zero gradient that looks like a real one; nanmean: NaN.
    if plain_grad == "nan":
        assert torch.isnan(x.grad).all()
    else:
        assert (x.grad == 0).all()


@pytest.mark.parametrize("op", [torch.sum, torch.mean, torch.amax])
@layouts
def test_reduction_of_fully_masked_tensor(op, layout):
    shape = (4, 3) if layout == torch.sparse_csr else (2, 2, 3)
    data = torch.randn(shape)
    mask = torch.zeros(shape, dtype=torch.bool)
    m = masked_tensor(stored_all(data, layout), stored_all(mask, layout), requires_grad=True)
    s = op(m)
    assert s.shape == () and not dense_of(s)[1]  # a 0-d, unspecified result
    s.backward()
    # The gradient is fully masked (no gradient anywhere), not NaN and not zero.
    expect(m.grad, torch.zeros(shape), mask, layout)
