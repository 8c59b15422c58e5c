"""scipy.sparse and numpy.ma interop: exact round trips in every format and layout.

References are computed independently of ``masked_sparse``: the stored entries of a scipy
matrix are read from its raw arrays (indptr/indices/data, keys, rows, offsets) by plain
Python loops with duplicates summed, and values are checked against scipy's own
``toarray()``; numpy.ma inputs are checked against their ``data`` and inverted mask.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    layout_params,
    make_masked,
)
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import masked_sparse as ms

FORMATS = ["coo", "csr", "csc", "bsr", "dok", "lil", "dia"]
NP_DTYPES = [np.float64, np.float32, np.int64, np.int32, np.int8, np.uint8, np.bool_,
             np.complex128, np.complex64]
TORCH_OF = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32,
            np.dtype(np.float16): torch.float16, np.dtype(np.int64): torch.int64,
            np.dtype(np.int32): torch.int32, np.dtype(np.int16): torch.int16,
            np.dtype(np.int8): torch.int8, np.dtype(np.uint8): torch.uint8,
            np.dtype(np.bool_): torch.bool, np.dtype(np.complex128): torch.complex128,
            np.dtype(np.complex64): torch.complex64}


# -- independent reference: the stored entries of a scipy matrix ----------------------------
def _add(entries: dict, key: tuple, value) -> None:
    if key in entries and isinstance(value, (bool, np.bool_)):
        entries[key] = bool(entries[key]) or bool(value)
    else:
        entries[key] = entries[key] + value if key in entries else value


def stored_entries(m) -> dict[tuple, object]:
    """``{position: value}`` of the entries ``m`` stores (duplicates summed), from raw arrays."""
    out: dict[tuple, object] = {}
    fmt = m.format
    if fmt == "coo":
        for *pos, v in zip(*m.coords, m.data):
            _add(out, tuple(int(p) for p in pos), v)
    elif fmt in ("csr", "csc") and m.ndim == 2:
        for major in range(len(m.indptr) - 1):
            for p in range(m.indptr[major], m.indptr[major + 1]):
                key = (major, int(m.indices[p])) if fmt == "csr" else (int(m.indices[p]), major)
                _add(out, key, m.data[p])
    elif fmt == "bsr":
        r, c = m.blocksize
        for br in range(len(m.indptr) - 1):
            for p in range(m.indptr[br], m.indptr[br + 1]):
                for i in range(r):
                    for j in range(c):
                        _add(out, (br * r + i, int(m.indices[p]) * c + j), m.data[p, i, j])
    elif fmt == "dok":
        for key, v in m.items():
            _add(out, tuple(int(k) for k in np.atleast_1d(key)), v)
    elif fmt == "lil":
        for i, (cols, vals) in enumerate(zip(m.rows, m.data)):
            for j, v in zip(cols, vals):
                _add(out, (i, int(j)), v)
    elif fmt == "dia":
        nrows, ncols = m.shape
        for k, off in enumerate(m.offsets):
            for j in range(min(m.data.shape[1], ncols)):
                if 0 <= j - off < nrows:
                    _add(out, (int(j - off), j), m.data[k, j])
    else:  # 1-D csr
        for p in range(m.indptr[0], m.indptr[1]):
            _add(out, (int(m.indices[p]),), m.data[p])
    return out


def reference(m) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (data, mask) of a scipy matrix: mask = stored positions, data = scipy's toarray."""
    mask = torch.zeros(m.shape, dtype=torch.bool)
    for key in stored_entries(m):
        mask[key] = True
    data = torch.from_numpy(np.ascontiguousarray(m.toarray()))
    return data, mask


def same_entries(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] for k in a)


# -- hypothesis: scipy matrices of every format, built from their raw arrays ----------------
def _values(draw, dtype, n) -> np.ndarray:
    ints = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    a = np.array(ints, dtype=np.int64)
    if np.dtype(dtype) == np.bool_:
        return a > 0
    if np.dtype(dtype).kind == "u":
        return np.abs(a).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (a + 1j * np.roll(a, 1)).astype(dtype)
    return a.astype(dtype)  # small integers: sums of duplicates are exact in any order


