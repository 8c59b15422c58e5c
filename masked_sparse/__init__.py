"""masked_sparse: masked semantics as a first-class part of PyTorch.

A :class:`MaskedTensor` holds data and a bool mask (True = specified) in strided, sparse
COO or sparse CSR storage -- or any layout registered with :mod:`layouts` -- and every op
keeps that storage's compression. The API mirrors ``torch.masked``.

>>> import torch, masked_sparse as ms
>>> mt = ms.masked_tensor(torch.tensor([[0., 2.], [3., 0.]]),
...                       torch.tensor([[False, True], [True, False]])).to_sparse_csr()
>>> mt.sqrt().to_tensor(0).to_dense()
tensor([[0.0000, 1.4142],
        [1.7321, 0.0000]])
"""

from torch.distributed import is_available as _dist_available

from layouts import set_product_density_threshold

from . import _collate, functional, ops, optim  # noqa: F401  (ops registers the op tables)
from ._autograd import lift
from ._construct import as_masked_tensor, masked_tensor
from ._masking import masked_invalid, masked_where
from ._serialize import _rebuild_masked  # noqa: F401  (allow-listed for torch.load)
from ._tensor import MaskedTensor, is_masked_tensor, layout_of

# torch.masked's functional API at ms.sum, ms.softmax, ...: attributes, not in __all__, so that
# ``from masked_sparse import *`` never shadows the builtins sum / min / max.
from .functional import (  # noqa: F401
    amax,
    amin,
    argmax,
    argmin,
    cumprod,
    cumsum,
    log_softmax,
    logsumexp,
    mean,
    median,
    norm,
    normalize,
    prod,
    softmax,
    softmin,
    std,
    sum,
    var,
)
from .interop import from_numpy, from_scipy, to_numpy, to_scipy
from .ops.attention import attention
from .ops.conversion import get_data, get_mask, to_layout, to_tensor
from .ops.sampled import sampled_matmul

if _dist_available():  # torch imports torch.distributed already: registering costs nothing
    from . import distributed  # noqa: F401  (torch.distributed's calls on MaskedTensors)

__all__ = [
    "MaskedTensor",
    "as_masked_tensor",
    "attention",
    "from_numpy",
    "from_scipy",
    "get_data",
    "get_mask",
    "is_masked_tensor",
    "layout_of",
    "lift",
    "masked_invalid",
    "masked_tensor",
    "masked_where",
    "sampled_matmul",
    "set_product_density_threshold",
    "to_layout",
    "to_numpy",
    "to_scipy",
    "to_tensor",
]
