"""Construction, accessors, conversions, printing and bad input, on every layout."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import (
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    dense_of,
    layout_params,
    make_masked,
)
from hypothesis import given
from hypothesis import strategies as st

import masked_sparse as ms


def _torch_masked():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.masked import masked_tensor

    def build(data, mask):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return masked_tensor(data, mask)

    return build


# -- construction ---------------------------------------------------------------------------
@layout_params()
def test_tensor_like_properties(layout):
    mt, data, mask = make_masked((3, 4), layout, torch.float64)
    check_invariants(mt, layout)
    assert mt.shape == data.shape and mt.size() == data.size()
    assert mt.dtype == torch.float64 and mt.device == data.device
    assert mt.dim() == 2 and mt.numel() == 12 and mt.ndim == 2
    assert mt.layout == layout
    assert mt.is_sparse == (layout != torch.strided)  # torch.masked's answer
    assert mt.is_sparse_csr == (layout == torch.sparse_csr)
    assert ms.is_masked_tensor(mt) and not ms.is_masked_tensor(data)
    assert ms.layout_of(mt).torch_layout == layout


@layout_params()
def test_get_data_get_mask_to_tensor(layout):
    mt, data, mask = make_masked((4, 5), layout, seed=3)
    got_mask = mt.get_mask()
    got_data = mt.get_data()
    assert got_mask.layout == layout and got_data.layout == layout
    assert torch.equal(got_mask.to_dense(), mask)
    assert torch.equal(torch.where(mask, got_data.to_dense(), 0), torch.where(mask, data, 0))
    zero = mt.to_tensor(0)
    assert zero.layout == layout  # stays sparse, same indices
    assert torch.equal(zero.to_dense(), torch.where(mask, data, 0))
    filled = mt.to_tensor(-1.5)
    assert filled.layout == torch.strided  # the only way to express a non-zero fill
    assert torch.equal(filled, torch.where(mask, data, torch.tensor(-1.5)))
    if layout == torch.sparse_coo:
        assert torch.equal(got_data._indices(), mt._storage.index[0])
        assert torch.equal(got_mask._indices(), got_data._indices())


SPARSE_LAYOUTS = [torch.sparse_coo, torch.sparse_csr, torch.sparse_csc]


@pytest.mark.parametrize("change", ["zero_", "mul_", "requires_grad_"])
@pytest.mark.parametrize("layout", SPARSE_LAYOUTS, ids=["coo", "csr", "csc"])
def test_get_data_builds_anew_once_the_caller_changed_it(layout, change):
    """Note [The data tensor is built once]: the caller owns the tensor it got. Once it
    changes the tensor itself (an in-place op bumps its version) or asks for its gradient,
    the next call builds a new one, with the MaskedTensor's data (a write to the elements
    shows through, as in a fresh tensor); the storage keeps its shapes (a compressed
    tensor's members are resized in place by ``zero_``: it is built over aliases)."""
    mt, data, mask = make_masked((4, 5), layout, seed=6)
    shapes = [t.shape for t in (*mt._storage.index, mt._storage.values, mt._storage.mask)]
    first = mt.get_data()
    expected = mt._storage.values.clone()
    if change == "requires_grad_":
        first.requires_grad_()
    else:
        getattr(first, change)(2) if change == "mul_" else first.zero_()
        if change == "mul_" and layout != torch.sparse_coo:  # written through the elements
            expected = expected * 2  # (COO's mul_ and every zero_ give the tensor new members)
    after = mt.get_data()
    assert after is not first and not after.requires_grad
    assert [t.shape for t in (*mt._storage.index, mt._storage.values, mt._storage.mask)] == shapes
    assert torch.equal(mt._storage.values, expected)
    assert torch.equal(after.values() if layout != torch.sparse_coo else after._values(),
                       expected)
    assert mt.get_data() is after


@pytest.mark.parametrize("layout", SPARSE_LAYOUTS, ids=["coo", "csr", "csc"])
def test_get_data_first_built_under_inference_mode_is_not_kept(layout):
    """A data tensor built under ``torch.inference_mode`` is an inference tensor, which
    autograd refuses to save: the call after it, outside, builds one that trains."""
    mt, data, mask = make_masked((4, 5), layout, seed=7)
    with torch.inference_mode():
        inside = mt.get_data()
    assert inside.is_inference()
    outside = mt.get_data()
    assert not outside.is_inference()
    weight = torch.randn(5, 3, requires_grad=True)
    torch.sparse.mm(outside.to_sparse_coo(), weight).sum().backward()
    dense_weight = weight.detach().requires_grad_()
    torch.mm(outside.to_dense(), dense_weight).sum().backward()
    assert torch.allclose(weight.grad, dense_weight.grad)


def test_new_storage_frees_the_kept_data_tensor():
    """Setting a MaskedTensor's storage drops the data tensor built from the old one."""
    mt, _, _ = make_masked((4, 5), torch.sparse_coo, seed=8)
    mt.get_data()
    assert "_data_of" in mt.__dict__
    mt._storage = mt._storage.with_values(mt._storage.values + 1)
    assert "_data_of" not in mt.__dict__


@layout_params()
def test_get_data_is_built_once_per_storage(layout):
    """Note [The data tensor is built once]: repeated plain calls give the same tensor, which
    shows in-place writes to the values; an in-place op (a new storage) gives a new one;
    autograd gets a fresh, differentiable one; copies do not carry it."""
    import copy
    import pickle

    mt, data, mask = make_masked((4, 5), layout, seed=4)
    first = mt.get_data()
    assert mt.get_data() is first
    mt._storage.values.mul_(2)  # a write through the storage shows in the kept tensor
    assert torch.equal(torch.where(mask, first.to_dense(), 0), torch.where(mask, 2 * data, 0))
    mt.add_(1)  # an in-place op on the values: shows through the same tensor
    assert mt.get_data() is first
    assert torch.equal(torch.where(mask, first.to_dense(), 0), torch.where(mask, 2 * data + 1, 0))
    mt.copy_(mt * 3)  # written into the values, which the tensor got before shows
    assert torch.equal(torch.where(mask, first.to_dense(), 0),
                       torch.where(mask, 3 * (2 * data + 1), 0))
    mt._storage = mt._storage.with_values(mt._storage.values - 1)  # a new storage: a new one
    after = mt.get_data()
    if layout != torch.strided:  # (strided: the values themselves, every time)
        assert after is not first
    assert torch.equal(torch.where(mask, after.to_dense(), 0),
                       torch.where(mask, 3 * (2 * data + 1) - 1, 0))
    for clone in (copy.deepcopy(mt), pickle.loads(pickle.dumps(mt))):
        assert "_data_of" not in clone.__dict__
        assert torch.equal(torch.where(mask, clone.get_data().to_dense(), 0),
                           torch.where(mask, after.to_dense(), 0))
    leaf = mt.detach().requires_grad_()
    leaf.get_data()
    tracked = leaf.get_data()
    assert tracked.grad_fn is not None
    tracked.to_dense().sum().backward()
    assert torch.equal(leaf.grad.get_mask().to_dense(), mask)


@layout_params()
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool],
                         ids=str)
