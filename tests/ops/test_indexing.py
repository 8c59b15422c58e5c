"""``mt[idx]``, item assignment and the overview tutorial's indexing examples, on every layout,
against the same index applied to the dense data and the dense mask separately."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    LAYOUT_IDS,
    LAYOUTS,
    assert_masked_equal,
    check_invariants,
    make_masked,
    make_masked_in,
)
from hypothesis import given
from hypothesis import strategies as st
from test_shape import check_result, expected_layout
from torch.utils._python_dispatch import TorchDispatchMode

import masked_sparse as ms
from masked_sparse import masked_tensor

pytestmark = pytest.mark.device_generic

_I = torch.tensor

INDEX_2D = {
    "int": 1, "neg_int": -1, "int_int": (1, 2), "int_tensor_scalar": _I(2),
    "slice": slice(1, 3), "slice_step": (slice(None), slice(1, 5, 2)),
    "slice_open": (slice(2, None),), "slice_empty": slice(3, 1), "slice_int": (slice(1, 3), -2),
    "none": (None, slice(2, None)), "none_mid": (slice(None), None, 3), "ellipsis": (..., 3),
    "ellipsis_only": ..., "tensor": _I([2, 0]), "list": [1, 1, 3],
    "tensor_dim1_neg": (slice(None), _I([-1, 0])), "tensor_slice": (_I([3, 0]), slice(1, 4)),
    "bool_full": torch.rand(4, 6, generator=torch.Generator().manual_seed(3)) > 0.5,
}
INDEX_3D = {
    "int": 0, "slice_last": (slice(None), slice(None), slice(2, 4)), "ellipsis": (..., 1),
    "mixed": (1, None, slice(None), _I([0, 4])), "int_int_int": (2, 3, 4),
    "tensor": _I([0, 2]), "bool_full": torch.rand(3, 4, 5, generator=torch.Generator()
                                                  .manual_seed(4)) > 0.3,
}
CASES = [(name, (4, 6), idx, layout) for name, idx in INDEX_2D.items() for layout in LAYOUTS] + [
    (name, (3, 4, 5), idx, layout) for name, idx in INDEX_3D.items() for layout in LAYOUTS[:2]]


@pytest.mark.parametrize("name,shape,idx,layout", CASES,
                         ids=[f"{LAYOUT_IDS[LAYOUTS.index(c[3])]}-{len(c[1])}d-{c[0]}"
                              for c in CASES])
def test_getitem(name, shape, idx, layout):
    mt, data, mask = make_masked(shape, layout, seed=len(name))
    check_result(mt[idx], data[idx], mask[idx], layout)


@given(st.data())
def test_getitem_sparse_decomposition_property(draw):
    """Random int/slice/None/Ellipsis/tensor indices on COO (3-D) and CSR (2-D)."""
    layout = draw.draw(st.sampled_from([torch.sparse_coo, torch.sparse_csr]))
    shape = (3, 4, 5) if layout == torch.sparse_coo else (4, 5)
    mt, data, mask = make_masked(shape, layout, seed=draw.draw(st.integers(0, 50)))
    items, d, used_tensor = [], 0, False
    for _ in range(draw.draw(st.integers(1, len(shape) + 1))):
        kind = draw.draw(st.sampled_from(["int", "slice", "none", "tensor"]))
        if kind == "none":
            items.append(None)
            continue
        if d >= len(shape):
            break
        size = shape[d]
        if kind == "int":
            items.append(draw.draw(st.integers(-size, size - 1)))
        elif kind == "tensor" and not used_tensor:
            used_tensor = True
            items.append(_I(draw.draw(st.lists(st.integers(-size, size - 1), max_size=4)),
                             dtype=torch.long))
        else:
            items.append(slice(draw.draw(st.none() | st.integers(-size - 1, size + 1)),
                               draw.draw(st.none() | st.integers(-size - 1, size + 1)),
                               draw.draw(st.none() | st.integers(1, 3))))
        d += 1
    if draw.draw(st.booleans()):
        items.insert(draw.draw(st.integers(0, len(items))), ...)
    idx = tuple(items)
    # Selecting every dim with ints leaves a 0-d (strided) intermediate: the result is strided.
    all_ints = sum(isinstance(it, int) for it in items) == len(shape)
    check_result(mt[idx], data[idx], mask[idx], layout, torch.strided if all_ints else None)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_getitem_sparse_bool_index(layout):
    """``mt[mt.get_mask()]`` on a sparse tensor: the sparse bool index is never densified."""
    mt, data, mask = make_masked((4, 6), layout, seed=5)
    out = mt[mt.get_mask()]
    check_invariants(out, torch.sparse_coo)
    assert_masked_equal(out, data[mask], mask[mask])
    other = make_masked((4, 6), torch.sparse_coo, seed=6)[2]
    out = mt[other.to_sparse()]
    assert_masked_equal(out, data[other], mask[other])


@pytest.mark.parametrize("idx", [(_I([0, 1]), _I([1, 2])), _I([[0, 1]]),
                                 (slice(None), torch.ones(6, dtype=torch.bool))],
                         ids=["two_tensors", "2d_tensor", "partial_bool"])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_getitem_unsupported_sparse_index(idx, layout):
    mt, data, mask = make_masked((4, 6), layout)
    with pytest.raises(NotImplementedError, match=r"sparse_\w+\] getitem: .*to_dense"):
        mt[idx]
    strided = masked_tensor(data, mask)  # the strided layout takes any index
    check_result(strided[idx], data[idx], mask[idx], torch.strided)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_getitem_errors(layout):
    mt, data, mask = make_masked((4, 6), layout)
    with pytest.raises(IndexError):
        mt[4]
    with pytest.raises(IndexError):
        mt[0, 0, 0]
    if layout != torch.strided or data.device.type == "cpu":
        # An index tensor out of range: the sparse layouts check it; the strided layout runs
        # torch's index kernel, which raises on the CPU and asserts on the device (as for a
        # plain tensor: a host check would sync).
        with pytest.raises(IndexError):
            mt[_I([0, 7])]
    with pytest.raises(TypeError, match="plain tensor"):
        mt[mt > 0]
    with pytest.raises(TypeError, match="plain tensor"):
        mt.index_select(0, masked_tensor(_I([0]), _I([True])))
    with pytest.raises(TypeError):
        data[masked_tensor(_I([0]), _I([True]))]
    with pytest.raises(TypeError, match="bool"):
        mt.masked_select(torch.ones(4, 6))


# -- Python int indices out of range: IndexError on the host, before any kernel --------------
class RecordAten(TorchDispatchMode):
    """The aten ops that run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


