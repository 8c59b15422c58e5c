"""Plain tensors get plain gradients (docs/autograd.md, Note [Plain operands get plain
gradients]): a plain tensor meeting a masked operand gets a plain ``.grad`` of its own shape,
equal to the dense reference's (the same computation on dense tensors, unspecified elements
left out with ``torch.where``), 0 where it met only unspecified elements; so every torch
optimizer steps it. In every layout, through broadcasting, ``torch.where``, matrix products,
the reductions that follow, in-place ops and ``create_graph=True``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked_in

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

SHAPE = (5, 4)
LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr]
IDS = ["strided", "coo", "csr", "csc", "bsr"]
F64 = torch.float64


def ratings(layout, seed=0):
    mt, data, mask = make_masked_in(SHAPE, layout, dtype=F64, seed=seed)
    return mt, data, mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, 0).sum() / mask.sum()


def plain_leaf(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=F64).requires_grad_()


def reference(*leaves):
    return [t.detach().clone().requires_grad_() for t in leaves]


def assert_plain_grad(t: torch.Tensor, ref: torch.Tensor) -> None:
    assert type(t.grad) is torch.Tensor and t.grad.layout == torch.strided
    assert t.grad.shape == t.shape
    torch.testing.assert_close(t.grad, ref.grad)


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_masked_mse_with_biases(layout):
    """The recommender's loss: ratings minus user and item biases, a masked mean."""
    R, data, mask = ratings(layout)
    bu, bi = plain_leaf(SHAPE[0]), plain_leaf(SHAPE[1], seed=2)
    loss = ((R - bu[:, None] - bi[None, :]) ** 2).mean()
    loss.backward()
    ru, ri = reference(bu, bi)
    masked_mean((data - ru[:, None] - ri[None, :]) ** 2, mask).backward()
    assert_plain_grad(bu, ru)
    assert_plain_grad(bi, ri)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam, torch.optim.Adagrad,
                                       torch.optim.AdamW, torch.optim.RMSprop])
@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_torch_optimizers_step_plain_biases(layout, optimizer):
    """Two steps of a torch optimizer give the dense reference's parameters."""
    R, data, mask = ratings(layout)
    b = plain_leaf(SHAPE[0])
    (rb,) = reference(b)
    opt, ref_opt = optimizer([b], lr=0.1), optimizer([rb], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        ((R - b[:, None]) ** 2).mean().backward()
        masked_mean((data - rb[:, None]) ** 2, mask).backward()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(b.detach(), rb.detach())


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_reductions_that_follow(layout):
    """Row sums, a column mean and an amax after the broadcast op."""
    R, data, mask = ratings(layout)
    b = plain_leaf(SHAPE[1])
    y = R * b
    (y.sum(1).to_tensor(0).pow(2).sum() + y.amax().to_tensor(0)).backward()
    (rb,) = reference(b)
    ry = torch.where(mask, data * rb, 0)
    amax = torch.where(mask, data * rb, -torch.inf).amax()
    (ry.sum(1).pow(2).sum() + amax).backward()
    assert_plain_grad(b, rb)


@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=IDS[:4])
def test_scalar_tensor_operand(layout):
    R, data, mask = ratings(layout)
    a = torch.tensor(1.5, dtype=F64, requires_grad=True)
    ((R * a - 1) ** 2).sum().backward()
    (ra,) = reference(a)
    torch.where(mask, (data * ra - 1) ** 2, 0).sum().backward()
    assert_plain_grad(a, ra)


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_in_place_ops(layout):
    R, data, mask = ratings(layout)
    b = plain_leaf(SHAPE[0])
    y = R.clone()
    y -= b[:, None]
    y.mul_(b[:, None])
    y.sum().backward()
    (rb,) = reference(b)
    torch.where(mask, (data - rb[:, None]) * rb[:, None], 0).sum().backward()
    assert_plain_grad(b, rb)


@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=IDS[:4])
def test_where_with_a_plain_operand(layout):
    R, data, mask = ratings(layout)
    t = plain_leaf(*SHAPE)
    out = torch.where(R > 0, R * 2, t)
    (out * out).sum().backward()
    (rt,) = reference(t)
    ref = torch.where(data > 0, data * 2, rt)
    torch.where(mask, ref * ref, 0).sum().backward()
    assert_plain_grad(t, rt)


@pytest.mark.parametrize("layout", LAYOUTS[:3], ids=IDS[:3])
def test_matrix_product_operand_stays_plain(layout):
    R, data, mask = ratings(layout)
    w, b = plain_leaf(SHAPE[1], 3), plain_leaf(3, seed=3)
    (F.relu((R @ w).to_tensor(0)) + b).sum().backward()
    rw, rb = reference(w, b)
    (F.relu(torch.where(mask, data, 0) @ rw) + rb).sum().backward()
    assert_plain_grad(w, rw)
    assert_plain_grad(b, rb)


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_create_graph_gives_a_differentiable_plain_gradient(layout):
    """A gradient penalty on a plain bias: the first gradient is plain and differentiable."""
    R, data, mask = ratings(layout)
    b = plain_leaf(SHAPE[0])
    (g,) = torch.autograd.grad(((R - b[:, None]) ** 3).mean(), b, create_graph=True)
    assert type(g) is torch.Tensor and g.requires_grad
    (g ** 2).sum().backward()
    (rb,) = reference(b)
    (rg,) = torch.autograd.grad(masked_mean((data - rb[:, None]) ** 3, mask), rb,
                                create_graph=True)
    (rg ** 2).sum().backward()
    torch.testing.assert_close(g, rg)
    assert_plain_grad(b, rb)


