"""The native backward kernels (``_native.backward``: ``ms_lines_backward`` /
``ms_scatter_backward`` in ``layouts/_native.c``).

Each op is compared with its definition written in torch ops, per line and per group of
an index (every index type), on random values with NaN and +-inf specified or not, ties,
empty and fully masked groups: the same bits, the exps within a few ULP of torch's, and
+0.0 wherever unspecified. Out-of-range indices raise instead of reading or writing
memory; inputs the kernels do not take give None (the torch-op backward runs). The
gradients these kernels give in a training step are compared with the torch-op backward in
``tests/kernels/test_one_route.py``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_native import INDEX_DTYPES, _inputs, build  # noqa: F401 (the fixture)

import layouts._native as native

pytestmark = pytest.mark.skipif(not native.available(),
                                reason=f"native kernels: {native.status()}")

DTYPES = [torch.float32, torch.float64]
OPS = ["expand", "dev", "dev+c", "exp", "softmax", "log_softmax", "ties"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def _definition(op, x, y, mask, a, b, c, gid):
    """``where(mask, f, 0)`` of the op in torch ops, each step in the values' type, and
    for the exps the size of the terms (their rounding sets the tolerance)."""
    A, B = a[gid], b[gid]
    zero = torch.zeros((), dtype=x.dtype)
    scale = None
    if op == "expand":
        out = A.expand_as(x)
    elif op == "dev":
        out = (x - B) * A
    elif op == "dev+c":
        out = c[gid] + (x - B) * A
    elif op == "exp":
        out = A * (x - B).exp()
        scale = out.abs()
    elif op == "softmax":
        out = x * (y - A)
    elif op == "log_softmax":
        prod = x.exp() * A
        out, scale = y - prod, y.abs() + prod.abs()
    else:  # ties
        hit = mask & (x == B)
        ties = torch.zeros(a.shape[0], dtype=torch.long).index_add_(0, gid, hit.long())
        out = torch.where(hit, A / ties.to(x.dtype)[gid], zero)
    return torch.where(mask, out, zero), scale


def _check(got, want, scale, mask):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got[~mask]), torch.zeros_like(_bits(got[~mask])))  # +0.0
    if scale is None:
        assert torch.equal(_bits(got), _bits(want))
        return
    eps = torch.finfo(got.dtype).eps
    close = ((got - want).abs() <= 4 * eps * scale) | (got == want)
    assert bool((close | (got.isnan() & want.isnan()))[mask].all())


def _operands(n, groups, dtype, density, seed, specials, op):
    """x, y (per element), a, b, c (per group); values rounded to halves (ties), b of the
    ties the groups' masked maxima, of the others random."""
    x, mask = _inputs(n, dtype, density, seed, specials=specials)
    g = torch.Generator().manual_seed(seed + 1)
    if op == "ties":
        x = (x * 2).round() / 2
    y = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    a, b, c = (torch.randn(groups, generator=g, dtype=torch.float64).to(dtype)
               for _ in range(3))
    return x, y, mask, a, b, c


def _call(op, mask, a, b, c, x, y, **where):
    kernel_op = "dev" if op == "dev+c" else op
    return native.backward(kernel_op, mask, a, b=b, x=x, y=y,
                           c=c if op == "dev+c" else None, **where)


# a few lines of any length, or many short ones (several line ends in one vector step of
# the one-pass kernels, Note in _native.c's BW_EXPAND section)
sizes = (st.lists(st.integers(0, 300) | st.integers(256, 1000), min_size=1, max_size=10)
         | st.lists(st.integers(0, 40), min_size=1, max_size=200))
densities = st.sampled_from([0.0, 0.5, 0.9, 1.0])
specials = st.sampled_from([0.0, 0.15])


@pytest.mark.usefixtures("build")
@settings(max_examples=60, deadline=None)
@given(lengths=sizes, density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS), specials=specials,
       listed=st.booleans())
def test_lines_backward_is_its_definition(lengths, density, seed, dtype, op, specials,
                                          listed):
    """Lines of any length (empty ones, short, blocks of 64 and their tails), every line
    or the non-empty ones listed (a grouping's lines), one group value per listed line."""
    _check_lines(lengths, density, seed, dtype, op, specials, listed)


