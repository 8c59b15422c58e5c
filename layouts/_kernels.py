"""One operation per masked kernel family, the same in inference and training.

Note [One kernel route]
~~~~~~~~~~~~~~~~~~~~~~~
The families are the groupings' masked primitives (``layouts._grouping``): ``REDUCE``
(sum, sum of squares, prod, amax, amin per group), ``MOMENTS`` (mean, and variance with a
correction), ``LOGSUMEXP``, ``SOFTMAX`` (softmax / log_softmax within groups, zeros at
unspecified elements), ``ARG`` (the extreme and the position of its first specified
element) and :func:`cumsum_lines`. Each is one ``torch.autograd.Function`` (:class:`_Op`,
cheaper per call than a ``torch.library.custom_op`` on the eager hot path):

- its forward picks the implementation by *device* only: a grouping's ``_native_*``
  method (the C kernels of ``_native``: CPU, float32 / float64, the library loaded) where
  it applies, else the grouping's torch-op implementation (``_torch_*``: every other
  device, dtype or shape, and ``MASKED_SPARSE_NATIVE=0``), run without autograd. Whether
  the input requires grad never changes which one runs, so a training step gets the
  inference value bit for bit (the kernels accumulate float sums in double; the torch ops
  in the values' type);
- its backward is written with masked torch ops and the grouping's own ``expand`` /
  masked sums (themselves families), differentiable, so that a backward with
  ``create_graph=True`` can be differentiated again. Where that backward is not recorded
  (grad mode off in it, as in a plain ``.backward()``) and a kernel applies, the
  elementwise part -- the groups' values onto their elements, the family's arithmetic and
  the fill -- is one native pass instead (``_native.backward`` through
  ``Grouping._native_backward``: sum, mean, var, amax / amin, logsumexp, softmax and
  log_softmax), step for step the same arithmetic.

Without autograd to record, :func:`run` calls the family's forward directly (no Function).
The ctypes kernels cannot be traced. While torch.compile traces, :func:`run` puts the
family's ``torch.library`` custom op in the graph instead (``masked_sparse::reduce``,
``moments``, ``logsumexp``, ``softmax``, ``arg_extreme``: Note [Kernel families as custom
ops] in ``layouts._custom_ops``), for the groupings that describe their groups by plain
tensors (``Grouping.kernel_groups``: the sparse ones without dense dims): its CPU
implementation is the family's ``forward`` here, its backward the family's ``backward``, so
a compiled graph runs the same C kernels, bit for bit. Eager calls keep the
``autograd.Function`` (a custom op costs more per call on this hot path; the fixed cost is
measured by ``benchmarks/profile_overhead.py --fixed``). Everywhere else a tracer runs --
the strided groupings under compile (Inductor fuses their torch ops), a torch.func
transform, a dispatch mode (fake tensors, ``make_fx``), complex values (the backwards here
are written for real values) -- :func:`run` takes the torch-op implementation as plain
differentiable torch ops, which the tracer records. :func:`cumsum_lines` (no grouping: a
running sum per line of plain tensors) is recorded by its own ``autograd.Function``
(:class:`_CumsumLines`) and, while torch.compile traces, put in the graph as the custom
op ``masked_sparse::cumsum_lines``; both differentiate by :func:`reverse_cumsum_lines`.

>>> import torch
>>> class Whole:  # a grouping of one group, for the example
...     def _native_reduce(self, op, values, mask): return None
...     def _torch_reduce(self, values, mask, op):
...         return torch.where(mask, values, 0).sum(0, keepdim=True)
...     def expand(self, out): return out.expand(3)
>>> v = torch.tensor([1., 2., 3.], requires_grad=True)
>>> out, = run(REDUCE, Whole(), v, torch.tensor([True, False, True]), "sum")
>>> out.backward(torch.ones(1)); v.grad.tolist()
[1.0, 0.0, 1.0]
"""

from __future__ import annotations

import math
from typing import Any

import torch


