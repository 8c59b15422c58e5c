"""``DistributedDataParallel`` over models with masked or sparse-gradient parameters.

Note [DDP and masked parameters]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch's DDP copies every gradient into flat dense buckets (its C++ reducer) and broadcasts
the initial parameters through flattened buffers (``_broadcast_coalesced``): neither can
carry a mask, and its sparse-gradient path needs torch's sparse all-reduce, which gloo has
and NCCL does not (pytorch#111422). So the parameters whose gradients are masked or sparse
(MaskedTensor parameters; ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True``) are
handed to DDP as *ignored* (``_ddp_params_and_buffers_to_ignore``) and synchronized here:
broadcast from rank 0 at construction, and :func:`sync_grads` at the end of every backward
(an autograd callback, queued when the gradient reaches the model's output, so every rank
runs it in the same order after DDP has launched its buckets). The dense parameters keep
DDP's buckets and overlap. :class:`DistributedDataParallel` does all of it;
:func:`split_for_ddp` + :func:`broadcast_parameters` + :func:`sync_grads` is the same recipe
by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP
from torch.utils._pytree import tree_flatten

from .._tensor import MaskedTensor
from . import _torch_api  # noqa: F401  (torch.distributed.broadcast of a MaskedTensor)
from ._grads import sync_grads

_SPARSE_MODULES = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def split_for_ddp(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Hand DDP the dense parameters; return the others, for :func:`sync_grads`.

    MaskedTensor parameters and the weights of ``nn.Embedding`` / ``nn.EmbeddingBag``
    with ``sparse=True`` are marked as ignored by ``torch.nn.parallel.DistributedDataParallel``
    (Note [DDP and masked parameters]). Call it before wrapping ``module``.

    Example (every rank)::

        sparse = msd.split_for_ddp(model)        # before DDP(model)
        msd.broadcast_parameters(sparse)         # DDP broadcasts only the others
        ddp = DistributedDataParallel(model)
        loss_fn(ddp(x), y).backward()
        msd.sync_grads(sparse)                   # DDP reduced the dense ones
        opt.step()
    """
    names, ours = [], []
    for mod_name, mod in module.named_modules():
        for name, p in mod.named_parameters(recurse=False):
            if isinstance(p, MaskedTensor) or (isinstance(mod, _SPARSE_MODULES) and mod.sparse):
                # DDP matches root-level names as ".name" in one place and "name" in
                # another (torch/nn/parallel/distributed.py): give both.
                names += [f"{mod_name}.{name}"] + ([] if mod_name else [name])
                ours.append(p)
    ignored = getattr(module, "_ddp_params_and_buffers_to_ignore", [])
    _TorchDDP._set_params_and_buffers_to_ignore_for_model(module, sorted(set(ignored) | set(names)))
    return ours


def broadcast_parameters(params: Iterable[torch.Tensor], src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameter values to every rank, in place (masked ones included).

    A MaskedTensor parameter goes through ``torch.distributed.broadcast`` itself, whose
    masked handler (``_torch_api``) writes rank ``src``'s values and mask into it in its
    own layout; ``p.data`` would not do: it is another wrapper of the same storage.
    """
    with torch.no_grad():
        for p in params:
            dist.broadcast(p if isinstance(p, MaskedTensor) else p.data, src, group=group)


class DistributedDataParallel(_TorchDDP):
    """torch's DDP for models that hold MaskedTensor or sparse-gradient parameters.

    Takes torch's arguments. The dense parameters go through DDP's buckets; the masked and
    sparse ones (:func:`split_for_ddp`) are broadcast from rank 0 here and their gradients
    are synchronized by :func:`sync_grads` at the end of every backward, with DDP's
    convention (sum over ranks / world size) and staying sparse. Parameters and gradients
    are therefore identical on every rank after each backward, as with torch's DDP.

    Example (every rank, ``torchrun --nproc-per-node 2 train.py``)::

        model = msd.DistributedDataParallel(Recommender())
        opt = ms.optim.Adagrad(model.parameters(), lr=0.1)
        loss_fn(model(ids, offsets), y).backward()      # all gradients synchronized
        opt.step()
    """

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        split = split_for_ddp(module)
        super().__init__(module, *args, **kwargs)
        self._split_params = split
        self._sync_queued = False
        broadcast_parameters(split, group=self.process_group)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        if self._split_params and torch.is_grad_enabled():
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._queue_sync)
        return out

    def _queue_sync(self, grad: torch.Tensor) -> torch.Tensor:
        if not self._sync_queued:
            self._sync_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync)
        return grad

    def _sync(self) -> None:
        self._sync_queued = False
        sync_grads(self._split_params, group=self.process_group)
