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

import math
from typing import Any

import torch
import torch.nn.functional as F

from layouts import Grouping, Storage

from . import reductions_args as A
from .reductions import _full, fill, register, run, source


def k_softmax(g: Grouping, dtype: torch.dtype | None, log: bool) -> Storage:
    """Unspecified elements read -inf (they weigh nothing), then the layout's plain softmax;
    fully masked slices (0/0 there) and every unspecified element end as 0, masked."""
    v, m = source(g, dtype)
    out = g.softmax(fill(v, m, -math.inf), log)
    return g.restore(torch.where(m, out, _full(0, out)))


def _softmax_impl(name: str, log: bool, sig: Any) -> Any:
    def impl(args: tuple, kwargs: dict, autograd: bool) -> Any:
        a = A.bind(sig, args, kwargs, name)
        mt = a["input"]
        dim = a["dim"]
        if dim is None:  # F.softmax's legacy implicit dim (torch warns there too)
            dim = F._get_softmax_dim(name, mt.dim(), 3)
        if "half_to_float" in a:
            dtype = torch.float32 if a["half_to_float"] else None
        else:
            dtype = A.check_dtype(a["dtype"], name)
        compute = dtype or mt.dtype
        if not (compute.is_floating_point or compute.is_complex):
            raise TypeError(f"{name}(): expected a floating point MaskedTensor, got {compute}; "
                            f"pass dtype=torch.float32")
        dims = A.one_dim(dim, mt.dim(), name)
        return run(k_softmax, mt, dims, True, dtype, log, autograd=autograd)

    return impl


aten = torch.ops.aten
for _name, _log in (("softmax", False), ("log_softmax", True)):
    register(_softmax_impl(_name, _log, A.sig_softmax),
             [getattr(torch, _name), getattr(torch.Tensor, _name),
              getattr(torch.special, _name)],
             [getattr(aten, _name).int])
    register(_softmax_impl(_name, _log, A.sig_functional_softmax), [getattr(F, _name)], [])
    register(_softmax_impl(_name, _log, A.sig_aten_softmax), [],
             [getattr(aten, "_" + _name).default])
