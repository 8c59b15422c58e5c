"""No optimizer step reads a value on the host on the device path.

The device path is what every non-CPU device runs: ``masked_sparse.optim._scatter.on_cpu``
answers False, so none of the CPU's shortcuts (a mask comparison, ``coalesce()``, a check
that a mask is all True) runs. Here it runs on the CPU under a ``TorchDispatchMode`` that
raises on every aten op that makes CUDA wait for the device (``.item()`` and ``bool(t)``,
``nonzero``, ``equal``, ``unique``, ``masked_select``, ``coalesce``, ``bincount``, boolean
indexing, ``repeat_interleave`` without ``output_size``). The step counter is a CPU tensor, as
in ``torch.optim`` (``capturable=False``): reading it is no device sync and is allowed.
Every optimizer x gradient form x parameter form takes a warm step (the second, after any
first-step caching) under the guard, and its numbers are the CPU path's, bit for bit.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from host_sync import HostSyncError, forbid_host_sync

import masked_sparse as ms
from masked_sparse.optim import _scatter

ROWS, COLS = 12, 8


def test_the_guard_catches_syncing_ops():
    t, mask = torch.arange(4.0), torch.tensor([True, False, True, True])
    for syncing in (lambda: t.sum().item(), lambda: bool(t.sum()), lambda: t.nonzero(),
                    lambda: t[mask], lambda: torch.masked_select(t, mask),
                    lambda: torch.equal(t, t), lambda: t.unique(),
                    lambda: torch.sparse_coo_tensor([[1, 1]], [1.0, 2.0], (3,)).coalesce()):
        with pytest.raises(HostSyncError), forbid_host_sync():
            syncing()
    step = torch.tensor(3.0)
    with forbid_host_sync(allowed=(step,)):
        assert float(step) == 3.0
        torch.where(mask, t, 0.0).index_add_(0, torch.tensor([0, 0]), torch.ones(2))


@pytest.fixture
def device_path(monkeypatch):
    """Run the optimizers' device path on the CPU (no CPU shortcut)."""
    monkeypatch.setattr(_scatter, "on_cpu", lambda t: False)


OPTIMIZERS = {
    "Adagrad": (ms.optim.Adagrad, dict(lr=0.1, weight_decay=0.05, lr_decay=0.01)),
    "Adam": (ms.optim.Adam, dict(lr=0.05, amsgrad=True)),
    "AdamW": (ms.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
    "SGD": (ms.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "SGD stateless": (ms.optim.SGD, dict(lr=0.1, maximize=True)),
    "SparseAdam": (ms.optim.SparseAdam, dict(lr=0.05)),
}
PARAMS = ["plain", "masked strided", "masked coo", "masked csr"]
GRADS = ["dense", "coo uncoalesced", "coo coalesced", "coo hybrid uncoalesced",
         "masked strided", "masked coo", "masked csr", "autograd"]
_PARAM_LAYOUTS = {"masked strided": torch.strided, "masked coo": torch.sparse_coo,
                  "masked csr": torch.sparse_csr}


def _param_mask() -> torch.Tensor:
    return torch.rand(ROWS, COLS, generator=torch.Generator().manual_seed(1)) < 0.6


def make_param(form: str) -> torch.nn.Parameter:
    start = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))
    if form == "plain":
        return torch.nn.Parameter(start)
    mt = ms.to_layout(ms.masked_tensor(start, _param_mask()), _PARAM_LAYOUTS[form])
    return torch.nn.Parameter(mt)


def make_grad(form: str, param: torch.Tensor, step: int) -> torch.Tensor | None:
    """A new gradient of ``form`` for ``step`` (None: set by backward)."""
    g = torch.Generator().manual_seed(10 + step)
    dense = torch.randn(ROWS, COLS, generator=g)
    mask = torch.rand(ROWS, COLS, generator=g) < 0.5
    rows = torch.randint(ROWS, (9,), generator=g)
    cols = torch.randint(COLS, (9,), generator=g)
    if form == "dense":
        return dense
    if form.startswith("coo hybrid"):
        return torch.sparse_coo_tensor(rows[None], torch.randn(9, COLS, generator=g),
                                       (ROWS, COLS))
    if form.startswith("coo"):
        grad = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.randn(9, generator=g),
                                       (ROWS, COLS))
        return grad.coalesce() if form == "coo coalesced" else grad
    if form == "autograd":
        (param * dense).sum().backward()
        return None
    layout = {"masked strided": torch.strided, "masked coo": torch.sparse_coo,
              "masked csr": torch.sparse_csr}[form]
    return ms.to_layout(ms.masked_tensor(dense, mask), layout)