def test_plain_operand_with_another_dtype():
    """A float32 bias against float64 ratings gets a float32 gradient."""
    R, data, mask = ratings(torch.sparse_csr)
    b = torch.zeros(SHAPE[0], requires_grad=True)
    ((R - b[:, None]) ** 2).mean().backward()
    assert b.grad.dtype == torch.float32
    ref = b.detach().double().requires_grad_()
    masked_mean((data - ref[:, None]) ** 2, mask).backward()
    torch.testing.assert_close(b.grad, ref.grad.float())


@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=IDS[:4])
def test_under_no_grad_nothing_is_recorded(layout):
    R, data, mask = ratings(layout)
    b = plain_leaf(SHAPE[0])
    with torch.no_grad():
        out = R - b[:, None]
    assert not out.requires_grad and out.grad_fn is None


# Every spelling of a sum or difference with a plain operand (Note [A sum with a plain
# operand]): ``op(a, b)`` is ``a + b`` or ``a - b``.
SUMS = {"torch.add": torch.add, "Tensor.add": torch.Tensor.add, "+": lambda a, b: a + b,
        "torch.sub": torch.sub, "torch.subtract": torch.subtract, "Tensor.sub": torch.Tensor.sub,
        "-": lambda a, b: a - b, "__radd__": lambda a, b: torch.Tensor.__radd__(b, a),
        "__rsub__": lambda a, b: torch.Tensor.__rsub__(b, a)}
SUBTRACTS = {"torch.sub", "torch.subtract", "Tensor.sub", "-", "__rsub__"}


@pytest.mark.parametrize("masked_grad", [False, True], ids=["fixed", "trained"])
@pytest.mark.parametrize("masked_first", [True, False], ids=["masked-first", "plain-first"])
@pytest.mark.parametrize("op", list(SUMS))
@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_sum_with_a_plain_operand_is_one_node(layout, op, masked_first, masked_grad):
    """``A ± b[:, None]`` in either order is one recorded node whose values and gradients
    (the plain operand's plain, the masked one's with its mask) are the dense reference's."""
    R, data, mask = ratings(layout)
    R.requires_grad_(masked_grad)
    b = plain_leaf(SHAPE[0])
    f = SUMS[op]
    out = f(R, b[:, None]) if masked_first else f(b[:, None], R)
    assert type(out.grad_fn).__name__ == "_PlainSumBackward"
    weights = torch.randn(SHAPE, dtype=F64, generator=torch.Generator().manual_seed(5))
    (out * weights).sum().backward()

    rdata, (rb,) = data.clone().requires_grad_(masked_grad), reference(b)
    ref = rdata - rb[:, None] if op in SUBTRACTS else rdata + rb[:, None]
    ref = ref if masked_first or op not in SUBTRACTS else -ref
    torch.testing.assert_close(out.to_tensor(0).to_dense(), torch.where(mask, ref, 0))
    torch.where(mask, ref * weights, 0).sum().backward()
    assert_plain_grad(b, rb)
    if masked_grad:
        assert type(R.grad) is type(R) and R.grad.layout == layout
        torch.testing.assert_close(R.grad.get_mask().to_dense(), mask)
        torch.testing.assert_close(R.grad.to_tensor(0).to_dense(),
                                   torch.where(mask, rdata.grad, 0))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_sum_with_plain_operands_at_every_head(dtype):
    """Graph attention's scores over a hybrid COO adjacency ``(N, N, H)``: two per-head node
    vectors broadcast at the edges, per-head gradients, the index stored once."""
    n, heads = 6, 3
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(n, n, generator=g) < 0.4
    edges = mask.nonzero().t()
    shape = (n, n, heads)
    nnz = edges.shape[1]
    a0 = ms.masked_tensor(
        torch.sparse_coo_tensor(edges, torch.zeros(nnz, heads, dtype=dtype), shape),
        torch.sparse_coo_tensor(edges, torch.ones(nnz, heads, dtype=torch.bool), shape))
    d = torch.randn(n, heads, generator=g, dtype=dtype, requires_grad=True)
    s = torch.randn(n, heads, generator=g, dtype=dtype, requires_grad=True)
    scores = a0 + d[:, None, :] - s[None, :, :]
    assert scores._storage.index[0] is a0._storage.index[0]
    weights = torch.randn(shape, generator=g, dtype=dtype)
    (scores.to_tensor(0).to_dense() * weights).sum().backward()
    rd, rs = reference(d, s)
    full = mask[:, :, None].expand(shape)
    torch.where(full, (rd[:, None, :] - rs[None, :, :]) * weights, 0).sum().backward()
    torch.testing.assert_close(scores.to_tensor(0).to_dense(),
                               torch.where(full, rd[:, None] - rs[None], 0))
    assert_plain_grad(d, rd)
    assert_plain_grad(s, rs)
