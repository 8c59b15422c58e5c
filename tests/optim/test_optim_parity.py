"""ms.optim against torch: dense parity (bitwise), SparseAdam, SGD's stateless sparse step.

References are torch's own optimizers run in the same test: on dense gradients every
ms.optim optimizer must compute *exactly* what the torch.optim class with the same
arguments computes (Note [Dense gradients]); ``ms.optim.SparseAdam`` must compute what
``torch.optim.SparseAdam`` computes on the COO form of the gradient, whatever its layout.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from conftest import make_masked

import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ROWS, DIM = 12, 6

# name -> (ms class, torch class, kwargs); every option of each optimizer appears.
DENSE_CONFIGS = {
    "sgd": (ms.optim.SGD, torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum": (ms.optim.SGD, torch.optim.SGD,
                     dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov": (ms.optim.SGD, torch.optim.SGD,
                     dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                          maximize=True)),
    "adagrad": (ms.optim.Adagrad, torch.optim.Adagrad,
                dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    "adagrad-max": (ms.optim.Adagrad, torch.optim.Adagrad, dict(lr=0.1, maximize=True, eps=1e-6)),
    "adam": (ms.optim.Adam, torch.optim.Adam, dict(lr=0.05, weight_decay=0.01, amsgrad=True)),
    "adam-max": (ms.optim.Adam, torch.optim.Adam,
                 dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, maximize=True)),
    "adam-lr-tensor": (ms.optim.Adam, torch.optim.Adam, dict(lr=torch.tensor(0.01))),
    "adamw": (ms.optim.AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
    "adamw-amsgrad": (ms.optim.AdamW, torch.optim.AdamW,
                      dict(lr=0.05, amsgrad=True, maximize=True)),
}
SHAPES = [(8, 5), (5,), (3, 4, 2), (1,)]


def mlp_params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def dense_grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def run_dense(cls, kwargs: dict, steps: int = 6, params=None, opt=None, first: int = 0):
    params = mlp_params() if params is None else params
    opt = cls(params, **kwargs) if opt is None else opt
    for s in range(first, first + steps):
        for p, g in zip(params, dense_grads(s)):
            p.grad = g
        opt.step()
    return params, opt


def assert_same_run(params, opt, ref_params, ref_opt) -> None:
    for p, q in zip(params, ref_params):
        assert torch.equal(p, q)
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert set(state) == set(ref_state)
        for key, value in ref_state.items():
            assert torch.equal(torch.as_tensor(state[key]), torch.as_tensor(value)), key


@pytest.mark.parametrize("switch", [{}, {"foreach": False}, {"foreach": True}, {"fused": True}],
                         ids=["default", "loop", "foreach", "fused"])
@pytest.mark.parametrize("config", list(DENSE_CONFIGS))
def test_dense_gradients_equal_torch_bitwise(config, switch, device):
    cls, ref_cls, kwargs = DENSE_CONFIGS[config]
    if "lr-tensor" in config and switch.get("foreach"):
        pytest.skip("torch refuses a Tensor lr with foreach=True")
    if switch.get("fused") and ref_cls is torch.optim.Adagrad and device.type != "cpu":
        pytest.skip(f"torch.optim.Adagrad has a fused kernel on the cpu only, not on {device}")
    mine = run_dense(cls, {**kwargs, **switch})
    ref = run_dense(ref_cls, {**kwargs, **switch})
    assert_same_run(*mine, *ref)


@pytest.mark.parametrize("config", ["sgd-nesterov", "adagrad", "adam", "adamw-amsgrad"])
def test_ms_default_equals_torch_default(config):
    """ms.optim's default (foreach on CPU) computes torch.optim's default (a loop on CPU)."""
    cls, ref_cls, kwargs = DENSE_CONFIGS[config]
    assert_same_run(*run_dense(cls, kwargs), *run_dense(ref_cls, kwargs))


@pytest.mark.parametrize("config", ["sgd-momentum", "adagrad", "adam", "adamw-amsgrad"])
def test_dense_state_dict_round_trip_and_exchange_with_torch(config):
    cls, ref_cls, kwargs = DENSE_CONFIGS[config]
    params, opt = run_dense(cls, kwargs, steps=3)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    for target_cls in (cls, ref_cls):  # ms -> ms and ms -> torch
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        other = target_cls(copies, **kwargs)
        other.load_state_dict(copy.deepcopy(loaded))
        run_dense(target_cls, kwargs, steps=3, params=copies, opt=other, first=3)
        if target_cls is cls:
            ref_params, ref_opt = copies, other
    run_dense(cls, kwargs, steps=3, params=params, opt=opt, first=3)
    assert_same_run(params, opt, ref_params, ref_opt)
    for p, q in zip(params, copies):  # the torch optimizer that loaded ms's state
        assert torch.equal(p, q)


def test_bad_switches():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(RuntimeError, match="fused.*foreach"):
        ms.optim.Adam(p, foreach=True, fused=True)
    with pytest.raises(NotImplementedError, match="differentiable"):
        ms.optim.SGD(p, differentiable=True)


# -- a model with sparse and dense gradients in one optimizer -----------------------------------
def test_embedding_and_linear_in_one_adagrad_match_torch():
    torch.manual_seed(0)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(torch.nn.ModuleDict({"emb": torch.nn.Embedding(30, 4, sparse=True),
                                           "lin": torch.nn.Linear(4, 2)}))
    opts = [ms.optim.Adagrad(models[0].parameters(), lr=0.1),
            torch.optim.Adagrad(models[1].parameters(), lr=0.1)]
    g = torch.Generator().manual_seed(3)
    for _ in range(8):
        idx = torch.randint(30, (10,), generator=g)
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model["lin"](model["emb"](idx)).pow(2).sum().backward()
            opt.step()
    # The embedding's rows differ in rounding (coalescing order), and so the Linear's
    # gradients that follow from them: close, not bitwise.
    torch.testing.assert_close(models[0].state_dict(), models[1].state_dict())


# -- SGD without momentum on COO gradients: torch's own step -------------------------------------
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
def test_stateless_sgd_on_coo_equals_torch_bitwise(hybrid, maximize):
    g = torch.Generator().manual_seed(7)
    start = torch.randn(ROWS, DIM, generator=g)
    params = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    opts = [ms.optim.SGD(params[:1], lr=0.1, maximize=maximize),
            torch.optim.SGD(params[1:], lr=0.1, maximize=maximize)]
    for _ in range(5):
        if hybrid:
            grad = torch.sparse_coo_tensor(torch.randint(ROWS, (1, 15), generator=g),
                                           torch.randn(15, DIM, generator=g), (ROWS, DIM))
        else:
            grad = torch.sparse_coo_tensor(torch.stack([torch.randint(ROWS, (15,), generator=g),
                                                        torch.randint(DIM, (15,), generator=g)]),
                                           torch.randn(15, generator=g), (ROWS, DIM))
        assert not grad.is_coalesced()
        for p, opt in zip(params, opts):
            p.grad = grad
            opt.step()
    assert torch.equal(params[0], params[1])
    assert not torch.equal(params[0], start)


# -- SparseAdam ------------------------------------------------------------------------------------
def embedding_grads(steps: int, scale: float, hybrid: bool = True, seed: int = 0):
    """Uncoalesced embedding-style COO gradients with values of magnitude ~``scale``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        rows = torch.randint(ROWS, (10,), generator=g)
        values = torch.randn(10, DIM, generator=g) * scale
        grad = torch.sparse_coo_tensor(rows[None], values, (ROWS, DIM))
        if not hybrid:
            grad = grad.coalesce().to_dense().to_sparse()  # one index per element
        out.append(grad)
    return out


