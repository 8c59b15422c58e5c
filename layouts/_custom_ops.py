"""The masked kernel families as ``torch.library`` custom ops, for torch.compile / export.

Note [Kernel families as custom ops]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Eager calls run a family through ``layouts._kernels`` (an ``autograd.Function``: the
cheaper call, Note [One kernel route]). A tracer cannot follow those ctypes calls, so while
torch.compile traces (``torch.compiler.is_compiling()``), :func:`call` puts one custom op
per family in the graph instead:

=============================  ================================================
``masked_sparse::reduce``      ``REDUCE``: sum, sumsq, prod, amax, amin per group
``masked_sparse::moments``     ``MOMENTS``: (var, mean, specified) per group
``masked_sparse::logsumexp``   ``LOGSUMEXP`` per group
``masked_sparse::softmax``     ``SOFTMAX``: softmax / log_softmax within groups
``masked_sparse::arg_extreme`` ``ARG``: the extreme and its first position
``masked_sparse::cumsum_lines`` the running sum along lines (``cumsum_lines``)
=============================  ================================================

Each takes the groups as plain arguments (:class:`Groups`): every element in one group (no
``offsets``, no ``index``), lines (``offsets``, int64 pointers, and the listed lines
``which``, None: all; the listed lines hold every element, in order), or a scatter (the
group ``index`` of every element into ``n`` groups). Every output is sized from those
arguments alone (1, the number of lines, ``n``), so the fake (shape-only) implementation
reads no data. Implementations:

- CPU: the family's ``forward`` on :class:`Groups` -- the C kernels of ``_native`` where
  they apply, else the torch ops (``MASKED_SPARSE_NATIVE=0``, other dtypes);
- every other device (the default kernel): the family's torch ops;
- autograd: the family's own ``backward`` (``_kernels``) on :class:`Groups`, so a compiled
  backward runs the same masked formulas (and, through them, these ops again).

So a compiled graph on CPU runs the same kernels as eager code, bit for bit. The routing
covers the groupings that can describe their groups this way (``Grouping.kernel_groups``):
the sparse ones without dense dims. In practice that is a sparse full reduction: a sparse
reduction along a dim or softmax breaks the graph before (its output size depends on the
data) and runs eagerly, on the same kernels. Strided groupings keep the torch ops under
compile (Inductor fuses them: Note [Compiled mask loads]). torch.export records a
MaskedTensor input's ops at the aten level on the subclass (the exported program runs them
through the eager handlers, on these kernels), so no op shows in an exported graph.

``cumsum_lines(values, offsets)`` takes no mask (its caller fills first) and only lines
(``offsets``, every element in one line): its CPU implementation is the C kernel
(``_native.cumsum_lines``: torch.cumsum of each line, bit for bit), else -- other devices,
other dtypes, no library -- the torch ops of ``_kernels.segmented_cumsum`` (no host sync,
Note [Segmented running sum]); its fake output is shaped as the values; its backward is
``_kernels.reverse_cumsum_lines``, the same op on the flipped lines. ``_kernels.
cumsum_lines`` puts it in the graph for real floating values, so a compiled ``cumsum``
along a CSR's rows (a CSC's columns: the stored lines, sized from the index alone) runs in
the graph on the kernel, eager's bits forward and backward; along other lines the scan's
sizes depend on the data, and the op breaks the graph and runs eagerly.

>>> import torch
>>> v, m = torch.tensor([1., 2., 3.]), torch.tensor([True, False, True])
>>> torch.ops.masked_sparse.reduce(v, m, None, None, None, 1, "sum").tolist()
[4.0]
"""

from __future__ import annotations

from typing import Any

import torch