def test_to_tensor_of_a_large_input_is_where_bit_for_bit(layout, dtype):
    """Large enough for the one-pass exact fill: NaN and inf under the mask become the fill,
    a specified -0.0 stays -0.0 (compared by bits where the result is strided: a sparse
    result's ``to_dense`` adds its values to +0.0)."""
    data = torch.randn(80, 70, dtype=torch.float64)
    data[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
    data = data.to(dtype) if dtype != torch.bool else data > 0
    mask = torch.rand(80, 70, generator=torch.Generator().manual_seed(5)) < 0.5
    mask[0, :3], mask[0, 3] = False, True
    mt, data, mask = make_masked((80, 70), layout, dtype, data=data, mask=mask)
    fills = [0] + ([-math.inf, -0.0, 2.5, math.nan] if layout == torch.strided
                   and dtype.is_floating_point else [])
    for value in fills:
        got = mt.to_tensor(value).to_dense()
        want = torch.where(mask, data, torch.tensor(value, dtype=dtype))
        if dtype.is_floating_point and layout == torch.strided:
            got, want = (t.view(torch.int32 if dtype == torch.float32 else torch.int64)
                         for t in (got, want))
        assert torch.equal(got, want), value


@pytest.mark.parametrize("n", [10, 100_000])  # the small path and the one-pass fill
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("value", [1e10, -1e10, 65504.0, 65519.0, 1e39, math.inf, math.nan,
                                   2**200])
def test_to_tensor_refuses_a_value_the_dtype_cannot_hold_as_masked_fill_does(n, dtype, value):
    """A fill value beyond the dtype's range raises what ``masked_fill`` raises; one within
    it (or inf / NaN) fills as masked_fill fills."""
    g = torch.Generator().manual_seed(9)
    data = torch.randn(n, generator=g).to(dtype)
    mask = torch.rand(n, generator=g) < 0.5
    try:
        want = data.masked_fill(~mask, value)
    except (RuntimeError, OverflowError) as refused:
        with pytest.raises(type(refused)) as ours:
            ms.masked_tensor(data, mask).to_tensor(value)
        assert str(ours.value) == str(refused)
        return
    assert torch.equal(ms.masked_tensor(data, mask).to_tensor(value).isnan(), want.isnan())
    assert torch.equal(ms.masked_tensor(data, mask).to_tensor(value).nan_to_num(),
                       want.nan_to_num())


def test_masked_tensor_copies_as_masked_tensor_does_not():
    data, mask = torch.arange(4.0), torch.tensor([True, False, True, True])
    copied, viewed = ms.masked_tensor(data, mask), ms.as_masked_tensor(data, mask)
    data.add_(100)
    assert torch.equal(copied.to_tensor(0), torch.tensor([0.0, 0, 2, 3]))
    assert torch.equal(viewed.to_tensor(0), torch.tensor([100.0, 0, 102, 103]))
    with pytest.warns(UserWarning, match="requires_grad"):  # torch.masked's warning
        leaf = ms.masked_tensor(data.requires_grad_(), mask, requires_grad=True)
    assert leaf.is_leaf and leaf.requires_grad


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_mask_pattern_is_authoritative(layout):
    # data stores (0,0) and (1,1); the mask stores (0,0) and (0,1): data at (1,1) is dropped,
    # the mask position (0,1) without data reads 0.
    data = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 1]]), torch.tensor([5.0, 7.0]),
                                   (2, 2))
    mask = torch.sparse_coo_tensor(torch.tensor([[0, 0], [0, 1]]), torch.tensor([True, True]),
                                   (2, 2))
    if layout == torch.sparse_csr:
        data, mask = data.to_sparse_csr(), mask.to_sparse_csr()
    mt = ms.masked_tensor(data, mask)
    check_invariants(mt, layout)
    assert_masked_equal(mt, torch.tensor([[5.0, 0.0], [0.0, 0.0]]),
                        torch.tensor([[True, True], [False, False]]))


