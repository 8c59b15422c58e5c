"""Shape and movement ops on every layout: the op applied to the dense data and the dense
mask separately is the reference; results are checked for layout and full invariants.

Unsupported (layout, op) pairs are read from each layout's ``refuses`` declaration and
must raise ``NotImplementedError`` naming the layout, the op and the way out.
"""

from __future__ import annotations

import pytest
import torch
from conftest import LAYOUT_IDS, LAYOUTS, assert_masked_equal, check_invariants, make_masked

import layouts
import masked_sparse as ms

pytestmark = pytest.mark.device_generic

_I = torch.tensor
SEL = torch.rand(4, 6, generator=torch.Generator().manual_seed(5)) > 0.5
GATHER = torch.tensor([[0, 5], [1, 1], [2, 0], [5, 3]])

# (op as named in a layout's ``refuses``, case id, input shape, fn). ``fn`` must be a pure
# movement of elements: it is applied to the MaskedTensor, to the dense data and to the dense mask.
CASES_2D = [
    ("transpose", "transpose", (4, 6), lambda t: t.transpose(0, 1)),
    ("transpose", "torch.transpose_neg", (4, 6), lambda t: torch.transpose(t, -1, 0)),
    ("transpose", "swapaxes", (4, 6), lambda t: torch.swapaxes(t, 0, 1)),
    ("t", "t", (4, 6), lambda t: t.t()),
    ("T", "T", (4, 6), lambda t: t.T),
    ("mT", "mT", (4, 6), lambda t: t.mT),
    ("permute", "permute", (4, 6), lambda t: t.permute(1, 0)),
    ("permute", "permute_id", (4, 6), lambda t: torch.permute(t, (0, 1))),
    ("movedim", "movedim", (4, 6), lambda t: torch.movedim(t, 0, 1)),
    ("select", "select0", (4, 6), lambda t: t.select(0, 2)),
    ("select", "select1_neg", (4, 6), lambda t: torch.select(t, 1, -1)),
    ("narrow", "narrow0", (4, 6), lambda t: t.narrow(0, 1, 2)),
    ("narrow", "narrow1", (4, 6), lambda t: torch.narrow(t, 1, 2, 3)),
    ("index_select", "index_select0", (4, 6), lambda t: t.index_select(0, _I([3, 0, 3]))),
    ("index_select", "index_select1", (4, 6), lambda t: torch.index_select(t, 1, _I([5, 1]))),
    ("index_select", "index_select_empty", (4, 6), lambda t: t.index_select(1, _I([]).long())),
    ("unsqueeze", "unsqueeze0", (4, 6), lambda t: t.unsqueeze(0)),
    ("unsqueeze", "unsqueeze_neg", (4, 6), lambda t: torch.unsqueeze(t, -1)),
    ("squeeze", "squeeze", (1, 6), lambda t: t.squeeze()),
    ("squeeze", "squeeze_dim", (1, 6), lambda t: torch.squeeze(t, 0)),
    ("squeeze", "squeeze_noop", (4, 6), lambda t: t.squeeze(1)),
    ("view", "view_flat", (4, 6), lambda t: t.view(-1)),
    ("view", "view_split", (4, 6), lambda t: t.view(2, 2, 6)),
    ("view", "view_same", (4, 6), lambda t: t.view((4, 6))),
    ("view_as", "view_as", (4, 6), lambda t: t.view_as(torch.empty(3, 8))),
    ("reshape", "reshape", (4, 6), lambda t: t.reshape(3, 8)),
    ("reshape", "reshape_3d", (4, 6), lambda t: torch.reshape(t, (2, -1, 4))),
    ("reshape_as", "reshape_as", (4, 6), lambda t: t.reshape_as(torch.empty(8, 3))),
    ("flatten", "flatten", (4, 6), lambda t: t.flatten()),
    ("unflatten", "unflatten", (4, 6), lambda t: t.unflatten(1, (2, -1))),
    ("ravel", "ravel", (4, 6), lambda t: torch.ravel(t)),
    ("expand", "expand", (1, 6), lambda t: t.expand(3, -1)),
    ("expand_as", "expand_as", (1, 6), lambda t: t.expand_as(torch.empty(2, 4, 6))),
    ("broadcast_to", "broadcast_to", (1, 6), lambda t: torch.broadcast_to(t, (3, 6))),
    ("repeat", "repeat", (4, 6), lambda t: t.repeat(2, 1)),
    ("tile", "tile", (4, 6), lambda t: t.tile((2,))),
    ("flip", "flip0", (4, 6), lambda t: t.flip(0)),
    ("flip", "flip01", (4, 6), lambda t: torch.flip(t, (0, 1))),
    ("fliplr", "fliplr", (4, 6), lambda t: torch.fliplr(t)),
    ("flipud", "flipud", (4, 6), lambda t: t.flipud()),
    ("roll", "roll", (4, 6), lambda t: t.roll(2, 1)),
    ("roll", "roll_flat", (4, 6), lambda t: torch.roll(t, 3)),
    ("roll", "roll2", (4, 6), lambda t: t.roll((1, -2), (0, 1))),
    ("cat", "cat0", (4, 6), lambda t: torch.cat([t[1:], t], 0)),
    ("cat", "cat1", (4, 6), lambda t: torch.cat((t, t[:, 1:], t), dim=1)),
    ("cat", "concat_neg", (4, 6), lambda t: torch.concat([t, t], -1)),
    ("stack", "stack", (4, 6), lambda t: torch.stack([t, t.flip(0)], 1)),
    ("split", "split", (4, 6), lambda t: t.split(4, 1)),
    ("split", "split_sizes", (4, 6), lambda t: torch.split(t, [1, 3], 0)),
    ("chunk", "chunk", (4, 6), lambda t: t.chunk(3, 1)),
    ("unbind", "unbind", (4, 6), lambda t: t.unbind(0)),
    ("unfold", "unfold", (4, 6), lambda t: t.unfold(1, 2, 2)),
    ("gather", "gather", (4, 6), lambda t: t.gather(1, GATHER)),
    ("take", "take", (4, 6), lambda t: torch.take(t, _I([0, 5, 23, 5]))),
    ("masked_select", "masked_select", (4, 6), lambda t: t.masked_select(SEL)),
    ("masked_select", "masked_select_bcast", (4, 6), lambda t: torch.masked_select(t, SEL[0])),
    ("narrow_copy", "narrow_copy", (4, 6), lambda t: t.narrow_copy(1, 1, 3)),
    ("hstack", "hstack", (4, 6), lambda t: torch.hstack([t, t[:, :2]])),
    ("vstack", "vstack", (4, 6), lambda t: torch.vstack((t, t[:1]))),
    ("vstack", "row_stack", (4, 6), lambda t: torch.row_stack([t[1:3], t])),
    ("dstack", "dstack", (4, 6), lambda t: torch.dstack([t, t])),
    ("column_stack", "column_stack", (4, 6), lambda t: torch.column_stack([t, t[:, 1:3]])),
    ("atleast_3d", "atleast_3d", (4, 6), lambda t: torch.atleast_3d(t)),
    ("atleast_2d", "atleast_2d_many", (4, 6), lambda t: torch.atleast_2d(t[1:], t)),
    ("tensor_split", "tensor_split", (4, 6), lambda t: torch.tensor_split(t, [1, 4], 1)),
    ("tensor_split", "tensor_split_n", (4, 6), lambda t: t.tensor_split(3)),
    ("hsplit", "hsplit", (4, 6), lambda t: torch.hsplit(t, 3)),
    ("vsplit", "vsplit", (4, 6), lambda t: t.vsplit([1])),
]
CASES_3D = [
    ("transpose", "transpose02", (3, 4, 5), lambda t: t.transpose(0, 2)),
    ("permute", "permute", (3, 4, 5), lambda t: t.permute(2, 0, 1)),
    ("movedim", "movedim", (3, 4, 5), lambda t: t.movedim((0, 1), (2, 0))),
    ("select", "select1", (3, 4, 5), lambda t: t.select(1, 3)),
    ("narrow", "narrow2", (3, 4, 5), lambda t: t.narrow(2, 1, 3)),
    ("index_select", "index_select1", (3, 4, 5), lambda t: t.index_select(1, _I([2, 2, 0]))),
    ("unsqueeze", "unsqueeze3", (3, 4, 5), lambda t: t.unsqueeze(3)),
    ("squeeze", "squeeze", (3, 1, 5), lambda t: t.squeeze(1)),
    ("view", "view", (3, 4, 5), lambda t: t.view(-1, 5)),
    ("reshape", "reshape", (3, 4, 5), lambda t: t.reshape(5, 12)),
    ("flatten", "flatten1", (3, 4, 5), lambda t: t.flatten(1)),
    ("cat", "cat2", (3, 4, 5), lambda t: torch.cat([t, t[:, :, :2]], 2)),
    ("stack", "stack3", (3, 4, 5), lambda t: torch.stack([t, t], 3)),
    ("split", "split2", (3, 4, 5), lambda t: t.split(2, 2)),
    ("unbind", "unbind2", (3, 4, 5), lambda t: t.unbind(2)),
    ("flip", "flip02", (3, 4, 5), lambda t: t.flip((0, 2))),
    ("roll", "roll", (3, 4, 5), lambda t: t.roll((1, 2), (0, 2))),
    ("expand", "expand", (3, 1, 5), lambda t: t.expand(2, 3, 4, 5)),
    ("repeat", "repeat", (3, 4, 5), lambda t: t.repeat(1, 2, 1)),
    ("unfold", "unfold", (3, 4, 5), lambda t: t.unfold(2, 3, 1)),
    ("dsplit", "dsplit", (3, 4, 5), lambda t: torch.dsplit(t, [2])),
]
CASES = [(c, layout) for c in CASES_2D for layout in LAYOUTS] + [
    (c, layout) for c in CASES_3D for layout in LAYOUTS[:2]]


