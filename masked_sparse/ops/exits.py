"""Leaving the masked world for Python and numpy: ``tolist``, ``numpy``, ``__array__``,
``format``.

A MaskedTensor has no plain-number form without a choice for its unspecified elements, so
``mt.tolist()``, ``mt.numpy()`` and ``np.asarray(mt)`` raise a ``TypeError`` that names the
two exits that make the choice explicit: ``mt.to_tensor(value)`` (fill) and
``ms.to_numpy(mt)`` (a ``numpy.ma`` array). ``format(mt, spec)`` formats a 0-d MaskedTensor
like a Python number (``--`` when unspecified), as ``format(t, spec)`` does for a 0-d tensor.

>>> import torch, masked_sparse as ms
>>> f"{ms.masked_tensor(torch.tensor(2.0), torch.tensor(True)):.3f}"
'2.000'
"""

from __future__ import annotations

from typing import Any

import torch

from .._registry import implements
from .._tensor import MaskedTensor


def _no_plain_exit(what: str, filled: str) -> Any:
    def handler(op: Any, mt: MaskedTensor, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{what} on a MaskedTensor: its unspecified elements have no value; "
                        f"fill them with {filled}, or use ms.to_numpy(mt) for a "
                        f"numpy.ma.MaskedArray")

    return handler


implements(torch.Tensor.tolist)(_no_plain_exit("mt.tolist()", "mt.to_tensor(value).tolist()"))
implements(torch.Tensor.numpy)(_no_plain_exit("mt.numpy()", "mt.to_tensor(value).numpy()"))
implements(torch.Tensor.__array__)(
    _no_plain_exit("np.asarray(mt)", "np.asarray(mt.to_tensor(value))"))


@implements(torch.Tensor.__format__)
def _format(op: Any, mt: MaskedTensor, format_spec: str) -> str:
    if not format_spec:
        return str(mt)
    if mt.dim() != 0:
        raise TypeError(f"unsupported format string {format_spec!r} passed to a MaskedTensor "
                        f"of shape {tuple(mt.shape)}: only a 0-d MaskedTensor formats as a "
                        f"number, as for torch.Tensor")
    s = mt._storage
    if not bool(s.mask.reshape(-1)[0]):
        return format("--", format_spec.split(".")[0].lstrip("+- "))
    return format(s.values.reshape(-1)[0].item(), format_spec)