from . import _kernels, _native
from ._grouping import identity, reduce_dense
from ._reduce_sparse import SparseSums

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Groups(SparseSums):
    """The groups of a custom op's arguments (see the Note): all (``offsets`` and ``index``
    None), lines or scatter, over ``size`` 1-D values; ``positions`` for the arg family.

    >>> g = Groups(4, offsets=torch.tensor([0, 1, 4]))
    >>> g.reduce(torch.tensor([1., 2., 3., 4.]), "sum").tolist()
    [1.0, 9.0]
    """

    def __init__(self, size: int, offsets: torch.Tensor | None = None,
                 which: torch.Tensor | None = None, index: torch.Tensor | None = None,
                 n: int = 1, positions: torch.Tensor | None = None) -> None:
        self.size, self.offsets, self.which, self.index = size, offsets, which, index
        self._positions = positions
        if offsets is not None:
            n = offsets.shape[0] - 1 if which is None else which.shape[0]
        elif index is None:
            n = 1
        self.n = n

    @property
    def kind(self) -> str:
        return "all" if self.offsets is None and self.index is None else \
            "lines" if self.index is None else "scatter"

    def kernel_groups(self, values: torch.Tensor) -> tuple:
        return self.offsets, self.which, self.index, self.n

    def _group_of(self) -> torch.Tensor:
        """The group of every element (lines: the listed lines, in order)."""
        if self.index is not None:
            return self.index.long()
        lengths = self.offsets.diff()
        if self.which is not None:
            lengths = lengths.index_select(0, self.which)
        return torch.repeat_interleave(torch.arange(self.n, device=lengths.device), lengths,
                                       output_size=self.size)

    def reduce(self, values: torch.Tensor, op: str) -> torch.Tensor:
        if op == "sum" and values.dtype == torch.bool:
            values = values.long()
        if self.kind == "all":
            return reduce_dense(values, (0,), True, op) if values.shape[0] else \
                reduce_dense(values.new_zeros(1), (0,), True, op)
        gid, shape = self._group_of(), (self.n,)
        if op == "sum":
            return values.new_zeros(shape).index_add(0, gid, values)
        if op in ("any", "all"):
            hits = (values if op == "any" else ~values.bool()).to(torch.int32)
            counts = torch.zeros(shape, dtype=torch.int32, device=values.device).index_add(
                0, gid, hits)
            return counts > 0 if op == "any" else counts == 0
        # a group without an element reads the op's identity (the kernels' convention)
        init = values.new_full(shape, 1 if op == "prod" else identity(op, values.dtype))
        return init.scatter_reduce(0, gid, values, op, include_self=True)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        if self.kind == "all":
            return out.expand(self.size)
        return out.index_select(0, self._group_of())

    def positions(self) -> torch.Tensor:
        return self._positions

    # -- the C kernels (None where they do not apply) ---------------------------------------
    def _native_reduce(self, op, values, mask):
        if self.kind == "all":
            return _native.reduce_all(values, mask, op) if values.shape[0] else None
        if self.kind == "lines":
            return _native.lines(values, mask, op, self.offsets, self.which)
        return _native.scatter(values, mask, op, self.index, self.n)

    def _fused_dev(self, f, values, mask, center):
        if self.kind == "all":
            return _native.deviations_all(f, values, mask, center) if values.shape[0] else None
        if self.kind == "lines":
            return _native.deviations_lines(f, values, mask, center, self.offsets, self.which)
        return _native.deviations_scatter(f, values, mask, center, self.index, self.n)

    def _native_moments(self, values, mask, correction):
        if self.kind == "all":
            return _native.moments(values, mask, correction) if values.shape[0] else None
        if self.kind == "lines":
            return _native.moments(values, mask, correction, self.offsets, self.which)
        counts = _native.count_scatter(mask, self.index, self.n)
        if counts is None:
            return None
        return _native.moments(values, mask, correction, index=self.index, counts=counts)

    def _native_logsumexp(self, values, mask, specified):
        if self.kind == "all":
            return _native.logsumexp_all(values, mask) if values.shape[0] else None
        if self.kind == "lines":
            return _native.logsumexp_lines(values, mask, self.offsets, self.which)
        return _native.logsumexp_scatter(values, mask, self.index, specified, self.n)

    def _native_softmax(self, values, mask, log):
        if self.kind == "all":
            return _native.softmax(values, mask, log) if values.shape[0] else None
        if self.kind == "lines":
            return _native.softmax(values, mask, log, self.offsets, self.which)
        return _native.softmax(values, mask, log, index=self.index, n=self.n)

    def _native_arg(self, values, mask, op):
        if not values.shape[0] or not _native.arg_applies(values, mask, op):
            return None
        if self.kind == "scatter":
            return _native.arg_scatter(values, mask, op, self.index, self.n, self._positions)
        offsets = self.offsets if self.kind == "lines" else \
            torch.tensor([0, values.shape[0]])
        return _native.arg_lines(values, mask, op, offsets, self.which, self._positions)


