"""The native reduction kernels (``layouts/_native.c``, Note [Native reductions]).

Each kernel is compared with its definition written in torch ops on random inputs
(hypothesis: sizes, densities, empty and fully masked groups, NaN and +-inf specified or
not): ``reduce(where(mask, values, identity))`` per group. Out-of-range indices raise
instead of reading memory. Without the built kernels (none, a damaged or a stale build:
Note [Shipping the native kernels]; or ``MASKED_SPARSE_NATIVE=0``) the library says why,
warns once where it was not a choice, and the reductions take the composed path, with the
same results.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layouts._native as native

pytestmark = pytest.mark.skipif(not native.available(),
                                reason=f"native kernels: {native.status()}")

DTYPES = [torch.float32, torch.float64]
OPS = ["sum", "sumsq", "prod", "amax", "amin"]


@pytest.fixture(scope="module", params=["native", "avx2", "portable"])
def build(request):
    """The build this CPU loads (explicit AVX-512 code where it has it), then each narrower
    build it runs (``MASKED_SPARSE_NATIVE=avx2``: the portable loops in 256-bit vectors,
    ``=portable``: baseline x86-64, the loops the compiler vectorizes in SSE2), so that every
    vector path meets the same tests (one install builds them all: Note [Shipping the
    native kernels])."""
    if request.param == "native":
        yield
        return
    native.status()  # (loads the build, if a test before cleared it)
    best = native._isa
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MASKED_SPARSE_NATIVE", request.param)
        for table in native._TABLES:  # what _declare fills
            patch.setattr(native, table, {})
        native._library.cache_clear()
        assert native.available(), native.status()
        if native._isa != request.param or native._isa == best:
            native._library.cache_clear()
            pytest.skip(f"no {request.param} build apart from the native one on this CPU "
                        f"({native.status()})")
        yield
    native._library.cache_clear()  # the next call loads this CPU's build again


def _inputs(n: int, dtype: torch.dtype, density: float, seed: int, op: str = "sum",
            specials: float = 0.15):
    """Random values and mask; a fraction ``specials`` of the values NaN or +-inf (few
    enough, in a long run, that the result is not NaN every time). A product's values stay
    near +-1, so that thousands of them neither overflow nor underflow (which one comes
    first would depend on the order of the products)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=g, dtype=torch.float64) * 4
    if op == "prod":
        values = values.sign() * (values * 0.02).exp()
    values = values.to(dtype)
    pick = torch.randint(0, 3, (n,), generator=g)
    special = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)[pick]
    values = torch.where(torch.rand(n, generator=g) < specials, special, values)
    mask = torch.rand(n, generator=g) < density
    return values, mask


def _reference(values, mask, op, groups, n):
    """Per group ``0..n-1`` (``groups[j]``: element j's group), the masked ``op`` reduction
    written with torch ops; groups without an element hold the identity. Sums accumulate in
    double (the kernels' documented choice: as exact as torch's or more), products in the
    values' dtype (torch's: an overflow on the way is inf)."""
    start = {"sum": 0, "sumsq": 0, "prod": 1, "amax": -math.inf, "amin": math.inf}[op]
    filled = torch.where(mask, values, torch.tensor(start, dtype=values.dtype))
    if op in ("sum", "sumsq"):
        filled = filled.double()
    if op == "sumsq":
        filled, op = filled * filled, "sum"
    out = torch.full((n,), start, dtype=filled.dtype)
    return out.scatter_reduce(0, groups, filled, op).to(values.dtype)


def _assert_same(got, want, op=None, run=0):
    """Equal up to rounding: a product of ``run`` factors in the values' dtype, taken in
    another order (vector lanes), may differ by up to ``run`` roundings."""
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol = None
    if op == "prod" and run:
        rtol = max(1.3e-6 if want.dtype == torch.float32 else 1e-7,
                   run * torch.finfo(want.dtype).eps)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=rtol,
                               atol=None if rtol is None else 0)


sizes = st.integers(0, 300)
# short runs (scalar, 16 at a time), then long ones: the vector code's blocks and tails
runs = sizes | st.integers(256, 3000)
densities = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0])
specials = st.sampled_from([0.0, 0.001, 0.15])  # the fraction of NaN / +-inf values


@settings(max_examples=40, deadline=None)
@given(n=runs, density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS), skip=st.integers(0, 7),
       specials=specials)
def test_reduce_all_is_the_masked_reduction(build, n, density, seed, dtype, op, skip,
                                            specials):
    """Any length, from any start (``skip`` elements in: unaligned values and mask)."""
    values, mask = _inputs(n + skip, dtype, density, seed, op, specials)
    values, mask = values[skip:], mask[skip:]
    got = native.reduce_all(values, mask, op)
    _assert_same(got, _reference(values, mask, op, torch.zeros(n, dtype=torch.long), 1), op, n)
    assert native.count_all(mask).item() == int(mask.sum())


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(runs, min_size=1, max_size=12), density=densities,
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS),
       specials=specials, data=st.data())
