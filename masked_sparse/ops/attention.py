"""Masked attention through torch's fused kernel: :func:`attention`.

Note [Attention through the fused kernel]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``softmax(as_masked_tensor(q @ k.mT * scale, mask), -1) @ v`` -- the masked softmax over the
specified keys, then the product summing over the specified weights -- is, for every query
that attends to at least one key, exactly ``F.scaled_dot_product_attention(q, k, v,
attn_mask=mask)``: SDPA's boolean mask also drops the masked keys from the softmax. The two
differ only on a query with no specified key: the masked result leaves its row unspecified,
SDPA's softmax of an all ``-inf`` row gives NaN (or 0, by kernel). :func:`attention` runs
SDPA on the mask with those rows opened (``mask | ~rows``: every key, finite values), then
zeroes their outputs with ``torch.where`` -- so their gradient is 0 and reaches neither
``q``, ``k`` nor ``v`` -- and leaves them unspecified in the result. No host sync: the
rows are a device ``any``. The fused kernel never forms the ``(..., Lq, Lk)`` scores, their
masked softmax or its backward, which is where the masked recipe spends its time
(``python -m benchmarks.bench_training_ops``).

The recipe itself is not rewritten into this call: the masked softmax is computed when it
is called (MaskedTensors are not lazy), so recognizing "a softmax whose first consumer is a
product" would mean deferring every masked softmax on the chance that a product follows,
and keeping both results alive when something else reads it. An explicit function keeps
the route visible and the recipe's semantics unchanged.

>>> import torch, masked_sparse as ms
>>> q = k = v = torch.ones(1, 2, 3)
>>> mask = torch.tensor([[True, False], [False, False]])  # query 1 attends to nothing
>>> ms.attention(q, k, v, mask)
MaskedTensor(
  [
    [
      [  1.0000,   1.0000,   1.0000],
      [      --,       --,       --]
    ]
  ]
)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import layouts

from .._construct import as_masked_tensor
from .._tensor import MaskedTensor

__all__ = ["attention"]


def _mask_of(mask: Any) -> torch.Tensor:
    if isinstance(mask, MaskedTensor):
        m = mask.get_mask()
        return m.to_dense() if m.layout != torch.strided else m
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return mask.to_dense() if mask.layout != torch.strided else mask
    raise TypeError(f"attention(): mask must be a bool tensor or a MaskedTensor (its mask is "
                    f"used), got {type(mask).__name__}"
                    + (f" of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else "")
                    + "; pass a bool mask, True where a query may attend to a key")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, *,
              scale: float | None = None) -> MaskedTensor:
    """Masked scaled dot-product attention, ``softmax(masked(q @ k.mT * scale), -1) @ v``,
    through ``F.scaled_dot_product_attention`` (Note [Attention through the fused kernel]).

    Parameters
    ----------
    query, key, value : Tensor
        Plain tensors ``(..., Lq, E)``, ``(..., Lk, E)``, ``(..., Lk, Ev)``.
    mask : Tensor or MaskedTensor
        Bool, broadcastable to ``(..., Lq, Lk)`` (a key-padding mask ``(B, 1, 1, Lk)``, a pair
        mask ``(B, 1, Lq, Lk)``), True where a query may attend to a key; a MaskedTensor's
        mask is used (the scores' mask of the recipe).
    scale : float, optional
        Defaults to ``1 / sqrt(E)``, as SDPA's.

    Returns
    -------
    MaskedTensor
        Strided, ``(..., Lq, Ev)``: a query's row is specified iff it attends to at least one
        key. Values and gradients of ``query``, ``key``, ``value`` equal the masked recipe's.

    >>> import torch, masked_sparse as ms
    >>> q = torch.randn(2, 4, 8)
    >>> keys = torch.tensor([[True, True, False, False], [True, True, True, True]])
    >>> ms.attention(q, q, q, keys[:, None, :]).shape
    torch.Size([2, 4, 8])
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if isinstance(x, MaskedTensor) or not isinstance(x, torch.Tensor):
            raise TypeError(f"attention(): {name} must be a plain Tensor, got "
                            f"{type(x).__name__}; pass .to_tensor(0) of a MaskedTensor, or "
                            f"mask the scores with the mask argument")
    # The mask at its stored size: a mask expanded over heads is read once, not per head.
    allowed = layouts.broadcast_part(_mask_of(mask))
    rows = allowed.any(-1, keepdim=True)  # queries that attend to something
    opened = allowed | ~rows  # an empty row attends everywhere: finite, zeroed below
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=opened, scale=scale)
    rows = torch.broadcast_to(rows, out.shape[:-1] + (1,))
    out = torch.where(rows, out, out.new_zeros(()))
    return as_masked_tensor(out, rows.expand(out.shape))
