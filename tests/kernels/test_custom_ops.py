"""The kernel families as ``torch.library`` ops (``layouts/kernels/``, Note [Kernel families
as ops]).

- each op against a float64 reference computed group by group with ``torch.where`` on the
  values' device, by the CPU implementation (the C kernels where loaded), by the torch-op
  implementation (``layouts.native_disabled()``: what other devices and
  ``MASKED_SPARSE_NATIVE=0`` run) and, with ``--device``, on that device;
- ``torch.library.opcheck`` of each op (fake vs real, autograd registration, AOT);
- torch.compile of sparse masked reductions puts the ops in the graph, and the compiled
  values and gradients equal eager ones bit for bit (the same C kernels).
Compiles are few and small (``aot_eager`` but one Inductor case); speed lives in
``benchmarks/``.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from conftest import cpu_only, dense_of, make_masked
from hypothesis import given
from hypothesis import strategies as st

import layouts
import masked_sparse as ms
from layouts import _native
from layouts.kernels import segmented_cumsum

pytestmark = pytest.mark.device_generic
ops = torch.ops.masked_sparse

# The groups of 10 values: (offsets, which, index, n) per kind (Note [Kernel families as
# custom ops]); the reference's group of each element.
KINDS = {
    "all": ((None, None, None, 1), [0] * 10),
    "lines": (([0, 3, 3, 7, 10], None, None, 4), [0, 0, 0, 2, 2, 2, 2, 3, 3, 3]),
    "listed lines": (([0, 3, 3, 7, 10], [0, 2, 3], None, 3), [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]),
    "scatter": ((None, None, [0, 2, 1, 2, 0, 1, 1, 2, 0, 0], 3),
                [0, 2, 1, 2, 0, 1, 1, 2, 0, 0]),
}
CASES = [("reduce", "sum"), ("reduce", "sumsq"), ("reduce", "prod"), ("reduce", "amax"),
         ("reduce", "amin"), ("moments", None), ("moments", 1.0), ("logsumexp", None),
         ("softmax", False), ("softmax", True), ("arg_extreme", "amax"),
         ("arg_extreme", "amin")]


def _inputs(kind, dtype, device, requires_grad=False):
    gen = torch.Generator().manual_seed(5)
    values = torch.randn(10, dtype=dtype, generator=gen)
    mask = torch.rand(10, generator=gen) > 0.35
    mask[[1, 2]] = False  # a scatter group with one specified element
    values[2] = float("nan")  # unspecified: never read
    (offsets, which, index, n), group = KINDS[kind]

    def t(x):
        return None if x is None else torch.tensor(x, device=device)

    return (values.to(device).requires_grad_(requires_grad), mask.to(device), t(offsets),
            t(which), t(index), n), torch.tensor(group)


def _specified(mask, group, n):
    """Per group, whether it holds a specified element (what ``logsumexp`` is given)."""
    return torch.zeros(n, dtype=torch.bool, device=mask.device).index_put_(
        (group.to(mask.device),), mask, accumulate=True)


def _call(name, arg, inputs, n, group):
    if name == "logsumexp":
        return ops.logsumexp(*inputs, _specified(inputs[1], group, n))
    if name == "arg_extreme":
        return ops.arg_extreme(*inputs, torch.arange(10, device=inputs[0].device), arg)
    return getattr(ops, name)(*inputs, arg)


def _reference(name, arg, values, mask, group, n):
    """Group by group in float64, from the specified elements (``torch.where``), built on
    the values' device (every tensor here names it)."""
    device = values.device
    v, m, group = values.detach().double(), mask, group.to(device)
    outs = []
    inf = torch.tensor(torch.inf, dtype=torch.float64, device=device)
    if name == "softmax":
        out = torch.zeros(10, dtype=torch.float64, device=device)
    for k in range(n):
        sel = (group == k) & m
        x = torch.where(sel, v, 0.0)[sel]
        if name == "reduce":
            op = {"sum": torch.sum, "prod": torch.prod, "sumsq": lambda y: (y * y).sum(),
                  "amax": lambda y: y.max() if y.numel() else -inf,
                  "amin": lambda y: y.min() if y.numel() else inf}[arg]
            outs.append(op(x))
        elif name == "moments":
            zero = torch.zeros((), dtype=torch.float64, device=device)
            mean = x.mean() if x.numel() else zero
            dof = x.numel() - (arg or 0)
            var = ((x - mean) ** 2).sum() / dof if dof > 0 else zero
            outs.append((var, mean, dof > 0))  # a variance needs count > correction
        elif name == "logsumexp":
            outs.append(torch.logsumexp(x, 0) if x.numel() else
                        torch.zeros((), dtype=torch.float64, device=device))
        elif name == "softmax":
            out[sel] = (torch.log_softmax if arg else torch.softmax)(x, 0)
        else:
            pos = sel.nonzero().squeeze(1)
            if not x.numel():
                outs.append((0.0, 0))
            else:
                i = int(x.argmax() if arg == "amax" else x.argmin())
                outs.append((float(x[i]), int(pos[i])))
    if name == "softmax":
        return (out,)
    if name == "reduce" or name == "logsumexp":
        return (torch.stack(outs),)
    if name == "moments":
        var = torch.stack([o[0] for o in outs]) if arg is not None else \
            torch.zeros(0, dtype=torch.float64, device=device)
        return (var, torch.stack([o[1] for o in outs]),
                torch.tensor([o[2] for o in outs], device=device))
    return (torch.tensor([o[0] for o in outs], dtype=torch.float64, device=device),
            torch.tensor([o[1] for o in outs], device=device))