def test_lines_are_the_masked_reduction_of_each_run(build, lengths, density, seed, dtype, op,
                                                    specials, data):
    """Lines of any length (empty, short, 16 at a time, vector code from 256) starting
    anywhere (aligned or not), any subset of them in any order."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    values, mask = _inputs(n, dtype, density, seed, op, specials)
    which = torch.tensor(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=12)),
                         dtype=torch.long)
    line_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    every = _reference(values, mask, op, line_of, len(lengths))
    _assert_same(native.lines(values, mask, op, offsets, which), every[which], op,
                 max(lengths))
    _assert_same(native.lines(values, mask, op, offsets), every, op, max(lengths))  # every line
    counts = torch.zeros(len(lengths), dtype=torch.long).index_add_(0, line_of, mask.long())
    assert torch.equal(native.count_lines(mask, offsets, which), counts[which])
    assert torch.equal(native.count_lines(mask, offsets), counts)


INDEX_DTYPES = [torch.int64, torch.int32, torch.uint16]


@settings(max_examples=60, deadline=None)
@given(n=sizes, groups=st.integers(1, 40), density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS),
       index_dtype=st.sampled_from(INDEX_DTYPES), narrowed=st.booleans(),
       sorted_index=st.booleans())
def test_scatter_is_the_masked_reduction_per_group(build, n, groups, density, seed, dtype,
                                                   op, index_dtype, narrowed, sorted_index):
    """Any group index type the kernels read (int64, a CSR's int32, uint16), given as is or
    as the ``narrow`` copy of the int64 index, random or sorted (runs of one group, reduced
    in a register); in both builds (with AVX-512, the sums over a random index go 64
    elements a block, specified ones only: ``sizes`` covers no block, partial blocks and
    several)."""
    values, mask = _inputs(n, dtype, density, seed)
    index = torch.randint(0, groups, (n,), generator=torch.Generator().manual_seed(seed))
    if sorted_index:
        index = index.sort().values
    given_index = native.narrow(index, groups) if narrowed else index.to(index_dtype)
    assert given_index.dtype == (torch.uint16 if narrowed else index_dtype)
    _assert_same(native.scatter(values, mask, op, given_index, groups),
                 _reference(values, mask, op, index, groups))
    counts = torch.zeros(groups, dtype=torch.long).index_add_(0, index, mask.long())
    assert torch.equal(native.count_scatter(mask, given_index, groups), counts)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_small_scatter_sums_on_the_stack_are_the_double_output_path_bit_for_bit(
        build, dtype, monkeypatch):
    """Into at most ``ms_scatter_stack()`` groups, a float32 sum / sumsq scatter is written
    as float32 by the kernel (its double sums on the stack) and the moments' scatter keeps
    its sums there: bit for bit what a double output cast after (the path of more groups,
    forced here by a bound of 0) gives, NaN and inf included, on both sides of the bound."""
    bound = native._SCATTER_TO["stack"]
    for groups in (1, 7, bound - 1, bound, bound + 1):
        values, mask = _inputs(4 * groups + 5, dtype, 0.7, groups)
        index = torch.randint(0, groups, values.shape,
                              generator=torch.Generator().manual_seed(groups))
        counts = torch.zeros(groups, dtype=torch.long).index_add_(0, index, mask.long())
        for ids in (index, native.narrow(index, groups), index.int()):
            got = [native.scatter(values, mask, op, ids, groups) for op in ("sum", "sumsq")]
            got += native.moments(values, mask, 1.0, index=ids, counts=counts)
            with monkeypatch.context() as patch:
                patch.setitem(native._SCATTER_TO, "stack", 0)
                want = [native.scatter(values, mask, op, ids, groups)
                        for op in ("sum", "sumsq")]
                want += native.moments(values, mask, 1.0, index=ids, counts=counts)
            for g, w in zip(got, want):
                assert _bits_equal(g, w), (groups, ids.dtype)
        _assert_same(got[0], _reference(values, mask, "sum", index, groups))


@pytest.mark.parametrize("groups,narrowed", [(1, torch.uint16), (2**16, torch.uint16),
                                             (2**16 + 1, torch.int32), (2**31, torch.int32),
                                             (2**31 + 1, None)])
def test_narrow_picks_the_narrowest_type_that_holds_every_group(groups, narrowed):
    index = torch.tensor([0, groups - 1, groups // 2, 0])
    out = native.narrow(index, groups)
    if narrowed is None:  # no narrower type holds every group: the index is read as is
        assert out is None
        return
    assert out.dtype == narrowed
    assert torch.equal(out.long(), index)
    assert native.narrow(index.int(), groups) is None  # only int64 is narrowed


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_narrow_with_remap_gives_each_slot_its_group(data):
    """Narrowing key slots with their groups (``remap``, what a column reduction caches) is
    ``remap[index]``; an index out of the slots, or a slot remapped out of the groups, is
    not narrowed (its kernel raises)."""
    slots = data.draw(st.integers(1, 300))
    present = torch.tensor(data.draw(st.lists(st.booleans(), min_size=slots,
                                              max_size=slots)))
    present[data.draw(st.integers(0, slots - 1))] = True
    keys = present.nonzero().squeeze(1)
    picks = data.draw(st.lists(st.integers(0, keys.numel() - 1), max_size=200))
    index = keys[torch.tensor(picks, dtype=torch.long)]
    remap = present.cumsum(0) - 1
    out = native.narrow(index, slots, remap=remap)
    assert out.dtype == torch.uint16
    assert torch.equal(out.long(), remap[index])
    bad = torch.cat([index, torch.tensor([slots])])
    assert native.narrow(bad, slots, remap=remap) is None
    # a remap entry out of the groups is never cut into range (70000 is 4464 as a uint16)
    for wrong in (-1, slots, 70000):
        broken = remap.clone()
        broken[keys[0]] = wrong
        assert native.narrow(torch.cat([index, keys[:1]]), slots, remap=broken) is None


@pytest.mark.parametrize("bad", [-1, 5, 2**16, 2**16 + 5, 2**32 + 1])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_an_out_of_range_group_index_raises_whatever_its_type(bad, index_dtype):
    """An index out of range is never narrowed into range (2**16 + 5 is 5 as a uint16): the
    int64 index is kept and its kernel raises; an int32 or uint16 index out of range
    (negative, or past the groups) raises too."""
    values, mask = torch.ones(4), torch.tensor([True, False, True, True])
    index = torch.tensor([0, 1, bad, 1])
    assert native.narrow(index, 5) is None  # not narrowed: its kernel raises
    for op in OPS:
        for ids in (index, index.sort().values):  # (sorted: the kernels' runs path)
            with pytest.raises(RuntimeError, match="out of range"):
                native.scatter(values, mask, op, ids, 5)
    with pytest.raises(RuntimeError, match="out of range"):
        native.count_scatter(mask, index, 5)
    wrapped = index.to(index_dtype)  # the bad element as that type holds it
    if 0 <= int(wrapped[2]) < 5:
        return  # 2**16 + 5 as uint16, 2**32 + 1 as int32: in range, a different index
    with pytest.raises(RuntimeError, match="out of range"):
        native.scatter(values, mask, "sum", wrapped, 5)
    with pytest.raises(RuntimeError, match="out of range"):
        native.count_scatter(mask, wrapped, 5)


@pytest.mark.parametrize("where", [5, 64, 127, 130, 199])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_an_out_of_range_index_of_an_unspecified_element_raises(build, where, index_dtype):
    """An index is checked whether its element is specified or not, in a vector block
    (64 elements) or in the tail, for every op and index type."""
    n, groups = 200, 7
    values, mask = torch.ones(n), torch.ones(n, dtype=torch.bool)
    index = (torch.arange(n) % groups).to(index_dtype)
    index[where], mask[where] = groups, False
    for op in OPS:
        with pytest.raises(RuntimeError, match="out of range"):
            native.scatter(values, mask, op, index, groups)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_an_index_written_in_place_is_narrowed_again(layout):
    """The narrowed group index (and every other fact of the index) is cached per index
    tensor and version: after an element moves to an empty column in place, the column
    reductions read the index as it is now."""
    from conftest import _to_layout, assert_masked_equal, dense_of

    import layouts._index as index_facts
    import masked_sparse as ms

    data = torch.tensor([[1.0, 2.0, 0.0, 4.0], [0.0, 8.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    stored = data != 0
    mask = stored.clone()
    mask[2, 3] = False
    mt = ms.masked_tensor(_to_layout(data, stored, torch.sparse_coo),
                          _to_layout(mask, stored, torch.sparse_coo))
    mt = mt.to_sparse_csr() if layout == "sparse_csr" else mt
    reductions = [lambda t: t.sum(0), lambda t: t.mean(0), lambda t: t.amax(0),
                  lambda t: t.prod(0), lambda t: torch.count_nonzero(t, 0)]
    for reduce in reductions:
        reduce(mt)
    storage = mt._storage
    owner = storage.index[1] if layout == "sparse_csr" else storage.index[0]
    narrowed = [entry[1]["_narrow_ids"] for key, entry in index_facts._CACHE.items()
                if entry[0]() is owner and key[1][0] == "grouping"
                and "_narrow_ids" in entry[1]]  # (kept with the grouping's index facts)
    assert [n.dtype for n in narrowed] == [torch.uint16]  # the kernels read a copy
    columns = storage.index[1] if layout == "sparse_csr" else storage.index[0][1]
    assert columns.tolist() == [0, 1, 3, 1, 3]
    columns[1] = 2  # (0, 1) -> (0, 2): column 2 was empty, row 0 stays sorted
    data_now, mask_now = dense_of(mt)
    assert mask_now[0, 2] and not mask_now[0, 1]
    for reduce in reductions:
        assert_masked_equal(reduce(mt), *dense_of(reduce(ms.masked_tensor(data_now, mask_now))))


def test_a_specified_nan_wins_and_an_unspecified_one_is_ignored():
    values = torch.tensor([1.0, math.nan, 3.0, math.nan, -1.0])
    mask = torch.tensor([True, True, True, False, True])
    offsets, which = torch.tensor([0, 3, 5]), torch.tensor([0, 1])
    assert native.lines(values, mask, "amax", offsets, which)[0].isnan()
    assert native.lines(values, mask, "amax", offsets, which)[1].item() == -1.0
    assert native.lines(values, mask, "sum", offsets, which)[1].item() == -1.0


@pytest.mark.parametrize("layout", ["strided", "sparse_csr", "sparse_coo"])
def test_a_float32_product_overflows_as_torch_prod(layout):
    """Products run in the values' dtype, as torch's: 1e30 * 1e30 is inf before 1e-30."""
    import masked_sparse as ms

    data = torch.tensor([[1e30, 1e30, 1e-30, 2.0]])
    mt = ms.masked_tensor(data, torch.tensor([[True, True, True, False]]))
    mt = mt if layout == "strided" else mt.to_sparse_coo() if layout == "sparse_coo" \
        else mt.to_sparse_csr()
    want = torch.prod(data[:, :3])
    assert want.isinf()
    assert mt.prod().to_tensor(0).item() == want.item()
    assert mt.prod(1).to_tensor(0).to_dense().item() == want.item()


def test_fake_tensors_and_tracing_take_the_composed_path():
    """A fake tensor has no memory and ``make_fx`` records torch ops only: neither may reach
    a kernel (a fake tensor's null pointer would crash the interpreter)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    import masked_sparse as ms

    with FakeTensorMode():
        data, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
        assert native.reduce_all(data.view(-1), mask.view(-1), "sum") is None
        assert native.scatter(data.view(-1), mask.view(-1), "sum",
                              torch.zeros(6, dtype=torch.long), 1) is None
        assert native.count_all(mask.view(-1)) is None
        ms.masked_tensor(data, mask).sum()  # runs, no crash
    graph = make_fx(lambda d, m: ms.masked_tensor(d, m).amax().to_tensor(0))(
        torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    data = torch.tensor([[1.0, 7.0, 3.0], [100.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, True], [False, True, True]])
    assert graph(data, mask).item() == 7.0


@pytest.mark.parametrize("n", [255, 256, 4096, 10_000])
def test_a_cancelling_float32_sum_is_the_same_on_every_path(n):
    """+-1e8 at the ends of a row of ones: lines (rows), scatter (columns) and all agree
    with the double sum, whatever the row's length picks for the vector path."""
    values, mask = torch.ones(n), torch.ones(n, dtype=torch.bool)
    values[0], values[-1] = 1e8, -1e8
    exact = float(n - 2)
    assert native.lines(values, mask, "sum", torch.tensor([0, n])).item() == exact
    assert native.scatter(values, mask, "sum", torch.zeros(n, dtype=torch.long), 1).item() \
        == exact
    assert native.reduce_all(values, mask, "sum").item() == exact


def test_sums_of_float32_accumulate_exactly_enough():
    """1e6 float32 values summed one by one in float32 would drift by ~1e-3 relative."""
    values = torch.full((1_000_000,), 0.1, dtype=torch.float32)
    mask = torch.ones(1_000_000, dtype=torch.bool)
    got = native.reduce_all(values, mask, "sum").item()
    assert got == pytest.approx(100_000.0, rel=1e-6)


@pytest.mark.parametrize("bad", ["scatter", "which", "offsets"])
def test_an_out_of_range_index_raises_and_touches_nothing(bad):
    values, mask = torch.ones(4), torch.ones(4, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="out of range"):
        if bad == "scatter":
            native.scatter(values, mask, "sum", torch.tensor([0, 1, 7, 1]), 3)
        elif bad == "which":
            native.lines(values, mask, "amax", torch.tensor([0, 2, 4]), torch.tensor([2]))
        else:  # decreasing pointers, and one past the stored values
            native.lines(values, mask, "sum", torch.tensor([0, 3, 1, 9]), torch.tensor([1]))
    with pytest.raises(RuntimeError, match="out of range"):
        native.count_lines(mask, torch.tensor([0, 9]), torch.tensor([0]))


@pytest.mark.parametrize("kernel", ["logsumexp", "softmax", "moments"])
@pytest.mark.parametrize("bad", ["which", "offsets"])
def test_the_one_call_line_kernels_raise_on_an_out_of_range_line(kernel, bad):
    """The lines kernels of logsumexp, softmax and mean / variance check every listed line
    and its offsets (LINE_BOUNDS) before they read: a line past the last, or pointers that
    decrease or run past the stored values, raise."""
    if not native.available():
        pytest.skip(f"native kernels: {native.status()}")
    values, mask = torch.ones(4), torch.ones(4, dtype=torch.bool)
    offsets, which = ((torch.tensor([0, 2, 4]), torch.tensor([2])) if bad == "which" else
                      (torch.tensor([0, 3, 1, 4]), torch.tensor([1])))
    call = {"logsumexp": lambda: native.logsumexp_lines(values, mask, offsets, which),
            "softmax": lambda: native.softmax(values, mask, False, offsets, which),
            "moments": lambda: native.moments(values, mask, 1.0, offsets, which)}[kernel]
    with pytest.raises(RuntimeError, match="out of range"):
        call()


def test_a_corrupted_sparse_index_raises_in_a_reduction():
    """An index written in place after the MaskedTensor was built is caught, not read."""
    import masked_sparse as ms

    dense = torch.arange(12.0).view(3, 4)
    mt = ms.masked_tensor(dense, dense > 2).to_sparse_csr()
    mt._storage.index[0][1] = 100  # row 0 now ends far past the stored values
    with pytest.raises(ValueError, match=r"\(sum\): an index is out of range \(line pointer "
                                         r"100 \(entry 1\) is outside \[0, \d+\]\).*rebuild"):
        mt.sum(1)


@pytest.mark.parametrize("change", ["written", ".data int32", "set_ shorter", ".data",
                                    "which written", "which set_"])
def test_checked_line_arguments_are_not_served_once_the_index_changed(change):
    """The lines kernels keep the checked arguments of an ``offsets`` / ``which`` pair per
    object (Note [Line arguments once per index]); an index changed after a first call --
    written in place, given another length by ``set_``, another dtype or length by
    ``.data`` -- is
    checked again: refused (None: the composed path) or raising, never read as it was."""
    if not native.status().startswith("available"):
        pytest.skip(f"native kernels: {native.status()}")
    values, mask = torch.arange(6.0), torch.ones(6, dtype=torch.bool)
    offsets, which = torch.tensor([0, 2, 4, 6]), torch.tensor([0, 2])
    assert native.lines(values, mask, "sum", offsets, which).tolist() == [1.0, 9.0]
    assert native.lines(values, mask, "sum", offsets, which).tolist() == [1.0, 9.0]  # cached
    if change == "written":
        offsets[1] = 60
        with pytest.raises(ValueError, match=r"line pointer 60 \(entry 1\)"):
            native.lines(values, mask, "sum", offsets, which)
    elif change == ".data int32":
        offsets.data = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
        assert native.lines(values, mask, "sum", offsets, which) is None
    elif change == "set_ shorter":
        offsets.set_(torch.tensor([0, 6]))
        with pytest.raises(ValueError, match=r"listed line 2 \(entry 1\) is outside \[0, 1\)"):
            native.lines(values, mask, "sum", offsets, which)
    elif change == ".data":
        offsets.data = torch.tensor([0, 3, 6])
        with pytest.raises(ValueError, match=r"listed line 2 \(entry 1\) is outside \[0, 2\)"):
            native.lines(values, mask, "sum", offsets, which)
    elif change == "which written":
        which[1] = 7
        with pytest.raises(ValueError, match=r"listed line 7 \(entry 1\)"):
            native.lines(values, mask, "sum", offsets, which)
    else:
        which.set_(torch.tensor([1, 0, 2]))
        assert native.lines(values, mask, "sum", offsets, which).tolist() == [5.0, 1.0, 9.0]
    assert native.lines(values, mask, "sum", torch.tensor([0, 2, 4, 6]), torch.tensor([0, 2])
                        ).tolist() == [1.0, 9.0]  # another pair: its own arguments


@pytest.mark.parametrize("case", ["group id", "negative id", "pointer past the end",
                                  "decreasing pointers", "listed line", "backward"])
def test_an_index_out_of_range_is_a_value_error_naming_the_op_the_index_and_the_bound(case):
    """Bad input is a ValueError (still a RuntimeError, as before) that names the op, the
    first bad entry and its bound, whichever kernel checked it."""
    if not native.status().startswith("available"):
        pytest.skip(f"native kernels: {native.status()}")
    values, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    calls = {
        "group id": (lambda: native.scatter(values, mask, "sum", torch.tensor([0, 1, 9, 1, 0, 0]),
                                            3), "(sum)", "group index 9 of stored element 2",
                     "[0, 3)"),
        "negative id": (lambda: native.count_scatter(mask, torch.tensor([0, 0, 0, 0, -2, 1]),
                                                     3), "(count)",
                        "group index -2 of stored element 4", "[0, 3)"),
        "pointer past the end": (lambda: native.lines(values, mask, "amax",
                                                      torch.tensor([0, 2, 40])), "(amax)",
                                 "line pointer 40 (entry 2)", "[0, 6]"),
        "decreasing pointers": (lambda: native.logsumexp_lines(values, mask,
                                                               torch.tensor([0, 4, 2, 6])),
                                "(logsumexp)", "line pointer 2 (entry 2)", "before it, 4"),
        "listed line": (lambda: native.moments(values, mask, 1.0, torch.tensor([0, 3, 6]),
                                               torch.tensor([0, 5])), "(var)",
                        "listed line 5 (entry 1)", "[0, 2)"),
        "backward": (lambda: native.backward("expand", mask, torch.ones(2),
                                             offsets=torch.tensor([0, 3, 5])),
                     "(expand backward)",
                     "line pointers run from 0 to 5", "6 stored values"),
    }
    call, *names = calls[case]
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, RuntimeError)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("kind", ["autograd", "other dtype", "2-D"])
def test_inputs_the_kernels_do_not_take_go_to_the_composed_path(kind):
    values, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    if kind == "autograd":
        values.requires_grad_()
    elif kind == "other dtype":
        values = values.to(torch.float16)
    else:
        values, mask = values.view(2, 3), mask.view(2, 3)
    assert native.reduce_all(values, mask, "sum") is None


_SCRIPT = """
import sys, warnings
from pathlib import Path
warnings.simplefilter("always")  # every warning printed: the kernels' must come once
import torch, masked_sparse as ms, layouts._native as native
if len(sys.argv) > 1:
    native._DIR = Path(sys.argv[1])  # the kernels (and manifest) the test prepared
# the process's first kernel call reads its table before the build loads
first = native.softmax(torch.tensor([1., 2.]), torch.tensor([True, True]), False,
                       index=torch.tensor([0, 0]), n=1)
d = torch.tensor([[1., float('nan'), 3.], [4., 5., 6.]])
m = torch.tensor([[True, False, True], [False, True, True]])
for _ in range(2):
    mt = ms.masked_tensor(d, m).to_sparse_csr()
    print(mt.sum(1).to_tensor(0).to_dense().tolist(),
          mt.amax(0).to_tensor(0).to_dense().tolist())
print("first call:", "kernel" if first is not None else "composed")
print(native.status())
"""


def _run(*args: str, env: dict | None = None) -> tuple[list[str], str]:
    """:data:`_SCRIPT` in a fresh process (the kernels loaded there, or not): its lines of
    output and its stderr; it must exit cleanly (a SIGBUS or a crash fails here)."""
    full_env = {name: value for name, value in os.environ.items()
                if name != "MASKED_SPARSE_NATIVE"}  # (the build fixture may have set it)
    full_env.update(env or {}, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=full_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    out = done.stdout.splitlines()
    assert out[:2] == ["[4.0, 11.0] [1.0, 5.0, 6.0]"] * 2, out  # the column max skips the NaN
    return out, done.stderr


def test_without_the_kernels_reductions_are_the_same_and_it_warns_once(tmp_path):
    """Not built (no compiler at install: no manifest where the kernels belong): in a fresh
    process the first reduction warns once, naming the reason and the fix, and every
    reduction runs the composed path with the same results."""
    out, err = _run(str(tmp_path))
    assert out[-1].startswith("no build in")
    assert err.count("NativeKernelsWarning") == 1, err
    assert "no build in" in err and "pip install -e ." in err and "build_ext --inplace" in err


def test_disabled_kernels_say_why_once():
    """``MASKED_SPARSE_NATIVE=0``: the status says so and the first reduction warns once,
    naming the variable and how to undo it (a forgotten setting is no silent slowdown)."""
    out, err = _run(env={"MASKED_SPARSE_NATIVE": "0"})
    assert out[-1] == "disabled by MASKED_SPARSE_NATIVE=0"
    assert err.count("NativeKernelsWarning") == 1, err
    assert "unset MASKED_SPARSE_NATIVE" in err, err


def _widest() -> str:
    """The widest build of the package that this CPU runs (asked as the loader asks)."""
    import ctypes
    import json

    builds = json.loads((native._DIR / native._MANIFEST).read_text())["kernels"]
    level = ctypes.CDLL(str(native._DIR / builds["portable"]["file"])).ms_cpu_isa()
    return max((isa for isa in builds if native._ISAS.index(isa) <= level),
               key=native._ISAS.index)


def test_the_installed_build_loads_without_a_warning():
    """The build in the package passes its checks: the widest build the CPU runs. The
    process's first kernel call, which read its table before the build loaded (the softmax
    passes ``_SOFTMAX`` while its argument check loads it), found its kernel there: the
    tables are filled in place."""
    out, err = _run()
    assert out[-1] == f"available ({_widest()})", out
    assert out[-2] == "first call: kernel", out
    assert "NativeKernelsWarning" not in err, err


def _copy_build(directory):
    """The package's build (its libraries, manifest and C source) copied to ``directory``;
    the manifest as a dict."""
    import json
    import shutil

    manifest = json.loads((native._DIR / native._MANIFEST).read_text())
    for name in [native._MANIFEST, "_native.c",
                 *(entry["file"] for entry in manifest["kernels"].values())]:
        shutil.copyfile(native._DIR / name, directory / name)
    return manifest


def _rewrite(directory, manifest, isa, data: bytes) -> None:
    """Build ``isa``'s library replaced by ``data``, the manifest updated to match it (so
    that the checks after the hash are what refuse it)."""
    import hashlib
    import json

    entry = manifest["kernels"][isa]
    (directory / entry["file"]).write_bytes(data)
    entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (directory / native._MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("which", ["widest", "portable"])
def test_a_truncated_build_is_refused_before_it_is_opened(which, tmp_path):
    """A truncated library, opened, can kill the process (SIGBUS on a page past its end):
    its hash differs from the manifest's, so it is refused unread, with the warning. The
    widest build truncated: the next narrower one runs; the baseline (which says what the
    CPU runs) truncated: none, the composed path runs."""
    manifest = _copy_build(tmp_path)
    isa = _widest() if which == "widest" else "portable"
    if isa == "portable" and which == "widest":
        pytest.skip("this CPU runs the portable build only")
    path = tmp_path / manifest["kernels"][isa]["file"]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    out, err = _run(str(tmp_path))
    assert err.count("NativeKernelsWarning") == 1, err
    assert f"{path} is damaged" in err
    if which == "widest":
        assert out[-1].startswith("available (") and out[-1] != f"available ({isa})", out
    else:
        assert out[-1].startswith(f"{path} is damaged"), out


def test_a_build_without_a_symbol_is_refused_and_nothing_changes(tmp_path):
    """A library that lacks a kernel's symbol (here renamed in its symbol table, the
    manifest rewritten to match) is refused at load, with the warning naming the symbol;
    the kernels already loaded stay in place (no reduction raises later)."""
    manifest = _copy_build(tmp_path)
    data = (tmp_path / manifest["kernels"]["portable"]["file"]).read_bytes()
    assert data.count(b"\0ms_all_sum_f64\0") >= 1
    _rewrite(tmp_path, manifest, "portable",
             data.replace(b"\0ms_all_sum_f64\0", b"\0xx_all_sum_f64\0"))
    tables = [getattr(native, table) for table in native._TABLES]
    lib, isa, problems = native._load(tmp_path, cap=0)
    assert lib is None and isa == ""
    assert len(problems) == 1 and "a symbol is missing" in problems[0]
    assert "ms_all_sum_f64" in problems[0]
    assert [getattr(native, table) for table in native._TABLES] == tables
    assert all(a is b for a, b in zip(tables, [getattr(native, t) for t in native._TABLES]))
    out, err = _run(str(tmp_path), env={"MASKED_SPARSE_NATIVE": "portable"})
    assert err.count("NativeKernelsWarning") == 1 and "ms_all_sum_f64" in err, err
    assert out[-1].startswith("a symbol is missing"), out


@pytest.mark.parametrize("stale", ["library ABI", "manifest ABI", "C source", "ISA",
                                   "garbled manifest", "missing library"])
def test_a_mismatched_build_is_refused(stale, tmp_path, monkeypatch):
    """A build of another version: kernels of another ABI (``ms_abi_version()``, or the
    manifest's), a C source edited since the build, a library that is not the build the
    manifest names; or a garbled manifest, a library it lists gone: refused, with the
    reason, and the kernels loaded before stay."""
    import json

    manifest = _copy_build(tmp_path)
    want = {"library ABI": "holds kernels of ABI", "manifest ABI": "is for kernels of ABI",
            "C source": "of another version of _native.c", "ISA": "not the portable build",
            "garbled manifest": "is unreadable", "missing library": "is unreadable"}
    if stale == "library ABI":  # the Python side moved on: the library's ABI is old
        manifest["abi"] = native._ABI + 1
        (tmp_path / native._MANIFEST).write_text(json.dumps(manifest))
        monkeypatch.setattr(native, "_ABI", native._ABI + 1)
    elif stale == "manifest ABI":
        manifest["abi"] = native._ABI + 1
        (tmp_path / native._MANIFEST).write_text(json.dumps(manifest))
    elif stale == "C source":
        with open(tmp_path / "_native.c", "a") as source:
            source.write("/* edited */\n")
    elif stale == "garbled manifest":
        (tmp_path / native._MANIFEST).write_text('{"abi": 1, "kernels": {')
    elif stale == "missing library":
        (tmp_path / manifest["kernels"]["portable"]["file"]).unlink()
    else:
        other = [isa for isa in manifest["kernels"] if isa != "portable"]
        if not other:
            pytest.skip("one build only on this machine")
        data = (tmp_path / manifest["kernels"][other[0]]["file"]).read_bytes()
        _rewrite(tmp_path, manifest, "portable", data)
    tables = [getattr(native, table) for table in native._TABLES]
    lib, isa, problems = native._load(tmp_path)
    assert lib is None and isa == "" and len(problems) == 1
    assert want[stale] in problems[0], problems
    assert all(a is b for a, b in zip(tables, [getattr(native, t) for t in native._TABLES]))


@pytest.mark.parametrize("n", [256, 1000, 1025, 1087])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_nan_anywhere_in_a_long_run_wins_only_where_specified(build, n, dtype):
    """The vector code's max / min collect NaNs apart from the lanes: one NaN in any lane of
    a block or of the partial last one is the result when specified, ignored when not."""
    values = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=dtype)
    mask = torch.ones(n, dtype=torch.bool)
    for where in (0, 15, 63, 64, n - 1):
        nan_values = values.clone()
        nan_values[where] = math.nan
        for op in ("amax", "amin"):
            assert native.reduce_all(nan_values, mask, op).isnan().all()
            unspecified = mask.clone()
            unspecified[where] = False
            want = getattr(values[unspecified], op)()
            assert native.reduce_all(nan_values, unspecified, op).item() == want.item()


def test_an_index_built_in_inference_mode_reduces_outside_it():
    """An inference tensor has no version counter: its index facts (the narrowed copy
    among them) are computed and cached all the same, in inference mode and out of it."""
    from conftest import assert_masked_equal, dense_of, make_masked

    import masked_sparse as ms

    with torch.inference_mode():
        mt, data, mask = make_masked((50, 40), torch.sparse_csr, torch.float64, seed=3)
        inside = mt.sum(0)
    assert mt._storage.index[1].is_inference()
    want = dense_of(ms.masked_tensor(data, mask).sum(0))
    for got in (inside, mt.sum(0), mt.sum(0)):
        assert_masked_equal(got, *want)


@settings(max_examples=60, deadline=None)
@given(n=runs, density=densities, seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       specials=specials, pick=st.sampled_from(["amax", "amin", "absent", "nan"]))
def test_first_is_the_first_specified_element_equal(build, n, density, seed, dtype,
                                                     specials, pick):
    """The first specified element equal to ``x`` (NaN: the first specified NaN), -1 when
    none is; with ``x`` the masked extreme, torch's argmax of the specified elements."""
    values, mask = _inputs(n, dtype, density, seed, "amax", specials)
    x = {"amax": native.reduce_all(values, mask, "amax"),
         "amin": native.reduce_all(values, mask, "amin"),
         "absent": torch.tensor([0.123], dtype=dtype),
         "nan": torch.tensor([math.nan], dtype=dtype)}[pick]
    hits = mask & ((values == x) | (torch.isnan(values) & torch.isnan(x)))
    want = int(hits.nonzero()[0, 0]) if hits.any() else -1
    assert native.first(values, mask, x) == want
    if pick in ("amax", "amin") and mask.any():  # the masked arg-extreme, as torch finds it
        filled = torch.where(mask, values, math.inf if pick == "amin" else -math.inf)
        arg = filled.argmax() if pick == "amax" else filled.argmin()
        assert want == int(arg) or not bool(mask[arg])


# -- arg-extremes (Note [Native arg-extremes]) --------------------------------------------
LONG_MAX = torch.iinfo(torch.long).max


def _arg_inputs(n: int, dtype: torch.dtype, density: float, seed: int, specials: float):
    """Values with many ties (a few distinct numbers), NaN and +-inf, and each element's
    position: distinct, in no particular order (the kernels compare positions, never rely
    on storage order)."""
    g = torch.Generator().manual_seed(seed)
    values, mask = _inputs(n, dtype, density, seed, "amax", specials)
    ties = torch.randint(-2, 3, (n,), generator=g).to(dtype)
    values = torch.where(torch.isfinite(values), ties, values)
    positions = torch.randperm(3 * n + 1, generator=g)[:n]
    return values, mask, positions


def _arg_reference(values, mask, op, groups, n, positions):
    """Per group, the masked extreme (NaN wins) and the smallest position of a specified
    element equal to it (NaN: of a specified NaN); (0, 0) where none is specified."""
    top = _reference(values, mask, op, groups, n)
    at = top[groups]
    hit = mask & ((values == at) | (torch.isnan(values) & torch.isnan(at)))
    keyed = torch.where(hit, positions, LONG_MAX)
    at = torch.full((n,), LONG_MAX).scatter_reduce(0, groups, keyed, "amin")
    specified = torch.zeros(n, dtype=torch.bool).index_put_((groups,), mask, accumulate=True)
    return torch.where(specified, top, 0), torch.where(specified, at, 0)


def _assert_arg_same(got, want):
    _assert_same(got[0], want[0])
    assert torch.equal(got[1], want[1]), (got[1], want[1])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(runs, min_size=1, max_size=8), density=densities,
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       op=st.sampled_from(["amax", "amin"]), specials=specials, data=st.data())
def test_arg_lines_are_the_first_extreme_of_each_run(build, lengths, density, seed, dtype,
                                                     op, specials, data):
    """Lines of any length (empty ones: 0 at 0), any subset in any order;
    ties go to the smallest position, a specified NaN wins (the first NaN), an unspecified
    one is ignored."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n = int(offsets[-1])
    values, mask, positions = _arg_inputs(n, dtype, density, seed, specials)
    line_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    top, at = _arg_reference(values, mask, op, line_of, len(lengths), positions)
    _assert_arg_same(native.arg_lines(values, mask, op, offsets, None, positions), (top, at))
    which = torch.tensor(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=8)),
                         dtype=torch.long)
    _assert_arg_same(native.arg_lines(values, mask, op, offsets, which, positions),
                     (top[which], at[which]))


@settings(max_examples=40, deadline=None)
@given(n=sizes, groups=st.integers(1, 40), density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), op=st.sampled_from(["amax", "amin"]),
       index_dtype=st.sampled_from(INDEX_DTYPES), specials=specials)
def test_arg_scatter_is_the_first_extreme_per_group(build, n, groups, density, seed, dtype,
                                                    op, index_dtype, specials):
    values, mask, positions = _arg_inputs(n, dtype, density, seed, specials)
    index = torch.randint(0, groups, (n,), generator=torch.Generator().manual_seed(seed))
    _assert_arg_same(native.arg_scatter(values, mask, op, index.to(index_dtype), groups,
                                        positions),
                     _arg_reference(values, mask, op, index, groups, positions))


def test_arg_kernels_pick_the_first_nan_and_the_first_of_ties(build):
    """Hand-made groups: a NaN after the maximum, two NaNs (the earlier position wins
    whatever the storage order), an unspecified NaN and larger value (ignored), a tie at
    -inf, nothing specified."""
    nan, inf = math.nan, math.inf
    values = torch.tensor([1., nan, 5., nan, 2., nan, nan, 9., 3., -inf, -inf, 7.])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.bool)
    positions = torch.tensor([0, 4, 1, 2, 0, 1, 0, 1, 2, 3, 2, 0])
    offsets = torch.tensor([0, 3, 6, 9, 11, 12])
    top, at = native.arg_lines(values, mask, "amax", offsets, None, positions)
    assert top[0].isnan() and top[1].isnan() and top[2:].tolist() == [3., -inf, 0.]
    assert at.tolist() == [4, 1, 2, 2, 0]
    groups = torch.repeat_interleave(torch.arange(5), offsets.diff())
    top, at = native.arg_scatter(values, mask, "amin", groups, 5, positions)
    assert top[0].isnan() and top[1].isnan() and top[2:].tolist() == [3., -inf, 0.]
    assert at.tolist() == [4, 1, 2, 2, 0]


def test_arg_kernels_raise_on_an_out_of_range_index(build):
    values, mask, positions = torch.ones(4), torch.ones(4, dtype=torch.bool), torch.arange(4)
    with pytest.raises(RuntimeError, match="argmax.*out of range"):
        native.arg_scatter(values, mask, "amax", torch.tensor([0, 1, 5, 0]), 2, positions)
    with pytest.raises(RuntimeError, match="argmin.*out of range"):
        native.arg_lines(values, mask, "amin", torch.tensor([0, 2, 7]), None, positions)


# -- sums of a function of the deviations: sqdev (variance), sumexp (logsumexp) -----------
DEVS = ["sqdev", "sumexp"]
scales = st.sampled_from([1.0, 60.0, 250.0])  # 250: deviations past exp's over/underflow


def _centers(n: int, dtype: torch.dtype, seed: int, specials: float) -> torch.Tensor:
    """A center per group: random, a fraction ``specials`` of them NaN or +-inf (what the
    mean or the max of a group holding one is)."""
    return _inputs(n, dtype, 1.0, seed + 1, specials=specials)[0]


def _dev_inputs(n, dtype, density, seed, specials, scale, groups):
    values, mask = _inputs(n, dtype, density, seed, specials=specials)
    return values * scale, mask, _centers(groups, dtype, seed, specials) * scale


def _dev_reference(dev, values, mask, center, groups, n):
    """Per group ``0..n-1``, the sum over the specified elements of ``f(values -
    center[group])`` in double (the kernels' accumulation), f the square (sqdev) or
    ``torch.exp`` (sumexp), in the values' dtype."""
    d = values.double() - center.double()[groups]
    f = torch.where(mask, d * d if dev == "sqdev" else d.exp(), 0.0)
    return torch.zeros(n, dtype=torch.float64).index_add_(0, groups, f).to(values.dtype)


def _assert_dev(dev, got, want, run):
    """sqdev: as the sums. sumexp: the kernel's exp is within 1 ULP of the exact value
    (Note [Native exp]) as torch.exp is, so a term differs by at most 2 eps (float64
    eps); both sums of ``run`` terms >= 0, in double and another order, are each within
    (run - 1) eps / 2 of the exact sum: rtol (run + 3) eps. A float32 result adds one
    rounding of each (1 ULP, eps of float32); atol, ``run + 3`` of the dtype's smallest
    subnormal, covers subnormal terms and sums (their ULP is absolute)."""
    if dev == "sqdev":
        return _assert_same(got, want)
    assert got.dtype == want.dtype and got.shape == want.shape
    info = torch.finfo(want.dtype)
    rtol = (run + 3) * torch.finfo(torch.float64).eps + (info.eps if info.bits == 32 else 0)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=rtol,
                               atol=(run + 3) * info.smallest_normal * info.eps)


def _dev(dev, kind):
    kernel = getattr(native, f"deviations_{kind}")
    return lambda *args: kernel(dev, *args)


@settings(max_examples=60, deadline=None)
@given(n=runs, density=densities, seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       skip=st.integers(0, 7), specials=specials, scale=scales, dev=st.sampled_from(DEVS))
def test_dev_all_is_the_masked_sum_of_f_of_the_deviations(build, n, density, seed, dtype,
                                                          skip, specials, scale, dev):
    values, mask, center = _dev_inputs(n + skip, dtype, density, seed, specials, scale, 1)
    values, mask = values[skip:], mask[skip:]
    want = _dev_reference(dev, values, mask, center, torch.zeros(n, dtype=torch.long), 1)
    _assert_dev(dev, _dev(dev, "all")(values, mask, center), want, n)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(runs, min_size=1, max_size=12), density=densities,
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES), specials=specials,
       scale=scales, dev=st.sampled_from(DEVS), data=st.data())