def _compressed(major, minor, data, n_major):
    """indptr/indices/data grouped by ``major``, keeping the drawn (unsorted) minor order."""
    order = np.argsort(major, kind="stable")
    indptr = np.zeros(n_major + 1, dtype=np.int64)
    np.add.at(indptr, major + 1, 1)
    return data[order], minor[order], np.cumsum(indptr)


@st.composite
def scipy_matrices(draw, fmt: str):
    dtype = draw(st.sampled_from(NP_DTYPES))
    kind = "matrix" if draw(st.booleans()) else "array"
    cls = getattr(sp, f"{fmt}_{kind}")
    if fmt == "bsr":
        r, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
        nbr, nbc = draw(st.integers(0, 3)), draw(st.integers(0, 3))
        n = draw(st.integers(0, 5)) if nbr and nbc else 0
        brow = np.array(draw(st.lists(st.integers(0, max(nbr - 1, 0)), min_size=n, max_size=n)),
                        dtype=np.int64)
        bcol = np.array(draw(st.lists(st.integers(0, max(nbc - 1, 0)), min_size=n, max_size=n)),
                        dtype=np.int64)
        data, indices, indptr = _compressed(brow, bcol, _values(draw, dtype, n * r * c)
                                            .reshape(n, r, c), nbr)
        return cls((data, indices, indptr), shape=(nbr * r, nbc * c), blocksize=(r, c))
    shape = (draw(st.integers(0, 5)), draw(st.integers(0, 6)))
    if fmt == "dia":
        offsets = draw(st.lists(st.integers(-shape[0] - 1, shape[1] + 1), max_size=4,
                                unique=True))
        width = draw(st.integers(0, shape[1] + 2))
        data = _values(draw, dtype, len(offsets) * width).reshape(len(offsets), width)
        return cls((data, np.array(offsets, dtype=np.int64)), shape=shape)
    n = draw(st.integers(0, 12)) if shape[0] and shape[1] else 0
    rows = np.array(draw(st.lists(st.integers(0, max(shape[0] - 1, 0)), min_size=n, max_size=n)),
                    dtype=np.int64)
    cols = np.array(draw(st.lists(st.integers(0, max(shape[1] - 1, 0)), min_size=n, max_size=n)),
                    dtype=np.int64)
    data = _values(draw, dtype, n)
    if fmt == "csr":  # duplicates and unsorted columns, as scipy allows
        return cls(_compressed(rows, cols, data, shape[0]), shape=shape)
    if fmt == "csc":
        return cls(_compressed(cols, rows, data, shape[1]), shape=shape)
    coo = cls if fmt == "coo" else getattr(sp, f"coo_{kind}")
    m = coo((data, (rows, cols)), shape=shape)  # duplicates kept in COO
    return m if fmt == "coo" else m.asformat(fmt)  # dok / lil: duplicates summed by scipy


def _snapshot(m) -> list[np.ndarray]:
    names = ("data", "indices", "indptr", "coords", "offsets")
    arrays = [np.array(getattr(m, n), copy=True) for n in names if hasattr(m, n)]
    return arrays + ([np.array(list(m.items()), dtype=object)] if m.format == "dok" else [])


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_from_scipy_every_format_round_trips(fmt, data):
    m = data.draw(scipy_matrices(fmt))
    before = _snapshot(m)
    ref_data, ref_mask = reference(m)
    entries = stored_entries(m)
    default = torch.sparse_csr if fmt in ("csr", "csc", "bsr", "lil") else torch.sparse_coo
    for layout in [None, *LAYOUTS]:
        mt = ms.from_scipy(m, layout=layout)
        check_invariants(mt, layout or default)
        assert mt.dtype == TORCH_OF[m.dtype] and mt.shape == m.shape
        assert_masked_equal(mt, ref_data, ref_mask, rtol=0, atol=0)
        back = ms.to_scipy(mt, fmt, matrix=isinstance(m, sp.spmatrix))
        assert type(back) is type(m) and back.dtype == m.dtype and back.shape == m.shape
        got = stored_entries(back)
        if fmt == "dia":  # DIA stores whole diagonals: extra stored positions hold 0
            assert entries.keys() <= got.keys()
            assert all(got[k] == 0 for k in got.keys() - entries.keys())
            assert np.array_equal(back.toarray(), m.toarray())
        else:
            assert same_entries(got, entries), (got, entries)
    for old, new in zip(before, _snapshot(m)):  # the user's matrix is untouched
        assert np.array_equal(old, new)


