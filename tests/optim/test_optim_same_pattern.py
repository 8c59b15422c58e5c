"""ms.optim over MaskedTensor parameters whose gradient has their pattern (Note [Gradients
over the parameter's pattern]): strided, COO, CSR.

Reference: the torch.optim class (``foreach=True``) on the dense weights, given the gradient
where the mask is specified and 0 elsewhere. Every torch optimizer is elementwise, so on
the specified entries its parameters are what the masked step must give; the unspecified
entries of a lazy step do not move (Note [Lazy updates]), so the reference puts them back
after each of its steps (weight decay would move them) and they must equal their start
exactly.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from optim_configs import CONFIGS
from torch.profiler import profile

import layouts
import masked_sparse as ms

ROWS, COLS, STEPS = 24, 20, 6

def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(ROWS, COLS, generator=g)
    mask = torch.rand(ROWS, COLS, generator=g) < 0.3
    weights = [torch.randn(ROWS, COLS, generator=g) for _ in range(STEPS)]
    return start, mask, weights


def _reference(torch_cls, kwargs, start, mask, weights):
    w = torch.nn.Parameter(start.clone())
    opt = torch_cls([w], foreach=True, **kwargs)
    for weight in weights:
        w.grad = torch.where(mask, weight, 0.0)
        opt.step()
        with torch.no_grad():
            w[~mask] = start[~mask]  # a lazy step leaves them; torch's decay would not
    return w.detach()


def _masked_run(cls, kwargs, start, mask, weights, data_fill=float("nan"),
                layout=torch.strided):
    # NaN under the mask: unspecified values must reach neither the step nor the result.
    data = torch.where(mask, start, start)  # a copy
    param = torch.nn.Parameter(ms.to_layout(ms.masked_tensor(data, mask), layout))
    opt = cls([param], **kwargs)
    for weight in weights:
        opt.zero_grad()
        (param * weight.masked_fill(~mask, data_fill)).sum().backward()
        assert ms.is_masked_tensor(param.grad) and param.grad.layout == layout
        assert param.grad._storage.mask is param._storage.mask
        opt.step()
    return param, opt


@pytest.mark.parametrize("layout", [torch.strided, torch.sparse_coo, torch.sparse_csr],
                         ids=["strided", "coo", "csr"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_masked_parameter_matches_torch_on_dense_weights(config, layout):
    cls, torch_cls, kwargs = CONFIGS[config]
    start, mask, weights = _data()
    ref = _reference(torch_cls, kwargs, start, mask, weights)
    param, _ = _masked_run(cls, kwargs, start, mask, weights, layout=layout)
    got = param.detach().to_tensor(0)
    got = got.to_dense() if got.layout != torch.strided else got
    torch.testing.assert_close(got[mask], ref[mask], rtol=1e-5, atol=1e-5)
    assert not torch.equal(got[mask], start[mask])
    if layout == torch.strided:
        assert torch.equal(param._storage.values.detach()[~mask], start[~mask])  # held


@pytest.mark.parametrize("layout", [torch.strided, torch.sparse_csr], ids=["strided", "csr"])
@pytest.mark.parametrize("config", ["adam", "sgd-momentum-decay", "adagrad", "adamw"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "native off"])
def test_masked_step_is_torch_multi_tensor_step(config, layout, native):
    """The step runs torch's foreach kernels on the values, no masked op per element; SGD
    with momentum on the CPU runs the native one-pass step instead (Note [SGD momentum in
    one pass]): no torch op on the values at all."""
    cls, _, kwargs = CONFIGS[config]
    start, mask, weights = _data(1)
    param, opt = _masked_run(cls, kwargs, start, mask, weights[:2], layout=layout)
    (param * weights[2]).sum().backward()
    with contextlib.nullcontext() if native else layouts.native_disabled():
        with profile() as prof:
            opt.step()
    names = {e.name for e in prof.events()}
    if native and "momentum" in kwargs and layouts.native_status().startswith("available"):
        assert not any(n.startswith("aten::_foreach_") for n in names), sorted(names)
        assert not names & {"aten::where", "aten::bitwise_and", "aten::clone",
                            "aten::copy_", "aten::add", "aten::mul"}, sorted(names)
    else:
        assert any(n.startswith("aten::_foreach_") for n in names), sorted(names)
    assert "PythonSubclass" not in names  # no MaskedTensor op in the step


def test_state_nonzero_outside_the_mask_takes_the_lazy_path():
    """A state that is not 0 where the parameter is unspecified (written under another mask)
    must not decay there: the step falls back to the lazy path, exact on those entries."""
    start, mask, weights = _data(2)
    param = ms.masked_tensor(start.clone(), mask)
    grad = ms.masked_tensor(weights[0], mask)
    exp_avg = torch.randn(ROWS, COLS)  # nonzero everywhere
    exp_avg_sq = torch.rand(ROWS, COLS)
    m0, v0 = exp_avg.clone(), exp_avg_sq.clone()
    step = torch.tensor(3.0)
    ms.optim.functional.adam([param], [grad], [exp_avg], [exp_avg_sq], [], [step],
                             amsgrad=False, beta1=0.9, beta2=0.999, lr=0.1, weight_decay=0,
                             eps=1e-8, maximize=False)
    values = param._storage.values
    assert torch.equal(exp_avg[~mask], m0[~mask])
    assert torch.equal(exp_avg_sq[~mask], v0[~mask])
    assert torch.equal(values[~mask], start[~mask])
    # The specified entries: Adam's step from the given state, derived here.
    m = m0 * 0.9 + weights[0] * 0.1
    v = v0 * 0.999 + weights[0] ** 2 * 0.001
    bc1, bc2 = 1 - 0.9 ** 4, 1 - 0.999 ** 4
    expected = start - 0.1 / bc1 * m / (v.sqrt() / bc2 ** 0.5 + 1e-8)
    torch.testing.assert_close(values[mask], expected[mask], rtol=1e-5, atol=1e-6)


def test_gradient_with_another_mask_is_lazy():
    """A gradient over a different mask object updates only where both are specified."""
    start, mask, weights = _data(3)
    gmask = mask & (torch.rand(ROWS, COLS, generator=torch.Generator().manual_seed(9)) < 0.5)
    param = torch.nn.Parameter(ms.masked_tensor(start.clone(), mask))
    opt = ms.optim.SGD([param], lr=0.5)
    param.grad = ms.masked_tensor(weights[0], gmask)
    opt.step()
    got = param._storage.values.detach()
    torch.testing.assert_close(got, torch.where(gmask, start - 0.5 * weights[0], start))