@pytest.mark.usefixtures("build")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["expand", "ties"])
def test_large_outputs_streamed_are_their_definition(dtype, op):
    """Outputs past the kernels' streaming size (Note [Streaming stores] in _native.c: the
    one-pass kernels' vector steps store non-temporally): ragged lines with short ones
    among them (scalar stores in the same cache lines), empty lines, several ties."""
    g = torch.Generator().manual_seed(7)
    n_min = (5 << 20) // torch.empty((), dtype=dtype).element_size()  # over 4 MiB
    lengths = []
    while sum(lengths) < n_min:
        lengths += torch.randint(0, 200, (1000,), generator=g).tolist()
        lengths += torch.randint(0, 12, (300,), generator=g).tolist()
    _check_lines(lengths, 0.9, 11, dtype, op, 0.15, listed=True)


def _check_lines(lengths, density, seed, dtype, op, specials, listed):
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    lines = torch.arange(len(lengths))
    which = None
    if listed:
        which = lines = torch.tensor([i for i, k in enumerate(lengths) if k], dtype=torch.long)
    x, y, mask, a, b, c = _operands(n, lines.shape[0], dtype, density, seed, specials, op)
    if op == "ties" and lines.shape[0]:  # b: each line's masked maximum
        line_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        top = torch.full((len(lengths),), -torch.inf, dtype=dtype).scatter_reduce(
            0, line_of, torch.where(mask, x, -torch.inf), "amax")
        b = top[lines]
    gid = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    if listed:  # element -> its listed line
        gid = (torch.cumsum(torch.tensor([k > 0 for k in lengths]), 0) - 1)[gid]
    got = _call(op, mask, a, b, c, x, y, offsets=offsets, which=which)
    want, scale = _definition(op, x, y, mask, a, b, c, gid)
    _check(got, want, scale, mask)


@pytest.mark.usefixtures("build")
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 700), groups=st.integers(1, 40), density=densities,
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS),
       specials=specials, index_dtype=st.sampled_from(INDEX_DTYPES))
def test_scatter_backward_is_its_definition(n, groups, density, seed, dtype, op, specials,
                                            index_dtype):
    """Any group index type the kernels read; groups without an element or with no
    specified one."""
    x, y, mask, a, b, c = _operands(n, groups, dtype, density, seed, specials, op)
    gid = torch.randint(0, groups, (n,), generator=torch.Generator().manual_seed(seed))
    if op == "ties":
        b = torch.full((groups,), -torch.inf, dtype=dtype).scatter_reduce(
            0, gid, torch.where(mask, x, -torch.inf), "amax")
    got = _call(op, mask, a, b, c, x, y, index=gid.to(index_dtype), n=groups)
    want, scale = _definition(op, x, y, mask, a, b, c, gid)
    _check(got, want, scale, mask)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", [-1, 3, 2**16 + 1])
def test_an_out_of_range_group_index_raises(op, index_dtype, bad):
    if bad < 0 and index_dtype is torch.uint16 or bad >= 2**16 and index_dtype is torch.uint16:
        pytest.skip("not a uint16 value")
    x = torch.ones(200)
    index = torch.zeros(200, dtype=torch.long)
    index[150] = bad
    with pytest.raises(RuntimeError, match="backward.*out of range"):
        _call(op, torch.ones(200, dtype=torch.bool), torch.ones(3), torch.ones(3),
              torch.ones(3), x, x, index=index.to(index_dtype), n=3)