@layout_params()
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_masked_to_scipy_and_back(layout, fmt, dtype):
    mt, data, mask = make_masked((5, 7), layout, dtype, seed=3)
    data = torch.where(torch.rand(data.shape, generator=torch.Generator().manual_seed(1)) < 0.3,
                       torch.zeros((), dtype=dtype), data)  # specified zeros
    if layout == torch.strided:
        mt = ms.masked_tensor(data, mask)
    else:
        mt, _, _ = make_masked((5, 7), layout, dtype, seed=3, data=data, mask=mask)
    m = ms.to_scipy(mt, fmt)
    assert isinstance(m, sp.sparray) and m.format == fmt and m.shape == (5, 7)
    entries = stored_entries(m)
    expected = {tuple(p): data[tuple(p)].item() for p in mask.nonzero().tolist()}
    if fmt == "dia":
        assert expected.keys() <= entries.keys()
        assert all(entries[k] == 0 for k in entries.keys() - expected.keys())
    else:
        assert same_entries(entries, expected)  # masked out: dropped; specified 0: kept
    if fmt != "dia":
        back = ms.from_scipy(m, layout=layout)
        check_invariants(back, layout)
        assert_masked_equal(back, data, mask, rtol=0, atol=0)


@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3), data=st.data())
def test_nd_coo_array_round_trips(shape, data):
    dtype = data.draw(st.sampled_from(NP_DTYPES))
    n = data.draw(st.integers(0, 10)) if all(shape) else 0
    coords = tuple(np.array(data.draw(st.lists(st.integers(0, max(s - 1, 0)), min_size=n,
                                               max_size=n)), dtype=np.int64) for s in shape)
    m = sp.coo_array((_values(data.draw, dtype, n), coords), shape=tuple(shape))
    ref_data, ref_mask = reference(m)
    for layout in [None, torch.sparse_coo, torch.strided]:
        mt = ms.from_scipy(m, layout=layout)
        check_invariants(mt, layout or torch.sparse_coo)
        assert_masked_equal(mt, ref_data, ref_mask, rtol=0, atol=0)
        back = ms.to_scipy(mt, "coo")
        assert back.shape == m.shape and back.dtype == m.dtype
        assert same_entries(stored_entries(back), stored_entries(m))
    if len(shape) == 1:
        for fmt in ("csr", "dok"):
            assert same_entries(stored_entries(ms.to_scipy(mt, fmt)), stored_entries(m))


def test_explicit_zeros_are_specified_and_duplicates_summed():
    rows, cols = np.array([0, 1, 1, 2, 2]), np.array([1, 0, 0, 2, 2])
    vals = np.array([0.0, 2.0, 3.0, 1.0, -1.0])
    for kind in ("array", "matrix"):
        m = getattr(sp, f"coo_{kind}")((vals, (rows, cols)), shape=(3, 3))
        mt = ms.from_scipy(m)
        dense = np.zeros((3, 3))
        np.add.at(dense, (rows, cols), vals)  # the reference sum of duplicates
        spec = np.zeros((3, 3), dtype=bool)
        spec[rows, cols] = True
        assert_masked_equal(mt, torch.from_numpy(dense), torch.from_numpy(spec), rtol=0, atol=0)
        assert m.nnz == 5 and len(m.data) == 5  # the user's COO keeps its duplicates
        back = ms.to_scipy(mt, "csr")
        assert back.nnz == 3 and np.array_equal(back.toarray(), dense)  # (2, 2) sums to 0, kept