def test_uncoalesced_coo_is_coalesced():
    idx = torch.tensor([[1, 0, 1], [0, 2, 0]])  # (1, 0) twice: summed, as torch does
    data = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 3.0]), (2, 3))
    mask = torch.sparse_coo_tensor(idx, torch.tensor([True, True, False]), (2, 3))
    mt = ms.masked_tensor(data, mask)
    check_invariants(mt, torch.sparse_coo)
    ref = torch.tensor([[0.0, 0, 2], [4, 0, 0]])
    assert_masked_equal(mt, ref, ref != 0)


def test_hybrid_coo():
    idx = torch.tensor([[0, 3]])
    data = torch.sparse_coo_tensor(idx, torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (5, 2))
    mask = torch.sparse_coo_tensor(idx, torch.tensor([True, True]), (5,)).coalesce()
    mask = torch.sparse_coo_tensor(idx, torch.tensor([[True, False], [True, True]]), (5, 2))
    mt = ms.masked_tensor(data, mask)
    check_invariants(mt, torch.sparse_coo)
    dense_mask = torch.zeros(5, 2, dtype=torch.bool)
    dense_mask[0, 0] = dense_mask[3, 0] = dense_mask[3, 1] = True
    assert_masked_equal((mt * 2).exp(), (data.to_dense() * 2).exp(), dense_mask)
    assert_masked_equal(mt.to_dense(), data.to_dense(), dense_mask)


