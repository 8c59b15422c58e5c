"""Plain operands broadcast against a MaskedTensor get plain gradients, read and reduced in
O(nnz) (Note [Plain operands get plain gradients] in masked_sparse/ops/plain_operands.py).

Every layout x binary op (both operand orders) x plain shape (column, row, vector, same
shape, 0-d scalar, a column slice view) x float32 / float64 against the dense reference:
``torch.where(mask, op(data, plain), 0)`` differentiated by plain autograd. Then the graph
attention score pattern ``A0 + d[:, None] + s[None, :]``: no tensor of the dense (n, m)
size on its forward or backward, and no host sync.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from conftest import make_masked_in, where0
from host_sync import native_off, no_host_sync  # noqa: F401  (native_off: a fixture)
from torch.utils._python_dispatch import TorchDispatchMode

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

SHAPE = (4, 6)
LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
           "csc": torch.sparse_csc, "bsr": torch.sparse_bsr}
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
       "plain_sub": lambda m, p: p - m, "plain_div": lambda m, p: p / m,
       "plain_mul": lambda m, p: p * m}
# The plain operand: a function of a (4, 6) base tensor (views of it keep their history).
PLAIN = {"row": lambda t: t[:1, :], "vector": lambda t: t[0],
         "same": lambda t: t, "scalar": lambda t: t[0, 0],
         "column_slice": lambda t: t[:, 2:3], "unsqueezed": lambda t: t[:, 0][:, None]}


def masked(layout: str, dtype: torch.dtype, seed: int = 0):
    """A MaskedTensor of SHAPE (sparse ones store some masked-out elements, BSR in 2x2
    blocks), its dense data and mask."""
    if layout == "bsr":
        mt, data, mask = make_masked_in(SHAPE, torch.sparse_csr, dtype=dtype, seed=seed)
        return mt.to_sparse_bsr((2, 2)), data, mask
    return make_masked_in(SHAPE, LAYOUTS[layout], dtype=dtype, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("plain", sorted(PLAIN))
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_plain_operand_gets_the_dense_reference_gradient(layout, op, plain, dtype):
    mt, data, mask = masked(layout, dtype)
    fn, view = OPS[op], PLAIN[plain]
    g = torch.Generator().manual_seed(1)
    base = (torch.rand(SHAPE, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    weights = torch.rand(SHAPE, generator=g, dtype=torch.float64).to(dtype)

    p = base.clone().requires_grad_()
    x = mt.detach().clone().requires_grad_()
    (fn(x, view(p)) * weights).sum().backward()

    ref_p, ref_x = base.clone().requires_grad_(), data.clone().requires_grad_()
    torch.where(mask, fn(ref_x, view(ref_p)) * weights, 0).sum().backward()

    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    assert type(p.grad) is torch.Tensor and p.grad.layout == torch.strided
    torch.testing.assert_close(p.grad, ref_p.grad, **tol)
    assert isinstance(x.grad, ms.MaskedTensor) and x.grad.layout == mt.layout
    got = x.grad if layout == "strided" else x.grad.to_dense()
    torch.testing.assert_close(where0(got.get_data(), mask), where0(ref_x.grad, mask), **tol)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_plain_operand_meeting_only_unspecified_elements_gets_zero(layout):
    """A row of ``b`` that meets no specified element gets 0 (not NaN, not missing), even
    where the stored masked-out values would make the formula infinite."""
    mt, data, mask = masked(layout, torch.float64, seed=4)
    b = torch.ones(SHAPE[0], dtype=torch.float64, requires_grad=True)
    keep = torch.ones(SHAPE, dtype=torch.bool)
    keep[1] = False
    mt = ms.to_layout(ms.masked_tensor(torch.where(keep, data, 0.0), mask & keep), mt.layout) \
        if layout != "bsr" else ms.masked_tensor(torch.where(keep, data, 0.0),
                                                 mask & keep).to_sparse_bsr((2, 2))
    (b[:, None] / mt).sum().backward()
    ref = b.detach().clone().requires_grad_()
    torch.where(mask & keep, ref[:, None] / torch.where(mask & keep, data, 1.0), 0).sum().backward()
    assert b.grad[1] == 0
    torch.testing.assert_close(b.grad, ref.grad)


class DenseSizeCheck(TorchDispatchMode):
    """Records every aten call that allocates a tensor of ``limit`` elements or more (views,
    such as a broadcast ``expand``, allocate nothing)."""

    observes_only = True

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.found = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not isinstance(t, ms.MaskedTensor) \
                    and t.untyped_storage().nbytes() >= self.limit * t.element_size():
                self.found.append(f"{func} -> {tuple(t.shape)}")
        return out


def graph(layout: torch.layout, n: int = 60, m: int = 50):
    """A zero masked sparse matrix on ~3 edges per row, and two plain score vectors."""
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(n).repeat_interleave(3)
    cols = torch.randint(0, m, (3 * n,), generator=g)
    edges = torch.zeros(n, m, dtype=torch.bool)
    edges[rows, cols] = True
    A0 = ms.masked_tensor(torch.zeros(n, m), edges).to_sparse_coo()
    A0 = {torch.sparse_coo: A0, torch.sparse_csr: A0.to_sparse_csr(),
          torch.sparse_csc: A0.to_sparse_csc()}[layout]
    d = torch.randn(n, generator=g, requires_grad=True)
    s = torch.randn(m, generator=g, requires_grad=True)
    return A0, edges, d, s


SPARSE = [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc]


@pytest.mark.parametrize("layout", SPARSE, ids=["coo", "csr", "csc"])
def test_score_pattern_gradients_match_the_dense_reference(layout):
    A0, edges, d, s = graph(layout)
    w = torch.rand(edges.shape, generator=torch.Generator().manual_seed(2))
    (F.leaky_relu(A0 + d[:, None] + s[None, :], 0.2) * w).sum().backward()
    rd, rs = d.detach().clone().requires_grad_(), s.detach().clone().requires_grad_()
    torch.where(edges, F.leaky_relu(rd[:, None] + rs[None, :], 0.2) * w, 0).sum().backward()
    assert type(d.grad) is torch.Tensor and type(s.grad) is torch.Tensor
    torch.testing.assert_close(d.grad, rd.grad)
    torch.testing.assert_close(s.grad, rs.grad)


@pytest.mark.parametrize("layout", SPARSE, ids=["coo", "csr", "csc"])
def test_score_pattern_never_densifies(layout):
    A0, edges, d, s = graph(layout)
    check = DenseSizeCheck(limit=edges.numel())
    with check:
        scores = F.leaky_relu(A0 + d[:, None] + s[None, :], 0.2)
        scores.sum().backward()
    assert not check.found, check.found
    assert d.grad.shape == d.shape and s.grad.shape == s.shape


@pytest.mark.usefixtures("native_off")
@pytest.mark.parametrize("layout", SPARSE, ids=["coo", "csr", "csc"])
def test_score_pattern_never_syncs(layout):
    A0, edges, d, s = graph(layout)
    (A0 + d[:, None] + s[None, :]).sum().backward()  # warm: index facts built
    d.grad = s.grad = None
    with no_host_sync(d.device):
        scores = A0 + d[:, None] + s[None, :]
        loss = (scores * 2.0).sum()
    with no_host_sync(d.device):
        loss.backward()
    assert d.grad is not None and s.grad is not None


def test_no_grad_path_is_unchanged():
    """Nothing requires grad: no plain_at node, the result has no history."""
    A0, edges, d, s = graph(torch.sparse_csr)
    out = A0 + d.detach()[:, None]
    assert not out.requires_grad and out.grad_fn is None