def test_dev_lines_is_the_masked_sum_of_f_of_the_deviations_of_each_run(
        build, lengths, density, seed, dtype, specials, scale, dev, data):
    """Every line, or a subset in any order (``center[i]`` is the i-th line asked for)."""
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    values, mask, center = _dev_inputs(int(offsets[-1]), dtype, density, seed, specials,
                                       scale, len(lengths))
    which = torch.tensor(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=12)),
                         dtype=torch.long)
    line_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    every = _dev_reference(dev, values, mask, center, line_of, len(lengths))
    _assert_dev(dev, _dev(dev, "lines")(values, mask, center, offsets), every, max(lengths))
    _assert_dev(dev, _dev(dev, "lines")(values, mask, center[which], offsets, which),
                every[which], max(lengths))


@settings(max_examples=60, deadline=None)
@given(n=runs, groups=st.integers(1, 40), density=densities, seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from(INDEX_DTYPES),
       specials=specials, scale=scales, dev=st.sampled_from(DEVS), ordered=st.booleans())
def test_dev_scatter_is_the_masked_sum_of_f_of_the_deviations_per_group(
        build, n, groups, density, seed, dtype, index_dtype, specials, scale, dev, ordered):
    """Random or sorted group ids (runs of one group), some groups empty."""
    values, mask, center = _dev_inputs(n, dtype, density, seed, specials, scale, groups)
    index = torch.randint(0, groups, (n,), generator=torch.Generator().manual_seed(seed))
    if ordered:
        index = index.sort().values
    _assert_dev(dev, _dev(dev, "scatter")(values, mask, center, index.to(index_dtype), groups),
                _dev_reference(dev, values, mask, center, index, groups), n)


