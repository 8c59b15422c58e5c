"""A layout written outside both packages passes the generic layout suite.

The toy "rows" layout stores a subset of the rows of a tensor densely: ``index ==
(row_ids,)`` (sorted, distinct, int64) and ``values`` / ``mask`` of shape
``(len(row_ids), *shape[1:])``. It has no ``torch.layout``; its plain-tensor form
(``to_torch``, what ``to_tensor(0)`` returns) is a hybrid sparse COO tensor with one sparse
dim. Nothing in ``layouts/`` or ``masked_sparse/`` is edited or monkeypatched: the layout
is registered for this module's tests only and unregistered afterwards.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_masked_equal, check_invariants
from test_layout_suite import LayoutSuite

import layouts
import masked_sparse as ms
from layouts import Layout, Storage


# -- the toy layout: eight primitives on plain tensors --------------------------------------
def _from_strided(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    rows = mask.flatten(1).any(1).nonzero().flatten()
    return ROWS.build((rows,), data[rows], mask[rows], data.shape)


def _from_torch(data: torch.Tensor, mask: torch.Tensor) -> Storage:
    if data.layout == torch.strided:
        return _from_strided(data, mask)
    # A hybrid COO tensor with one sparse dim; the mask's rows are authoritative.
    mask = mask.coalesce()
    rows = mask.indices()[0]
    return ROWS.build((rows,), data.index_select(0, rows).to_dense(),
                      mask.index_select(0, rows).to_dense(), mask.shape)


def _densify(storage: Storage, values: torch.Tensor, fill) -> torch.Tensor:
    out = torch.full(storage.shape, fill, dtype=values.dtype, device=values.device)
    return out.index_put(storage.index, values)


def _to_torch(storage: Storage, values: torch.Tensor) -> torch.Tensor:
    (rows,) = storage.index
    return torch.sparse_coo_tensor(rows[None], values, storage.shape, is_coalesced=True,
                                   check_invariants=False)


def _gather(storage: Storage, dense: torch.Tensor) -> torch.Tensor:
    return dense if dense.dim() == 0 else dense.expand(storage.shape)[storage.index[0]]


def _to_coo(storage: Storage) -> Storage:
    (rows,) = storage.index
    inner = storage.mask.new_ones(storage.shape[1:]).nonzero().t()  # row-major, same device
    n, m = rows.numel(), inner.shape[1]
    indices = torch.cat([rows.repeat_interleave(m)[None], inner.repeat(1, n)])
    coo = layouts.get_layout("sparse_coo")
    return coo.build((indices,), storage.values.reshape(-1), storage.mask.reshape(-1),
                     storage.shape)


def _from_coo(coo: Storage) -> Storage:
    (indices,) = coo.index
    rows, which = torch.unique(indices[0], sorted=True, return_inverse=True)
    shape = (rows.numel(),) + tuple(coo.shape[1:])
    at = (which,) + tuple(indices[1:])
    values = coo.values.new_zeros(shape).index_put(at, coo.values)
    mask = coo.mask.new_zeros(shape).index_put(at, coo.mask)
    return ROWS.build((rows,), values, mask, coo.shape)


def _validate(storage: Storage, full: bool = False) -> None:
    (rows,) = storage.index
    expected = (rows.numel(),) + tuple(storage.shape[1:])
    if rows.dim() != 1 or rows.dtype != torch.int64 or len(storage.shape) < 1:
        raise ValueError("rows layout: row_ids must be a 1-D int64 tensor")
    if storage.values.shape != expected or storage.mask.shape != expected:
        raise ValueError(f"rows layout: values and mask must have shape {expected}")
    if full and rows.numel():
        if bool((rows[1:] <= rows[:-1]).any()) or rows[0] < 0 or rows[-1] >= storage.shape[0]:
            raise ValueError("rows layout: row_ids must be sorted, distinct and in bounds")


ROWS = Layout(name="rows", torch_layout=None, index_names=("row_ids",),
              from_torch=_from_torch, from_strided=_from_strided, densify=_densify,
              to_torch=_to_torch, gather=_gather, to_coo=_to_coo, from_coo=_from_coo,
              validate=_validate)


@pytest.fixture(scope="module")
def rows_layout():
    layout = layouts.register_layout(ROWS)
    yield layout
    layouts.unregister_layout(layout)


# -- the generic suite, unchanged ------------------------------------------------------------
class TestRowsLayout(LayoutSuite):
    SHAPES = ((5, 4), (3, 6))  # odd row counts: round trips use 1 x 2 BSR blocks
    OPTIONS = {"sparse_bsr": {"blocksize": (1, 2)}}

    @pytest.fixture
    def layout(self, rows_layout):
        return rows_layout


# -- what is specific to it ------------------------------------------------------------------
def test_rows_stores_only_rows_with_a_specified_element(rows_layout):
    data = torch.arange(12.0).reshape(4, 3)
    mask = torch.tensor([[False] * 3, [True, False, True], [False] * 3, [False, False, True]])
    mt = ms.to_layout(ms.masked_tensor(data, mask), "rows")
    check_invariants(mt)
    assert mt._storage.index[0].tolist() == [1, 3]
    assert mt.layout == torch.strided  # no torch.layout: it reports strided
    out = (mt * 2).sum(1)
    assert_masked_equal(out, (data * 2 * mask).sum(1), mask.any(1))


def test_register_and_unregister_leave_no_trace():
    before = layouts.registered_layouts()
    tmp = layouts.register_layout(dataclasses.replace(ROWS, name="rows_tmp"))
    assert layouts.get_layout("rows_tmp") is tmp
    assert layouts.unregister_layout("rows_tmp") is tmp
    assert layouts.registered_layouts() == before
    with pytest.raises(NotImplementedError, match="no masked layout is registered for 'rows_tmp'"):
        layouts.get_layout("rows_tmp")
