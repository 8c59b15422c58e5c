"""The generic layout test suite: one class, run over every registered layout.

:class:`LayoutSuite` checks what the layout protocol promises (``layouts.registry``)
through the public MaskedTensor API, against the dense ``torch.where`` reference:
construction, full invariants, exact round trips with every other registered layout,
unary and binary ops, ``to_tensor`` / ``get_data`` / ``get_mask``, reductions, autograd
and printing. It needs nothing but a ``layout`` fixture, so a new layout gets the same
coverage as the built-in ones from its own test file::

    from test_layout_suite import LayoutSuite

    class TestMyLayout(LayoutSuite):
        OPTIONS = {"my_layout": {"tile": 4}}      # conversion options, if it takes any

        @pytest.fixture(scope="class")
        def layout(self):
            lay = layouts.register_layout(MY_LAYOUT)
            yield lay
            layouts.unregister_layout(lay)

(``tests/layouts/test_toy_layout.py`` does exactly that.) Inputs are built as COO masked tensors
with stored-but-masked entries (``conftest.make_masked``) and converted to the layout
under test, so every layout sees the authoritative-mask case.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import pytest
import torch
from conftest import assert_masked_equal, check_invariants, make_masked

import layouts
import masked_sparse as ms
from layouts import Layout

BUILTIN = ["strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"]


class LayoutSuite:
    """Every check of the layout protocol, for the layout given by the ``layout`` fixture.

    Subclasses provide ``layout`` (a registered :class:`layouts.Layout`) and may override
    ``SHAPES`` (2-D by default, divisible by the BSR blocksize) and ``OPTIONS`` (conversion
    options by layout name, used whenever the suite converts into that layout).
    """

    pytestmark = [pytest.mark.device_generic]  # subclasses too: ``pytest --device cuda``
    SHAPES: tuple[tuple[int, ...], ...] = ((4, 6), (6, 3))
    OPTIONS: dict[str, dict[str, Any]] = {"sparse_bsr": {"blocksize": (2, 3)}}

    # -- helpers -------------------------------------------------------------------------
    def options_for(self, layout: Layout) -> dict[str, Any]:
        return dict(self.OPTIONS.get(layout.name, {}))

    def to(self, mt: ms.MaskedTensor, layout: Layout) -> ms.MaskedTensor:
        return ms.to_layout(mt, layout, **self.options_for(layout))

    def make(self, layout: Layout, shape=None, seed=0, density=0.6, stored_masked=0.3,
             data=None, mask=None):
        """``(mt, data, mask)``: a masked tensor of ``layout`` and its dense reference."""
        shape = self.SHAPES[0] if shape is None else shape
        coo, data, mask = make_masked(shape, torch.sparse_coo, seed=seed, density=density,
                                      stored_masked=stored_masked, data=data, mask=mask)
        return self.to(coo, layout), data, mask

    def check(self, mt: ms.MaskedTensor, layout: Layout) -> None:
        """Full invariants, and the layout reported to users."""
        check_invariants(mt)
        assert ms.layout_of(mt) is layout
        assert mt.layout == (layout.torch_layout or torch.strided)

    @staticmethod
    def same_index(a: ms.MaskedTensor, b: ms.MaskedTensor) -> bool:
        return all(x is y for x, y in zip(a._storage.index, b._storage.index))

    # -- registration and construction ---------------------------------------------------
    def test_registered(self, layout):
        assert layout in layouts.registered_layouts()
        assert layouts.get_layout(layout.name) is layout
        if layout.torch_layout is not None:
            assert layouts.get_layout(layout.torch_layout) is layout
        assert len(layout.index_names) == len(self.make(layout)[0]._storage.index)

    @pytest.mark.parametrize("shape_id", [0, 1])
    @pytest.mark.parametrize("density", [0.0, 0.5, 1.0])
    def test_construct_and_invariants(self, layout, shape_id, density):
        mt, data, mask = self.make(layout, self.SHAPES[shape_id], seed=shape_id,
                                   density=density)
        self.check(mt, layout)
        assert mt.shape == data.shape and mt.dtype == data.dtype
        assert_masked_equal(mt, data, mask)
        s = mt._storage
        assert s.mask.dtype == torch.bool and s.values.shape == s.mask.shape
        assert torch.equal(s.densify(s.mask, False), mask)

    def torch_pair(self, layout: Layout, dense: torch.Tensor, stored: torch.Tensor):
        """``dense`` as a plain tensor of the layout storing exactly ``stored`` (for layouts
        with a ``torch.layout``), built with torch's own conversions."""
        if layout.torch_layout == torch.strided:
            return dense
        idx = stored.nonzero().t()
        coo = torch.sparse_coo_tensor(idx, dense[stored], dense.shape).coalesce()
        if layout.torch_layout == torch.sparse_coo:
            return coo
        return coo.to_sparse(layout=layout.torch_layout, **self.options_for(layout))

    @pytest.mark.parametrize("same_pattern", [True, False])
    def test_construct_from_torch_tensors(self, layout, same_pattern):
        if layout.torch_layout is None:
            pytest.skip("a layout without a torch.layout has no torch tensors to start from")
        g = torch.Generator().manual_seed(3)
        shape = self.SHAPES[0]
        data = torch.randn(shape, generator=g)
        mask = torch.rand(shape, generator=g) < 0.5
        stored = mask | (torch.rand(shape, generator=g) < 0.3)
        t_mask = self.torch_pair(layout, torch.where(stored, mask, False), stored)
        # The data stores either the mask's pattern or every position: the mask's pattern
        # is authoritative in both cases.
        d_stored = stored if same_pattern else torch.ones(shape, dtype=torch.bool)
        t_data = self.torch_pair(layout, torch.where(d_stored, data, 0), d_stored)
        mt = ms.masked_tensor(t_data, t_mask)
        self.check(mt, layout)
        assert_masked_equal(mt, data, mask)
        back = mt.get_mask()
        assert back.layout == t_mask.layout
        assert torch.equal(back.to_dense(), mask)

    # -- conversions ---------------------------------------------------------------------
    def test_round_trip_with_every_layout(self, layout):
        mt, data, mask = self.make(layout, seed=4)
        for other in layouts.registered_layouts():
            there = self.to(mt, other)
            self.check(there, other)
            assert_masked_equal(there, data, mask)
            back = self.to(there, layout)
            self.check(back, layout)
            assert_masked_equal(back, data, mask)
            # and from the other layout's own inputs
            theirs, d2, m2 = self.make(other, seed=5)
            mine = self.to(theirs, layout)
            self.check(mine, layout)
            assert_masked_equal(mine, d2, m2)

    def test_conversion_is_differentiable(self, layout):
        mt, data, mask = self.make(layout, seed=6)
        for other in layouts.registered_layouts():
            x = mt.clone().requires_grad_()
            y = self.to(self.to(x, other), layout) * 3
            y.to_dense().to_tensor(0).sum().backward()
            assert ms.layout_of(x.grad) is layout
            assert_masked_equal(x.grad, torch.full_like(data, 3.0), mask)

    def test_to_same_layout_is_identity(self, layout):
        mt = self.make(layout, seed=7)[0]
        assert self.to(mt, layout) is mt

    # -- pointwise -----------------------------------------------------------------------
    @pytest.mark.parametrize("op", ["exp", "abs", "sin", "neg", "sigmoid", "square",
                                    "isfinite", "double"])
    def test_unary(self, layout, op):
        mt, data, mask = self.make(layout, seed=8)
        out = getattr(mt, op)()
        self.check(out, layout)
        assert self.same_index(out, mt)
        assert_masked_equal(out, getattr(data, op)(), mask)

    def test_unary_inplace(self, layout):
        mt, data, mask = self.make(layout, seed=9)
        index = mt._storage.index
        assert mt.mul_(2).add_(1) is mt
        assert mt._storage.index is index
        assert_masked_equal(mt, data * 2 + 1, mask)

    @pytest.mark.parametrize("op", [operator.add, operator.mul, operator.truediv, torch.maximum,
                                    torch.atan2, operator.lt])
    def test_binary_masked_masked(self, layout, op):
        a, da, mask = self.make(layout, seed=10)
        # Same specified set, stored differently (another stored-but-masked pattern).
        b, db, _ = self.make(layout, seed=11, data=torch.rand(da.shape) + 0.5, mask=mask,
                             stored_masked=0.6)
        out = op(a, b)
        self.check(out, layout)
        assert_masked_equal(out, op(da, db), mask)
        shared = op(a, a.exp())  # shared index objects: the fast path
        self.check(shared, layout)
        assert self.same_index(shared, a)
        assert_masked_equal(shared, op(da, da.exp()), mask)

    @pytest.mark.parametrize("which", ["full", "row", "keepdim_row", "column", "scalar_tensor"])
    @pytest.mark.parametrize("op", [operator.add, operator.mul, operator.truediv, torch.minimum])
    def test_binary_masked_plain(self, layout, which, op):
        mt, data, mask = self.make(layout, seed=12)
        n, m = data.shape[-2:]
        plain = {"full": torch.rand(data.shape), "row": torch.rand(m),
                 "keepdim_row": torch.rand(1, m), "column": torch.rand(n, 1),
                 "scalar_tensor": torch.tensor(1.5)}[which] + 0.5
        for out, ref in [(op(mt, plain), op(data, plain)), (op(plain, mt), op(plain, data))]:
            self.check(out, layout)
            assert self.same_index(out, mt)
            assert_masked_equal(out, ref, mask)

    @pytest.mark.parametrize("expr", ["x + 2", "3 * x", "x / 4", "2 - x", "x ** 2", "x > 0",
                                      "-x"])
    def test_binary_scalar(self, layout, expr):
        mt, data, mask = self.make(layout, seed=13)
        out = eval(expr, {"x": mt})
        self.check(out, layout)
        assert_masked_equal(out, eval(expr, {"x": data}), mask)

    def test_mismatched_masks_raise(self, layout):
        a, _, mask = self.make(layout, seed=14)
        b = self.make(layout, seed=14, mask=~mask)[0]
        with pytest.raises(ValueError, match="masks of MaskedTensor operands must match"):
            a + b

    # -- leaving the masked world --------------------------------------------------------
    def test_to_tensor_and_get_data_keep_the_layout(self, layout):
        mt, data, mask = self.make(layout, seed=15)
        zero, got, m = mt.to_tensor(0), mt.get_data(), mt.get_mask()
        assert zero.layout == got.layout == m.layout
        if layout.torch_layout is not None:
            assert zero.layout == layout.torch_layout
        if mt._storage.index:  # a compressed layout stays compressed
            assert zero.layout != torch.strided
        assert torch.equal(zero.to_dense(), torch.where(mask, data, 0))
        assert torch.equal(m.to_dense(), mask)
        assert torch.equal(torch.where(mask, got.to_dense(), 0), torch.where(mask, data, 0))
        filled = mt.to_tensor(float("nan"))
        assert filled.layout == torch.strided
        assert torch.equal(filled, torch.where(mask, data, float("nan"))) or torch.allclose(
            filled, torch.where(mask, data, float("nan")), equal_nan=True)

    def test_get_data_is_differentiable(self, layout):
        mt, data, mask = self.make(layout, seed=16)
        x = mt.clone().requires_grad_()
        (x * 2).get_data().to_dense().sum().backward()
        assert ms.layout_of(x.grad) is layout
        assert_masked_equal(x.grad, torch.full_like(data, 2.0), mask)

    def test_repr_matches_strided(self, layout):
        mt, data, mask = self.make(layout, seed=17)
        assert repr(mt) == repr(ms.masked_tensor(data, mask))

    # -- reductions ----------------------------------------------------------------------
    @pytest.mark.parametrize(("dim", "keepdim"), [(None, False), (0, False), (1, True),
                                                  (-1, False), ((0, 1), False), ((0, 1), True)])
    @pytest.mark.parametrize("op", ["sum", "amax", "mean"])
    @pytest.mark.parametrize("density", [0.0, 0.4])
    def test_reductions(self, layout, op, dim, keepdim, density):
        mt, data, mask = self.make(layout, seed=18, density=density)
        if dim is None:
            out, rdims = getattr(torch, op)(mt), tuple(range(data.dim()))
            assert out.dim() == 0
        else:
            out = getattr(torch, op)(mt, dim, keepdim=keepdim)
            rdims = dim if isinstance(dim, tuple) else (dim,)
        check_invariants(out)
        specified = mask.any(rdims, keepdim=keepdim or dim is None)
        total = torch.where(mask, data, 0).sum(rdims, keepdim=keepdim or dim is None)
        if op == "sum":
            ref = total
        elif op == "mean":
            ref = total / mask.sum(rdims, keepdim=keepdim or dim is None).clamp(min=1)
        else:
            ref = torch.where(mask, data, -math.inf).amax(rdims, keepdim=keepdim or dim is None)
        if dim is None:
            ref, specified = ref.reshape(()), specified.reshape(())
        assert_masked_equal(out, ref, specified)

    def test_reduction_gradient_keeps_the_mask(self, layout):
        mt, data, mask = self.make(layout, seed=19)
        x = mt.clone().requires_grad_()
        (x.exp().sum(1) * 2).sum().backward()
        assert ms.layout_of(x.grad) is layout
        assert_masked_equal(x.grad, 2 * data.exp(), mask)


class TestBuiltinLayouts(LayoutSuite):
    """The suite over the five built-in layouts."""

    @pytest.fixture(params=BUILTIN)
    def layout(self, request):
        return layouts.get_layout(request.param)


def test_every_builtin_layout_is_covered():
    names = [lay.name for lay in layouts.registered_layouts()]
    assert names[: len(BUILTIN)] == BUILTIN, "add new built-in layouts to BUILTIN"


class TestReplacedCopies(LayoutSuite):
    """The suite over a ``dataclasses.replace`` copy of each built-in layout, registered under
    another name and without a torch layout: a copy must be a fully working layout."""

    OPTIONS = {"sparse_bsr": {"blocksize": (2, 3)}, "copy_of_sparse_bsr": {"blocksize": (2, 3)}}

    @pytest.fixture(params=BUILTIN)
    def layout(self, request):
        original = layouts.get_layout(request.param)
        copy = layouts.register_layout(dataclasses.replace(
            original, name=f"copy_of_{original.name}", torch_layout=None))
        yield copy
        layouts.unregister_layout(copy)
