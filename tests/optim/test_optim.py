"""ms.optim: equivalence with torch.optim, layout independence, lazy updates, training, state.

References are torch's own optimizers run in the same test: ``torch.optim.Adagrad`` (its
sparse path for COO gradients), ``torch.optim.SparseAdam``, ``torch.optim.SGD``, and the
dense ``Adagrad`` / ``SGD`` / ``Adam`` / ``AdamW`` on the sub-tensor of the rows a lazy step
touches.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from conftest import cpu_only, make_masked
from torch.profiler import ProfilerActivity, profile

import layouts
import masked_sparse as ms

pytestmark = pytest.mark.device_generic

ROWS, DIM = 12, 6
assert_close = torch.testing.assert_close

# name -> (ms class, torch class for dense reference, kwargs)
CONFIGS = {
    "adagrad": (ms.optim.Adagrad, torch.optim.Adagrad,
                dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    "sgd": (ms.optim.SGD, torch.optim.SGD,
            dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov": (ms.optim.SGD, torch.optim.SGD,
                     dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                          maximize=True)),
    "adam": (ms.optim.Adam, torch.optim.Adam, dict(lr=0.05, weight_decay=0.01, amsgrad=True)),
    "adamw": (ms.optim.AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
}
config_params = pytest.mark.parametrize("config", list(CONFIGS))


def coo_grad(seed: int, *, hybrid: bool, n: int = 10, rows=None) -> torch.Tensor:
    """A random *uncoalesced* COO gradient with duplicates; embedding-style if ``hybrid``."""
    g = torch.Generator().manual_seed(seed)
    if hybrid:
        pick = torch.randint(ROWS, (n,), generator=g) if rows is None else \
            rows[torch.randint(len(rows), (n,), generator=g)]
        return torch.sparse_coo_tensor(pick[None], torch.randn(n, DIM, generator=g), (ROWS, DIM))
    idx = torch.stack([torch.randint(ROWS, (n,), generator=g),
                       torch.randint(DIM, (n,), generator=g)])
    return torch.sparse_coo_tensor(idx, torch.randn(n, generator=g), (ROWS, DIM))


def initial(seed: int = 123, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(seed)).to(dtype)


def run(cls, kwargs: dict, grads: list, start: torch.Tensor | None = None):
    """``(param, state)`` after one step of ``cls`` per gradient."""
    p = torch.nn.Parameter((initial() if start is None else start).clone())
    opt = cls([p], **kwargs)
    for g in grads:
        p.grad = g
        opt.step()
    return p.detach(), opt.state[p]


# -- equivalence with torch ------------------------------------------------------------------
@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
@pytest.mark.parametrize("kwargs", [dict(lr=0.1), dict(lr=0.05, lr_decay=0.01, eps=1e-6,
                                                       initial_accumulator_value=0.3),
                                    dict(lr=0.1, maximize=True)], ids=["plain", "decay", "max"])
def test_adagrad_matches_torch_on_coo(hybrid, kwargs):
    grads = [coo_grad(s, hybrid=hybrid) for s in range(40)]
    assert not grads[0].is_coalesced()
    mine, state = run(ms.optim.Adagrad, kwargs, grads)
    ref, ref_state = run(torch.optim.Adagrad, kwargs, grads)
    assert_close(mine, ref)
    assert_close(state["sum"], ref_state["sum"])
    assert float(state["step"]) == float(ref_state["step"]) == 40


@pytest.mark.parametrize("kwargs", [dict(lr=0.1, weight_decay=0.1, lr_decay=0.01),
                                    dict(lr=0.1, maximize=True, initial_accumulator_value=1.0)])
def test_adagrad_matches_torch_on_dense(kwargs):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(ROWS, DIM, generator=g) for _ in range(30)]
    mine, state = run(ms.optim.Adagrad, kwargs, grads)
    ref, ref_state = run(torch.optim.Adagrad, kwargs, grads)
    assert_close(mine, ref)
    assert_close(state["sum"], ref_state["sum"])


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
@pytest.mark.parametrize("kwargs", [dict(lr=0.01), dict(lr=0.05, betas=(0.8, 0.99),
                                                        maximize=True)], ids=["default", "max"])
def test_adam_matches_sparse_adam_on_coo(hybrid, kwargs):
    grads = [coo_grad(s, hybrid=hybrid) for s in range(40)]
    mine, state = run(ms.optim.Adam, kwargs, grads)
    ref, ref_state = run(torch.optim.SparseAdam, kwargs, grads)
    # Note [Adam and SparseAdam]: the moments are computed alike, eps is added after the
    # bias correction (as Adam does) instead of before it: a difference of O(eps / |g|).
    assert_close(mine, ref, rtol=1e-5, atol=1e-5)
    assert_close(state["exp_avg"], ref_state["exp_avg"])
    assert_close(state["exp_avg_sq"], ref_state["exp_avg_sq"])


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
@pytest.mark.parametrize("maximize", [False, True])
def test_sgd_matches_torch_on_coo(hybrid, maximize):
    grads = [coo_grad(s, hybrid=hybrid) for s in range(30)]
    mine, _ = run(ms.optim.SGD, dict(lr=0.1, maximize=maximize), grads)
    ref, _ = run(torch.optim.SGD, dict(lr=0.1, maximize=maximize), grads)
    assert_close(mine, ref)


@pytest.mark.parametrize("config", ["sgd", "sgd-nesterov", "adam", "adamw"])
def test_matches_torch_on_dense(config):
    cls, ref_cls, kwargs = CONFIGS[config]
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(ROWS, DIM, generator=g) for _ in range(30)]
    mine, state = run(cls, kwargs, grads)
    ref, ref_state = run(ref_cls, kwargs, grads)
    assert_close(mine, ref)
    for key, value in ref_state.items():
        # ms.optim keeps the step counter on the CPU, as torch.optim does by default;
        # ``--device`` (OnDevice) moves the one torch.optim builds there: compare its value.
        assert_close(state[key], value, check_device=key != "step")


@config_params
def test_lazy_rows_match_dense_torch_on_those_rows(config):
    """A lazy step on the rows a gradient touches is the dense torch step on those rows,
    weight decay included (Note [Lazy weight decay]); the other rows never change."""
    cls, ref_cls, kwargs = CONFIGS[config]
    rows = torch.tensor([1, 4, 5, 9])
    grads = [coo_grad(s, hybrid=True, n=8, rows=rows) for s in range(25)]
    grads = [g for g in grads if torch.equal(g.coalesce().indices()[0], rows)]
    assert len(grads) > 10
    mine, _ = run(cls, kwargs, grads)
    sub, _ = run(ref_cls, kwargs, [g.coalesce().values() for g in grads],
                 start=initial()[rows])
    assert_close(mine[rows], sub)
    others = torch.ones(ROWS, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(mine[others], initial()[others])


# -- one code path: every gradient form gives the same step ------------------------------------
def masked_grads(steps: int = 12):
    """Per step: the forms of one masked gradient, with NaN at unspecified entries."""
    out = []
    for s in range(steps):
        g = torch.Generator().manual_seed(100 + s)
        data = torch.randn(ROWS, DIM, generator=g)
        mask = torch.rand(ROWS, DIM, generator=g) < 0.4
        data = data.masked_fill(~mask, float("nan"))
        strided = ms.masked_tensor(data, mask)
        forms = {"strided": strided,
                 "coo": make_masked((ROWS, DIM), torch.sparse_coo, data=data, mask=mask, seed=s)[0],
                 "csr": make_masked((ROWS, DIM), torch.sparse_csr, data=data, mask=mask, seed=s)[0],
                 "torch coo": torch.sparse_coo_tensor(mask.nonzero().t(), data[mask], (ROWS, DIM))}
        for name in ("sparse_csc", "sparse_bsr"):  # layouts registered outside the core
            try:
                layout = layouts.get_layout(name)
            except NotImplementedError:
                continue
            options = {"blocksize": (2, 3)} if name == "sparse_bsr" else {}
            forms[name] = ms.to_layout(strided, layout.torch_layout, **options)
        out.append((forms, mask))
    return out


@config_params
def test_every_gradient_form_gives_identical_parameters(config):
    cls, _, kwargs = CONFIGS[config]
    steps = masked_grads()
    results = {}
    for form in steps[0][0]:
        p, state = run(cls, kwargs, [forms[form] for forms, _ in steps])
        results[form] = (p, {k: v.clone() for k, v in state.items()})
    ref_p, ref_state = results["strided"]
    assert torch.isfinite(ref_p).all()
    for form, (p, state) in results.items():
        assert torch.equal(p, ref_p), form
        for key, value in ref_state.items():
            assert torch.equal(state[key], value), (form, key)
    # Entries that no gradient ever specified did not move (lazy updates).
    never = ~torch.stack([mask for _, mask in steps]).any(0)
    assert never.any()
    assert torch.equal(ref_p[never], initial()[never])


# -- the MaskedTensor Adagrad tutorial ---------------------------------------------------------
SEED_PARAM = [[0, 1, 1.9027, 3], [3.9015, 5, 5.9010, 7]]
SEED_SUM = [[0.5, 0.5, 9.5, 0.5], [16.5, 0.5, 25.5, 0.5]]


@pytest.mark.parametrize("form", ["strided", "coo", "csr", "torch coo"])
def test_tutorial_adagrad_numbers(form):
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    grad = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0, 5.0]), [2, 4])
    mask = grad.to_dense() != 0
    grads = {"strided": ms.masked_tensor(grad.to_dense(), mask),
             "coo": ms.masked_tensor(grad, mask.to_sparse()),
             "csr": ms.masked_tensor(grad.to_sparse_csr(), mask.to_sparse_csr()),
             "torch coo": grad}
    # torch's own sparse Adagrad on the same gradient.
    ref = torch.nn.Parameter(torch.arange(8.0).reshape(2, 4))
    opt = torch.optim.Adagrad([ref], lr=0.1, eps=1e-10, initial_accumulator_value=0.5)
    ref.grad = grad
    opt.step()
    # The functional form, as the tutorial writes it ...
    param = torch.arange(8.0).reshape(2, 4)
    state_sum = torch.full_like(param, 0.5)
    ms.optim.functional.adagrad([param], [grads[form]], [state_sum], [torch.tensor(0.0)],
                                lr=0.1, lr_decay=0, weight_decay=0, eps=1e-10, maximize=False)
    assert_close(param, ref.detach())
    assert_close(state_sum, opt.state[ref]["sum"])
    assert_close(param, torch.tensor(SEED_PARAM), atol=1e-4, rtol=0)
    assert_close(state_sum, torch.tensor(SEED_SUM))
    # ... and the optimizer class.
    mine, state = run(ms.optim.Adagrad, dict(lr=0.1, eps=1e-10, initial_accumulator_value=0.5),
                      [grads[form]], start=torch.arange(8.0).reshape(2, 4))
    assert torch.equal(mine, param)


# -- MaskedTensor parameters and gradients from autograd ----------------------------------------
@pytest.mark.parametrize("param_layout", [torch.strided, torch.sparse_coo, torch.sparse_csr],
                         ids=["strided", "coo", "csr"])
@pytest.mark.parametrize("grad_form", ["autograd", "dense", "torch coo"])
def test_masked_parameter_updates_only_specified_entries(param_layout, grad_form):
    start = initial()
    pmask = torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(7)) < 0.5
    param, _, _ = make_masked((ROWS, DIM), param_layout, data=start, mask=pmask, seed=3)
    param.requires_grad_()
    stored_before = param._storage.values.detach().clone()
    opt = ms.optim.Adagrad([param], lr=0.1)
    ref = torch.nn.Parameter(start.clone())
    ref_opt = torch.optim.Adagrad([ref], lr=0.1)
    for s in range(5):
        g = torch.Generator().manual_seed(s)
        weights = torch.randn(ROWS, DIM, generator=g)
        gmask = torch.ones(ROWS, DIM, dtype=torch.bool)
        if grad_form == "autograd":
            opt.zero_grad()
            (param * weights).sum().backward()
            assert ms.is_masked_tensor(param.grad)
        elif grad_form == "dense":
            param.grad = weights
        else:
            gmask = torch.rand(ROWS, DIM, generator=g) < 0.6
            param.grad = torch.sparse_coo_tensor(gmask.nonzero().t(), weights[gmask], (ROWS, DIM))
        # Adagrad with a zero gradient leaves an entry as it is: the dense reference.
        ref.grad = torch.where(pmask & gmask, weights, 0.0)
        ref_opt.step()
        opt.step()
    s = param._storage
    got, got_mask = s.densify(s.values.detach(), 0), s.densify(s.mask, False)
    assert torch.equal(got_mask, pmask)
    assert_close(got[pmask], ref.detach()[pmask])
    assert not torch.equal(got[pmask], start[pmask])
    # Stored but unspecified entries of the parameter keep their values.
    assert (~s.mask).any()
    assert torch.equal(s.values.detach()[~s.mask], stored_before[~s.mask])


def test_masked_gradient_from_autograd_on_plain_parameter():
    x = torch.nn.Parameter(initial())
    mask = torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(5)) < 0.5
    target = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(6))
    opt = ms.optim.Adam([x], lr=0.05)
    ref = torch.nn.Parameter(initial())
    ref_opt = torch.optim.SparseAdam([ref], lr=0.05)
    for _ in range(10):
        opt.zero_grad()
        ((ms.as_masked_tensor(x, mask) - target) ** 2).sum().backward()
        assert not ms.is_masked_tensor(x.grad)
        opt.step()
        g = 2 * (ref.detach() - target)
        ref.grad = torch.sparse_coo_tensor(mask.nonzero().t(), g[mask], (ROWS, DIM))
        ref_opt.step()
    assert_close(x.detach(), ref.detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(x.detach()[~mask], initial()[~mask])


# -- no densification ---------------------------------------------------------------------------
@config_params
@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "2d"])
@cpu_only("reads allocations from the CPU profiler")
def test_sparse_step_is_o_nnz(config, hybrid):
    """No op of a step on a sparse gradient allocates more than O(nnz) (a densified
    gradient or state slice of this 20_000 x 8 parameter would take 640 KB)."""
    cls, _, kwargs = CONFIGS[config]
    w = torch.nn.Parameter(torch.randn(20_000, 8))
    opt = cls([w], **kwargs)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(20_000, (30,), generator=g)
    if hybrid:
        w.grad = torch.sparse_coo_tensor(rows[None], torch.randn(30, 8, generator=g), w.shape)
    else:
        cols = torch.randint(8, (30,), generator=g)
        w.grad = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.randn(30, generator=g),
                                         w.shape)
    opt.step()  # creates the (dense) state
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    largest = max(e.self_cpu_memory_usage for e in prof.events())
    assert 0 < largest <= 16_000, largest
    w.grad = torch.randn(20_000, 8)  # the same check sees a dense step
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    assert max(e.self_cpu_memory_usage for e in prof.events()) >= 20_000 * 8 * 4


# -- training and state ---------------------------------------------------------------------------
TRAIN = {"adagrad": (ms.optim.Adagrad, dict(lr=0.1)),
         "sgd": (ms.optim.SGD, dict(lr=0.05, momentum=0.9)),
         "adam": (ms.optim.Adam, dict(lr=0.02)),
         "adamw": (ms.optim.AdamW, dict(lr=0.02, weight_decay=1e-3))}


@pytest.mark.parametrize("name", list(TRAIN))
def test_embedding_training_loss_goes_down(name):
    cls, kwargs = TRAIN[name]
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8, sparse=True)
    head = torch.nn.Linear(8, 1)
    targets = torch.randn(50)
    opt = cls(list(emb.parameters()) + list(head.parameters()), **kwargs)

    def loss_on(idx):
        return ((head(emb(idx)).squeeze(-1) - targets[idx]) ** 2).mean()

    with torch.no_grad():
        before = float(loss_on(torch.arange(50)))
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        opt.zero_grad()
        loss_on(torch.randint(50, (16,), generator=g)).backward()
        assert emb.weight.grad.is_sparse and not emb.weight.grad.is_coalesced()
        opt.step()
    with torch.no_grad():
        after = float(loss_on(torch.arange(50)))
    assert after < 0.2 * before, (before, after)


@config_params
def test_state_dict_round_trips_through_torch_save(config):
    cls, _, kwargs = CONFIGS[config]
    grads = [coo_grad(s, hybrid=True) for s in range(10)]
    p = torch.nn.Parameter(initial())
    opt = cls([p], **kwargs)
    for g in grads[:5]:
        p.grad = g
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = cls([q], **kwargs)
    opt2.load_state_dict(loaded)
    assert set(opt2.state[q]) == set(opt.state[p])
    for g in grads[5:]:
        p.grad, q.grad = g, g
        opt.step()
        opt2.step()
    assert torch.equal(p, q)


def test_adagrad_loads_torch_adagrad_state():
    grads = [coo_grad(s, hybrid=True) for s in range(10)]
    ref = torch.nn.Parameter(initial())
    ref_opt = torch.optim.Adagrad([ref], lr=0.1)
    for g in grads[:5]:
        ref.grad = g
        ref_opt.step()
    p = torch.nn.Parameter(ref.detach().clone())
    opt = ms.optim.Adagrad([p], lr=0.1)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    for g in grads[5:]:
        p.grad, ref.grad = g, g
        opt.step()
        ref_opt.step()
    assert_close(p, ref)


def test_zero_grad_with_masked_gradients():
    p = torch.nn.Parameter(initial())
    opt = ms.optim.SGD([p], lr=0.1)
    mask = torch.eye(ROWS, DIM, dtype=torch.bool)
    p.grad = ms.masked_tensor(torch.ones(ROWS, DIM), mask).to_sparse_csr()
    opt.zero_grad(set_to_none=False)
    assert ms.is_masked_tensor(p.grad) and p.grad.layout == torch.sparse_csr
    opt.step()  # a zero (but specified) gradient: nothing moves
    assert torch.equal(p.detach(), initial())
    opt.zero_grad()
    assert p.grad is None


# -- errors ---------------------------------------------------------------------------------------
def test_unsupported_gradient_forms_raise_type_error():
    p, s = torch.zeros(2, 2), torch.zeros(2, 2)
    args = dict(lr=0.1, lr_decay=0, weight_decay=0, eps=1e-10, maximize=False)
    with pytest.raises(TypeError, match="list"):
        ms.optim.functional.adagrad([p], [[1.0, 2.0]], [s], [torch.tensor(0.0)], **args)
    unregistered = torch.eye(2).to_sparse_bsc((1, 1))
    try:
        layouts.get_layout(torch.sparse_bsc)
    except NotImplementedError:
        with pytest.raises(TypeError, match="sparse_bsc"):
            ms.optim.functional.adagrad([p], [unregistered], [s], [torch.tensor(0.0)], **args)
    with pytest.raises(ValueError, match="shape"):
        ms.optim.functional.adagrad([p], [torch.zeros(3)], [s], [torch.tensor(0.0)], **args)
    with pytest.raises(TypeError, match="MaskedTensor"):
        ms.optim.add_at_(p, torch.ones(2, 2))


def test_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(NotImplementedError, match="capturable"):
        ms.optim.Adam(p, capturable=True)
    with pytest.raises(ValueError, match="Nesterov"):
        ms.optim.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        ms.optim.Adagrad(p, lr=-1.0)
    with pytest.raises(ValueError, match="beta"):
        ms.optim.AdamW(p, betas=(1.0, 0.9))


def test_positions_cache_lets_a_dead_gradient_pattern_go():
    import gc

    from masked_sparse.optim import _scatter

    idx = torch.tensor([[1, 5, 7]])
    grad = ms.masked_tensor(torch.sparse_coo_tensor(idx, torch.ones(3), (100,)),
                            torch.sparse_coo_tensor(idx, torch.ones(3, dtype=torch.bool), (100,)))
    _scatter._CACHE.clear()
    _scatter._positions(grad._storage)
    assert len(_scatter._CACHE) == 1
    del grad
    gc.collect()
    assert len(_scatter._CACHE) == 0  # the cached positions did not keep the index alive