@pytest.mark.parametrize("order", ["canonical", "unsorted", "duplicates", "flag-lies"])
@pytest.mark.parametrize("shape", [(7,), (5, 6), (3, 4, 5)], ids=str)
def test_coo_input_in_any_order(order, shape):
    """A COO input already sorted and unique is taken without scipy's sort (its copy
    forgets the flag); one out of order, with duplicates, or whose has_canonical_format
    flag is wrong, is sorted and summed: all agree with the dense sum of the entries."""
    rng = np.random.default_rng(len(shape))
    size = int(np.prod(shape))
    flat = np.sort(rng.choice(size, size // 2, replace=False))
    if order in ("unsorted", "flag-lies"):
        flat = flat[::-1].copy()
    if order == "duplicates":
        flat = np.sort(np.concatenate([flat, flat[:3]]))
    vals = rng.standard_normal(flat.size)
    m = sp.coo_array((vals, np.unravel_index(flat, shape)), shape=shape)
    if order == "flag-lies":
        m.has_canonical_format = True
    before = [c.copy() for c in m.coords]
    mt = ms.from_scipy(m)
    dense = np.zeros(size)
    np.add.at(dense, flat, vals)
    spec = np.zeros(size, dtype=bool)
    spec[flat] = True
    assert_masked_equal(mt, torch.from_numpy(dense.reshape(shape)),
                        torch.from_numpy(spec.reshape(shape)), rtol=0, atol=0)
    assert all(np.array_equal(b, c) for b, c in zip(before, m.coords))  # m untouched


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(0, 0), (3, 0), (0, 4), (3, 4)])
@pytest.mark.parametrize("layout", [None, *LAYOUTS], ids=["default", *LAYOUT_IDS])
def test_empty_and_all_masked(fmt, shape, layout):
    m = sp.coo_array(shape, dtype=np.float32).asformat(fmt)
    mt = ms.from_scipy(m, layout=layout)
    assert mt.shape == shape and mt.dtype == torch.float32
    assert not bool(mt._storage.mask.any())
    assert ms.to_scipy(mt, fmt).nnz == 0
    if layout is not None:
        full = ms.masked_tensor(torch.ones(shape), torch.zeros(shape, dtype=torch.bool))
        out = ms.to_scipy(ms.to_layout(full, layout), fmt)  # all masked: nothing stored
        assert out.shape == shape and out.nnz == 0 and out.dtype == np.float32


def test_matrix_classes_and_formats():
    mt, data, mask = make_masked((4, 5), torch.sparse_csr, torch.float64, seed=2)
    for fmt in FORMATS:
        m = ms.to_scipy(mt, fmt, matrix=True)
        assert isinstance(m, sp.spmatrix) and not isinstance(m, sp.sparray) and m.format == fmt
        assert np.array_equal(m.toarray(), torch.where(mask, data, 0).numpy())


def test_hybrid_coo_to_scipy():
    indices = torch.tensor([[0, 2]])
    values = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    vmask = torch.tensor([[True, True], [False, True]])
    mt = ms.masked_tensor(torch.sparse_coo_tensor(indices, values, (3, 2)),
                          torch.sparse_coo_tensor(indices, vmask, (3, 2)))
    m = ms.to_scipy(mt, "coo")
    dense_mask = torch.zeros(3, 2, dtype=torch.bool)
    dense_mask[indices[0]] = vmask
    assert stored_entries(m).keys() == {tuple(p) for p in dense_mask.nonzero().tolist()}
    assert_masked_equal(ms.from_scipy(m), mt.to_dense().to_tensor(0), dense_mask)


