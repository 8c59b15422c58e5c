"""Shared fixtures: the layouts under test, a masked-tensor factory and invariant checks.

Every test builds its inputs with :func:`make_masked`, which returns the MaskedTensor *and*
its dense reference (data, mask), so each op can be checked against the same computation
done densely with ``torch.where``.

``pytest --device DEVICE`` (default ``cpu``) runs the device-generic modules -- those whose
``pytestmark`` holds ``device_generic`` -- on ``DEVICE``: :func:`make_masked` builds there,
and every tensor a test builds without ``device=`` lands there too (:class:`OnDevice`),
so each op is compared against a dense reference on the same device. Elsewhere, and for
tests marked ``cpu_only`` (native kernels, numpy / scipy interop, gloo), the run skips with
the reason; where the device is absent (``--device cuda`` without CUDA) everything skips,
so CI stays green. Tensors made inside ``layouts`` / ``masked_sparse`` keep torch's default
device, so an op that forgets ``device=`` fails on the device as it would for a user.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

import layouts
import masked_sparse as ms

settings.register_profile("fast", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr]
LAYOUT_IDS = ["strided", "coo", "csr"]
#: Every built-in layout: LAYOUTS and the two added through the registry (CSC, BSR).
ALL_LAYOUTS = [*LAYOUTS, torch.sparse_csc, torch.sparse_bsr]
ALL_LAYOUT_IDS = [*LAYOUT_IDS, "csc", "bsr"]
FLOAT_DTYPES = [torch.float32, torch.float64]


# -- the device under test ------------------------------------------------------------------
#: The device tests build on: ``--device`` (``cpu`` unless given). Set by pytest_configure.
DEVICE = torch.device("cpu")
DEVICE_ENV = "MASKED_SPARSE_TEST_DEVICE"  # tells subprocesses (the tutorials) the device
_LIBRARY = ("layouts", "masked_sparse")
_RANDOM = {torch.rand, torch.randn, torch.randint, torch.randperm}


class OnDevice(TorchFunctionMode):
    """Factory calls made by test code without ``device=`` build on ``device``.

    Random tensors are drawn on the CPU and moved, so a seed gives the same numbers on every
    device (and a CPU ``torch.Generator`` keeps working). torch's own Python code counts as
    its caller's (``nn.Linear(...)`` in a test builds there, as under
    ``torch.set_default_device``). Calls from ``layouts`` / ``masked_sparse`` are left
    alone: a tensor an op builds must follow its input's device explicitly, as it must for a
    user whose default device is the CPU.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in _device_constructors() and kwargs.get("device") is None
                and not _caller_module().startswith(_LIBRARY)):
            if func in _RANDOM:  # a leaf that requires grad stays a leaf, on the device
                requires_grad = kwargs.pop("requires_grad", False)
                return func(*args, **kwargs).to(self.device).requires_grad_(requires_grad)
            kwargs = {**kwargs, "device": self.device}
        return func(*args, **kwargs)


def _caller_module() -> str:
    """The module of the code that called a factory, past torch's own Python frames and
    those of an ``OnDevice`` nested in this one (a test's own, within ``--device``'s)."""
    frame = sys._getframe(2)  # 0: this function, 1: __torch_function__
    while frame is not None and (frame.f_globals.get("__name__", "").startswith("torch")
                                 or frame.f_code is OnDevice.__torch_function__.__code__):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")


def device_absent(device: torch.device) -> str | None:
    """Why tests cannot run on ``device`` here, or None when they can."""
    if device.type in ("cpu", "meta"):
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "is_available") or not backend.is_available():
        return (f"--device {device}: torch.{device.type}.is_available() is False on this "
                f"machine (torch {torch.__version__}); run without --device for the CPU")
    return None


def pytest_addoption(parser):
    parser.addoption("--device", default=None,
                     help="device the device-generic tests build on (default: cpu); e.g. cuda")


def pytest_configure(config):
    global DEVICE
    config.addinivalue_line("markers", "device_generic: the module's tests take --device")
    config.addinivalue_line("markers", "cpu_only(reason): runs only with --device cpu")
    given = config.getoption("device")
    DEVICE = torch.device(given or "cpu")
    if given is not None and device_absent(DEVICE) is None:
        DEVICE = torch.empty(0, device=DEVICE).device  # with its index: cuda -> cuda:0
        # An explicit --device (cpu too: the plumbing's own check) routes test code's
        # factories there for the whole session, module-level constants included.
        mode = OnDevice(DEVICE)
        mode.__enter__()
        config._masked_sparse_device_mode = mode
        os.environ[DEVICE_ENV] = str(DEVICE)


def pytest_unconfigure(config):
    mode = getattr(config, "_masked_sparse_device_mode", None)
    if mode is not None:
        mode.__exit__(None, None, None)


def pytest_collection_modifyitems(config, items):
    if DEVICE.type == "cpu":
        return
    absent = device_absent(DEVICE)
    for item in items:
        if absent is not None:
            item.add_marker(pytest.mark.skip(reason=absent))
        elif item.get_closest_marker("device_generic") is None:
            item.add_marker(pytest.mark.skip(
                reason=f"--device {DEVICE}: this module runs on the cpu only (no "
                       "device_generic mark)"))
        elif (mark := item.get_closest_marker("cpu_only")) is not None:
            why = mark.args[0] if mark.args else "needs the cpu"
            item.add_marker(pytest.mark.skip(reason=f"--device {DEVICE}: cpu only: {why}"))


#: torch's text for a kernel that asserted on the device (CUDA, and HIP builds of torch).
DEVICE_ASSERT = "device-side assert triggered"


