"""MaskedTensor parameters whose gradient's mask equals the parameter's but is another tensor
(after a collective, after clipping, set by hand), changes in place, or differs.

References: the same optimizer given a gradient that shares the parameter's mask and index
objects (autograd's, the multi-tensor path), and ``torch.optim`` (``foreach=True``) on the
dense weights given the gradient where both masks hold and 0 elsewhere, every entry outside
them (values and states) put back after each step -- the lazy rule, Note [Lazy updates].
Every optimizer here is elementwise, so the comparisons are bit for bit. Each test runs the
CPU path and the device path (``_scatter.on_cpu`` off: no mask comparison, Note [Equal masks
without a host sync]).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from optim_configs import CONFIGS
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

import layouts
import masked_sparse as ms
from masked_sparse.optim import _scatter

ROWS, COLS, STEPS = 16, 12, 5
LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr}

@pytest.fixture(params=["cpu path", "device path"])
def path(request, monkeypatch):
    if request.param == "device path":
        monkeypatch.setattr(_scatter, "on_cpu", lambda t: False)
    return request.param


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(ROWS, COLS, generator=g)
    mask = torch.rand(ROWS, COLS, generator=g) < 0.5
    weights = [torch.randn(ROWS, COLS, generator=g) for _ in range(STEPS)]
    return start, mask, weights


def _param(start: torch.Tensor, mask: torch.Tensor, layout: str) -> torch.nn.Parameter:
    data = start.masked_fill(~mask, float("nan"))  # unspecified values reach no step
    return torch.nn.Parameter(ms.to_layout(ms.masked_tensor(data, mask), LAYOUTS[layout]))


def _copy_pattern(grad: ms.MaskedTensor) -> ms.MaskedTensor:
    """``grad`` over equal index and mask tensors that are other objects (as a collective
    or a hand-made gradient gives it)."""
    s = grad._storage
    clone = s.layout.build(tuple(t.clone() for t in s.index), s.values.clone(),
                           s.mask.clone(), s.shape)
    return ms.masked_tensor(s.layout.to_torch(clone, clone.values),
                            s.layout.to_torch(clone, clone.mask))


def _state(opt: torch.optim.Optimizer, param: torch.Tensor) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in opt.state[param].items()}


def _run(cls, kwargs, start, mask, weights, layout, grad_of):
    """``(values, state)`` after one step per weight; ``grad_of(param, weight)`` sets the
    gradient."""
    param = _param(start, mask, layout)
    opt = cls([param], **kwargs)
    for weight in weights:
        opt.zero_grad()
        grad_of(param, weight)
        opt.step()
    return param._storage.values.detach().clone(), _state(opt, param)


def _autograd(param, weight):
    (param * weight).sum().backward()
    assert param.grad._storage.mask is param._storage.mask


def _distinct(param, weight):
    _autograd(param, weight)
    param.grad = _copy_pattern(param.grad)
    assert param.grad._storage.mask is not param._storage.mask


def _assert_same(got, ref):
    values, state = got
    ref_values, ref_state = ref
    assert torch.equal(values.nan_to_num(7.0), ref_values.nan_to_num(7.0))
    assert state.keys() == ref_state.keys()
    for key, value in ref_state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key
        else:
            assert state[key] == value, key


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_equal_but_distinct_mask_gives_the_shared_mask_numbers(config, layout, path):
    cls, _, kwargs = CONFIGS[config]
    start, mask, weights = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's CSR "beta" warning
        shared = _run(cls, kwargs, start, mask, weights, layout, _autograd)
        distinct = _run(cls, kwargs, start, mask, weights, layout, _distinct)
    _assert_same(distinct, shared)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("config", ["adam", "sgd-momentum-decay", "adagrad", "adamw"])
def test_equal_but_distinct_mask_takes_the_multi_tensor_step_on_the_cpu(config, layout):
    """On the CPU the comparison sends the pair to torch's foreach step on the stored
    values: no copy of the parameter or its states, no gather, no write back (the one
    ``where`` is the gradient's zero fill)."""
    cls, _, kwargs = CONFIGS[config]
    start, mask, weights = _data(1)
    param = _param(start, mask, layout)
    opt = cls([param], **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for weight in weights[:2]:
            opt.zero_grad()
            _distinct(param, weight)
            opt.step()
        opt.zero_grad()
        _distinct(param, weights[2])
        with profile() as prof:
            opt.step()
    names = {e.name for e in prof.events()}
    # (SGD with momentum on the CPU: the native one-pass step, no torch op on the values,
    # Note [SGD momentum in one pass])
    one_pass = "momentum" in kwargs and layouts.native_status().startswith("available")
    assert one_pass or any(n.startswith("aten::_foreach_") for n in names), sorted(names)
    assert not names & {"aten::clone", "aten::index_select", "aten::index_copy_",
                        "aten::scatter_"}, sorted(names)
    assert not (one_pass and names & {"aten::where", "aten::bitwise_and"}), sorted(names)
    assert "PythonSubclass" not in names


class _CountEqual(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.equal.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _comparisons(opt: torch.optim.Optimizer) -> int:
    with _CountEqual() as counter:
        opt.step()
    return counter.count


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_kept_gradient_mask_is_compared_once_and_again_after_an_in_place_change(layout):
    """A gradient whose mask object comes back step after step is compared with the
    parameter's once; an in-place change of it bumps its version: compared again, and the
    step then follows the changed mask (the entries it dropped do not move)."""
    start, mask, weights = _data(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        param = _param(start, mask, layout)
        opt = ms.optim.Adam([param], lr=0.05)
        (param * weights[0]).sum().backward()
        kept = _copy_pattern(param.grad)
        ks = kept._storage
        param.grad = kept
        assert _comparisons(opt) >= 1
        for weight in weights[1:3]:
            ks.values.copy_(weight if not ks.index else weight[mask])  # new gradient values
            param.grad = kept
            assert _comparisons(opt) == 0
        before = param._storage.values.detach().clone()
        state = _state(opt, param)
        dropped = ks.mask.clone()
        dropped.view(-1)[1::2] = False  # half of the specified entries leave the gradient
        ks.mask.copy_(dropped)
        param.grad = kept
        assert _comparisons(opt) >= 1
    ps = param._storage
    gone = ps.mask & ~dropped
    assert gone.any()
    assert torch.equal(ps.values.detach()[gone], before[gone])
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[param][key][gone], state[key][gone])
    stays = ps.mask & dropped
    assert not torch.equal(ps.values.detach()[stays], before[stays])


def _lazy_reference(torch_cls, kwargs, start, mask, grads):
    """torch.optim on the dense weights, each step given the gradient where both masks
    hold and 0 elsewhere, every other entry of the weight and of the state put back."""
    w = torch.nn.Parameter(start.clone())
    opt = torch_cls([w], foreach=True, **kwargs)
    for data, gmask in grads:
        keep = mask & gmask
        before_w = w.detach().clone()
        before = {k: v.clone() for k, v in opt.state[w].items()
                  if isinstance(v, torch.Tensor) and v.shape == w.shape}
        w.grad = torch.where(keep, data, 0.0)
        opt.step()
        if not before:  # the states this step created started at their initial values
            start_sum = kwargs.get("initial_accumulator_value", 0.0)
            before = {k: torch.full_like(v, start_sum if k == "sum" else 0.0)
                      for k, v in opt.state[w].items()
                      if isinstance(v, torch.Tensor) and v.shape == w.shape}
        with torch.no_grad():
            w[~keep] = before_w[~keep]
            for key, value in before.items():
                opt.state[w][key][~keep] = value[~keep]
    return w.detach(), opt.state[w]


@pytest.mark.parametrize("grad_layout", list(LAYOUTS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_another_mask_updates_only_where_both_masks_hold(config, layout, grad_layout, path):
    cls, torch_cls, kwargs = CONFIGS[config]
    start, mask, weights = _data(3)
    g = torch.Generator().manual_seed(4)
    grads = []
    for weight in weights:
        gmask = torch.rand(ROWS, COLS, generator=g) < 0.7  # some of the parameter's, some not
        grads.append((weight, gmask))
    ref, ref_state = _lazy_reference(torch_cls, kwargs, start, mask, grads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        param = _param(start, mask, layout)
        opt = cls([param], **kwargs)
        for data, gmask in grads:
            param.grad = ms.to_layout(ms.masked_tensor(data, gmask), LAYOUTS[grad_layout])
            opt.step()
    ps = param._storage
    dense = ps.densify(ps.values.detach(), 0.0)
    assert torch.equal(dense[mask], ref[mask])
    if not ps.index:  # the unspecified entries kept their (NaN) values
        assert ps.values.detach()[~mask].isnan().all()
    for key, value in ref_state.items():
        if isinstance(value, torch.Tensor) and value.shape == ref.shape:
            got = ps.densify(opt.state[param][key], 0.0)
            assert torch.equal(got[mask], value[mask]), key
            if not ps.index:  # never written outside the mask
                assert torch.equal(opt.state[param][key][~mask], value[~mask]), key


_MOMENTUM_CONFIGS = {
    "nesterov-decay": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
    "dampening-decay-max": dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.05,
                                maximize=True),
    "foreach-off": dict(lr=0.05, momentum=0.5, foreach=False),
}


@pytest.mark.parametrize("native", [True, False], ids=["native", "native off"])
@pytest.mark.parametrize("garbage", [float("nan"), 1e30, float("-inf")])
@pytest.mark.parametrize("layout", ["strided", "csr"])
@pytest.mark.parametrize("config", list(_MOMENTUM_CONFIGS))
def test_sgd_momentum_equal_but_distinct_mask_ignores_unspecified_gradient_values(
        config, layout, garbage, native):
    """SGD with momentum, an equal-but-distinct gradient mask whose unspecified gradient
    values are garbage: against ``torch.optim.SGD`` on the dense weights with the gradient
    ``torch.where(mask, grad, 0)``, the entries outside the mask put back after each step
    (the lazy rule); the garbage never reaches a parameter or the momentum buffer."""
    kwargs = _MOMENTUM_CONFIGS[config]
    start, mask, weights = _data(4)
    param = _param(start, mask, layout)
    opt = ms.optim.SGD([param], **kwargs)
    dense = torch.nn.Parameter(start.clone())
    ref = torch.optim.SGD([dense], **{"foreach": True, **kwargs})
    with warnings.catch_warnings(), (contextlib.nullcontext() if native
                                     else layouts.native_disabled()):
        warnings.simplefilter("ignore")
        for weight in weights:
            opt.zero_grad()
            values = torch.where(mask, weight, garbage)
            grad = ms.to_layout(ms.masked_tensor(values, mask.clone()), LAYOUTS[layout])
            param.grad = grad
            opt.step()
            dense.grad = torch.where(mask, weight, 0.0)
            ref.step()
            with torch.no_grad():
                dense[~mask] = start[~mask]
                ref.state[dense]["momentum_buffer"][~mask] = 0
    got = ms.to_layout(param.detach(), torch.strided)._storage
    buf = opt.state[param]["momentum_buffer"]
    assert torch.equal(got.mask, mask)
    torch.testing.assert_close(got.values[mask], dense.detach()[mask], rtol=0, atol=0)
    if layout == "strided":
        assert got.values[~mask].isnan().all()  # the parameter's own unspecified values
        assert torch.equal(buf, ref.state[dense]["momentum_buffer"])
    assert buf.isfinite().all()