def traced(values: torch.Tensor) -> bool:
    """True where the ctypes kernels cannot serve ``values`` whatever its device: while
    torch.compile traces, inside a torch.func transform or a dispatch mode, and for complex
    values (Note [One kernel route]): the torch-op implementation runs, differentiably."""
    return (_compiling() or _transforms_active() or bool(_modes_active())
            or values.is_complex())


# (bound once: :func:`run` asks on every masked primitive; Dynamo knows them by object)
_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_modes_active = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled


def eager(values: torch.Tensor) -> bool:
    """True where index facts may be cached and narrowed per index tensor: not tracing (a
    traced graph must not capture them), whether or not ``values`` requires grad."""
    return not (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active())


def _where(mask: torch.Tensor, x: torch.Tensor, fresh: bool = False) -> torch.Tensor:
    """``torch.where(mask, x, 0)``: the layouts' exact fill (one native pass on CPU where
    nothing is to be differentiated); with ``fresh`` (``x`` is a temporary of the caller's)
    in place there, one output-sized allocation less."""
    if (fresh and not torch.is_grad_enabled() and x.shape == mask.shape
            and not x._is_view()  # an expand shares the memory of what it broadcasts
            and x.is_contiguous() and _grouping._native.fill(x, mask, 0, out=x) is not None):
        return x
    return _grouping.zero_unspecified(x.expand_as(mask) if x.shape != mask.shape else x, mask)


