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

from layouts import Grouping, Storage, kernels

from .._fill import mark_zero_filled, zero_fill
from .._registry import implements, op_name
from . import reductions_args as A
from .reductions import accumulate, run, source


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
    wide, narrow = accumulate(compute)  # Note [Half precision accumulates in float32]
    return run(op, name, k_softmax, mt, dims, True, wide if narrow else dtype,
               name == "log_softmax", narrow=narrow)