@pytest.mark.parametrize("dev", DEVS)
@pytest.mark.parametrize("bad", ["center dtype", "center size", "autograd",
                                 "center autograd", "complex"])
def test_dev_inputs_the_kernels_do_not_take_go_to_the_composed_path(bad, dev):
    values, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    center, offsets = torch.zeros(2), torch.tensor([0, 3, 6])
    if bad == "center dtype":
        center = center.double()
    elif bad == "center size":
        center = torch.zeros(3)
    elif bad == "autograd":
        values.requires_grad_()
    elif bad == "center autograd":
        center.requires_grad_()
    else:
        values, center = values.to(torch.complex64), center.to(torch.complex64)
    assert _dev(dev, "lines")(values, mask, center, offsets) is None
    assert _dev(dev, "scatter")(values, mask, center, torch.tensor([0, 1] * 3), 2) is None
    assert _dev(dev, "all")(values, mask, center if bad == "center size" else center[:1]) \
        is None


@pytest.mark.parametrize("dev", DEVS)
def test_dev_out_of_range_indices_raise(dev):
    values, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    lines, scatter = _dev(dev, "lines"), _dev(dev, "scatter")
    for n in (6, 200):  # the scalar loop, the blocks of 64
        values, mask = torch.ones(n), torch.ones(n, dtype=torch.bool)
        index = torch.arange(n) % 2
        index[n // 2] = 2
        for index_dtype in INDEX_DTYPES:
            with pytest.raises(RuntimeError, match="out of range"):
                scatter(values, mask, torch.zeros(2), index.to(index_dtype), 2)
        if index_dtype is not torch.uint16:
            with pytest.raises(RuntimeError, match="out of range"):  # negative
                scatter(values, mask, torch.zeros(2), (-index).to(torch.int32), 2)
    values, mask = torch.ones(6), torch.ones(6, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="out of range"):
        lines(values, mask, torch.zeros(2), torch.tensor([0, 3, 7]))
    with pytest.raises(RuntimeError, match="out of range"):
        lines(values, mask, torch.zeros(1), torch.tensor([0, 3, 6]), torch.tensor([2]))


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """The distance in units in the last place between finite or infinite values of one
    sign (consecutive doubles are consecutive integers), 0 where both are NaN."""
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}[got.dtype]
    apart = (got.view(bits).long() - want.view(bits).long()).abs()
    return torch.where(torch.isnan(got) & torch.isnan(want), 0, apart)