# -- conversions ----------------------------------------------------------------------------
@pytest.mark.parametrize("source", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("target", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_conversions_are_exact(source, target, dtype):
    mt, data, mask = make_masked((5, 3), source, dtype, seed=4)
    method = {torch.strided: "to_dense", torch.sparse_coo: "to_sparse_coo",
              torch.sparse_csr: "to_sparse_csr"}[target]
    out = getattr(mt, method)()
    check_invariants(out, target)
    assert_masked_equal(out, data, mask)
    back = ms.to_layout(out, source)
    check_invariants(back, source)
    assert_masked_equal(back, data, mask)


@layout_params()
def test_to_sparse_forms(layout):
    mt, data, mask = make_masked((4, 4), layout, seed=5)
    assert mt.to_sparse().layout == torch.sparse_coo
    assert mt.to_sparse(layout=torch.sparse_csr).layout == torch.sparse_csr
    assert_masked_equal(mt.to_sparse(), data, mask)


def test_csr_must_be_2d():
    mt, _, _ = make_masked((2, 3, 4), torch.strided)
    with pytest.raises(ValueError, match="CSR masked tensor must be 2-D"):
        mt.to_sparse_csr()
    with pytest.raises(ValueError, match="must be 2-D"):
        mt.to_sparse_coo().to_sparse_csr()


def test_sparse_keeps_unstored_unspecified_through_conversions():
    mt, data, mask = make_masked((6, 6), torch.sparse_coo, density=0.2, stored_masked=0.4)
    stored = mt._storage.values.shape[0]
    csr = mt.to_sparse_csr()
    assert csr._storage.values.shape[0] == stored  # stored-but-masked entries travel too
    assert_masked_equal(csr.to_sparse_coo(), data, mask)


@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS),
       st.tuples(st.integers(0, 6), st.integers(0, 6)), st.floats(0, 1), st.integers(0, 999))
def test_random_round_trips(source, target, shape, density, seed):
    mt, data, mask = make_masked(shape, source, density=density, seed=seed)
    out = ms.to_layout(ms.to_layout(mt, target), source)
    check_invariants(out, source)
    assert_masked_equal(out, data, mask)


# -- printing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 2, 3), (), (0, 3), (1,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float64])
def test_repr_matches_torch_masked(shape, dtype):
    _, data, mask = make_masked(shape, torch.strided, dtype, seed=6)
    if shape == ():
        mask = torch.tensor(True)
    expected = repr(_torch_masked()(data, mask))
    assert repr(ms.masked_tensor(data, mask)) == expected
    assert str(ms.masked_tensor(data, mask)) == expected


def test_repr_fully_masked_scalar_matches_torch_masked():
    data, mask = torch.tensor(3.0), torch.tensor(False)
    assert repr(ms.masked_tensor(data, mask)) == repr(_torch_masked()(data, mask))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_repr_sparse_same_text_as_dense(layout):
    mt, data, mask = make_masked((3, 4), layout, seed=7)
    assert repr(mt) == repr(ms.masked_tensor(data, mask))


def test_repr_huge_sparse_is_a_summary():
    idx = torch.tensor([[0, 99_999], [5, 99_999]])
    data = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (100_000, 100_000))
    mask = torch.sparse_coo_tensor(idx, torch.tensor([True, False]), (100_000, 100_000))
    text = repr(ms.masked_tensor(data, mask))
    assert "shape=(100000, 100000)" in text and "stored=2" in text and "specified=1" in text