def run(cls, kwargs, grads, start=None):
    p = torch.nn.Parameter(torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(9))
                           if start is None else start.clone())
    opt = cls([p], **kwargs)
    for grad in grads:
        p.grad = grad
        opt.step()
    return p.detach(), opt


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
@pytest.mark.parametrize("kwargs", [dict(lr=0.01), dict(lr=0.05, betas=(0.8, 0.99), eps=1e-7,
                                                        maximize=True)], ids=["default", "max"])
@pytest.mark.parametrize("scale", [1e-7, 1.0])
def test_sparse_adam_equals_torch_sparse_adam(scale, kwargs, hybrid):
    """The case that showed the problem: embedding gradients of ~1e-7, next to eps."""
    grads = embedding_grads(8, scale, hybrid)
    mine, opt = run(ms.optim.SparseAdam, kwargs, grads)
    ref, ref_opt = run(torch.optim.SparseAdam, kwargs, grads)
    torch.testing.assert_close(mine, ref, rtol=1e-6, atol=0)
    (state,), (ref_state,) = opt.state.values(), ref_opt.state.values()
    assert state["step"] == ref_state["step"] == 8 and isinstance(state["step"], int)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(state[key], ref_state[key], rtol=1e-6, atol=0)


def test_adam_is_not_sparse_adam_on_tiny_gradients():
    """ms.optim.Adam keeps dense Adam's eps placement: on ~1e-7 gradients it differs from
    SparseAdam by a large fraction of lr (docs/optimizers.md), SparseAdam does not."""
    grads = embedding_grads(8, 1e-7)
    ref, _ = run(torch.optim.SparseAdam, dict(lr=0.01), grads)
    adam, _ = run(ms.optim.Adam, dict(lr=0.01), grads)
    sparse_adam, _ = run(ms.optim.SparseAdam, dict(lr=0.01), grads)
    assert float((adam - ref).abs().max()) / 0.01 > 0.1
    assert float((sparse_adam - ref).abs().max()) / 0.01 < 1e-4


