"""A guard that fails a test when an op would make a CUDA device sync with the host, run on
the CPU: a ``TorchDispatchMode`` raising on the aten ops whose CUDA kernels read a value on
the host or size their output by the data. (A shared guard for the whole suite may replace
this module; its one entry point is :func:`forbid_host_sync`.)

>>> import torch
>>> with forbid_host_sync():
...     _ = torch.arange(3.0) * 2
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# aten ops whose CUDA kernel waits for the device: a value read on the host, or an output
# size only the data decides.
_SYNCING = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.nonzero.default,
            aten.equal.default, aten.masked_select.default, aten._unique.default,
            aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
            aten._coalesce.default, aten.bincount.default, aten._to_sparse.default,
            aten._to_sparse_csr.default}
_BOOL_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


class HostSyncError(AssertionError):
    """An op that would sync a CUDA device with the host ran under :func:`forbid_host_sync`."""


class _ForbidHostSync(TorchDispatchMode):
    """Raise on an aten op that would sync a CUDA device with the host; ``allowed`` tensors
    (CPU step counters) may be read."""

    def __init__(self, allowed: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.allowed = {id(t) for t in allowed}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        syncs = func in _SYNCING
        if func is aten._local_scalar_dense.default and id(args[0]) in self.allowed:
            syncs = False
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            syncs = True
        if func in _BOOL_INDEXED and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                         for i in args[1] if i is not None):
            syncs = True
        if syncs:
            raise HostSyncError(f"{func} syncs the host")
        return func(*args, **kwargs)


@contextlib.contextmanager
def forbid_host_sync(allowed: tuple[torch.Tensor, ...] = ()):
    """Raise :class:`HostSyncError` on any syncing aten op inside the block; reading one of
    ``allowed`` (CPU tensors such as an optimizer's step counters) is no device sync."""
    with _ForbidHostSync(allowed):
        yield