# -- bad input --------------------------------------------------------------------------------
def test_non_bool_mask():
    with pytest.raises(TypeError, match="masked_tensor: mask must have dtype torch.bool"):
        ms.masked_tensor(torch.zeros(3), torch.ones(3))


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"data \(3,\) and mask \(4,\) must have the same shape"):
        ms.masked_tensor(torch.zeros(3), torch.ones(4, dtype=torch.bool))


def test_layout_mismatch_takes_the_masks_layout():
    # Note [The mask's layout wins]: sparse data read at a strided mask's positions
    mt = ms.masked_tensor(torch.eye(2).to_sparse(), torch.ones(2, 2, dtype=torch.bool))
    assert mt.layout == torch.strided and torch.equal(mt.to_tensor(-1), torch.eye(2))


def test_non_tensor_input():
    with pytest.raises(TypeError, match="data must be a plain torch.Tensor"):
        ms.masked_tensor([1.0, 2.0], torch.ones(2, dtype=torch.bool))
    mt = ms.masked_tensor(torch.zeros(2), torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="data must be a plain torch.Tensor"):
        ms.masked_tensor(mt, torch.ones(2, dtype=torch.bool))


def test_unregistered_layout():
    data = torch.eye(2).to_sparse_bsc((1, 1))  # no masked layout is registered for BSC
    with pytest.raises(NotImplementedError, match="no masked layout is registered for "
                                                  "torch.sparse_bsc"):
        ms.masked_tensor(data, data.bool())


@layout_params()
def test_op_without_kernel_raises_not_implemented(layout):
    mt, _, _ = make_masked((3, 3), layout)
    with pytest.raises(NotImplementedError, match=r"MaskedTensor\[.*\] .*to_dense"):
        torch.ops.aten.cholesky.default(mt)


def test_item():
    assert ms.masked_tensor(torch.tensor(2.5), torch.tensor(True)).item() == 2.5
    with pytest.raises(ValueError, match="unspecified"):
        ms.masked_tensor(torch.tensor(2.5), torch.tensor(False)).item()


# -- casts, devices, compile-readiness ------------------------------------------------------
@layout_params()
def test_casts_and_device_moves(layout):
    mt, data, mask = make_masked((3, 4), layout, seed=8)
    for out, ref in [(mt.double(), data.double()), (mt.half(), data.half()),
                     (mt.to(torch.int32), data.to(torch.int32)), (mt.cpu(), data),
                     (mt.to("cpu", torch.float64), data.double())]:
        check_invariants(out, layout)
        assert_masked_equal(out, ref, mask)


@layout_params()
def test_flatten_unflatten_round_trip(layout):
    mt, data, mask = make_masked((3, 4), layout, seed=9)
    names, meta = mt.__tensor_flatten__()
    inner = {n: getattr(mt, n) for n in names}
    assert all(isinstance(t, torch.Tensor) and not ms.is_masked_tensor(t) for t in inner.values())
    hash(meta)
    back = type(mt).__tensor_unflatten__(inner, meta, mt.shape, mt.stride())
    check_invariants(back, layout)
    assert_masked_equal(back, data, mask)


def test_dense_of_helper_is_independent_of_ops():
    mt, data, mask = make_masked((2, 3), torch.sparse_coo, seed=10)
    got_data, got_mask = dense_of(mt)
    assert torch.equal(got_mask, mask)


@layout_params()
def test_validate_method(layout):
    mt, _, _ = make_masked((3, 4), layout, seed=11)
    assert mt.validate() is mt and mt.validate(full=True) is mt


@pytest.mark.parametrize("specified", [True, False])
def test_zero_dim_coo_round_trip(specified):
    data, mask = torch.tensor(3.0), torch.tensor(specified)
    coo = ms.masked_tensor(data, mask).to_sparse_coo()
    check_invariants(coo, torch.sparse_coo)
    assert_masked_equal(coo.to_dense(), data, mask)
    assert repr(coo) == repr(ms.masked_tensor(data, mask))