def _device_asserted(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a device-side assert."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if DEVICE_ASSERT in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Stop the run after the first test whose kernel asserted on the device.

    A device-side assert loses the CUDA context: every later test that touches the device
    would fail with the same error, burying the one that caused it. The test's own failure
    is reported as usual (and written to ``--junitxml``); then the run stops, naming it.
    """
    report = yield
    if call.excinfo is not None and _device_asserted(call.excinfo.value):
        item.session.shouldfail = (
            f"device-side assert in {item.nodeid}: the CUDA context is lost; every later test "
            "would fail. Fix or deselect it and rerun")
    return report


@pytest.fixture
def device() -> torch.device:
    """The device under test (``--device``, default cpu)."""
    return DEVICE


def cpu_only(reason: str):
    """Mark a test that only makes sense on the CPU (native kernels, numpy, scipy, gloo)."""
    return pytest.mark.cpu_only(reason)


def layout_params():
    return pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)


def random_values(shape, dtype, generator) -> torch.Tensor:
    """Random data of any dtype, away from 0 so that log/div/etc. stay finite."""
    cpu = {"generator": generator, "device": "cpu"}
    if dtype == torch.bool:
        return torch.rand(shape, **cpu) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.rand(shape, dtype=torch.float64, **cpu) * 1.8 + 0.1
        x = x * torch.where(torch.rand(shape, **cpu) > 0.5, 1.0, -1.0)
        if dtype.is_complex:
            x = torch.complex(x, torch.rand(shape, dtype=torch.float64, **cpu))
        return x.to(dtype)
    low = 0 if dtype == torch.uint8 else -9
    return torch.randint(low, 10, shape, **cpu).to(dtype)


def make_masked(shape, layout=torch.strided, dtype=torch.float32, density=0.6, seed=0,
                stored_masked=0.3, data=None, mask=None, device=None):
    """A MaskedTensor of ``layout`` and its dense reference ``(mt, data, mask)``, all on
    ``device`` (default: the device under test, ``--device``).

    For sparse layouts a fraction ``stored_masked`` of the stored entries have mask False
    (stored but unspecified), so that tests exercise the authoritative-mask semantics.
    The random numbers are drawn on the CPU: a seed gives the same tensor on every device.
    """
    device = DEVICE if device is None else torch.device(device)
    g = torch.Generator().manual_seed(seed)
    if data is None:
        data = random_values(shape, dtype, g)
    if mask is None:
        mask = torch.rand(shape, generator=g, device="cpu") < density
    data, mask = data.to(device), mask.to(device)
    if layout == torch.strided:
        return ms.masked_tensor(data, mask), data, mask
    stored = mask | (torch.rand(shape, generator=g, device="cpu") < stored_masked).to(device)
    sparse_mask = _to_layout(torch.where(stored, mask, False), stored, layout)
    zero = torch.zeros((), dtype=dtype, device=device)
    sparse_data = _to_layout(torch.where(stored, data, zero), stored, layout)
    return ms.masked_tensor(sparse_data, sparse_mask), data, mask


def make_masked_in(shape, layout, seed=0, dtype=torch.float32, **kw):
    """:func:`make_masked` in any built-in layout: CSC and BSR (1x1 blocks) are converted from
    the CSR one, so they store the same entries."""
    if layout in (torch.sparse_csc, torch.sparse_bsr):
        mt, data, mask = make_masked(shape, torch.sparse_csr, seed=seed, dtype=dtype, **kw)
        out = mt.to_sparse_csc() if layout == torch.sparse_csc else mt.to_sparse_bsr((1, 1))
        return out, data, mask
    return make_masked(shape, layout, seed=seed, dtype=dtype, **kw)


def where0(data: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``data`` where ``mask``, else 0: the dense reference of ``mt.to_tensor(0)``."""
    return torch.where(mask, data, torch.zeros((), dtype=data.dtype, device=data.device))


def _to_layout(dense: torch.Tensor, stored: torch.Tensor, layout) -> torch.Tensor:
    """``dense`` as a torch sparse tensor storing exactly the ``stored`` positions."""
    idx = stored.nonzero().t()
    coo = torch.sparse_coo_tensor(idx, dense[stored], dense.shape,
                                  device=dense.device).coalesce()
    return coo if layout == torch.sparse_coo else coo.to_sparse_csr()


def dense_of(mt: ms.MaskedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense data (0 where unstored) and mask of a MaskedTensor, without using its ops."""
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def check_invariants(mt: ms.MaskedTensor, layout=None) -> None:
    """The storage's full invariants, and the layout it reports."""
    s = mt._storage
    s.layout.validate(s, full=True)
    assert s.mask.dtype == torch.bool
    assert s.values.shape == s.mask.shape
    assert mt.shape == s.shape
    if layout is not None:
        assert mt.layout == layout
        assert s.layout is layouts.get_layout(layout)


def assert_masked_equal(mt, data, mask, *, rtol=None, atol=None, equal_nan=True) -> None:
    """``mt`` specifies exactly ``mask`` and agrees with ``data`` there, on ``data``'s
    device."""
    assert isinstance(mt, ms.MaskedTensor), type(mt)
    got_data, got_mask = dense_of(mt)
    assert got_data.device == data.device == got_mask.device, (got_data.device, data.device)
    assert torch.equal(got_mask, mask.expand(got_mask.shape)), (got_mask, mask)
    ref = torch.where(mask, data, torch.zeros((), dtype=data.dtype, device=data.device))
    got = torch.where(got_mask, got_data,
                      torch.zeros((), dtype=got_data.dtype, device=got_data.device))
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=equal_nan)


@pytest.fixture
def fresh_dynamo():
    """A clean torch.compile state around a test (graphs, guards and caches reset), with
    Dynamo's cache chatter silenced."""
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo / AOT cache chatter
        yield
    torch._dynamo.reset()