def _check(got, ref, dtype):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.device == r.device
        if r.is_floating_point():
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            torch.testing.assert_close(g.double(), r, rtol=tol, atol=tol)
        else:
            assert torch.equal(g, r.to(g.dtype))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("name", "arg"), CASES, ids=[f"{n}-{a}" for n, a in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
def test_op_equals_the_reference(name, arg, kind, dtype, native, device):
    if native and (device.type != "cpu" or not _native.available()):
        pytest.skip("the C kernels serve the CPU, when built")
    inputs, group = _inputs(kind, dtype, device)
    n = KINDS[kind][0][3]
    with contextlib.nullcontext() if native else layouts.native_disabled():
        # (disabled: the torch-op implementation, what every other device runs)
        got = _call(name, arg, inputs, n, group)
    _check(got, _reference(name, arg, inputs[0], inputs[1], group, n), dtype)


@cpu_only("opcheck of the CPU implementation")
@pytest.mark.parametrize(("name", "arg"), CASES, ids=[f"{n}-{a}" for n, a in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_opcheck(name, arg, dtype, requires_grad):
    for kind in KINDS:
        inputs, group = _inputs(kind, dtype, "cpu", requires_grad)
        n = KINDS[kind][0][3]
        extra = {"logsumexp": (_specified(inputs[1], group, n),),
                 "arg_extreme": (torch.arange(10), arg)}.get(name, (arg,))
        torch.library.opcheck(getattr(ops, name).default, (*inputs, *extra))


# -- torch.compile: the ops in the graph, eager's bits ------------------------------------
def _graphs_of(fn, fullgraph=True):
    """``fn`` compiled with AOTAutograd (no Inductor), and the list of its graphs' code."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    codes: list[str] = []

    def keep(gm, _):
        codes.append(gm.code)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    return torch.compile(fn, fullgraph=fullgraph, dynamic=False, backend=backend), codes


FULL = {"sum": lambda x: x.sum(), "amax": lambda x: x.amax(), "mean": lambda x: x.mean(),
        "var": lambda x: x.var(), "logsumexp": lambda x: x.logsumexp((0, 1)),
        "argmax": lambda x: x.argmax()}
OP_OF = {"sum": "reduce", "amax": "reduce", "mean": "moments", "var": "moments",
         "logsumexp": "logsumexp", "argmax": "arg_extreme"}


def _leaf(layout, dtype=torch.float64, requires_grad=True):
    mt = ms.to_layout(make_masked((4, 6), dtype=dtype, seed=0)[0], layout)
    return mt.requires_grad_() if requires_grad else mt


def _same_masked(got, ref, ulps=0):
    """Equal masks and values, bit for bit (``ulps=0``) or within ``ulps`` of rounding: the
    eager backward of an exp family runs the native kernels' exp (within an ulp of
    torch's), a compiled one torch's."""
    (gd, gm), (rd, rm) = dense_of(got), dense_of(ref)
    assert torch.equal(gm, rm)
    gd, rd = torch.where(gm, gd, 0), torch.where(rm, rd, 0)
    if ulps:
        eps = torch.finfo(gd.dtype).eps
        torch.testing.assert_close(gd, rd, rtol=ulps * eps, atol=ulps * eps)
    else:
        assert torch.equal(gd, rd)


@cpu_only("the C kernels in a compiled graph")
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.skipif(not _native.available(), reason="the native kernels are not built")
@pytest.mark.parametrize("layout", ["sparse_csr", "sparse_coo"])
@pytest.mark.parametrize("family", list(FULL))
def test_compiled_full_reduction_runs_the_op_bit_for_bit(layout, family):
    def fn(x):
        return FULL[family](x).to_tensor(0)

    ref_x, x = _leaf(layout), _leaf(layout)
    ref = fn(ref_x)
    compiled, codes = _graphs_of(fn)
    got = compiled(x)
    assert torch.equal(got, ref)
    assert any(f"masked_sparse.{OP_OF[family]}" in code for code in codes), codes
    if got.is_floating_point():
        ref.backward()
        got.backward()
        _same_masked(x.grad, ref_x.grad, ulps=4 if family == "logsumexp" else 0)


@cpu_only("the C kernels in a compiled graph")
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("layout", ["sparse_csr", "sparse_coo"])
def test_compiled_softmax_and_dim_reductions_equal_eager(layout):
    # A softmax or reduction along a dim of a sparse layout traces every line (Note [Lines
    # while tracing]); the full sum after it is in the graph too. (The results are taken
    # strided: a torch sparse result would end the graph there, and a MaskedTensor output
    # that backward never reaches gets a plain zero tangent, which torch cannot coerce.)
    def fn(x):
        return (x.softmax(1).sum().to_tensor(0), x.log_softmax(0).sum().to_tensor(0),
                x.sum(1).to_dense().to_tensor(0), x.amax(0).to_dense().to_tensor(0))

    ref_x, x = _leaf(layout, torch.float32), _leaf(layout, torch.float32)
    ref = fn(ref_x)
    compiled, codes = _graphs_of(fn, fullgraph=False)
    got = compiled(x)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)
    (ref[0] + ref[1]).backward()
    (got[0] + got[1]).backward()
    _same_masked(x.grad, ref_x.grad, ulps=4)  # softmax's backward: eager runs the kernels
    assert any("masked_sparse.reduce" in code for code in codes)


@cpu_only("Inductor's CPU backend")
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.skipif(not _native.available(), reason="the native kernels are not built")
def test_inductor_calls_the_op():
    from torch._inductor.utils import run_and_get_code

    x = _leaf("sparse_csr", torch.float32, requires_grad=False)

    def fn(x):
        return x.sum().to_tensor(0) * 2, x.var().to_tensor(0)

    got, codes = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), x)
    ref = fn(x)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert any("masked_sparse.reduce" in c for c in codes)
    assert any("masked_sparse.moments" in c for c in codes)


def test_eager_calls_skip_the_op(monkeypatch):
    # Eager code calls the implementations the op registers, never the op's dispatcher
    # (Note [Eager calls skip the dispatcher]); the op is for tracers.
    from layouts.kernels import moments, reduce

    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through the op")

    for family in (moments.MOMENTS, reduce.REDUCE):
        monkeypatch.setattr(family, "op", staticmethod(refuse))
    x = _leaf("sparse_csr", torch.float64)
    x.mean().to_tensor(0).backward()
    x.sum(1).to_tensor(0).to_dense().sum()
    assert layouts.native_status()  # (the library still reports its state)


# -- masked_sparse::cumsum_lines: the running sum per line ---------------------------------
def _lines_reference(values, offsets):
    """Line by line, ``torch.cumsum`` of the line in float64."""
    v, o = values.detach().double().cpu(), offsets.tolist()
    return torch.cat([v.new_zeros(0)] + [v[a:b].cumsum(0) for a, b in zip(o, o[1:])])


def _lines(lengths, dtype, device="cpu", seed=0, specials=False):
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    values = (torch.randn(int(offsets[-1]), generator=gen) * 100).to(dtype)
    if specials and values.numel() > 2:  # inf and NaN stay in their line
        values[torch.randint(values.numel(), (2,), generator=gen)] = torch.tensor(
            [math.inf, math.nan], dtype=dtype)
    return values.to(device), offsets.to(device)


def _same_nan(got, want):
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    return got[ok], want[ok]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "inf-nan"])
def test_cumsum_lines_op_equals_the_reference(dtype, native, specials, device, monkeypatch):
    """The op on lines of every length (empty ones, one longer than the rest), with inf and
    NaN that must not leave their line: the C kernel is torch.cumsum of each line bit for
    bit; the torch ops (other devices, ``MASKED_SPARSE_NATIVE=0``) within rounding."""
    if not native:
        monkeypatch.setattr(_native, "_library", _native._none)
    elif device.type != "cpu" or not _native.available():
        pytest.skip("the C kernels serve the CPU, when built")
    values, offsets = _lines([3, 0, 1, 0, 40, 7, 0], dtype, device, specials=specials)
    got = ops.cumsum_lines(values, offsets)
    assert got.dtype == dtype and got.device == values.device
    want = _lines_reference(values, offsets)
    got, want = _same_nan(got.cpu().double(), want)
    if native:  # torch.cumsum's own bits, line by line
        per_line = torch.cat([values[a:b].cumsum(0) for a, b in
                              zip(offsets.tolist(), offsets.tolist()[1:])])
        assert torch.equal(*_same_nan(ops.cumsum_lines(values, offsets), per_line))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * 100)


@cpu_only("the torch ops against the C kernel")
@pytest.mark.skipif(not _native.available(), reason="the native kernels are not built")
@given(lengths=st.lists(st.integers(0, 70) | st.just(0) | st.integers(200, 2000), min_size=1,
                       max_size=12),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16),
       scale=st.sampled_from([1.0, 1e6]))
def test_cumsum_lines_torch_ops_agree_with_the_kernel(lengths, dtype, seed, scale):
    """The segmented running sum of torch ops (Note [Segmented running sum]) against the
    kernel on random lines: within a rounding of the kernel's sequential sums, and no line
    reads another (a huge line before a small one leaves the small one exact)."""
    values, offsets = _lines(lengths, dtype, seed=seed)
    values = values * torch.where(torch.arange(values.numel()) % 2 == 0, scale, 1.0).to(dtype)
    kernel = _native.cumsum_lines(values, offsets)
    torch_ops = segmented_cumsum(values, offsets)
    assert torch_ops.dtype == dtype and torch_ops.shape == values.shape
    eps = torch.finfo(dtype).eps
    # bound: a few roundings of the running sums' magnitudes, per element
    bound = 4 * eps * _lines_reference(values.abs(), offsets)
    assert bool(((torch_ops.double() - kernel.double()).abs() <= bound).all())


@cpu_only("opcheck of the CPU implementation")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_cumsum_lines_opcheck(dtype, requires_grad):
    for lengths in ([3, 0, 5, 1], [0], [17]):
        values, offsets = _lines(lengths, dtype)
        torch.library.opcheck(ops.cumsum_lines.default,
                              (values.requires_grad_(requires_grad), offsets))


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
def test_cumsum_lines_backward_is_the_reverse_running_sum(native, device, monkeypatch):
    """The op's registered backward against finite differences (float64), and its double
    backward (create_graph: the backward runs the op again, itself differentiable)."""
    if not native:
        monkeypatch.setattr(_native, "_library", _native._none)
    values, offsets = _lines([4, 0, 6, 1], torch.float64, device)
    values.requires_grad_()
    assert torch.autograd.gradcheck(lambda v: ops.cumsum_lines(v, offsets), (values,))
    assert torch.autograd.gradgradcheck(lambda v: ops.cumsum_lines(v, offsets) ** 2,
                                        (values,))


def _cumsum_leaf(layout, dtype, seed=3):
    g = torch.Generator().manual_seed(seed)
    data = (torch.randn(6, 9, generator=g) * 50).to(dtype)
    mask = torch.rand(6, 9, generator=g) < 0.7
    mask[2] = False  # a line with nothing specified
    mt = ms.to_layout(make_masked((6, 9), dtype=dtype, data=data, mask=mask,
                                  stored_masked=0.2, seed=seed)[0], layout)
    return mt, data, mask


@cpu_only("the C kernels in a compiled graph")
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.skipif(not _native.available(), reason="the native kernels are not built")
@pytest.mark.parametrize(("layout", "dim"), [("sparse_csr", 1), ("sparse_csc", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_compiled_cumsum_along_stored_lines_runs_the_op(layout, dim, dtype):
    """torch.cumsum along a compressed layout's stored lines compiles into one graph with
    the op: eager's bits forward and backward (the same kernel on the flipped lines), and
    the gradient of the float64 dense reference."""
    mt, data, mask = _cumsum_leaf(layout, dtype)
    w = torch.linspace(0.5, 2.0, mask.numel(), dtype=dtype).reshape(mask.shape)

    def fn(x):
        return (torch.cumsum(x, dim).to_dense().to_tensor(0) * w).sum(), \
            torch.cumsum(x, dim).to_dense().to_tensor(0)

    ref_x, x = mt.clone().requires_grad_(), mt.clone().requires_grad_()
    ref = fn(ref_x)
    compiled, codes = _graphs_of(fn)
    got = compiled(x)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0])
    assert any("masked_sparse.cumsum_lines" in code for code in codes[:1]), codes
    ref[0].backward()
    got[0].backward()
    assert any("masked_sparse.cumsum_lines" in code for code in codes[1:]), codes
    _same_masked(x.grad, ref_x.grad)
    xx = data.double().requires_grad_()
    (torch.where(mask, torch.where(mask, xx, 0).cumsum(dim), 0) * w.double()).sum().backward()
    gd, gm = dense_of(x.grad)
    assert torch.equal(gm, mask)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(torch.where(mask, gd, 0).double(),
                               torch.where(mask, xx.grad, 0), rtol=tol, atol=tol)
    want = torch.where(mask, torch.where(mask, data.double(), 0).cumsum(dim), 0)
    torch.testing.assert_close(torch.where(mask, got[1], 0).double(), want, rtol=tol, atol=tol)


@cpu_only("Inductor's CPU backend")
@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.skipif(not _native.available(), reason="the native kernels are not built")
def test_inductor_cumsum_calls_the_op():
    from torch._inductor.utils import run_and_get_code

    mt, data, mask = _cumsum_leaf("sparse_csr", torch.float32)

    def fn(x):
        return torch.cumsum(x, 1).to_dense().to_tensor(0) * 2

    got, codes = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), mt)
    assert torch.equal(got, fn(mt))
    assert any("masked_sparse.cumsum_lines" in c for c in codes)
