"""The masked kernel families: one module, one op, one implementation per device each.

Note [Kernel families as ops]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Every masked computation over groups that the core writes its reductions with is one of
six families, each a module here, as ``torch_scatter`` keeps one op per file:

=================  ==============================  ============================================
module             op                              computes per group
=================  ==============================  ============================================
``reduce``         ``masked_sparse::reduce``       sum, sum of squares, prod, amax, amin
``moments``        ``masked_sparse::moments``      mean; variance with a correction
``logsumexp``      ``masked_sparse::logsumexp``    log of the sum of exp
``softmax``        ``masked_sparse::softmax``      softmax / log_softmax within the group
``arg_extreme``    ``masked_sparse::arg_extreme``  the extreme and its first position
``cumsum``         ``masked_sparse::cumsum_lines`` the running sum along lines
=================  ==============================  ============================================

A family module holds, together: a Note stating the family's semantics (the only
statement of them: identities, corrections, NaN and inf rules, gradient rules), its CPU
implementation (``native``: the C kernels of ``layouts/_native.c`` where they apply,
else the torch ops), its implementation for every other device (``torch``: torch ops, the
raw kernel per op and device from the measured table of ``_device_table.py``, no host
sync), its ``torch.library`` op with a fake implementation and its autograd, and its
backward, written with the same masked kernels (on CPU one native pass where nothing
records it; differentiable torch ops where something does, so ``create_graph=True``
differentiates again).

**The groups.** A family reads only what describes the groups -- their kind (all, lines,
scatter, each, dense, generic), the line pointers, the group ids, their number, the
positions, the dense dims -- from a grouping (``layouts.Grouping``, whose facts are cached
per index tensor) or from a :class:`Groups` record of plain tensors (the ops' arguments):
Note [Groups as a record] in ``_groups.py``. Groupings hold no family code.

**The route, in one place.** ``_route.run`` chooses: while torch.compile traces, the
family's op (the groups as plain tensors; the strided groupings' torch ops, which Inductor
fuses, elsewhere); under other tracers (torch.func, fake tensors, ``make_fx``, complex
values) the torch ops as differentiable ops; with values that require grad, the family's
forward recorded with its backward by one ``autograd.Function``; otherwise the forward
itself. The forward is the implementation for the values' device, the same one the op
registers for that device. The family entry points (:func:`masked_reduce` & co.) inline
the last case -- *the direct call*: CPU eager without autograd or tracer calls the CPU
implementation with no dispatch, no Function and no tuple between, keeping a small
reduction's fixed cost (``python -m benchmarks.profile_overhead --fixed``). Eager code
never goes through the op's dispatcher (Note [Eager calls skip the dispatcher]).

**The device table.** Off the native kernels, a group reduction is a fill and one raw
torch kernel: ``segment_reduce`` over line pointers (or over the column order kept per
index, Note [Column order]), ``index_add`` or ``scatter_reduce`` over group ids. Which one,
per op, kind of groups and device, is data in ``_device_table.py`` (Note [The device
table]), written from ``python -m benchmarks.gpu``'s measurements. Nothing there hands
values to torch's sparse-tensor reductions, and nothing round-trips through float64:
sums accumulate as torch's own do.

**No host sync on the device path.** Off the native kernels no family reads device data
on the host or sizes an output by it (no ``.item()``, ``nonzero``, ``unique``,
``masked_select``, ``bincount``, ``repeat_interleave`` without ``output_size``; a
``segment_reduce`` takes ``unsafe=True``: its offsets are index facts, checked when built).
Only a grouping's *first* reduction over an index tensor may sync, to build the index facts
that size its result (the number of non-empty lines or groups: ``nonzero`` / ``unique`` of
the index); they are cached per index tensor, so every later call -- forward, backward,
any family -- runs without one (``tests/kernels/test_no_host_sync.py`` checks every family x
layout x dim, with and without autograd; under ``--device cuda`` with
``torch.cuda.set_sync_debug_mode("error")``). Host reads that remain are keyed to the CPU
(the native kernels' own checks, a single group's ``specified.item()``).

**The route of one call: ``torch.sum(csr_mt, 1)``.**

1. ``masked_sparse/_tensor.py``: ``MaskedTensor.__torch_function__`` looks ``torch.sum``
   up and calls ``ops/reductions._summing``, which binds the arguments and calls
   ``reductions.run`` (``on_values`` when the values require grad).
2. ``ops/reductions._reduce``: the CSR layout's ``reduction`` table has no ``sum``, so
   ``layouts.group_by`` (``layouts/_reduce_sparse.py``) builds a ``CompressedGrouping``
   of kind ``"lines"``: the row pointers as int64 offsets and the non-empty rows, cached
   per ``crow_indices`` tensor.
3. ``ops/reductions.k_sum`` calls ``kernels.masked_sum`` (``layouts/kernels/reduce.py``),
   which calls ``masked_reduce(g, values, mask, "sum")``.
4. ``masked_reduce``: CPU, no grad, no tracer -- the direct call: ``_cpu`` reads the kind
   and calls ``_native.lines`` (``layouts/_native.py``: one C pass over values, mask and
   pointers, sums in double). Without the kernels (another device,
   ``MASKED_SPARSE_NATIVE=0``) ``_torch`` fills with ``layouts._fill.fill_unspecified``
   and the grouping's ``reduce`` runs ``_groups.raw_reduce``: the table's kernel
   (``segment_reduce`` over the offsets, or ``index_add`` over the cached line of each
   element). With grad, ``_route.run`` records ``_FamilyOp`` whose backward is
   ``REDUCE.backward``: ``_native.backward("expand")`` on CPU, else the grouping's
   ``expand`` and the in-place zero fill.
5. Back in ``k_sum``: the result mask is ``g.reduce(mask, "any")`` (the counts, cached
   per mask object), and ``g.build`` makes the 1-D COO result.

Under torch.compile step 4 puts ``torch.ops.masked_sparse.reduce`` in the graph (for a
sparse full reduction; a sparse reduction along a dim breaks the graph first, its output
size depending on the data, and runs eagerly as above).
"""

from ._groups import Groups
from ._route import node_backward
from .arg_extreme import masked_arg, masked_arg_extreme
from .cumsum import cumsum_lines, reverse_cumsum_lines, segmented_cumsum
from .logsumexp import masked_logsumexp
from .moments import masked_mean, masked_var
from .reduce import masked_reduce, masked_reduce_zeroed, masked_sum
from .softmax import masked_softmax, masked_softmax_backward

__all__ = [
    "Groups",
    "cumsum_lines",
    "masked_arg",
    "masked_arg_extreme",
    "masked_logsumexp",
    "masked_mean",
    "masked_reduce",
    "masked_reduce_zeroed",
    "masked_softmax",
    "masked_softmax_backward",
    "masked_sum",
    "masked_var",
    "node_backward",
    "reverse_cumsum_lines",
    "segmented_cumsum",
]
