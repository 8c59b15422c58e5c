"""The device plumbing of the tests (``pytest --device``) and ops that follow their input's
device.

A CUDA run cannot happen here, so two checks stand in for it on the CPU:

- conftest's :class:`~conftest.OnDevice` routes tensors built by test code to the device
  under test and leaves those built inside the library alone (checked with ``meta``);
- :class:`LibraryDefault` plays the user whose default device is not the input's: every
  tensor ``layouts`` / ``masked_sparse`` build without ``device=`` lands on ``meta``, so an
  op that forgets its input's device returns (or mixes in) a meta tensor, where on CUDA it
  would return a CPU tensor or raise a device mismatch.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import DEVICE, OnDevice, device_absent, make_masked
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

import layouts
import layouts._native as native
import masked_sparse as ms
from masked_sparse._tensor import _wrap

pytestmark = pytest.mark.device_generic


class LibraryDefault(TorchFunctionMode):
    """Factory calls made by ``layouts`` / ``masked_sparse`` without ``device=`` build on
    ``device`` (meta): what a default device other than the input's does to them."""

    def __init__(self, device: str = "meta") -> None:
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = sys._getframe(1).f_globals.get("__name__", "")
        if (func in _device_constructors() and kwargs.get("device") is None
                and name.startswith(("layouts", "masked_sparse"))):
            kwargs = {**kwargs, "device": self.device}
        return func(*args, **kwargs)


def _devices(x) -> set[str]:
    """The device types of every tensor a result holds (a MaskedTensor's storage too)."""
    if isinstance(x, (tuple, list)):
        return set().union(*(_devices(y) for y in x))
    if isinstance(x, ms.MaskedTensor):
        s = x._storage
        return {t.device.type for t in (*s.index, s.values, s.mask)}
    return {x.device.type} if isinstance(x, torch.Tensor) else set()


# -- the plumbing ---------------------------------------------------------------------------
def test_test_code_builds_on_the_device_and_the_library_keeps_its_default():
    with OnDevice(torch.device("meta")):
        assert torch.zeros(2).device.type == "meta"
        assert torch.tensor([1, 2]).device.type == "meta"
        g = torch.Generator().manual_seed(0)
        drawn = torch.rand(3, generator=g)  # a CPU generator still works; same numbers
        assert drawn.device.type == "meta"
        assert torch.zeros(2, device="cpu").device.type == "cpu"
        leaf = torch.randn(3, requires_grad=True)  # drawn on the CPU, a leaf on the device
        assert leaf.device.type == "meta" and leaf.is_leaf and leaf.requires_grad
        library = {"__name__": "layouts.some_module", "torch": torch}
        exec("made = torch.zeros(2)", library)
        assert library["made"].device.type == "cpu"
    with OnDevice(torch.device("meta")), OnDevice(torch.device("meta")):
        # A test's own OnDevice within --device's: the outer one sees the library too.
        exec("made = torch.zeros(2)", library)
        assert library["made"].device.type == "cpu"
        assert torch.zeros(2).device.type == "meta"


def test_make_masked_builds_on_the_device_asked_for(device):
    mt, data, mask = make_masked((3, 4), device="meta")
    assert _devices(mt) == {"meta"} and data.device.type == mask.device.type == "meta"
    coo, data, mask = make_masked((3, 4), torch.sparse_coo, seed=1)  # the device under test
    assert device == DEVICE and _devices(coo) == {device.type}
    assert data.device == torch.empty(0, device=device).device  # cuda and cuda:0 alike
    # The same seed gives the same numbers wherever the tensor is built.
    cpu = make_masked((3, 4), device="cpu")[1]
    assert torch.equal(cpu, make_masked((3, 4), device="cpu")[1])


def test_an_absent_device_is_a_skip_with_its_reason():
    assert device_absent(torch.device("cpu")) is None
    if not torch.cuda.is_available():
        why = device_absent(torch.device("cuda"))
        assert why is not None and "--device cuda" in why and "is_available() is False" in why


# -- ops follow their input's device --------------------------------------------------------
@pytest.fixture
def library_on_meta(monkeypatch):
    """No native kernel (they take CPU tensors only); library factories default to meta."""
    monkeypatch.setattr(native, "_library", lambda: None)
    with LibraryDefault("meta"):
        yield


def _coo3():
    data = torch.arange(24.0, device=DEVICE).reshape(2, 3, 4)
    return ms.masked_tensor(data, data % 3 != 0).to_sparse_coo()


FOLLOW = {
    "clip_grad_norm_ of no specified entry": lambda: _clip_nothing(),
    "cummax of a 0-d tensor": lambda: torch.cummax(
        ms.masked_tensor(torch.tensor(1.0, device=DEVICE),
                         torch.tensor(True, device=DEVICE)), 0),
    "coo[list]": lambda: _coo3()[[0, 1]],
    "coo.permute (sparse dims reordered)": lambda: _coo3().permute(1, 0, 2),
    "csr repr (coordinates of stored elements)": lambda: repr(
        ms.masked_tensor(torch.eye(3, device=DEVICE),
                         torch.eye(3, device=DEVICE) > 0).to_sparse_csr()),
}


def _clip_nothing():
    p = torch.nn.Parameter(torch.zeros(3, device=DEVICE))
    p.grad = ms.masked_tensor(torch.zeros(3, device=DEVICE),
                              torch.zeros(3, dtype=torch.bool, device=DEVICE))
    return ms.optim.clip_grad_norm_([p], 1.0)


@pytest.mark.parametrize("case", list(FOLLOW))
def test_tensors_an_op_builds_follow_its_input(library_on_meta, case):
    out = FOLLOW[case]()
    assert _devices(out) <= {DEVICE.type}, (case, _devices(out))


# -- what torch lacks on a device -----------------------------------------------------------
def test_a_kernel_torch_lacks_on_the_device_names_the_op_the_device_and_the_way_out():
    """torch has no sparse CSR matmul on meta (as it lacks kernels on CUDA for some ops and
    dtypes): the error names the masked op, the device and the CPU as the way out."""
    idx = torch.zeros(2, 5, dtype=torch.long, device="meta")
    lay = layouts.get_layout("sparse_coo")
    coo = _wrap(lay.build((idx,), torch.zeros(5, device="meta"),
                          torch.ones(5, dtype=torch.bool, device="meta"), (3, 4)))
    with pytest.raises(NotImplementedError, match=r"^matmul on meta: .*aten::addmm.*"
                                                  r"mt\.cpu\(\)"):
        coo @ torch.zeros(4, 2, device="meta")


def test_other_errors_and_cpu_errors_pass_through_unchanged():
    from masked_sparse._device import missing_kernel

    meta, cpu = torch.empty(0, device="meta"), torch.empty(0, device="cpu")
    lacking = NotImplementedError("Could not run 'aten::x' with arguments from the 'SparseCPU'")
    assert missing_kernel(torch.sum, (cpu,), lacking) is None  # the CPU has every op
    assert missing_kernel(torch.sum, (meta,), ValueError("sum: bad dim 3")) is None
    assert missing_kernel(torch.sum, ([meta],), lacking) is not None  # a list of operands