def _id(case_layout):
    (op, cid, shape, fn), layout = case_layout
    return f"{LAYOUT_IDS[LAYOUTS.index(layout)]}-{len(shape)}d-{cid}"


def expected_layout(layout, ndim):
    """Strided stays strided; a 0-d result is strided; a CSR input gives CSR if 2-D, else COO."""
    if layout == torch.strided or ndim == 0:
        return torch.strided
    if layout == torch.sparse_csr:
        return torch.sparse_csr if ndim == 2 else torch.sparse_coo
    return layout


def check_shared_indices(out):
    """get_data() and get_mask() use the same index tensors (the storage's)."""
    data, mask = out.get_data(), out.get_mask()
    if out.layout == torch.sparse_coo:
        assert torch.equal(data._indices(), mask._indices())
    elif out.layout == torch.sparse_csr:
        assert torch.equal(data.crow_indices(), mask.crow_indices())
        assert torch.equal(data.col_indices(), mask.col_indices())


def check_result(out, ref_data, ref_mask, layout, expect=None):
    if isinstance(ref_data, (tuple, list)):
        assert type(out) is type(ref_data) and len(out) == len(ref_data)
        for o, d, m in zip(out, ref_data, ref_mask):
            check_result(o, d, m, layout)
        return
    check_invariants(out, expect or expected_layout(layout, ref_data.dim()))
    check_shared_indices(out)
    assert out.shape == ref_data.shape
    assert_masked_equal(out, ref_data, ref_mask)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_shape_op(case):
    (op, cid, shape, fn), layout = case
    mt, data, mask = make_masked(shape, layout, seed=len(cid))
    key = (ms.layout_of(mt).name, op)
    if op in ms.layout_of(mt).refuses:
        with pytest.raises(NotImplementedError, match=rf"{key[0]}\].*{op}.*(to_dense|to_sparse)"):
            fn(mt)
        return
    check_result(fn(mt), fn(data), fn(mask), layout)


