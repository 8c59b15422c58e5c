"""torch.compile, torch.export, torch.func and torch.jit on MaskedTensors.

Every compiled result is compared with the eager result of the same function (itself
tested against dense references elsewhere). Kept small: few shapes, ``dynamic=False``, the
``aot_eager`` backend except where Inductor itself is under test, and a Dynamo reset
around every test. Speed is measured in ``benchmarks/bench_compile.py``, never here.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import dense_of, make_masked

import masked_sparse as ms

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # a clean Dynamo state per test

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SPARSE = ["sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def compiled(fn, fullgraph=True, backend="aot_eager"):
    return torch.compile(fn, fullgraph=fullgraph, dynamic=False, backend=backend)


def in_layout(mt, layout):
    if layout == "sparse_bsr":
        return mt.to_sparse_bsr((2, 2))
    return ms.to_layout(mt, layout)


def masked(shape, device, layout="strided", seed=0, dtype=torch.float32):
    mt, _, _ = make_masked(shape, dtype=dtype, seed=seed)
    mt = mt.to(device)
    return mt if layout == "strided" else in_layout(mt, layout)


def assert_same(got, ref):
    """``got`` equals ``ref``: the same type, layout, mask and specified values."""
    if isinstance(ref, (tuple, list)):
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_same(g, r)
        return
    if isinstance(ref, ms.MaskedTensor):
        assert isinstance(got, ms.MaskedTensor), type(got)
        assert ms.layout_of(got) is ms.layout_of(ref)
        gd, gm = dense_of(got)
        rd, rm = dense_of(ref)
        assert torch.equal(gm, rm)
        zero = torch.zeros((), dtype=rd.dtype, device=rd.device)
        torch.testing.assert_close(torch.where(gm, gd, zero), torch.where(rm, rd, zero),
                                   equal_nan=True)
        return
    assert type(got) is type(ref) and got.layout == ref.layout
    torch.testing.assert_close(got.to_dense(), ref.to_dense(), equal_nan=True)


def graph_breaks(fn, *args):
    return torch._dynamo.explain(fn)(*args).graph_break_count


# -- strided: one graph, equal to eager -------------------------------------------------
FAMILIES = {
    "unary": lambda x: (x.exp() - x.abs().sqrt(), torch.sin(x), -x, x.sigmoid()),
    "binary": lambda x: (x * x + x / 3, x - 1.5, x * torch.arange(6.0, device=x.device),
                         x > 0, torch.maximum(x, x * 2)),
    "where": lambda x: torch.where(x > 0, x, x * 2),
    "reductions": lambda x: (x.sum(), x.sum(1), x.mean(0), x.amax(1), x.amin(0), x.prod(1),
                             (x > 0).any(1), (x > 0).all(0), x.var(1), x.std(0),
                             x.logsumexp(1), x.norm(dim=1), x.argmax(1), x.nansum(1),
                             x.count_nonzero(1)),
    "softmax": lambda x: (x.softmax(1), x.log_softmax(0), torch.softmax(x, -1)),
    "to_tensor": lambda x: (x.to_tensor(0), x.to_tensor(-math.inf), x.get_mask(),
                            x.get_data()),
    "matmul": lambda x: _matmuls(x),
}


def _matmuls(x):
    """The matrix-product family on a (4, 6) masked ``x``: masked @ plain, masked @ masked,
    ``mm``, ``mv``, ``bmm``, ``addmm``, ``F.linear`` with a bias and ``einsum``."""
    w = torch.linspace(-1, 1, 18, device=x.device).reshape(6, 3)
    b = torch.arange(3.0, device=x.device)
    return (x @ w, x @ x.T, torch.mm(x, w), torch.mv(x, w[:, 0]),
            torch.bmm(x.unsqueeze(0), w.unsqueeze(0)), torch.addmm(b, x, w),
            torch.nn.functional.linear(x, w.T, b), torch.einsum("ij,jk->ik", x, w))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_strided_fullgraph_equals_eager(family, device):
    mt = masked((4, 6), device)
    fn = FAMILIES[family]
    assert_same(compiled(fn)(mt), fn(mt))


def _nonfinite_masked(shape, device, dtype):
    """NaN and +-inf both specified and unspecified, and a fully masked row."""
    mt, data, mask = make_masked(shape, dtype=dtype, seed=5)
    data = data.clone()
    data[1, :6] = torch.tensor([math.nan, math.inf, -math.inf] * 2, dtype=dtype)
    mask = mask.clone()
    mask[1, :6] = torch.tensor([True, True, True, False, False, False])
    mask[2] = False
    mask[3, :5] = True
    data[3, :5] = torch.tensor([math.inf, -math.inf, 1, 2, 3], dtype=dtype)  # inf - inf
    mask[4, :3] = True
    data[4, :3] = torch.tensor([-math.inf, -math.inf, -math.inf], dtype=dtype)
    mask[4, 3:] = False  # a row of -inf only
    return ms.masked_tensor(data, mask).to(device)


@pytest.fixture
def vector_masks_from_any_size(monkeypatch):
    """Small test tensors take the uint8-view path too (Note [Compiled mask loads])."""
    import layouts._vector_mask

    monkeypatch.setattr(layouts._vector_mask, "_MIN_ELEMENTS", 0)


@pytest.mark.usefixtures("vector_masks_from_any_size")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_inductor_reductions_and_softmax(device, dtype):
    # Inductor itself: the compiled path reads the mask through ``vector_mask`` (Note
    # [Compiled mask loads]) and fills with ``where`` instead of the eager bit tricks.
    mt = _nonfinite_masked((6, 40), device, dtype)

    def fn(x):
        return (x.sum(1), x.sum(), x.mean(1), x.amax(1), x.amin(0), x.argmax(1), x.prod(1),
                x.logsumexp(1), x.var(1), x.std(0), x.norm(dim=1), (x > 0).any(1),
                (x > 0).all(0), x.count_nonzero(1), x.softmax(1), x.log_softmax(1),
                x.softmax(0), x.to_tensor(0))

    assert_same(compiled(fn, backend="inductor")(mt), fn(mt))


@pytest.mark.usefixtures("vector_masks_from_any_size")
def test_compiled_strided_kernels_read_the_mask_bytes_once():
    # Note [Compiled mask loads]: the traced graph reads the mask through one uint8 view
    # (via int16), shared by every op on that mask (softmax, then to_tensor).
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, inputs):
        def keep(g, _):
            graphs.append(g)
            return g

        return aot_module_simplified(gm, inputs, fw_compiler=keep)

    mt = masked((4, 6), "cpu")
    fn = torch.compile(lambda x: (x.sum(1), x.softmax(1).to_tensor(0)), backend=backend,
                       fullgraph=True, dynamic=False)
    assert_same(fn(mt), (mt.sum(1), mt.softmax(1).to_tensor(0)))
    code = graphs[0].code
    assert code.count("torch.int16") == 1 and code.count("torch.uint8") == 1, code


@pytest.mark.parametrize("make", [
    lambda: torch.rand(6, 8) > 0.5,                     # the views apply
    lambda: torch.rand(5, 7) > 0.5,                     # odd size: the mask itself
    lambda: (torch.rand(8, 6) > 0.5).t(),               # not contiguous
    lambda: (torch.rand(9, 2) > 0.5)[1:],               # odd storage offset
    lambda: torch.zeros(0, 4, dtype=torch.bool),
    lambda: torch.tensor(True),
], ids=["even", "odd", "transposed", "offset", "empty", "0-d"])
@pytest.mark.usefixtures("vector_masks_from_any_size")
def test_vector_mask_equals_the_mask(make):
    from layouts._vector_mask import vector_mask

    mask = make()
    got = vector_mask(mask)
    assert got.dtype == torch.bool and torch.equal(got, mask)


def test_vector_mask_leaves_small_masks_alone():
    from layouts._vector_mask import _MIN_ELEMENTS, vector_mask

    small, large = torch.rand(4, 6) > 0.5, torch.rand(2, _MIN_ELEMENTS) > 0.5
    assert vector_mask(small) is small
    got = vector_mask(large)
    assert got is not large and torch.equal(got, large)


def test_construction_and_autograd_inside_compiled_function(device):
    gen = torch.Generator().manual_seed(3)
    lin = torch.nn.Linear(6, 6).to(device)
    x = torch.randn(4, 6, generator=gen).to(device)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).to(device)
    mask[1] = False  # a fully masked row: unspecified in the result, no NaN gradient

    def fn(x, mask):
        mt = ms.as_masked_tensor(lin(x), mask)
        built = ms.masked_tensor(x, mask)
        return (mt.softmax(1) * 2).sum(1).to_tensor(0).sum() + built.sum().to_tensor(0)

    ref = fn(x, mask)
    ref.backward()
    ref_grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    got = compiled(fn)(x, mask)
    got.backward()
    torch.testing.assert_close(got, ref)
    for p, g in zip(lin.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g)
        assert not p.grad.isnan().any()


@pytest.mark.parametrize("fn", [lambda x: x.exp().softmax(1).amax(1).sum(),
                                lambda x: sum(y.sum().to_tensor(0) for y in _matmuls(x))],
                         ids=["softmax-amax", "matmul"])
def test_masked_leaf_gradient_through_compiled_function(device, fn):
    mt = masked((4, 6), device).requires_grad_()
    ref_mt = masked((4, 6), device).requires_grad_()
    fn(ref_mt).backward()
    compiled(fn)(mt).backward()
    assert_same(mt.grad, ref_mt.grad)


# -- sparse layouts: compile, equal to eager, graph breaks only where torch needs them ----
SPARSE_FAMILIES = {  # family -> (function, compiles in one graph)
    "pointwise": (lambda x: (x.exp() * 2 - x.abs()).sin() + x * x, True),
    "where": (lambda x: torch.where(x > 0, x, x * 2), True),
    "full reduction": (lambda x: (x.sum(), x.amax()), True),
    "reduction along a dim": (lambda x: (x.sum(1), x.amax(0), x.mean(1)), True),
    "softmax": (lambda x: (x.softmax(1), x.log_softmax(0)), True),
    "to_tensor": (lambda x: (x.to_tensor(0), x.get_mask(), x.to_tensor(1.5)), False),
    "matmul": (lambda x: (x @ torch.ones(6, 2, device=x.device)).sin() * 2, True),
}


# Every family on COO and CSR; CSC and BSR share those kernels (through COO / the
# compressed code), so they run the families that compile differently: kept short for CI.
SPARSE_CASES = [(lay, fam) for lay in ("sparse_coo", "sparse_csr") for fam in SPARSE_FAMILIES]
SPARSE_CASES += [(lay, fam) for lay in ("sparse_csc", "sparse_bsr")
                 for fam in ("pointwise", "full reduction", "reduction along a dim", "to_tensor",
                             "matmul")]


@pytest.mark.parametrize(("layout", "family"), SPARSE_CASES)
def test_sparse_compiles_and_equals_eager(layout, family, device):
    mt = masked((4, 6), device, layout)
    fn, one_graph = SPARSE_FAMILIES[family]
    assert_same(compiled(fn, fullgraph=one_graph)(mt), fn(mt))
    if one_graph:
        assert graph_breaks(fn, mt) == 0


def test_as_masked_tensor_of_a_linear_inside_compiled_forward(device):
    layout = "sparse_coo"
    lin = torch.nn.Linear(6, 6).to(device)
    mt = masked((4, 6), device, layout)

    def forward(x):
        y = ms.as_masked_tensor(lin(x.to_tensor(0).to_dense()), x.to_dense().get_mask())
        return ms.to_layout(y, layout).exp().sum(1)

    assert_same(compiled(forward, fullgraph=False)(mt), forward(mt))


# -- torch.export -------------------------------------------------------------------------
class Block(torch.nn.Module):
    def forward(self, x):
        y = (x * 2 + 1).exp()
        return y.softmax(1).sum(1), y.amax(0), x.mean(), y.log_softmax(1).to_tensor(0)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_export_runs_on_new_data_and_mask(strict, device):
    ep = torch.export.export(Block(), (masked((4, 6), device, seed=0),), strict=strict)
    assert "_tensor_constant" not in ep.graph_module.code  # computes from its input
    new = masked((4, 6), device, seed=7)
    assert_same(ep.module()(new), Block()(new))


# -- torch.func ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["strided"] + SPARSE)
def test_vmap_over_masked_tensors(layout, device):
    mt = masked((4, 6), device, layout)

    def fn(x):  # one row at a time
        return ms.to_tensor(x.sin() * 2, 0.5), ms.to_tensor(x.exp().sum(0), 0)

    got = torch.func.vmap(fn)(mt)
    ref = fn(mt)[0], ms.to_tensor(mt.exp().sum(1), 0)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.to_dense(), r.to_dense())


@pytest.mark.parametrize("layout", ["strided"] + SPARSE)
def test_vjp_of_pointwise_ops(layout, device):
    mt = masked((4, 6), device, layout, dtype=torch.float64)
    out, pullback = torch.func.vjp(lambda x: x.sin() * 3, mt)
    (got,) = pullback(torch.ones_like(out))
    assert_same(got, mt.cos() * 3)


# -- torch.jit ----------------------------------------------------------------------------
def test_jit_trace_says_what_to_use_instead():
    mt = masked((2, 3), "cpu")
    with pytest.raises(NotImplementedError, match="torch.compile"):
        torch.jit.trace(lambda x: x * 2, (mt,))
