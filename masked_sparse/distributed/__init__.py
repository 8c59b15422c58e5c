"""Masked collectives and data-parallel training on ``torch.distributed``.

Every function takes ``group=None`` (the default process group) like torch's, and runs on
any backend: underneath are dense collectives only (``all_gather_into_tensor`` of padded
buffers, ``all_reduce`` of dense buffers, ``broadcast``, ``scatter``), so gloo and NCCL run
the same code and a rank with nothing stored takes part like any other.

- :func:`all_reduce` ``(mt, op="sum")``: an element is specified iff some rank specifies it;
  ``sum`` / ``prod`` / ``amax`` / ``amin`` over the ranks that specify it, ``mean`` divided by
  their number. Per tensor it gathers the stored entries or all-reduces a dense buffer,
  whichever moves fewer bytes (Note [Gather or dense: the byte rule] in ``_entries``).
- :func:`all_gather`, :func:`gather`, :func:`broadcast`, :func:`scatter`: every rank's
  MaskedTensor (or one rank's), in the receiver's layout.
- :func:`sync_grads` ``(params)``: after ``backward()``, every gradient becomes the sum over
  ranks divided by the world size (DDP's convention) -- dense, torch sparse or masked, any
  layout -- and sparse ones stay sparse (Note [Gradients across ranks] in ``_grads``).
- :class:`DistributedDataParallel`: torch's DDP for models with MaskedTensor or
  sparse-gradient parameters (those are synchronized by ``sync_grads`` at the end of each
  backward; Note [DDP and masked parameters] in ``_ddp``); :func:`split_for_ddp` /
  :func:`broadcast_parameters` are the same recipe by hand, around torch's own DDP.

``torch.distributed.all_reduce`` / ``broadcast`` / ``all_gather`` / ``gather`` / ``scatter``
called on MaskedTensors run these (``import masked_sparse`` registers them; Note [Where
torch.distributed calls arrive] in ``_torch_api``).

Example (run on every rank, e.g. ``torchrun --nproc-per-node 2 script.py``)::

    import torch, torch.distributed as dist
    import masked_sparse as ms, masked_sparse.distributed as msd

    dist.init_process_group("gloo")
    r = dist.get_rank()
    mt = ms.masked_tensor(torch.tensor([1., 2., 3.]),
                          torch.tensor([True, r == 1, False])).to_sparse_coo()
    msd.all_reduce(mt, "sum")          # [2.0, 2.0, --] on every rank (world size 2)
"""

from . import _torch_api  # noqa: F401  (registers torch.distributed's calls)
from ._collectives import all_gather, all_reduce, broadcast, gather, scatter
from ._ddp import DistributedDataParallel, broadcast_parameters, split_for_ddp
from ._grads import sync_grads

__all__ = ["DistributedDataParallel", "all_gather", "all_reduce", "broadcast",
           "broadcast_parameters", "gather", "scatter", "split_for_ddp", "sync_grads"]