def _steps(opt: torch.optim.Optimizer) -> tuple[torch.Tensor, ...]:
    return tuple(st["step"] for st in opt.state.values()
                 if isinstance(st.get("step"), torch.Tensor))


def run(optimizer: str, param_form: str, grad_form: str, guard: bool) -> tuple:
    """Three steps; the last one (warm) under the guard when ``guard``."""
    cls, kwargs = OPTIMIZERS[optimizer]
    param = make_param(param_form)
    opt = cls([param], **kwargs)
    for step in range(3):
        opt.zero_grad()
        grad = make_grad(grad_form, param, step)
        if grad is not None:
            param.grad = grad
        with forbid_host_sync(_steps(opt)) if guard and step == 2 else contextlib.nullcontext():
            opt.step()
    values = param._storage.values if ms.is_masked_tensor(param) else param
    return values.detach(), [v for st in opt.state.values() for v in st.values()
                             if isinstance(v, torch.Tensor)]


def _cases():
    for optimizer in OPTIMIZERS:
        for param_form in PARAMS:
            for grad_form in GRADS:
                if grad_form == "autograd" and param_form == "plain":
                    continue
                yield optimizer, param_form, grad_form


@pytest.mark.parametrize("optimizer,param_form,grad_form", list(_cases()))
def test_warm_step_syncs_nothing_and_matches_the_cpu_path(optimizer, param_form, grad_form,
                                                          monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's CSR "beta" warning
        cpu_values, cpu_states = run(optimizer, param_form, grad_form, guard=False)
        monkeypatch.setattr(_scatter, "on_cpu", lambda t: False)
        values, states = run(optimizer, param_form, grad_form, guard=True)
    if optimizer == "SGD stateless" and param_form == "plain" and grad_form.startswith("coo"):
        # The CPU hands a COO gradient to torch's own ``param.add_(grad, alpha=-lr)``, whose
        # kernel for a coalesced one rounds ``grad * lr`` before adding (Note [SGD without
        # state]); the device path adds with one multiply-add, as a dense step does.
        torch.testing.assert_close(values, cpu_values, rtol=1e-6, atol=1e-7)
        return
    assert torch.equal(values, cpu_values)
    assert len(states) == len(cpu_states)
    for state, cpu_state in zip(states, cpu_states):
        assert torch.equal(state, cpu_state)


def test_duplicate_rows_are_summed_without_coalesce(device_path):
    """An embedding gradient with repeated rows: the device path sums them (sort, cumsum,
    index_add_) as torch's sparse Adagrad sums them with coalesce()."""
    g = torch.Generator().manual_seed(3)
    start = torch.randn(20, 4, generator=g)
    params = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    mine = ms.optim.Adagrad(params[:1], lr=0.1)
    ref = torch.optim.Adagrad(params[1:], lr=0.1)
    for _ in range(4):
        rows = torch.randint(5, (30,), generator=g)  # every row many times
        grad = torch.sparse_coo_tensor(rows[None], torch.randn(30, 4, generator=g), (20, 4))
        for p, opt in zip(params, (mine, ref)):
            p.grad = grad
            opt.step()
        torch.testing.assert_close(params[0], params[1])
        torch.testing.assert_close(mine.state[params[0]]["sum"], ref.state[params[1]]["sum"])
    untouched = torch.arange(5, 20)
    assert torch.equal(params[0].detach()[untouched], start[untouched])


def test_summed_rows_equals_coalesce():
    from masked_sparse.optim._entries import summed_rows

    g = torch.Generator().manual_seed(4)
    rows = torch.randint(6, (25,), generator=g)
    values = torch.randn(25, 3, generator=g)
    got_rows, got = summed_rows(rows, values)
    ref = torch.sparse_coo_tensor(rows[None], values, (6, 3)).coalesce()
    assert torch.equal(got_rows, rows.sort().values)
    # Every repeat carries its row's sum: coalesce()'s sum on the CPU, bit for bit.
    assert torch.equal(got, ref.to_dense()[got_rows])