def run_functional(grads, lr):
    """``ms.optim.functional.sparse_adam`` steps from run()'s start, default betas/eps."""
    p = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(9))
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for step, grad in enumerate(grads, 1):
        ms.optim.functional.sparse_adam([p], [grad], [m], [v], [step], eps=1e-8, beta1=0.9,
                                        beta2=0.999, lr=lr, maximize=False)
    return p


def grad_forms(mask: torch.Tensor, data: torch.Tensor, seed: int) -> dict:
    """One gradient (specified where ``mask``) in every form ms.optim takes."""
    strided = ms.masked_tensor(data, mask)
    coo = torch.sparse_coo_tensor(mask.nonzero().t(), data[mask], data.shape).coalesce()
    forms = {"torch coo": coo, "torch csr": coo.to_sparse_csr(),
             "torch csc": coo.to_sparse_csc(), "masked strided": strided,
             "masked coo": make_masked(data.shape, torch.sparse_coo, data=data, mask=mask,
                                       seed=seed)[0],
             "masked csr": make_masked(data.shape, torch.sparse_csr, data=data, mask=mask,
                                       seed=seed)[0],
             "masked csc": ms.to_layout(strided, torch.sparse_csc),
             "masked bsr": ms.to_layout(strided, torch.sparse_bsr, blocksize=(2, 3))}
    return forms


def test_sparse_adam_every_gradient_form_equals_torch_on_coo():
    steps = []
    for s in range(6):
        g = torch.Generator().manual_seed(200 + s)
        mask = torch.rand(ROWS, DIM, generator=g) < 0.4
        data = (torch.randn(ROWS, DIM, generator=g) * 1e-3).masked_fill(~mask, float("nan"))
        steps.append(grad_forms(mask, data, s))
    ref, _ = run(torch.optim.SparseAdam, dict(lr=0.01), [f["torch coo"] for f in steps])
    for form in steps[0]:
        if form in ("torch csr", "torch csc"):  # torch refuses them as .grad of a dense param
            mine = run_functional([f[form] for f in steps], lr=0.01)
        else:
            mine, _ = run(ms.optim.SparseAdam, dict(lr=0.01), [f[form] for f in steps])
        torch.testing.assert_close(mine, ref, rtol=1e-6, atol=0, msg=form)
    # A torch BSR gradient specifies its whole stored blocks (zeros included): the
    # reference is torch on the COO form of the same blocks.
    bsr = [f["torch coo"].to_dense().to_sparse_bsr((2, 3)) for f in steps]
    ref, _ = run(torch.optim.SparseAdam, dict(lr=0.01), [b.to_sparse_coo() for b in bsr])
    torch.testing.assert_close(run_functional(bsr, lr=0.01), ref, rtol=1e-6, atol=0)
    # A dense gradient is specified everywhere (torch.optim.SparseAdam raises on it).
    dense = [torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    mine, _ = run(ms.optim.SparseAdam, dict(lr=0.01), dense)
    ref, _ = run(torch.optim.SparseAdam, dict(lr=0.01), [d.to_sparse() for d in dense])
    torch.testing.assert_close(mine, ref, rtol=1e-6, atol=0)


def test_sparse_adam_masked_parameter_updates_only_specified_entries():
    start = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(4))
    pmask = torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(5)) < 0.5
    param = ms.masked_tensor(start.clone(), pmask, requires_grad=True)
    opt = ms.optim.SparseAdam([param], lr=0.1)
    ((param * 2.0).sum()).backward()
    opt.step()
    values = param._storage.values.detach()
    assert torch.equal(values[~pmask], start[~pmask])
    torch.testing.assert_close(values[pmask], start[pmask] - 0.1)


def test_sparse_adam_state_dict_moves_to_and_from_torch():
    grads = embedding_grads(6, 1e-3)
    for first, second in [(ms.optim.SparseAdam, torch.optim.SparseAdam),
                          (torch.optim.SparseAdam, ms.optim.SparseAdam)]:
        p, opt = run(first, dict(lr=0.01), grads[:3])
        q = torch.nn.Parameter(p.clone())
        other = second([q], lr=0.01)
        other.load_state_dict(copy.deepcopy(opt.state_dict()))
        ref, _ = run(torch.optim.SparseAdam, dict(lr=0.01), grads)
        for grad in grads[3:]:
            q.grad = grad
            other.step()
        torch.testing.assert_close(q.detach(), ref, rtol=1e-6, atol=0)


def test_sparse_adam_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kwargs, word in [(dict(lr=0.0), "learning rate"), (dict(eps=0.0), "epsilon"),
                         (dict(betas=(0.9, 1.0)), "beta")]:
        with pytest.raises(ValueError, match=word):
            ms.optim.SparseAdam(p, **kwargs)