EXP_EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 709.78, 709.7827128933840,
             709.7827128933841, -708.39, -745.13, -745.1332191019411, -745.2, -800.0, -1e300,
             1e300, 5e-324, -5e-324, 1e-10, -1e-10, 0.5 * math.log(2), -0.5 * math.log(2)]


def test_native_exp_is_within_one_ulp_of_torch_exp(build):
    """The kernels' exp (Note [Native exp]) element by element (one-element lines, center
    0): a sweep of [-760, 720] (underflow to overflow) and of [-1, 1], and the edges: at
    most 1 ULP from torch.exp in float64, exact at 0, +-inf, NaN, below the underflow and
    above the overflow threshold; float32 values (widened, the sum rounded once) at most
    1 float32 ULP."""
    x = torch.cat([torch.linspace(-760, 720, 300_001, dtype=torch.float64),
                   torch.linspace(-1, 1, 100_001, dtype=torch.float64),
                   torch.tensor(EXP_EDGES, dtype=torch.float64)])
    edges = torch.tensor(EXP_EDGES, dtype=torch.float64)
    exact = (edges == 0) | edges.isinf() | edges.isnan() | (edges < -746) | (edges > 710)
    for dtype in DTYPES:
        v = x.to(dtype)
        got = native.deviations_lines("sumexp", v, torch.ones(v.shape[0], dtype=torch.bool),
                                      torch.zeros(v.shape[0], dtype=dtype),
                                      torch.arange(v.shape[0] + 1))
        want = torch.exp(v.double()).to(dtype)
        assert _ulps(got, want).max() <= 1
        at_edges = slice(-len(EXP_EDGES), None)
        assert _ulps(got[at_edges][exact], want[at_edges][exact]).max() == 0