class _NoLargeTensors(TorchFunctionMode):
    """Fails any torch call that asks for, or returns, more than ``limit`` elements."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sizes = [a for a in (*args, *kwargs.values())
                 if isinstance(a, (list, tuple)) and a and all(isinstance(x, int) for x in a)]
        sizes.append([a for a in args if isinstance(a, int) and not isinstance(a, bool)])
        for size in sizes:  # torch.full(shape), torch.zeros(n, m), t.new_zeros(...), ...
            assert int(np.prod(size, dtype=np.float64)) <= self.limit, f"{func} asked {size}"
        out = func(*args, **kwargs)
        for o in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(o, torch.Tensor):
                assert o.numel() <= self.limit, f"{func} produced {tuple(o.shape)}"
        return out


@pytest.mark.parametrize("layout", [None, torch.sparse_coo], ids=["csr", "coo"])
def test_huge_sparse_matrix_converts_in_o_nnz(layout):
    n, nnz = 100_000, 100_000
    rng = np.random.default_rng(0)
    m = sp.csr_array((rng.standard_normal(nnz), (rng.integers(0, n, nnz),
                      rng.integers(0, n, nnz))), shape=(n, n))
    limit = 8 * (m.nnz + n + 1)  # a dense (n, n) tensor would hold 1e10 elements (40+ GB)
    tracemalloc.start()
    try:
        with _NoLargeTensors(limit):
            mt = ms.from_scipy(m, layout=layout)
            back = ms.to_scipy(mt, "csr")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"numpy/scipy peaked at {peak / 2**20:.0f} MiB"
    assert mt.shape == (n, n) and mt._storage.values.numel() == m.nnz
    assert np.array_equal(back.indptr, m.indptr) and np.array_equal(back.indices, m.indices)
    assert np.array_equal(back.data, m.data)


# -- numpy.ma ------------------------------------------------------------------------------
NUMPY_MA_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int16, np.uint8, np.bool_,
                   np.complex128]


@st.composite
def masked_arrays(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = draw(st.sampled_from(NUMPY_MA_DTYPES))
    size = int(np.prod(shape))
    data = _values(draw, dtype, size).reshape(shape)
    if draw(st.booleans()):
        data = data.astype(data.dtype.newbyteorder(">"))  # non-native byte order
    choice = draw(st.sampled_from(["nomask", "array", "all"]))
    if choice == "nomask":
        return np.ma.MaskedArray(data, mask=np.ma.nomask)
    invalid = np.ones(shape, bool) if choice == "all" else np.array(
        draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool).reshape(shape)
    return np.ma.MaskedArray(data, mask=invalid)


@given(a=masked_arrays())
def test_numpy_ma_round_trips(a):
    ref_data = torch.from_numpy(np.asarray(a.data, dtype=a.dtype.newbyteorder("=")))
    ref_mask = torch.from_numpy(np.asarray(~np.ma.getmaskarray(a)))
    for layout in LAYOUTS:
        if layout == torch.sparse_csr and a.ndim != 2 or layout != torch.strided and not a.ndim:
            continue  # CSR is 2-D; 0-d sparse COO cannot densify yet (layouts' index_put)
        mt = ms.from_numpy(a, layout=layout)
        check_invariants(mt, layout)
        assert mt.dtype == TORCH_OF[a.dtype.newbyteorder("=")]
        assert_masked_equal(mt, ref_data, ref_mask, rtol=0, atol=0)
        back = ms.to_numpy(mt)
        assert isinstance(back, np.ma.MaskedArray) and back.shape == a.shape
        assert back.dtype == a.dtype.newbyteorder("=")
        assert np.array_equal(np.ma.getmaskarray(back), np.ma.getmaskarray(a))
        assert np.array_equal(back.compressed(), a.compressed())
        fill = a.dtype.type(1)
        filled = ms.to_numpy(mt, fill_value=fill).filled()
        assert np.array_equal(filled, a.filled(fill))
        assert np.array_equal(filled, mt.to_tensor(fill.item()).to_dense().numpy())


@layout_params()
def test_plain_ndarray_with_mask(layout):
    data = np.arange(12.0).reshape(3, 4)
    valid = (np.arange(12) % 3 == 0).reshape(3, 4)
    mt = ms.from_numpy(data, mask=valid, layout=layout)
    check_invariants(mt, layout)
    assert_masked_equal(mt, torch.from_numpy(data), torch.from_numpy(valid), rtol=0, atol=0)
    all_valid = ms.from_numpy(data, layout=layout)
    assert bool(all_valid.get_mask().to_dense().all())
    data[0, 0] = 100.0  # from_numpy copies: the MaskedTensor does not alias the array
    assert mt.to_tensor(0).to_dense()[0, 0] == 0.0


# -- bad input -----------------------------------------------------------------------------
def test_bad_input_messages():
    with pytest.raises(TypeError, match="numpy.ndarray"):
        ms.from_scipy(np.eye(2))
    with pytest.raises(TypeError, match="list"):
        ms.from_scipy([[1, 0]])
    obj = sp.csr_array(np.eye(2))
    obj.data = obj.data.astype(object)
    with pytest.raises(TypeError, match="object"):
        ms.from_scipy(obj)
    with pytest.raises(TypeError, match="float128|longdouble"):
        ms.from_scipy(sp.csr_array(np.eye(2, dtype=np.longdouble)))
    with pytest.raises(TypeError, match="object"):
        ms.from_numpy(np.array([1, "a"], dtype=object))
    with pytest.raises(TypeError, match="<U"):
        ms.from_numpy(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="list"):
        ms.from_numpy([1.0, 2.0])
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        ms.from_numpy(np.zeros(3), mask=np.ones(2, dtype=bool))
    with pytest.raises(TypeError, match="bool"):
        ms.from_numpy(np.zeros(3), mask=np.ones(3, dtype=np.int64))
    with pytest.raises(TypeError, match="MaskedArray"):
        ms.from_numpy(np.ma.masked_array([1.0]), mask=np.ones(1, dtype=bool))
    mt = ms.masked_tensor(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="Tensor"):
        ms.to_scipy(torch.ones(2, 2))
    with pytest.raises(TypeError, match="Tensor"):
        ms.to_numpy(torch.ones(2, 2))
    with pytest.raises(ValueError, match="'csx'"):
        ms.to_scipy(mt, "csx")
    with pytest.raises(TypeError, match="float16"):
        ms.to_scipy(mt.half())
    with pytest.raises(TypeError, match="bfloat16"):
        ms.to_numpy(mt.bfloat16())
    cube = ms.masked_tensor(torch.ones(2, 2, 2), torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(2, 2, 2\)"):
        ms.to_scipy(cube, "csr")
    with pytest.raises(ValueError, match="1-D"):
        ms.to_scipy(ms.masked_tensor(torch.ones(3), torch.ones(3, dtype=torch.bool)),
                    "coo", matrix=True)
    with pytest.raises(ValueError, match="CSR"):
        ms.from_scipy(sp.coo_array(np.ones(3)), layout=torch.sparse_csr)


@given(a=masked_arrays())
def test_numpy_ma_round_trip_keeps_fill_value_and_data_under_the_mask(a):
    a = np.ma.MaskedArray(a, fill_value=a.dtype.type(3))  # not numpy's default
    back = ms.to_numpy(ms.from_numpy(a))
    assert back.fill_value == a.fill_value
    assert np.array_equal(np.ma.getmaskarray(back), np.ma.getmaskarray(a))
    assert np.array_equal(back.data, a.data, equal_nan=a.dtype.kind in "fc")
    assert np.array_equal(back.filled(), a.filled(), equal_nan=a.dtype.kind in "fc")
    explicit = ms.to_numpy(ms.from_numpy(a), fill_value=a.dtype.type(1))
    assert explicit.fill_value == a.dtype.type(1)
    assert np.array_equal(explicit.data, a.data, equal_nan=a.dtype.kind in "fc")
    for layout in (torch.sparse_coo,) if a.ndim else ():  # sparse: data stored where specified
        sparse_back = ms.to_numpy(ms.from_numpy(a, layout=layout))
        assert sparse_back.fill_value == a.fill_value
        assert np.array_equal(sparse_back.compressed(), a.compressed(),
                              equal_nan=a.dtype.kind in "fc")