def _bad_lines(bad: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Line pointers and listed lines over 6 elements that a lines kernel must refuse."""
    return {"which": (torch.tensor([0, 2, 6]), torch.tensor([2])),
            "decreasing": (torch.tensor([0, 4, 2, 6]), torch.tensor([1])),
            "short": (torch.tensor([0, 2, 5]), None),
            "long": (torch.tensor([0, 2, 9]), None)}[bad]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", ["which", "decreasing", "short", "long"])
def test_out_of_range_lines_raise(op, bad):
    """A listed line past the last, pointers that decrease, or that do not end at the
    number of elements: raised before anything is read past the arrays."""
    x, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    offsets, which = _bad_lines(bad)
    groups = 1 if which is not None else offsets.shape[0] - 1
    per_group = torch.ones(groups)
    with pytest.raises(RuntimeError, match="out of range"):
        _call(op, mask, per_group, per_group, per_group, x, x, offsets=offsets, which=which)


def test_the_error_names_the_op():
    with pytest.raises(RuntimeError, match=r"\(amax backward\)"):
        native.backward("ties", torch.ones(2, dtype=torch.bool), torch.ones(1),
                        b=torch.ones(1), x=torch.ones(2), index=torch.tensor([0, 5]), n=1,
                        what="amax")


@pytest.mark.parametrize("case", ["float16", "int mask", "short a", "no b", "2-D mask",
                                  "x of another dtype"])
def test_inputs_the_kernels_do_not_take_give_none(case):
    """The caller's torch-op backward runs instead."""
    mask, a, x = torch.ones(4, dtype=torch.bool), torch.ones(2), torch.ones(4)
    offsets = torch.tensor([0, 2, 4])
    kwargs = dict(b=torch.ones(2), x=x, offsets=offsets)
    op = "dev"
    if case == "float16":
        a, kwargs["b"], kwargs["x"] = a.half(), kwargs["b"].half(), x.half()
    elif case == "int mask":
        mask = mask.to(torch.uint8)
    elif case == "short a":
        a = torch.ones(1)
    elif case == "no b":
        kwargs["b"] = None
    elif case == "2-D mask":
        mask = mask.view(2, 2)
    else:
        kwargs["x"] = x.double()
    assert native.backward(op, mask, a, **kwargs) is None


@pytest.mark.usefixtures("build")
@settings(max_examples=60, deadline=None)
@given(lengths=sizes, density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), specials=specials, listed=st.booleans())
def test_the_fused_softmax_backward_is_the_composed_one(lengths, density, seed, dtype,
                                                        specials, listed):
    """``softmax_backward`` (one call) against the composed route it replaces -- the
    multiply, the lines sum and ``backward("softmax")`` -- bit for bit, NaN and inf in the
    softmax output and the gradient, specified or not, any line length, listed lines."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    which = None
    if listed:
        which = torch.tensor([i for i, k in enumerate(lengths) if k], dtype=torch.long)
    out, mask = _inputs(n, dtype, density, seed, specials=specials)
    grad, _ = _inputs(n, dtype, 1.0, seed + 1, specials=specials)
    total = native.lines(grad * out, mask, "sum", offsets, which)
    want = native.backward("softmax", mask, total, x=out, y=grad, offsets=offsets,
                           which=which)
    got = native.softmax_backward(out, grad, mask, offsets, which)
    assert got is not None and want is not None
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("bad", ["which", "decreasing", "short", "long"])
def test_the_fused_softmax_backward_refuses_out_of_range_lines(bad):
    x, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    offsets, which = _bad_lines(bad)
    with pytest.raises(RuntimeError, match=r"softmax backward.*out of range"):
        native.softmax_backward(x, x, mask, offsets, which)


def test_the_fused_softmax_backward_declines_what_it_does_not_take():
    """Other dtypes, a mask of another length, a 2-D mask that is no column: None (the
    composed route runs)."""
    m, offsets = torch.ones(4, dtype=torch.bool), torch.tensor([0, 4])
    assert native.softmax_backward(torch.ones(4, dtype=torch.float16),
                                   torch.ones(4, dtype=torch.float16), m, offsets) is None
    assert native.softmax_backward(torch.ones(5), torch.ones(5), m, offsets) is None
    assert native.softmax_backward(torch.ones(2, 2), torch.ones(2, 2), m.view(2, 2),
                                   offsets) is None


@pytest.mark.usefixtures("build")
@settings(max_examples=30, deadline=None)
@given(lengths=sizes, density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), specials=specials)
def test_a_column_is_read_as_the_vector(lengths, density, seed, dtype, specials):
    """One head of a hybrid tensor's values, ``(nnz, 1)``: the softmax, its fused backward
    and the any-shape scatter read the column as they read the vector -- the same bits, in
    the column's shape (no reshape each way)."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    x, mask = _inputs(n, dtype, density, seed, specials=specials)
    y, _ = _inputs(n, dtype, 1.0, seed + 1, specials=specials)
    col = (x[:, None], y[:, None], mask[:, None])
    want = native.softmax(x, mask, False, offsets)
    got = native.softmax(col[0], col[2], False, offsets)
    assert got.shape == (n, 1) and torch.equal(_bits(got.view(-1)), _bits(want))
    want = native.softmax_backward(want, y, mask, offsets)
    got = native.softmax_backward(got, col[1], col[2], offsets)
    assert got.shape == (n, 1) and torch.equal(_bits(got.view(-1)), _bits(want))
    groups = torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(seed))
    want = native.scatter(y, mask, "sum", groups, 5)
    for index in (groups, groups[:, None]):  # a vector, or the values' shape
        got = native.scatter(col[1], col[2], "sum", index, 5, (5, 1))
        assert got.shape == (5, 1) and torch.equal(_bits(got.view(-1)), _bits(want))
    assert native.scatter(col[1], col[2], "sum", groups, 5) is None  # vectors only
