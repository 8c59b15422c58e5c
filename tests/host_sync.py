"""Checks that code on the device path never waits on the device: :func:`no_host_sync`, and
:func:`native_off` (the device path on the CPU).

The rule (docs/design.md): nothing on an op's path syncs with the host on a non-CPU device
-- no ``.item()`` / ``bool(t)`` / ``int(t)``, ``.tolist()``, ``nonzero``, ``torch.equal``,
``unique``, ``masked_select``, ``repeat_interleave`` without ``output_size``, ``bincount``,
no indexing by a bool mask -- unless the result's shape needs it. On the CPU nothing
syncs, so the check watches the ops go by instead: a ``TorchDispatchMode`` that records
every aten call of those kinds (and a ``TorchFunctionMode`` for ``tolist`` / ``numpy``,
which reach no aten op). The mode declares ``observes_only`` (Note [Observing modes] in
``layouts/kernels/_route.py``): the library takes the route it takes without it, while its
CPU-only shortcuts (the native kernels, host reads keyed to the CPU) step aside as for any
mode -- what runs is the path of every other device. On CUDA the same block also runs under
``torch.cuda.set_sync_debug_mode("error")``, which catches what the watch cannot see.

Use (from any test folder: ``tests`` is on the path)::

    from host_sync import native_off, no_host_sync

    def test_sum_never_syncs(native_off):
        mt = ...; torch.sum(mt, 1)  # warm: index facts built (a first call may sync)
        with no_host_sync(mt.device):
            torch.sum(mt, 1)

:func:`forbid_host_sync` raises :class:`HostSyncError` at the syncing call itself instead
(``allowed``: CPU tensors whose reads are no device sync, an optimizer's step counters).

>>> with forbid_host_sync():
...     _ = torch.arange(3.0) * 2
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import layouts

aten = torch.ops.aten

#: aten overloads whose every call reads device data on the host or sizes its output by it
SYNCING = {
    aten._local_scalar_dense.default: ".item() / bool() / int() / float() of a tensor",
    aten.is_nonzero.default: "bool() of a tensor",
    aten.nonzero.default: "nonzero",
    aten.argwhere.default: "argwhere",
    aten.equal.default: "torch.equal",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    aten.unique_dim_consecutive.default: "unique_consecutive",
    aten.masked_select.default: "masked_select",
    aten.bincount.default: "bincount (its length is read from the data)",
    aten._coalesce.default: "coalesce (its nnz is read from the data)",
    aten._to_sparse.default: "to_sparse (its nnz is read from the data)",
    aten._to_sparse_csr.default: "to_sparse_csr (its nnz is read from the data)",
}
_REPEAT = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_INDEX = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
          aten._index_put_impl_.default}
_HOST = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy",
         torch.Tensor.__bool__: "bool() of a tensor", torch.Tensor.item: ".item()"}
_PACKAGES = ("/layouts/", "/masked_sparse/")


def _where() -> str:
    """The innermost line of the library on the stack (what to fix), else the caller's."""
    frames = traceback.extract_stack()[:-3]
    for frame in reversed(frames):
        if any(p in frame.filename for p in _PACKAGES):
            return f"{frame.filename.split('/')[-2]}/{frame.filename.split('/')[-1]}:" \
                   f"{frame.lineno} ({frame.name})"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}"


def _why(func: Any, args: tuple, kwargs: dict) -> str | None:
    why = SYNCING.get(func)
    if why is not None:
        return why
    if func in _REPEAT:
        size = kwargs.get("output_size", args[3] if len(args) > 3 else None)
        return None if size is not None else "repeat_interleave without output_size"
    if func in _INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices or ()):
            return "indexing by a bool mask (a nonzero)"
    return None


class HostSyncError(AssertionError):
    """An op that would sync a device with the host ran under :func:`forbid_host_sync`."""


class HostSyncCheck(TorchDispatchMode):
    """Records the aten calls of :data:`SYNCING` (and their kin) made while active, with
    where the library made them (``strict``: raises :class:`HostSyncError` at the call).
    Reading one of ``allowed`` (CPU tensors) is no device sync. Observes only: the route the
    library takes is the one it takes without this mode (Note [Observing modes])."""

    observes_only = True

    def __init__(self, allowed: tuple[torch.Tensor, ...] = (), strict: bool = False) -> None:
        super().__init__()
        self.found: list[str] = []
        self.allowed, self.strict = {id(t) for t in allowed}, strict

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _why(func, args, kwargs)
        if why is not None and not (func is aten._local_scalar_dense.default
                                    and id(args[0]) in self.allowed):
            self.found.append(f"{why}: {func} at {_where()}")
            if self.strict:
                raise HostSyncError(f"{func} syncs the host ({why}) at {_where()}")
        return func(*args, **kwargs)


class _HostReads(TorchFunctionMode):
    """``tolist`` / ``numpy`` / ``bool()`` / ``item()`` on tensors (``tolist`` and
    ``numpy`` reach no aten op on the CPU)."""

    def __init__(self, check: HostSyncCheck) -> None:
        super().__init__()
        self.check = check

    def __torch_function__(self, func, types, args=(), kwargs=None):
        why = _HOST.get(func)
        if why is not None:
            self.check.found.append(f"{why} at {_where()}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_sync(device: torch.device | str | None = None) -> Iterator[HostSyncCheck]:
    """Within the block, no op syncs with the host: an ``AssertionError`` at its end lists
    every syncing call and the library line that made it. On CUDA the block also runs
    under ``torch.cuda.set_sync_debug_mode("error")`` (a sync raises where it happens)."""
    check = HostSyncCheck()
    cuda = device is not None and torch.device(device).type == "cuda"
    before = torch.cuda.get_sync_debug_mode() if cuda else None
    if cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        with _HostReads(check), check:
            yield check
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(before)
    if check.found:
        raise AssertionError("the device path synced with the host:\n  "
                             + "\n  ".join(dict.fromkeys(check.found)))


@contextlib.contextmanager
def forbid_host_sync(allowed: tuple[torch.Tensor, ...] = ()) -> Iterator[HostSyncCheck]:
    """Raise :class:`HostSyncError` on any syncing aten op inside the block, where it is
    made; reading one of ``allowed`` (CPU tensors such as an optimizer's step counters) is
    no device sync."""
    with HostSyncCheck(allowed, strict=True) as check:
        yield check


@pytest.fixture
def native_off() -> Iterator[None]:
    """The native kernels off for the test (``layouts.native_disabled()``): on the CPU the
    torch-op implementation runs, the path every other device takes."""
    with layouts.native_disabled():
        yield


class DeviceMixCheck(TorchDispatchMode):
    """Records the aten calls that take tensors of more than one device (a 0-d CPU
    constant next to tensors of another device included): a constant the library kept, or
    built without ``device=``, leaking into another device's computation. Observes only."""

    observes_only = True

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device for t in _tensors(args) + _tensors(tuple(kwargs.values()))}
        if len(devices) > 1:
            self.found.append(f"{func} on {sorted(map(str, devices))} at {_where()}")
        return func(*args, **kwargs)


def _tensors(items: tuple) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for x in items:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(tuple(x))
    return out


@contextlib.contextmanager
def one_device() -> Iterator[DeviceMixCheck]:
    """Within the block, no op mixes devices (:class:`DeviceMixCheck`): an
    ``AssertionError`` at its end lists every call that did and where."""
    check = DeviceMixCheck()
    with check:
        yield check
    if check.found:
        raise AssertionError("tensors of two devices met:\n  "
                             + "\n  ".join(dict.fromkeys(check.found)))