def test_unsupported_table_is_exercised():
    """Every declared (layout, op) pair has a case above that runs on that layout."""
    ran = {(ms.layout_of(make_masked((2, 2), layout)[0]).name, op)
           for (op, _, shape, _), layout in CASES}
    declared = {(lay.name, op) for lay in layouts.registered_layouts() for op in lay.refuses}
    assert declared - {(lay, "setitem") for lay, _ in declared} <= ran


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_unsupported_error_text(layout):
    mt = make_masked((1, 6), layout)[0]
    with pytest.raises(NotImplementedError, match=r"MaskedTensor\[sparse_\w+\] expand: .*"
                                                  r"\.to_dense\(\)"):
        mt.expand(3, 6)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_dtypes(dtype, layout):
    mt, data, mask = make_masked((4, 6), layout, dtype=dtype, seed=3)
    for fn in (lambda t: t.t(), lambda t: t[1:3], lambda t: torch.cat([t, t], 1),
               lambda t: t.index_select(0, _I([1, 1]))):
        check_result(fn(mt), fn(data), fn(mask), layout)


# -- layout-specific properties -----------------------------------------------------------
def test_coo_stays_coalesced_and_sorted_after_reordering():
    mt, data, mask = make_masked((5, 7, 3), torch.sparse_coo, seed=4)
    for out, ref in [(mt.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
                     (mt.index_select(2, _I([2, 0, 0, 1])), lambda t: t.index_select(2, _I(
                         [2, 0, 0, 1]))), (mt.flip(1), lambda t: t.flip(1)),
                     (torch.cat([mt, mt], 1), lambda t: torch.cat([t, t], 1))]:
        check_invariants(out, torch.sparse_coo)  # validate(full=True) checks coalescing
        assert_masked_equal(out, ref(data), ref(mask))
        assert out.get_data().is_coalesced() and out.get_mask().is_coalesced()


def test_coo_reshape_keeps_values_and_order():
    mt, data, mask = make_masked((4, 6), torch.sparse_coo, seed=6)
    out = mt.view(2, 12)
    assert out._storage.values is mt._storage.values  # a COO reshape never copies values
    assert_masked_equal(out, data.view(2, 12), mask.view(2, 12))
    assert_masked_equal(mt.unsqueeze(1), data.unsqueeze(1), mask.unsqueeze(1))
    assert mt.unsqueeze(1)._storage.values is mt._storage.values


def test_csr_transpose_is_csr_and_row_ops_are_native():
    mt, data, mask = make_masked((5, 7), torch.sparse_csr, seed=7)
    out = mt.t()
    check_invariants(out, torch.sparse_csr)
    assert_masked_equal(out, data.t(), mask.t())
    rows = mt.narrow(0, 1, 3)
    check_invariants(rows, torch.sparse_csr)
    assert rows._storage.values._base is not None  # a row slice is a view of the values
    assert_masked_equal(rows, data[1:4], mask[1:4])
    assert_masked_equal(mt[3], data[3], mask[3])
    assert mt[3].layout == torch.sparse_coo


def _hybrid(seed=0):
    """A hybrid COO masked tensor of shape (4, 5, 3) (2 sparse dims, 1 dense dim)."""
    g = torch.Generator().manual_seed(seed)
    stored = torch.rand(4, 5, generator=g) < 0.5
    idx = stored.nonzero().t()
    vals = torch.randn(idx.shape[1], 3, generator=g)
    mvals = torch.rand(idx.shape[1], 3, generator=g) < 0.7
    data = torch.sparse_coo_tensor(idx, vals, (4, 5, 3)).coalesce()
    mask = torch.sparse_coo_tensor(idx, mvals, (4, 5, 3)).coalesce()
    return ms.masked_tensor(data, mask), data.to_dense(), mask.to_dense()


@pytest.mark.parametrize("name,fn", [
    ("select_sparse", lambda t: t.select(1, 2)), ("select_dense", lambda t: t.select(2, 1)),
    ("narrow_dense", lambda t: t.narrow(2, 1, 2)), ("slice_sparse", lambda t: t[:, 1:4:2]),
    ("index_select_dense", lambda t: t.index_select(2, _I([2, 2, 0]))),
    ("transpose_sparse", lambda t: t.transpose(0, 1)),
    ("unsqueeze_dense", lambda t: t.unsqueeze(3)), ("unsqueeze_sparse", lambda t: t.unsqueeze(1)),
    ("flip_both", lambda t: t.flip((0, 2))), ("cat_sparse", lambda t: torch.cat([t, t], 1)),
    ("cat_dense", lambda t: torch.cat([t, t], 2)), ("reshape_sparse", lambda t: t.reshape(20, 3)),
    ("select_all_sparse", lambda t: t[1, 2]), ("roll_dense", lambda t: t.roll(1, 2)),
])
def test_coo_hybrid(name, fn):
    mt, data, mask = _hybrid()
    out = fn(mt)
    check_invariants(out)
    assert_masked_equal(out, fn(data), fn(mask))


def test_coo_hybrid_mixing_dims_raises():
    mt = _hybrid()[0]
    with pytest.raises(NotImplementedError, match=r"sparse_coo\] permute.*to_dense"):
        mt.transpose(1, 2)
    with pytest.raises(NotImplementedError, match=r"sparse_coo\] reshape.*to_dense"):
        mt.reshape(4, 15)


# -- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_bad_arguments_raise_like_torch(layout):
    mt = make_masked((4, 6), layout)[0]
    with pytest.raises(IndexError):
        mt.transpose(0, 2)
    with pytest.raises(IndexError):
        mt.select(0, 4)
    with pytest.raises(RuntimeError, match="invalid for input of size 24"):
        mt.view(5, -1)
    with pytest.raises(TypeError, match="every input must be a MaskedTensor"):
        torch.cat([mt, torch.zeros(4, 6)])


def test_cat_mixed_layouts_raises():
    a = make_masked((4, 6))[0]
    with pytest.raises(ValueError, match="one layout"):
        torch.cat([a, a.to_sparse_coo()])


def test_view_of_non_contiguous_raises_like_torch():
    mt, data, _ = make_masked((4, 6))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        mt.t().view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        data.t().view(-1)


# -- autograd: the gradient is a MaskedTensor over the input's storage ---------------------
GRAD_CASES = {
    "transpose": lambda t: t.transpose(0, 1), "t": lambda t: t.t(),
    "permute": lambda t: t.permute(1, 0), "view": lambda t: t.view(2, 12),
    "reshape": lambda t: t.reshape(3, 8), "select": lambda t: t.select(1, 2),
    "narrow": lambda t: t.narrow(0, 1, 2), "index_select": lambda t: t.index_select(0, _I(
        [3, 0, 3])), "getitem": lambda t: t[1:, [5, 0, 5]], "cat": lambda t: torch.cat([t, t], 1),
    "stack": lambda t: torch.stack([t, t.flip(0)]), "split": lambda t: t.split(4, 1)[1],
    "flip": lambda t: t.flip(1), "roll": lambda t: t.roll(1, 0),
    "unsqueeze": lambda t: t.unsqueeze(1), "masked_select": lambda t: t.masked_select(SEL),
    "expand": lambda t: t[:1].expand(3, 6), "gather": lambda t: t.gather(1, GATHER),
    "take": lambda t: t.take(_I([0, 5, 5])), "unfold": lambda t: t.unfold(1, 2, 2),
    "vstack": lambda t: torch.vstack([t, t[1:]]), "atleast_3d": torch.atleast_3d,
    "tensor_split": lambda t: torch.tensor_split(t, [1, 4], 1)[1],
    "movedim": lambda t: t.movedim(0, 1), "flatten": lambda t: t.flatten(),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_gradient_keeps_input_mask_and_layout(name, layout):
    fn = GRAD_CASES[name]
    mt, data, mask = make_masked((4, 6), layout, seed=8)
    if name in ms.layout_of(mt).refuses:
        pytest.skip("declared unsupported (checked in test_shape_op)")
    x = mt.requires_grad_()
    out = fn(x)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    plain = out.to_tensor(0)
    plain = plain.to_dense() if plain.layout != torch.strided else plain
    (plain * w).sum().backward()
    d = data.clone().requires_grad_()
    (torch.where(fn(mask), fn(d), 0.0) * w).sum().backward()
    assert isinstance(x.grad, ms.MaskedTensor)
    check_invariants(x.grad, layout)
    assert all(a is b for a, b in zip(x.grad._storage.index, mt._storage.index))
    assert_masked_equal(x.grad, d.grad, mask)


def test_view_sum_backward_on_transposed_non_contiguous():
    """``view`` -> ``sum`` -> ``backward`` on a transposed (non-contiguous) masked tensor."""
    data = torch.arange(12.0).view(3, 4)
    mask = data.remainder(3) > 0
    x = ms.masked_tensor(data, mask, requires_grad=True)
    y = x.t()
    assert not y.is_contiguous() and y.stride() == data.t().stride()
    y.view(2, 2, 3).sum().backward()
    assert x.grad.layout == torch.strided
    assert_masked_equal(x.grad, torch.ones(3, 4), mask)


def test_overview_contiguity_cell():
    """The is_contiguous / view / transpose cell of the overview tutorial, against torch."""
    t = torch.arange(4).reshape(1, 2, 2).float()
    mt = ms.masked_tensor(t, t > 0)
    ref = t
    for step in (lambda a: a.view(a.size()), lambda a: a.transpose(0, 1),
                 lambda a: a.view(a.size()), lambda a: a.contiguous()):
        mt, ref = step(mt), step(ref)
        assert (mt.is_contiguous(), mt.size(), mt.stride()) == (
            ref.is_contiguous(), ref.size(), ref.stride())
        assert mt.get_data().stride() == ref.stride()
    x = ms.masked_tensor(t, t > 0, requires_grad=True)
    x.view([4]).sum().backward()
    assert_masked_equal(x.grad, torch.ones(1, 2, 2), t > 0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_plain_tensor_gradient_reduction(layout):
    """A broadcast plain operand's gradient is reduced by torch (sum + view aten kernels)."""
    mt, data, mask = make_masked((4, 6), layout, seed=9)
    y = torch.randn(6, requires_grad=True)
    (mt * y).to_tensor(0).to_dense().sum().backward()
    ref = torch.where(mask, data, 0.0).sum(0)
    got = y.grad.to_tensor(0) if isinstance(y.grad, ms.MaskedTensor) else y.grad
    torch.testing.assert_close(got.to_dense(), ref)


# -- aten overloads (calls arriving from C++), forward --------------------------------
aten = torch.ops.aten
ATEN_CASES = {
    "view": lambda t: aten.view.default(t, [6, 4]),
    "_unsafe_view": lambda t: aten._unsafe_view.default(t, [24]),
    "transpose": lambda t: aten.transpose.int(t, 0, -1), "t": lambda t: aten.t.default(t),
    "permute": lambda t: aten.permute.default(t, [1, 0]),
    "select": lambda t: aten.select.int(t, 1, 4),
    "slice": lambda t: aten.slice.Tensor(t, 1, 1, 2**62, 2),
    "slice_neg": lambda t: aten.slice.Tensor(t, 0, -3, None),
    "expand": lambda t: aten.expand.default(aten.slice.Tensor(t, 0, 0, 1), [3, 6]),
    "unsqueeze": lambda t: aten.unsqueeze.default(t, 1),
    "squeeze_dim": lambda t: aten.squeeze.dim(aten.slice.Tensor(t, 0, 2, 3), 0),
    "squeeze_dims": lambda t: aten.squeeze.dims(aten.slice.Tensor(t, 1, 2, 3), [1, 0]),
    "cat": lambda t: aten.cat.default([t, t], 1), "stack": lambda t: aten.stack.default([t, t]),
    "index": lambda t: aten.index.Tensor(t, [None, _I([4, 0, 4])]),
    "index_select": lambda t: aten.index_select.default(t, 0, _I([2, 1])),
    "split": lambda t: aten.split.Tensor(t, 4, 1),
    "split_with_sizes": lambda t: aten.split_with_sizes.default(t, [3, 1]),
    "unbind": lambda t: aten.unbind.int(t, 1), "flip": lambda t: aten.flip.default(t, [0]),
    "roll": lambda t: aten.roll.default(t, [1], [1]),
}


@pytest.mark.parametrize("name", sorted(ATEN_CASES))
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_aten_overloads(name, layout):
    fn = ATEN_CASES[name]
    mt, data, mask = make_masked((4, 6), layout, seed=14)
    if name in ms.layout_of(mt).refuses:
        with pytest.raises(NotImplementedError):
            fn(mt)
        return
    check_result(fn(mt), fn(data), fn(mask), layout)


# -- movement ops that keep the pattern ------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_copies_casts_and_likes_keep_the_mask(layout):
    mt, data, mask = make_masked((4, 6), layout, seed=10)
    for out, ref in [(mt.clone(), data), (mt.detach(), data), (mt.to(torch.float64), data.double()),
                     (mt.to("cpu", torch.int64), data.long().cpu()), (mt.cpu(), data.cpu()),
                     (mt.double(), data.double()), (torch.ones_like(mt), torch.ones(4, 6)),
                     (torch.zeros_like(mt), torch.zeros(4, 6)),
                     (torch.full_like(mt, 7.0), torch.full((4, 6), 7.0)),
                     (mt.contiguous(), data),
                     (mt.masked_fill(SEL, -1.0), data.masked_fill(SEL, -1))]:
        check_invariants(out, layout)
        assert_masked_equal(out, ref, mask.to(ref.device))
    empty = torch.empty_like(mt)
    check_invariants(empty, layout)
    assert torch.equal(empty.get_mask().to_dense(), mask)
    assert mt.clone()._storage.values is not mt._storage.values


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_fill_zero_copy_inplace(layout):
    mt, data, mask = make_masked((4, 6), layout, seed=11)
    assert mt.clone().fill_(3.0) is not None
    assert_masked_equal(mt.clone().fill_(3.0), torch.full((4, 6), 3.0), mask)
    assert_masked_equal(mt.clone().zero_(), torch.zeros(4, 6), mask)
    dst = torch.zeros_like(mt)
    dst.copy_(mt * 2)
    assert_masked_equal(dst, data * 2, mask)
    other = make_masked((4, 6), layout, seed=12)[0]
    with pytest.raises(ValueError, match="masks"):
        dst.copy_(other)


def test_strided_views_share_data():
    mt, data, mask = make_masked((4, 6), seed=13)
    view = mt.t()[1:3]
    view.mul_(0.0)
    expected = data.clone()
    expected[:, 1:3] = 0
    assert_masked_equal(mt, expected, mask)


@pytest.mark.parametrize("dim", [0, 1])
def test_coo_index_select_long_dim_matches_torch_sparse(dim):
    """A dim longer than nnz takes the search path (no per-coordinate table)."""
    g = torch.Generator().manual_seed(15)
    idx = torch.stack([torch.randint(0, 100_000, (50,), generator=g),
                       torch.randint(0, 3, (50,), generator=g)])
    data = torch.sparse_coo_tensor(idx, torch.randn(50, generator=g), (100_000, 3)).coalesce()
    mask = torch.sparse_coo_tensor(data._indices(), torch.rand(data._nnz(), generator=g) > 0.3,
                                   data.shape).coalesce()
    mt = ms.masked_tensor(data, mask)
    index = torch.cat([idx[dim, :7], idx[dim, :3], torch.tensor([2])]).flip(0)
    out = mt.index_select(dim, index)
    check_invariants(out, torch.sparse_coo)
    assert_masked_equal(out, data.index_select(dim, index).to_dense(),
                        mask.index_select(dim, index).to_dense())


@pytest.mark.parametrize("shape, dims", [
    ((40_000, 3), (1, 0)), ((3, 40_000), (1, 0)),  # one-coordinate sort: int16 / int32 keys
    ((5, 7, 3), (1, 2, 0)), ((300, 3, 400), (1, 2, 0)),  # full keys: int16 / int32
    ((70_000, 3, 70_000), (2, 1, 0)),  # full keys past 2**31: int64
    ((300, 3, 400), (2, 0, 1)), ((3, 300, 40_000), (2, 0, 1))], ids=str)
def test_coo_permute_of_wide_dims_matches_torch_sparse(shape, dims):
    """COO permutes sort on the narrowest key type (``layouts._index.sort_key``) and, when
    the dims after the first keep their order, by the first coordinate alone: the result
    is torch's permuted and coalesced tensor, entry for entry, for key bounds on each side
    of the int16 and int32 limits."""
    g = torch.Generator().manual_seed(len(shape) + shape[-1])
    idx = torch.stack([torch.randint(0, n, (400,), generator=g) for n in shape])
    data = torch.sparse_coo_tensor(idx, torch.randn(400, generator=g), shape).coalesce()
    mask = torch.sparse_coo_tensor(data._indices(), torch.rand(data._nnz(), generator=g) > 0.3,
                                   shape).coalesce()
    out = ms.masked_tensor(data, mask).permute(*dims)
    check_invariants(out, torch.sparse_coo)
    for got, ref in [(out.get_data(), data), (out.get_mask(), mask)]:
        want = ref.permute(*dims).coalesce()
        assert torch.equal(got.indices(), want.indices())
        assert torch.equal(got.values(), want.values())


@pytest.mark.parametrize("shape", [(40_000, 3), (3, 40_000)], ids=str)
def test_csr_transpose_of_wide_dims_matches_torch(shape):
    """A CSR transpose sorts the column index on its narrowest key type (int16 below 32768
    columns, int32 above): the result is torch's transposed tensor, entry for entry."""
    g = torch.Generator().manual_seed(shape[1])
    idx = torch.stack([torch.randint(0, n, (400,), generator=g) for n in shape])
    data = torch.sparse_coo_tensor(idx, torch.randn(400, generator=g), shape).coalesce()
    mask = torch.sparse_coo_tensor(data._indices(), torch.rand(data._nnz(), generator=g) > 0.3,
                                   shape).coalesce()
    out = ms.masked_tensor(data, mask).to_sparse_csr().t()
    check_invariants(out, torch.sparse_csr)
    for got, ref in [(out.get_data(), data), (out.get_mask(), mask)]:
        want = ref.t().coalesce().to_sparse_csr()
        assert torch.equal(got.crow_indices(), want.crow_indices())
        assert torch.equal(got.col_indices(), want.col_indices())
        assert torch.equal(got.values(), want.values())
