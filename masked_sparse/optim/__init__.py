"""Optimizers for dense, sparse and masked gradients: ``ms.optim``.

``Adagrad``, ``SGD``, ``Adam``, ``AdamW`` and ``SparseAdam`` are ``torch.optim.Optimizer``
subclasses with torch's arguments and numbers; ``clip_grad_norm_`` / ``clip_grad_value_``
are torch's clipping functions. Gradients may be dense tensors, torch sparse COO tensors (as
``nn.Embedding(sparse=True)`` produces, uncoalesced and hybrid) or MaskedTensors of any
layout; parameters may be MaskedTensors. Sparse and masked gradients update lazily: only
the specified entries of the parameter and of the state are read and written, in
O(nnz), with torch's own numbers there, and no step syncs a CUDA device with the host.
:mod:`masked_sparse.optim.functional` has the algorithms as functions; the helpers
:func:`as_masked_grad`, :func:`read_at` and :func:`add_at_` write new ones with masked ops.

>>> import torch, masked_sparse as ms
>>> emb = torch.nn.Embedding(100, 4, sparse=True)
>>> opt = ms.optim.AdamW(emb.parameters(), lr=1e-2)
>>> emb(torch.tensor([3, 3, 50])).pow(2).sum().backward()
>>> opt.step(); opt.zero_grad()
"""

from . import functional
from ._scatter import add_at_, as_masked_grad, read_at
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .clip import clip_grad_norm_, clip_grad_value_
from .sgd import SGD
from .sparse_adam import SparseAdam

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "SparseAdam", "add_at_", "as_masked_grad",
           "clip_grad_norm_", "clip_grad_value_", "functional", "read_at"]
