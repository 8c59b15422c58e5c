"""Every tensor the library keeps -- 0-d fills, all-True masks, index facts, line
arguments -- belongs to one device: nothing built for the CPU leaks into another device's
computation (``host_sync.one_device``).

The same reductions run on the CPU first (which fills every table kept for it: the 0-d
fill constants, the native kernels' line arguments, the index facts), then on the ``meta``
device (shapes only, no data: a second device every machine has) with a check that no aten
call meets tensors of two devices, a 0-d CPU constant included. The strided layout runs the
whole public op; the sparse layouts, whose index facts read the data, run the kernel
families on groups given as meta tensors (the record a custom op takes).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from host_sync import one_device

import layouts
import masked_sparse as ms
from layouts import kernels
from layouts.kernels import Groups

META = torch.device("meta")
OPS = {
    "sum": lambda x: (x.sum(1), x.sum()), "mean": lambda x: (x.mean(0), x.mean()),
    "var": lambda x: (x.var(1), x.var()), "amax": lambda x: (x.amax(0), x.amax()),
    "prod": lambda x: (x.prod(1),), "logsumexp": lambda x: (x.logsumexp(1),),
    "softmax": lambda x: (x.softmax(1), x.log_softmax(0)),
    "argmax": lambda x: (x.argmax(1), x.argmax(), x.max(0).values),
    "norm": lambda x: (torch.linalg.vector_norm(x, dim=1),), "cumsum": lambda x: (x.cumsum(0),),
}


def _strided(device: torch.device, grad: bool) -> ms.MaskedTensor:
    data = torch.arange(20.0, device=device).reshape(4, 5).sin()
    mask = (torch.arange(20, device=device).reshape(4, 5) % 3) != 0
    mt = ms.masked_tensor(data, mask)
    return mt.requires_grad_() if grad else mt


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("op", list(OPS))
def test_strided_reductions_keep_to_their_device(op, grad):
    for device in (torch.device("cpu"), META):  # the CPU's tables first
        mt = _strided(device, grad)
        with one_device():
            outs = OPS[op](mt)
            for out in outs:
                s = out._storage
                assert s.values.device == s.mask.device == device, (op, device)
                if grad and out.requires_grad:
                    (g,) = torch.autograd.grad(out, mt, torch.ones_like(out))
                    assert g._storage.values.device == device


def _groups(kind: str, device: torch.device, n: int = 12) -> Groups:
    if kind == "all":
        return Groups(n, positions=torch.arange(n, device=device))
    if kind == "lines":
        return Groups(n, offsets=torch.tensor([0, 5, 5, 12], device=device),
                      which=torch.tensor([0, 2], device=device),
                      positions=torch.arange(n, device=device) % 4)
    return Groups(n, index=torch.arange(n, device=device) % 3, n=3,
                  positions=torch.arange(n, device=device) // 3)


FAMILIES = {
    "reduce": lambda g, v, m: [kernels.masked_reduce(g, v, m, op)
                               for op in ("sum", "sumsq", "prod", "amax", "amin")],
    "moments": lambda g, v, m: [*kernels.masked_mean(g, v, m)[:1],
                                *kernels.masked_var(g, v, m, 1.0)[:2]],
    "logsumexp": lambda g, v, m: [kernels.masked_logsumexp(
        g, v, m, torch.ones(g.n, dtype=torch.bool, device=v.device))],
    "softmax": lambda g, v, m: [kernels.masked_softmax(g, v, m, log)[0]
                                for log in (False, True)],
    "arg_extreme": lambda g, v, m: [kernels.masked_arg_extreme(g, v, m, "amax")[0]],
    "cumsum": lambda g, v, m: [kernels.cumsum_lines(v, g.offsets)] if g.offsets is not None
    else [],
}


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch-ops"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("kind", ["all", "lines", "scatter"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_kernel_families_keep_to_their_device(family, kind, grad, native):
    for device in (torch.device("cpu"), META):  # the CPU's tables first
        g = _groups(kind, device)
        values = torch.linspace(-2, 3, 12, dtype=torch.float64, device=device)
        values = values.requires_grad_(grad)
        mask = torch.arange(12, device=device) % 4 != 1
        with contextlib.nullcontext() if native else layouts.native_disabled(), one_device():
            outs = FAMILIES[family](g, values, mask)
            for out in outs:
                assert out.device == device
                if grad and out.requires_grad:
                    (grad_values,) = torch.autograd.grad(out, values, torch.ones_like(out),
                                                         retain_graph=True)
                    assert grad_values.device == device


def test_the_check_can_fail():
    with pytest.raises(AssertionError, match="two devices"):
        with one_device():
            torch.zeros(3, device=META) + torch.ones(3).sum()  # a 0-d CPU tensor


@pytest.mark.parametrize("layout", ["strided", "sparse_coo"])
def test_positions_of_no_dim_follow_the_values(layout):
    """A reduction over no dim (a 0-d input's median, argmax) reads every element at
    position 0: that 0 is built on the values' device (on CUDA a CPU one was indexed by a
    CUDA index: ``median`` along a dim raised)."""
    lay = layouts.get_layout(layout)
    values = torch.empty(1 if layout == "sparse_coo" else (), device=META)
    mask = torch.ones(values.shape, dtype=torch.bool, device=META)
    index = (torch.zeros(0, 1, dtype=torch.long, device=META),) if layout == "sparse_coo" \
        else ()
    g = layouts.group_by(lay.build(index, values, mask, ()), (), False)
    assert g.positions().device == META