# -- the ops ------------------------------------------------------------------------------
# Each op: (values, mask, offsets, which, index, n, *family arguments). ``_FAMILY`` maps an
# op to its family, how its family arguments are read, and how its outputs map to the
# family's (an op has a fixed number of outputs: ``moments`` always returns the variance
# slot, empty without a correction).
Tensor = torch.Tensor
_LIB = "masked_sparse"


def _groups(values, offsets, which, index, n, positions=None) -> Groups:
    return Groups(values.shape[0], offsets, which, index, n, positions)


def _size(offsets, which, index, n) -> int:
    if offsets is not None:
        return offsets.shape[0] - 1 if which is None else which.shape[0]
    return 1 if index is None else n


@torch.library.custom_op(f"{_LIB}::reduce", mutates_args=())
def reduce(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
           index: Tensor | None, n: int, op: str) -> Tensor:
    """``REDUCE`` per group (see the Note); the default (non-CPU) implementation."""
    return _kernels.REDUCE.torch_ops(_groups(values, offsets, which, index, n), values, mask,
                                     op)[0]


@reduce.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, op):
    return _cpu(_kernels.REDUCE, values, mask, offsets, which, index, n, op)[0]


@reduce.register_fake
def _(values, mask, offsets, which, index, n, op):
    return values.new_empty(_size(offsets, which, index, n))


@torch.library.custom_op(f"{_LIB}::moments", mutates_args=())
def moments(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
            index: Tensor | None, n: int, correction: float | None
            ) -> tuple[Tensor, Tensor, Tensor]:
    """``MOMENTS`` per group: (var, mean, specified), var empty without a correction."""
    out = _kernels.MOMENTS.torch_ops(_groups(values, offsets, which, index, n), values, mask,
                                     correction)
    return _moments_out(values, out, correction)


@moments.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, correction):
    out = _cpu(_kernels.MOMENTS, values, mask, offsets, which, index, n, correction)
    return _moments_out(values, out, correction)


def _moments_out(values: Tensor, out: tuple, correction: float | None) -> tuple:
    if correction is None:
        return (values.new_empty(0),) + tuple(out)
    return tuple(out)


@moments.register_fake
def _(values, mask, offsets, which, index, n, correction):
    size = _size(offsets, which, index, n)
    var = values.new_empty(0 if correction is None else size)
    return var, values.new_empty(size), mask.new_empty(size)


@torch.library.custom_op(f"{_LIB}::logsumexp", mutates_args=())
def logsumexp(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
              index: Tensor | None, n: int, specified: Tensor) -> Tensor:
    """``LOGSUMEXP`` per group, 0 where ``specified`` is False."""
    return _kernels.LOGSUMEXP.torch_ops(_groups(values, offsets, which, index, n), values,
                                        mask, specified)[0]


@logsumexp.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, specified):
    return _cpu(_kernels.LOGSUMEXP, values, mask, offsets, which, index, n, specified)[0]


@logsumexp.register_fake
def _(values, mask, offsets, which, index, n, specified):
    return values.new_empty(_size(offsets, which, index, n))


@torch.library.custom_op(f"{_LIB}::softmax", mutates_args=())
def softmax(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
            index: Tensor | None, n: int, log: bool) -> Tensor:
    """``SOFTMAX`` within each group, 0 at unspecified elements."""
    return _kernels.SOFTMAX.torch_ops(_groups(values, offsets, which, index, n), values, mask,
                                      log)[0]


@softmax.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, log):
    return _cpu(_kernels.SOFTMAX, values, mask, offsets, which, index, n, log)[0]


@softmax.register_fake
def _(values, mask, offsets, which, index, n, log):
    return torch.empty_like(values)


@torch.library.custom_op(f"{_LIB}::arg_extreme", mutates_args=())
def arg_extreme(values: Tensor, mask: Tensor, offsets: Tensor | None, which: Tensor | None,
                index: Tensor | None, n: int, positions: Tensor, op: str
                ) -> tuple[Tensor, Tensor]:
    """``ARG`` per group: the masked extreme and the first ``positions`` reaching it."""
    g = _groups(values, offsets, which, index, n, positions)
    top, at = _kernels.ARG.torch_ops(g, values, mask, op)
    return top, at


@arg_extreme.register_kernel("cpu")
def _(values, mask, offsets, which, index, n, positions, op):
    g = _groups(values, offsets, which, index, n, positions)
    top, at = _kernels.ARG.forward(g, values, mask, op)
    return top, at


