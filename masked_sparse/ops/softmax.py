"""``softmax`` / ``log_softmax`` along one dim, on every layout: a per-group reduction.

Each slice along ``dim`` is a group (a :class:`layouts.Grouping` with ``keepdim=True``):
the maximum of its specified elements is subtracted, ``exp`` summed per group and the
sum broadcast back onto the values. Only specified elements take part; the result has the
input's mask and, for sparse layouts, the very same index tensors. A fully masked slice
stays masked: no ``0/0``, no NaN, in values or gradients (Note [Fill before transform]
in ``reductions.py``).

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.tensor([[0., 0.], [1., 2.]]),
...                       torch.tensor([[False, False], [True, True]]))
>>> mt.softmax(1)
MaskedTensor(
  [
    [      --,       --],
    [  0.2689,   0.7311]
  ]
)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import layouts
from layouts import Grouping, Storage, kernels

from .. import _func
from .._autograd import _FREED, _backward_with_graph, grad_values
from .._fill import mark_zero_filled, zero_fill
from .._registry import implements, is_aten, op_name
from .._tensor import MaskedTensor, _wrap, requires_grad_of
from . import reductions_args as A
from .reductions import KEYS, _reduce, accumulate, run, source


def k_softmax(g: Grouping, dtype: torch.dtype | None, log: bool) -> Storage:
    """The layout's softmax over the specified elements (the others weigh nothing); fully
    masked slices and every unspecified element end as 0, masked (filled here unless the
    layout's kernel wrote the zeros)."""
    v, m = source(g, dtype)
    out, zeroed = kernels.masked_softmax(g, v, m, log)
    return g.restore(mark_zero_filled(out, m) if zeroed else zero_fill(out, m))


aten = torch.ops.aten

#: the signatures other than ``torch.softmax``'s that the handler binds
_SIGNATURES = {F.softmax: A.sig_functional_softmax, F.log_softmax: A.sig_functional_softmax,
               aten._softmax.default: A.sig_aten_softmax,
               aten._log_softmax.default: A.sig_aten_softmax}

@implements(torch.softmax, torch.Tensor.softmax, torch.special.softmax, aten.softmax.int,
            F.softmax, aten._softmax.default,
            torch.log_softmax, torch.Tensor.log_softmax, torch.special.log_softmax,
            aten.log_softmax.int, F.log_softmax, aten._log_softmax.default)
def _softmax(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op).lstrip("_")
    a = A.bind(_SIGNATURES.get(op, A.sig_softmax), args, kwargs, name)
    mt = a["input"]
    s = mt._storage
    ndim = len(s.shape)
    dim = a["dim"]
    if dim is None:  # F.softmax's legacy implicit dim (torch warns there too)
        dim = F._get_softmax_dim(name, ndim, 3)
    if "half_to_float" in a:
        dtype = torch.float32 if a["half_to_float"] else None
    else:
        dtype = A.check_dtype(a["dtype"], name)
    compute = dtype or s.values.dtype
    if not (compute.is_floating_point or compute.is_complex):
        raise TypeError(f"{name}(): expected a floating point MaskedTensor, got {compute}; "
                        f"pass dtype=torch.float32")
    dims = A.one_dim(dim, ndim, name)
    log = name == "log_softmax"
    wide, narrow = accumulate(compute)  # Note [Half precision accumulates in float32]
    if s.index and narrow is None and compute is s.values.dtype and _records_one_node(op, mt):
        g = layouts.group_by(s, dims, True)
        if g.source is s and g.kind != "dense" and not s.layout.reduction.get(KEYS[name]):
            return _SOFTMAX_APPLY(mt, g, log)
    return run(op, name, k_softmax, mt, dims, True, wide if narrow else dtype, log,
               narrow=narrow)


def _records_one_node(op: Any, mt: MaskedTensor) -> bool:
    """True where a Python-level softmax of ``mt`` is recorded eagerly: grad mode on, ``mt``
    requires grad, no tracer (Note [A sparse softmax as one node])."""
    return (not is_aten(op) and torch.is_grad_enabled() and requires_grad_of(mt)
            and not torch.compiler.is_compiling() and not _func.active()
            and not mt._storage.values.is_complex())


class _SparseSoftmax(torch.autograd.Function):
    """Note [A sparse softmax as one node]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    A sparse MaskedTensor's softmax under autograd (graph attention's, once per layer) is
    recorded as one node whose backward is the softmax family's own
    (``kernels.masked_softmax_backward``: native passes on CPU), as the per-head product
    is (``_PerHeadProduct``): through ``on_values`` it would be a node around an inner graph
    of the family's node, and on a small graph building and running that graph cost more
    than the kernels. The values are the generic route's: the same grouping, the same
    family forward (``kernels.masked_softmax``). It applies where that route would take the
    family with nothing between: a sparse layout without its own softmax kernel, grouped
    in place (not through a COO copy), values of the result's dtype. With
    ``create_graph=True`` the backward is ``on_values``' own (Note [Double backward]).
    Recorded only eagerly, outside torch.func transforms (``_records_one_node``), so it is a
    plain Function applied without torch's per-call binding (``_SOFTMAX_APPLY``).
    """

    @staticmethod
    def forward(ctx, mt: MaskedTensor, g: Grouping, log: bool) -> Any:  # type: ignore[override]
        s = mt._storage
        out, zeroed = kernels.masked_softmax(g, s.values, s.mask, log)
        out = g.restore(mark_zero_filled(out, s.mask) if zeroed else zero_fill(out, s.mask))
        ctx.mt, ctx.g, ctx.log, ctx.out = mt, g, log, out
        return _wrap(out)

    @staticmethod
    def backward(ctx, grad: Any) -> tuple:
        mt, g, out = ctx.mt, ctx.g, ctx.out
        if out is None:  # freed by an earlier backward without retain_graph
            raise RuntimeError(_FREED)
        if not torch._C._autograd._get_current_graph_task_keep_graph():
            ctx.mt = ctx.g = ctx.out = None  # what the graph holds goes with it, as torch's
        if torch.is_grad_enabled():  # create_graph=True
            name = "log_softmax" if ctx.log else "softmax"
            extra = (KEYS[name], k_softmax, g.dims, True, (None, ctx.log))
            return (*_backward_with_graph(_reduce, extra, [mt], [out], [grad]), None, None)
        values = kernels.masked_softmax_backward(g, out.values, out.mask,
                                                 grad_values(grad, out), ctx.log)
        return _wrap(mt._storage.with_values(values)), None, None


_SOFTMAX_APPLY = super(torch.autograd.Function, _SparseSoftmax).apply  # _FunctionBase.apply