def test_native_exp_is_the_same_in_every_kernel(build):
    """Note [Native exp]: the lines kernels' exp (explicit vector code in an AVX-512 build)
    and the scatter kernels' (the scalar function, vectorized by the compiler or not) give
    the same bits, element by element: a sum is never a different exp by the kernel."""
    gen = torch.Generator().manual_seed(7)
    x = torch.cat([torch.empty(100_000, dtype=torch.float64).uniform_(-760, 720, generator=gen),
                   torch.empty(100_000, dtype=torch.float64).uniform_(-1, 1, generator=gen),
                   torch.empty(20_000, dtype=torch.float64).uniform_(-745.2, -708,
                                                                      generator=gen),
                   torch.empty(20_000, dtype=torch.float64).uniform_(700, 709.8, generator=gen),
                   torch.tensor(EXP_EDGES, dtype=torch.float64)])
    n = x.shape[0]
    ones, zeros = torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64)
    by_lines = native.deviations_lines("sumexp", x, ones, zeros, torch.arange(n + 1))
    by_scatter = native.deviations_scatter("sumexp", x, ones, zeros, torch.arange(n), n)
    assert torch.equal(by_lines.isnan(), by_scatter.isnan())
    numbers = ~by_lines.isnan()
    assert torch.equal(by_lines[numbers].view(torch.int64), by_scatter[numbers].view(torch.int64))