#: index -> (the int out of range, the dim it indexes) on a (4, 6) tensor
BAD_INT_INDICES = {
    "int": (4, (4, 0)), "neg_int": (-5, (-5, 0)), "tuple_second": ((1, 7), (7, 1)),
    "tuple_first": ((9, 2), (9, 0)), "tuple_neg": ((0, -7), (-7, 1)),
    "ellipsis_last": ((..., 6), (6, 1)), "ellipsis_first": ((5, ...), (5, 0)),
    "none_then_int": ((None, 1, -7), (-7, 1)), "int_none_int": ((2, None, 6), (6, 1)),
    "slice_then_int": ((slice(1, 3), 8), (8, 1)), "tensor_then_int": ((_I([0, 1]), 6), (6, 1)),
    "none_ellipsis_int": ((None, ..., 12), (12, 1)),
}


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
@pytest.mark.parametrize("name", list(BAD_INT_INDICES))
def test_int_index_out_of_range_raises_before_any_kernel(layout, name):
    mt, data, mask = make_masked_in((4, 6), layout)
    idx, (bad, dim) = BAD_INT_INDICES[name]
    size = data.shape[dim]
    with pytest.raises(IndexError):
        data[idx]  # torch raises too (its reference)
    record = RecordAten()
    with record, pytest.raises(IndexError, match=rf"^index {bad} is out of bounds for "
                                                 rf"dimension {dim} with size {size}$"):
        mt[idx]
    assert record.ops == []


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=ALL_LAYOUT_IDS)
def test_int_index_out_of_range_message_is_torchs(layout):
    mt, data, _ = make_masked_in((4, 6), layout)
    for idx in (4, -5, (1, 7), (0, -7), (..., 6), (5, ...)):
        with pytest.raises(IndexError) as theirs:
            data[idx]
        with pytest.raises(IndexError) as ours:
            mt[idx]
        assert str(ours.value) == str(theirs.value), idx


@pytest.mark.parametrize("idx", [(1, 7), 4, (..., -7), (None, 9)], ids=str)
def test_setitem_int_index_out_of_range_raises_before_any_kernel(idx):
    mt, data, _ = make_masked((4, 6))
    before = data.clone()
    record = RecordAten()
    with record, pytest.raises(IndexError, match="is out of bounds for dimension"):
        mt[idx] = 0.0
    assert record.ops == []
    assert torch.equal(mt.get_data(), before)