@arg_extreme.register_fake
def _(values, mask, offsets, which, index, n, positions, op):
    size = _size(offsets, which, index, n)
    return values.new_empty(size), positions.new_empty(size)


@torch.library.custom_op(f"{_LIB}::cumsum_lines", mutates_args=())
def cumsum_lines(values: Tensor, offsets: Tensor) -> Tensor:
    """The running sum of 1-D ``values`` restarting at each line of ``offsets`` (int64,
    from 0 to the number of values); the default (non-CPU) implementation: the torch ops of
    ``_kernels.segmented_cumsum``."""
    return _kernels.segmented_cumsum(values, offsets)


@cumsum_lines.register_kernel("cpu")
def _(values, offsets):
    out = _native.cumsum_lines(values.contiguous(), offsets.contiguous())
    return out if out is not None else _kernels.segmented_cumsum(values, offsets)


@cumsum_lines.register_fake
def _(values, offsets):
    return torch.empty_like(values, memory_format=torch.contiguous_format)


def _cumsum_setup(ctx, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(inputs[1])


def _cumsum_backward(ctx, grad):
    (offsets,) = ctx.saved_tensors
    return _kernels.reverse_cumsum_lines(grad, offsets, running=cumsum_lines), None


cumsum_lines.register_autograd(_cumsum_backward, setup_context=_cumsum_setup)


def _cpu(family: type[_kernels.Family], values, mask, offsets, which, index, n, arg) -> tuple:
    """The CPU implementation: the family's forward (the C kernels where they apply)."""
    return family.forward(_groups(values, offsets, which, index, n), values, mask, arg)


# -- autograd: the families' own backwards ------------------------------------------------
def _setup(ctx, inputs: tuple, output: Any) -> None:
    values, mask, offsets, which, index, n, *rest = inputs
    ctx.set_materialize_grads(False)  # an output not used gets no gradient pass
    outs = output if isinstance(output, tuple) else (output,)
    positions = rest[0] if len(rest) == 2 else None
    ctx.save_for_backward(values, mask, offsets, which, index, positions, *outs)
    ctx.n, ctx.arg = n, rest[-1]


def _backward_of(family: type[_kernels.Family], nargs: int):
    def backward(ctx, *grads):
        values, mask, offsets, which, index, positions, *outs = ctx.saved_tensors
        g = _groups(values, offsets, which, index, ctx.n, positions)
        if family is _kernels.MOMENTS and ctx.arg is None:  # the empty variance slot
            outs, grads = outs[1:], grads[1:]
        grad = family.backward(g, values, mask, tuple(outs), tuple(grads), ctx.arg)
        return (grad,) + (None,) * (nargs - 1)
    return backward


for _op, _family, _nargs in ((reduce, _kernels.REDUCE, 7), (moments, _kernels.MOMENTS, 7),
                             (logsumexp, _kernels.LOGSUMEXP, 7),
                             (softmax, _kernels.SOFTMAX, 7), (arg_extreme, _kernels.ARG, 8)):
    _op.register_autograd(_backward_of(_family, _nargs), setup_context=_setup)

_OPS = {_kernels.REDUCE: reduce, _kernels.MOMENTS: moments, _kernels.LOGSUMEXP: logsumexp,
        _kernels.SOFTMAX: softmax, _kernels.ARG: arg_extreme}


def call(family: type[_kernels.Family], g: Any, values: torch.Tensor, mask: torch.Tensor,
         *args: Any) -> tuple | None:
    """``family``'s outputs for grouping ``g`` by its custom op, or None where none serves
    (a grouping that cannot describe its groups, values that are not 1-D real floats): the
    caller runs the torch ops. Called while torch.compile traces."""
    op = _OPS.get(family)
    spec = None if op is None else g.kernel_groups(values)
    if (spec is None or values.dtype not in _FLOATS or values.dim() != 1
            or mask.dtype != torch.bool or mask.shape != values.shape):
        return None
    offsets, which, index, n = spec
    if family is _kernels.ARG:
        positions = g.positions()
        if positions.shape != values.shape:
            positions = positions.expand_as(values).contiguous()
        return arg_extreme(values, mask, offsets, which, index, n, positions, args[0])
    out = op(values, mask, offsets, which, index, n, *args)
    if family is _kernels.MOMENTS:
        return out[1:] if args[0] is None else out
    return out if isinstance(out, tuple) else (out,)