def test_logsumexp_kernels_of_special_values(build):
    """The one-call logsumexp (lines, scatter, all): a specified NaN makes its group NaN,
    +inf inf; all specified -inf is -inf; an unspecified element counts for nothing
    whatever it holds; an empty or fully masked group is 0; differences that overflow exp
    (800 and -800) shift by the max. Reference: float64 torch.logsumexp per group."""
    nan, inf = math.nan, math.inf
    values = torch.tensor([0., nan, inf, -inf, 1., 2., nan, inf, 3., -inf, 800., -800.,
                           -inf, -inf, inf, 5.])
    mask = torch.tensor([1, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    offsets = torch.tensor([0, 4, 7, 9, 10, 12, 14, 14, 16])
    groups = torch.repeat_interleave(torch.arange(8), offsets.diff())
    specified = torch.zeros(8, dtype=torch.bool).index_put_((groups,), mask, accumulate=True)
    want = torch.stack([torch.logsumexp(torch.where(mask, values, -inf)[a:b], 0) if a < b
                        else torch.tensor(0.) for a, b in zip(offsets[:-1], offsets[1:])])
    want = torch.where(specified, want, 0.)
    assert want.tolist()[2:6] == [3.0, 0.0, 800.0, -inf]  # the reference says what it should
    for dtype in DTYPES:
        v = values.to(dtype)
        by_lines = native.logsumexp_lines(v, mask, offsets)
        by_scatter = native.logsumexp_scatter(v, mask, groups, specified, 8)
        for got in (by_lines, by_scatter):
            torch.testing.assert_close(got, want.to(dtype), equal_nan=True)
        for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
            got = native.logsumexp_all(v[a:b].contiguous(), mask[a:b].contiguous())
            torch.testing.assert_close(got, want[i:i + 1].to(dtype), equal_nan=True)


def test_moments_kernels_of_special_values(build):
    """The one-call mean and variance (lines, scatter, all), the mean alone (correction
    None: specified where an element is) and with corrections 0, 1 and 0.5: a
    specified NaN or inf makes its group NaN; an unspecified element counts for nothing
    whatever it holds; an empty, fully masked or (correction 1) one-element group is
    unspecified, its variance 0; the mean is 0 where nothing is specified. Reference: per
    group in float64, float32 degrees of freedom as torch's int64 count minus a float."""
    nan, inf = math.nan, math.inf
    values = torch.tensor([1., nan, 3., 4., 2., 2., nan, 7., inf, 5., -1., 9., 2.5])
    mask = torch.tensor([1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    offsets = torch.tensor([0, 4, 7, 9, 9, 10, 11, 13])
    groups = torch.repeat_interleave(torch.arange(7), offsets.diff())
    counts = torch.zeros(7, dtype=torch.long).index_add_(0, groups, mask.long())
    for correction in (None, 0, 1, 0.5):
        var, mean, specified = [], [], []
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            x = values[a:b][mask[a:b]].double()
            mu = x.sum() / max(x.numel(), 1)
            dof = torch.tensor(x.numel(), dtype=torch.float32) - (correction or 0)
            mean.append(mu)
            specified.append(bool(dof > 0))
            var.append(((x - mu) ** 2).sum() / dof.double() if dof > 0 else torch.tensor(0.))
        want = torch.stack(var), torch.stack(mean), torch.tensor(specified)
        one = correction is None or correction < 1  # a one-element group is specified
        assert want[2].tolist() == [True, True, True, False, one, one, one]  # derived above
        assert want[0][1:3].isnan().all()  # a specified NaN; inf - inf
        for dtype in DTYPES:
            v = values.to(dtype)
            outs = [native.moments(v, mask, correction, offsets),
                    native.moments(v, mask, correction, index=groups, counts=counts)]
            alone = zip(*(native.moments(v[a:b].contiguous(), mask[a:b].contiguous(),
                                         correction)
                          for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())))
            outs += [[None if t[0] is None else torch.cat(t) for t in alone]]
            for got in outs:
                if correction is None:
                    assert got[0] is None
                    got = (want[0].to(dtype), *got[1:])
                torch.testing.assert_close(got[0], want[0].to(dtype), equal_nan=True)
                torch.testing.assert_close(got[1], want[1].to(dtype), equal_nan=True)
                assert torch.equal(got[2], want[2])


def test_sumexp_of_special_values():
    """A specified NaN makes its group NaN, +inf makes it inf, -inf adds 0; an unspecified
    element adds nothing whatever it holds; an empty or fully masked group sums to 0."""
    nan, inf = math.nan, math.inf
    values = torch.tensor([0., nan, inf, -inf, 1., 2., nan, inf, 3., -inf, 800., -800.])
    mask = torch.tensor([1, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1, 1], dtype=torch.bool)
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4])
    want = torch.tensor([1., nan, 1. * math.exp(3.), 0., inf, 0.])
    for dtype in DTYPES:
        got = native.deviations_scatter("sumexp", values.to(dtype), mask,
                                        torch.zeros(6, dtype=dtype), index, 6)
        torch.testing.assert_close(got, want.to(dtype), equal_nan=True)
        offsets = torch.tensor([0, 4, 7, 9, 10, 12, 12])
        got = native.deviations_lines("sumexp", values.to(dtype), mask,
                                      torch.zeros(6, dtype=dtype), offsets)
        torch.testing.assert_close(got, want.to(dtype), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32, torch.uint16], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_over_group_ids_is_the_lines_kernel_per_group(build, dtype, index_dtype, log):
    """The scatter softmax takes the lines kernel's steps over each group's elements in
    storage order: the lines kernel's result on the elements sorted by group (a stable
    sort keeps their order) to a few ulp (the lines kernel sums 8 lanes, the scatter
    kernel in storage order), the same NaNs, on groups with NaN, +-inf, all -inf, one
    element, no specified element, and lengths that are no multiple of 8."""
    g = torch.Generator().manual_seed(7)
    n, groups = 999, 37
    values = (torch.randn(n, generator=g) * 30).to(dtype)
    for x in (math.nan, math.inf, -math.inf):
        values[torch.randint(0, n, (5,), generator=g)] = x
    index = torch.randint(0, groups - 3, (n,), generator=g)
    index[:3] = torch.tensor([groups - 3, groups - 2, groups - 1])  # one element each
    mask = torch.rand(n, generator=g) < 0.7
    mask[index == 5] = False  # a group without a specified element
    values[index == 6] = -math.inf  # a group all -inf: NaN, as torch.softmax
    mask[0] = True
    got = native.softmax(values, mask, log, index=index.to(index_dtype), n=groups)
    order = torch.sort(index, stable=True).indices
    offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                         torch.bincount(index, minlength=groups).cumsum(0)])
    want = native.softmax(values[order], mask[order], log, offsets)
    assert got is not None and want is not None
    assert torch.equal(got[order].isnan(), want.isnan())
    ulp = torch.finfo(dtype).eps  # log_softmax: d - log(total), |d| up to ~200 here
    torch.testing.assert_close(got[order], want, rtol=4 * ulp, atol=4 * ulp * 256 * log,
                               equal_nan=True)
    assert (got[~mask] == 0).all() and not torch.signbit(got[~mask]).any()
    reference = torch.where(mask, values.double(), -math.inf)
    for group in (0, 1, groups - 1):  # and against torch, per group
        at = index == group
        want_g = getattr(torch, "log_softmax" if log else "softmax")(reference[at], 0)
        torch.testing.assert_close(torch.where(mask[at], got[at].double(), 0.0),
                                   torch.where(mask[at], want_g, 0.0), equal_nan=True,
                                   rtol=1e-5, atol=1e-6)


def test_softmax_over_group_ids_raises_on_an_out_of_range_group(build):
    values, mask = torch.randn(20), torch.ones(20, dtype=torch.bool)
    index = torch.zeros(20, dtype=torch.long)
    index[13] = 4
    with pytest.raises(RuntimeError, match="out of range"):
        native.softmax(values, mask, False, index=index, n=4)


@pytest.mark.parametrize("offsets", [[0, 3, 2, 5], [1, 5], [0, 4], [0, 6]], ids=str)
def test_cumsum_lines_raises_on_bad_offsets(offsets):
    """Line offsets that decrease, or do not run from 0 to the number of values, raise
    (the kernel would read or write outside the values otherwise)."""
    if not native.available():
        pytest.skip(f"native kernels: {native.status()}")
    with pytest.raises(RuntimeError, match="out of range"):
        native.cumsum_lines(torch.ones(5), torch.tensor(offsets))