@pytest.mark.parametrize("layout", ALL_LAYOUTS[:4], ids=ALL_LAYOUT_IDS[:4])  # BSR: no select
def test_int_indices_in_range_still_index(layout):
    mt, data, mask = make_masked_in((4, 6), layout)
    for idx in ((3, -6), (-4, 5), (..., -1), (None, 3, 0)):
        out = mt[idx]
        assert_masked_equal(out.to_dense() if out.dim() else out, data[idx], mask[idx])


def test_expected_layout_rule():
    assert expected_layout(torch.sparse_csr, 1) == torch.sparse_coo
    assert expected_layout(torch.sparse_csr, 2) == torch.sparse_csr
    assert expected_layout(torch.sparse_coo, 0) == torch.strided


# -- item assignment -------------------------------------------------------------------
def test_setitem_strided():
    mt, data, mask = make_masked((4, 6), seed=7)
    mt[0] = 5.0
    mt[:, 1:3] = torch.arange(2.0)
    expected = data.clone()
    expected[0] = 5.0
    expected[:, 1:3] = torch.arange(2.0)
    assert_masked_equal(mt, expected, mask)  # plain values write the data; the mask is kept
    src = masked_tensor(torch.full((6,), 9.0), mask[2])
    mt[2] = src  # a MaskedTensor value must match the mask of the indexed part
    expected[2] = 9.0
    assert_masked_equal(mt, expected, mask)
    with pytest.raises(ValueError, match="masks"):
        mt[3] = masked_tensor(torch.zeros(6), ~mask[3])
    # into a plain tensor: the specified elements are written, the others stay (Note
    # [Masked values into plain tensors]; what gradcheck's Jacobian needs)
    plain = torch.zeros(4, 6)
    plain[1] = src
    assert torch.equal(plain, torch.where(torch.arange(4)[:, None] == 1,
                                          torch.where(mask[2], 9.0, 0.0), 0.0))
    sparse_src = masked_tensor(torch.full((4, 6), 3.0), mask).to_sparse_coo()
    plain[:] = sparse_src
    assert torch.equal(plain[mask], torch.full((int(mask.sum()),), 3.0))
    assert torch.equal(plain[~mask], torch.where(torch.arange(4)[:, None] == 1,
                                                 torch.where(mask[2], 9.0, 0.0), 0.0)[~mask])


def test_setitem_strided_autograd():
    mt, data, mask = make_masked((4, 6), seed=8)
    x = mt.requires_grad_()
    y = x * 2
    y[1] = 0.0
    (y.to_tensor(0) * torch.arange(24.0).view(4, 6)).sum().backward()
    expected = 2 * torch.arange(24.0).view(4, 6)
    expected[1] = 0
    assert_masked_equal(x.grad, expected, mask)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_setitem_sparse_raises(layout):
    mt = make_masked((4, 6), layout)[0]
    with pytest.raises(NotImplementedError, match=r"sparse_\w+\] setitem: .*to_dense"):
        mt[0] = 1.0


# -- the overview tutorials' indexing examples -----------------------------------------
def _reference_text(data, mask):
    return str(masked_tensor(data, mask))


@pytest.mark.parametrize("layout", LAYOUTS[:2], ids=LAYOUT_IDS[:2])
def test_overview_indexing_examples(layout):
    """``mt[0]``, ``mt[:, :, 2:4]`` (2x3x4 example) and ``m[0]``, ``m[torch.tensor([0, 2])]``,
    ``m[m.get_mask()]`` (4x5x3 example) print the same masked values as the dense reference."""
    data = torch.arange(24).reshape(2, 3, 4).float()
    mask = data % 2 == 0
    mt = ms.to_layout(masked_tensor(data, mask), layout)
    for idx in (0, (slice(None), slice(None), slice(2, 4))):
        assert str(mt[idx]) == _reference_text(data[idx], mask[idx])
    torch.manual_seed(0)
    data = torch.randn(4, 5, 3).mul(5).float()
    mask = torch.randint(2, (4, 5, 3), dtype=torch.bool)
    m = ms.to_layout(masked_tensor(data, mask), layout)
    assert str(m) == _reference_text(data, mask)
    assert str(m[0]) == _reference_text(data[0], mask[0])
    idx = torch.tensor([0, 2])
    assert str(m[idx]) == _reference_text(data[idx], mask[idx])
    out = m[m.get_mask()]
    assert out.shape == (int(mask.sum()),)
    assert str(out) == _reference_text(data[mask], mask[mask])