def _operand(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` as a backward multiplies them: as they are when the backward is not
    differentiated (the result is filled once, at the end), else filled with 0 first, so
    that what an unspecified element holds (NaN, inf) never meets a zero gradient in the
    double backward (Note [Fill before transform])."""
    return _where(mask, values) if torch.is_grad_enabled() else values


def _native_backward(g: Any, op: str, mask: torch.Tensor, a: torch.Tensor,
                     **operands: Any) -> torch.Tensor | None:
    """A backward in one native pass (``Grouping._native_backward``: the layout's kernel of
    ``_native.backward``, op ``op``, per group ``a``), or None: where the backward is
    itself recorded (``create_graph=True``: the torch ops, differentiable, run) and where no
    kernel applies (other devices or dtypes, no library)."""
    if torch.is_grad_enabled() or traced(a):  # (traced: fake or functorch tensors)
        return None
    native = getattr(g, "_native_backward", None)
    if native is None:
        return None
    # No detach: grad mode is off here, and the kernel only reads its operands.
    return native(op, mask, a, **operands)


class Family:
    """One kernel family: ``forward`` (by device), ``torch_ops`` (differentiable torch
    ops), ``backward`` (masked torch ops); outputs are tuples of tensors."""

    name = ""

    @staticmethod
    def native(g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple | None:
        raise NotImplementedError

    @staticmethod
    def torch_ops(g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple:
        raise NotImplementedError

    @classmethod
    def forward(cls, g: Any, values: torch.Tensor, mask: torch.Tensor, *args: Any) -> tuple:
        out = cls.native(g, values, mask, *args)
        return out if out is not None else cls.torch_ops(g, values, mask, *args)

    @staticmethod
    def backward(g: Any, values: torch.Tensor, mask: torch.Tensor, outs: tuple,
                 grads: tuple, *args: Any) -> torch.Tensor:
        raise NotImplementedError


class _Op(torch.autograd.Function):
    """A family's forward, recorded with the family's backward (Note [One kernel route])."""

    @staticmethod
    def forward(ctx, family: type[Family], g: Any, args: tuple,  # type: ignore[override]
                values: torch.Tensor, mask: torch.Tensor) -> tuple:
        outs = family.forward(g, values, mask, *args)
        ctx.family, ctx.g, ctx.args, ctx.n_outputs = family, g, args, len(outs)
        ctx.set_materialize_grads(False)  # an output not used gets no gradient pass
        ctx.save_for_backward(values, mask, *outs)
        plain = [o for o in outs if not o.is_floating_point()]
        if plain:
            ctx.mark_non_differentiable(*plain)
        return outs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple:  # type: ignore[override]
        values, mask, *outs = ctx.saved_tensors
        grad = ctx.family.backward(ctx.g, values, mask, tuple(outs), grads, *ctx.args)
        return None, None, None, grad, None


def node_backward(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                  grads: list[torch.Tensor]) -> list[torch.Tensor | None] | None:
    """``torch.autograd.grad(outputs, inputs, grads, allow_unused=True)`` where every output
    comes from one family node (:class:`_Op`) applied to an input leaf itself: that node's
    backward called directly; None elsewhere (the caller runs the engine).

    Note [A family's backward without the engine]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A masked op differentiates its kernel's small inner graph with one
    ``torch.autograd.grad`` call (Note [Autograd on the values] in ``masked_sparse``). For a
    reduction or softmax that graph is one node, this module's Function on the leaf copy of
    the values, and a run of the engine for it (graph task, input checks) costs as much as
    the node's own Python. So where the graph is that one node, outside a recorded backward
    (``create_graph``: the engine records the backward's ops) and anomaly mode, the node's
    ``backward`` runs as the engine would run it: gradients by output number, ``None`` for
    an output not used (the Function does not materialize them), its gradient for the
    values input. The node's saved tensors go when the caller drops the inner graph.

    >>> v = torch.tensor([1., 2.], requires_grad=True)
    >>> class One:
    ...     def _native_reduce(self, op, values, mask): return None
    ...     def _torch_reduce(self, values, mask, op):
    ...         return torch.where(mask, values, 0).sum(0, keepdim=True)
    ...     def expand(self, out): return out.expand(2)
    >>> out, = run(REDUCE, One(), v, torch.tensor([True, True]), "sum")
    >>> with torch.no_grad():
    ...     node_backward([out], [v], [torch.tensor([3.])])
    [tensor([3., 3.])]
    """
    node = outputs[0].grad_fn
    if (type(node) is not _OP_NODE or torch.is_grad_enabled() or torch.is_anomaly_enabled()
            or (len(outputs) > 1 and any(o.grad_fn is not node for o in outputs[1:]))):
        return None
    source = node.next_functions[0][0]  # the values input (the mask has no gradient)
    leaf = getattr(source, "variable", None)
    if leaf is None or not any(leaf is t for t in inputs):
        return None
    if len(outputs) == 1 and node.n_outputs == 1:
        by_output: list[torch.Tensor | None] = list(grads)
    else:
        by_output = [None] * node.n_outputs
        for o, g in zip(outputs, grads):
            i = o.output_nr
            by_output[i] = g if by_output[i] is None else by_output[i] + g
    grad = _Op.backward(node, *by_output)[3]  # (the node is the Function's ctx)
    return [grad if t is leaf else None for t in inputs]


def run(family: type[Family], g: Any, values: torch.Tensor, mask: torch.Tensor,
        *args: Any) -> tuple:
    """``family``'s outputs for grouping ``g`` (Note [One kernel route])."""
    if _compiling() or _transforms_active() or _modes_active() or values.is_complex():
        # (:func:`traced`, inlined: this runs on every masked primitive)
        if torch.compiler.is_compiling():  # Note [Kernel families as custom ops]
            from ._custom_ops import call  # (it imports this module)

            out = call(family, g, values, mask, *args)
            if out is not None:
                return out
        return family.torch_ops(g, values, mask, *args)
    if values.requires_grad and _grad_enabled():
        # torch's ``Function.apply`` less its Python layer: ``_Op`` has no setup_context
        # whose arguments it would bind, and no torch.func transform is active here (traced)
        unwrap = torch._C._functorch.unwrap_if_dead
        return _APPLY(family, g, args, unwrap(values), unwrap(mask))
    return family.forward(g, values, mask, *args)


def _direct(values: torch.Tensor) -> bool:
    """True where a family's no-grad eager implementation can be called directly: nothing
    traces (:func:`traced`) and no backward is to be recorded, so :func:`run` would take
    ``family.forward`` anyway (the entry points below skip its layers: a small
    reduction's fixed cost, ``benchmarks/profile_overhead.py --fixed``)."""
    return not (_compiling() or _transforms_active() or _modes_active() or values.is_complex()
                or (values.requires_grad and _grad_enabled()))


def reduce(g: Any, values: torch.Tensor, mask: torch.Tensor, op: str) -> torch.Tensor:
    """``run(REDUCE, g, values, mask, op)[0]``, the most called family: without autograd to
    record and no tracer, the grouping's native implementation, else its torch ops, called
    here directly (no family, tuple or forward layer between: the fixed cost of a small
    reduction, ``benchmarks/profile_overhead.py --fixed``); the rest through :func:`run`."""
    if not _direct(values):
        return run(REDUCE, g, values, mask, op)[0]
    out = g._native_reduce(op, values, mask)
    return out if out is not None else g._torch_reduce(values, mask, op)


def moments(g: Any, values: torch.Tensor, mask: torch.Tensor,
            correction: float | None) -> tuple:
    """``run(MOMENTS, g, values, mask, correction)``, as :func:`reduce`: without autograd
    to record and no tracer, the grouping's native implementation, else its torch ops,
    called here directly (a mean's or variance's fixed cost)."""
    if not _direct(values):
        return run(MOMENTS, g, values, mask, correction)
    out = g._native_moments(values, mask, correction)
    if out is None:
        return g._torch_moments(values, mask, correction)
    return out[1:] if correction is None else out


def arg_extreme(g: Any, values: torch.Tensor, mask: torch.Tensor, op: str) -> tuple:
    """``run(ARG, g, values, mask, op)``, as :func:`reduce`: the grouping's native
    implementation called directly when nothing is traced or recorded."""
    if not _direct(values):
        return run(ARG, g, values, mask, op)
    out = g._native_arg(values, mask, op)
    return out if out is not None else g._torch_arg(values, mask, op)


def logsumexp(g: Any, values: torch.Tensor, mask: torch.Tensor,
              specified: torch.Tensor) -> torch.Tensor:
    """``run(LOGSUMEXP, g, values, mask, specified)[0]``, as :func:`reduce`."""
    if not _direct(values):
        return run(LOGSUMEXP, g, values, mask, specified)[0]
    out = g._native_logsumexp(values, mask, specified)
    return out if out is not None else g._torch_logsumexp(values, mask, specified)


def softmax(g: Any, values: torch.Tensor, mask: torch.Tensor, log: bool) -> torch.Tensor:
    """``run(SOFTMAX, g, values, mask, log)[0]``, as :func:`reduce`."""
    if not _direct(values):
        return run(SOFTMAX, g, values, mask, log)[0]
    out = g._native_softmax(values, mask, log)
    return out if out is not None else g._torch_softmax(values, mask, log)


def reduce_zeroed(g: Any, values: torch.Tensor, mask: torch.Tensor, op: str,
                  specified: torch.Tensor) -> torch.Tensor | None:
    """``Grouping.masked_reduce_zeroed``: without autograd to record and no tracer, the
    grouping's native ``op`` reduction (a fresh tensor) with 0 written in place where
    ``specified`` is False, bit for bit ``where(specified, out, 0)``; None otherwise."""
    if not _direct(values):
        return None
    out = g._native_reduce(op, values, mask)
    if out is None:
        return None
    if specified.numel() == 1 and specified.dtype is torch.bool:  # one group: read it
        return out if specified.item() else _grouping.zero_unspecified(out, specified)
    if _grouping._native.fill(out, specified, 0, out=out) is None:
        return _grouping.zero_unspecified(out, specified)
    return out


_OP_NODE = _Op._backward_cls  # the type of a family node in a graph (its grad_fn)
_APPLY = super(torch.autograd.Function, _Op).apply  # torch._C._FunctionBase.apply of _Op


class REDUCE(Family):
    """Per group, the masked ``op`` ("sum", "sumsq", "prod", "amax", "amin"): unspecified
    elements read the op's identity (0 for "sumsq")."""

    @staticmethod
    def native(g, values, mask, op):
        out = g._native_reduce(op, values, mask)
        return None if out is None else (out,)

    @staticmethod
    def torch_ops(g, values, mask, op):
        return (g._torch_reduce(values, mask, op),)

    @staticmethod
    def backward(g, values, mask, outs, grads, op):
        (grad,), (out,) = grads, outs
        if op == "sum":
            out = _native_backward(g, "expand", mask, grad, what=op)
            return out if out is not None else _where(mask, g.expand(grad), fresh=True)
        if op == "sumsq":
            return _where(mask, 2 * _operand(values, mask) * g.expand(grad), fresh=True)
        if op in ("amax", "amin"):  # split among the specified ties, as torch's amax
            out_ = _native_backward(g, "ties", mask, grad, b=out, x=values, what=op)
            if out_ is not None:
                return out_
            hit = mask & (values == g.expand(out))
            ties = g.reduce(hit, "sum").to(grad.dtype)  # counted by the layout's kernel
            share = grad / ties.clamp(min=1)
            return _where(hit, g.expand(share), fresh=True)
        # prod: differentiate the torch ops (torch's own rule for zeros), first order only
        with torch.enable_grad():
            leaf = values.detach().requires_grad_()
            again = g._torch_reduce(leaf, mask, op)
            return torch.autograd.grad(again, leaf, grad)[0]


class MOMENTS(Family):
    """Per group, ``(var, mean, specified)`` for a ``correction`` (``(mean, specified)``
    for None): ``Grouping.masked_var`` / ``masked_mean``."""

    @staticmethod
    def native(g, values, mask, correction):
        out = g._native_moments(values, mask, correction)
        if out is None:
            return None
        return out[1:] if correction is None else out

    @staticmethod
    def torch_ops(g, values, mask, correction):
        return g._torch_moments(values, mask, correction)

    @staticmethod
    def backward(g, values, mask, outs, grads, correction):
        count = g.reduce(mask, "sum").to(values.dtype)
        if correction is None:
            g_mean, g_var = grads[0], None
        else:
            g_var, g_mean = grads[0], grads[1]
        total = None
        share = None if g_mean is None else g_mean / count.clamp(min=1)
        if g_var is None and share is not None:
            out = _native_backward(g, "expand", mask, share, what="mean")
            if out is not None:
                return out
        if share is not None:
            total = g.expand(share)
        if g_var is not None:  # 2 (x - mean) / dof; the mean's own term sums to 0
            dof = count - correction
            ok = dof > 0
            coef = _where(ok, 2 * g_var / torch.where(ok, dof, torch.ones((), dtype=dof.dtype)))
            out = _native_backward(g, "dev", mask, coef, b=outs[1], x=values, c=share,
                                   what="var")
            if out is not None:
                return out
            # unspecified elements (NaN or inf included) are filled once, at the end
            part = (_operand(values, mask) - g.expand(outs[1])) * g.expand(coef)
            total = part if total is None else total + part
        if total is None:
            return torch.zeros_like(values)
        return _where(mask, total.expand_as(values), fresh=True)


class LOGSUMEXP(Family):
    """Per group, the log of the sum of ``exp`` of the specified elements, 0 where the
    bool ``specified`` (one per group) is False."""

    @staticmethod
    def native(g, values, mask, specified):
        out = g._native_logsumexp(values, mask, specified)
        return None if out is None else (out,)

    @staticmethod
    def torch_ops(g, values, mask, specified):
        return (g._torch_logsumexp(values, mask, specified),)

    @staticmethod
    def backward(g, values, mask, outs, grads, specified):
        (grad,), (out,) = grads, outs
        native = _native_backward(g, "exp", mask, grad, b=out, x=values, what="logsumexp")
        if native is not None:
            return native
        # exp of the filled difference (Note [Fill before transform]): what an unspecified
        # element holds never reaches an exp
        weight = _where(mask, values - g.expand(out)).exp()
        return _where(mask, g.expand(grad) * weight, fresh=True)


class SOFTMAX(Family):
    """Softmax (``log``: log_softmax) within each group of a ``keepdim=True`` grouping over
    the specified elements, 0 at every other element."""

    @staticmethod
    def native(g, values, mask, log):
        out = g._native_softmax(values, mask, log)
        return None if out is None else (out,)

    @staticmethod
    def torch_ops(g, values, mask, log):
        return (g._torch_softmax(values, mask, log),)

    @staticmethod
    def backward(g, values, mask, outs, grads, log):
        (grad,), (out,) = grads, outs
        what = "log_softmax" if log else "softmax"
        if log:
            total = g.masked_sum(grad, mask)[0]
            native = _native_backward(g, what, mask, total, x=out, y=grad, what=what)
            if native is not None:
                return native
            return _where(mask, grad - out.exp() * g.expand(total), fresh=True)
        total = g.masked_sum(grad * out, mask)[0]
        native = _native_backward(g, what, mask, total, x=out, y=grad, what=what)
        if native is not None:
            return native
        return _where(mask, out * (grad - g.expand(total)), fresh=True)


class ARG(Family):
    """Per group, the masked extreme (``op`` "amax" / "amin") and the smallest position of
    a specified element reaching it (NaN first), both 0 where none is specified."""

    @staticmethod
    def native(g, values, mask, op):
        return g._native_arg(values, mask, op)

    @staticmethod
    def torch_ops(g, values, mask, op):
        return g._torch_arg(values, mask, op)

    @staticmethod
    def backward(g, values, mask, outs, grads, op):
        grad = grads[0]
        if grad is None:
            return torch.zeros_like(values)
        hit = mask & (g.positions() == g.expand(outs[1]))
        return _where(hit, g.expand(grad).expand_as(values))


class _CumsumLines(torch.autograd.Function):
    """:func:`cumsum_lines` recorded with its backward, :func:`reverse_cumsum_lines`."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, offsets: torch.Tensor,  # type: ignore[override]
                out: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(offsets)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        (offsets,) = ctx.saved_tensors
        return reverse_cumsum_lines(grad, offsets), None, None


def reverse_cumsum_lines(grad: torch.Tensor, offsets: torch.Tensor,
                         running: Any = None) -> torch.Tensor:
    """The backward of a running sum per line: the reverse running sum of ``grad`` along
    the lines of ``offsets`` -- the lines flipped, their running sums, flipped back. The
    running sum is ``running`` (the custom op, in its own backward), else
    :func:`cumsum_lines` (the kernel; recorded when ``grad`` requires grad), else the torch
    ops of :func:`segmented_cumsum` (differentiable).

    >>> reverse_cumsum_lines(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 3, 4])).tolist()
    [6.0, 5.0, 3.0, 4.0]
    """
    flipped, back = grad.flip(0), (offsets[-1] - offsets).flip(0)
    out = (cumsum_lines if running is None else running)(flipped, back)
    if out is None:  # not a kernel's input (no library, another device or dtype)
        out = segmented_cumsum(flipped, back)
    return out.flip(0)


def segmented_cumsum(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The running sum of ``values`` along dim 0 restarting at each line of ``offsets``
    (int, from 0 to ``values.shape[0]``, empty lines allowed), by torch ops alone: the
    implementation of every device without the kernel, with no host sync.

    Note [Segmented running sum]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torch has no segmented scan. Subtracting each line's start from one running sum over
    every line would carry the earlier lines into a line (their rounding, their inf and
    NaN), and padding the lines into blocks needs the longest line on the host. So the
    elements go in blocks of ``_SCAN_BLOCK`` (a fixed width: padding known from the shape)
    and each block is scanned by doubling (Hillis-Steele, with the lines' first elements
    as flags): after the step of width ``k`` an element holds the sum of the up to ``2k``
    elements of its line ending at it within its block. What a line carries into a block
    is the same scan, one level down, over the blocks' last elements (a segment starts at
    a block holding a line's first element), added to the elements before the block's
    first line start. No element ever reads another line; the sum runs in float64 for
    float32 and narrower (float32 on MPS, which has no float64), rounded once at the end:
    within a rounding of the kernel's sequential sum (and of ``torch.cumsum``), NaN and inf
    confined to their line and to the elements after them, as torch's.

    >>> segmented_cumsum(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 2, 2, 4])).tolist()
    [1.0, 3.0, 3.0, 7.0]
    """
    n = values.shape[0]
    head = torch.zeros(n + 1, dtype=torch.bool, device=values.device)
    head = head.index_fill(0, offsets.long(), True)[:n]  # each line's first element
    wide = values.dtype
    if values.dtype in (torch.float16, torch.bfloat16, torch.float32):
        wide = torch.float32 if values.device.type == "mps" else torch.float64
    out = _flagged_scan(values.reshape(n, math.prod(values.shape[1:])).to(wide), head)
    return out.reshape(values.shape).to(values.dtype)


_SCAN_BLOCK = 32


def _flagged_scan(x: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """The running sums of ``x`` (n, m) along dim 0 restarting where ``head`` (n, bool;
    ``head[0]`` True) is: Note [Segmented running sum]."""
    n, m, width = x.shape[0], x.shape[1], _SCAN_BLOCK
    blocks = -(-n // width)
    pad = blocks * width - n
    if pad:  # each padding element a line of its own
        x = torch.cat([x, x.new_zeros(pad, m)])
        head = torch.cat([head, head.new_ones(pad)])
    xs, flags = x.view(blocks, width, m), head.view(blocks, width)
    slot = torch.arange(width, device=x.device)
    step = 1
    while step < width:
        before = torch.cat([xs.new_zeros(blocks, step, m), xs[:, :-step]], 1)
        keep = flags | (slot < step)
        xs = torch.where(keep.unsqueeze(-1), xs, xs + before)
        flags = flags | torch.cat([flags.new_zeros(blocks, step), flags[:, :-step]], 1)
        step *= 2
    if blocks > 1:  # what the open line carries into each block
        carry = _flagged_scan(xs[:, -1], flags[:, -1])[:-1]
        xs = torch.cat([xs[:1], torch.where(flags[1:].unsqueeze(-1), xs[1:],
                                            xs[1:] + carry.unsqueeze(1))])
    return xs.reshape(blocks * width, m)[:n]


_OP_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cumsum_lines(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor | None:
    """Per line (``offsets``: int64, from 0 to the number of 1-D ``values``) the running
    sum of ``values``, restarting at each line, by the native kernel (``torch.cumsum``'s
    bits), recorded for autograd when ``values`` requires grad; while torch.compile traces,
    the custom op ``masked_sparse::cumsum_lines`` (the same kernel on CPU, Note [Kernel
    families as custom ops]) for real floating values; None where neither applies (the
    caller's torch ops run).

    >>> out = cumsum_lines(torch.tensor([1., 2., 3., 4.]), torch.tensor([0, 2, 4]))
    >>> out is None or out.tolist() == [1.0, 3.0, 3.0, 7.0]
    True
    """
    if torch.compiler.is_compiling():
        if (values.dtype in _OP_DTYPES and values.dim() == 1 and offsets.dim() == 1
                and offsets.dtype == torch.long):
            from ._custom_ops import cumsum_lines as op  # (it imports this module)

            return op(values, offsets)
        return None
    if traced(values):
        return None
    out = _grouping._native.cumsum_lines(values.detach(), offsets)
    if out is None or not (values.requires_grad and torch.is_grad_enabled()):
        return out
    return _CumsumLines.apply(values, offsets, out)


# The groupings import this module, and the native kernels import the groupings: a module
# reference, bound last (any import order works), read at call time -- ``_grouping._native``
# is the kernels' module -- instead of an import in every call.
from . import _grouping  # noqa: E402
