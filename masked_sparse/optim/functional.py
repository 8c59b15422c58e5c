"""Functional optimizers: one code path per algorithm, for every gradient form and layout.

Each function has the signature of its ``torch.optim`` counterpart. Every parameter takes
one of three routes, and all of them end in torch's own functional optimizer
(``torch.optim.adam.adam``, ``...sgd.sgd``, ``...adagrad.adagrad``), called once per group:

- a dense gradient of a plain parameter is handed over as it is (Note [Dense gradients]);
- a MaskedTensor parameter whose gradient covers its pattern hands over its stored values
  (Note [Gradients over the parameter's pattern]);
- every other pair -- a sparse gradient, a masked one, a masked parameter with another
  gradient -- is gathered at the entries its gradient specifies, stepped, and written back
  (Note [Lazy steps on gathered entries] in ``_entries.py``).

SGD with momentum on the CPU steps the second kind in one native pass instead, the fill
included (Note [SGD momentum in one pass] in ``layouts/_sgd.py``): torch's operations in
torch's order where the parameter's mask holds.

Nothing asks for the layout, so dense, torch sparse COO (uncoalesced, hybrid) and
MaskedTensor gradients in strided, COO, CSR -- or any registered layout -- go through the
same lines, and no route reads a value on the host (Note [No host sync in a step]).
``sparse_adam`` has no torch multi-tensor counterpart: its lines are written here, on the
gathered entries.

Note [Lazy updates]
~~~~~~~~~~~~~~~~~~~
Only the specified entries of a gradient take part in a step: the parameter and every
state tensor are read and written there only, as torch's sparse Adagrad and
``SparseAdam`` do. An entry that is not specified is not "a zero gradient": its moments
do not decay and its parameter does not move. A dense gradient is specified everywhere,
so on dense gradients these are the ordinary algorithms; on the entries a step updates, the
numbers are those of the ``torch.optim`` algorithm on those entries.

Note [No host sync in a step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
On a CUDA (or any non-CPU) device a step reads no value on the host: duplicates of an
uncoalesced COO gradient are summed without ``coalesce()`` (Note [Duplicate rows without a
host sync]), a gradient is read at a sparse parameter's positions by a binary search of
fixed size, every write is ``index_copy_`` / ``index_add_`` / ``where`` over the entries, and
the checks that would read a bool (are two masks equal, is a state 0 outside the mask) run
only on the CPU (Note [Equal masks without a host sync]). What is read on the host is what
torch.optim reads: the step counter, a CPU tensor as in ``torch.optim`` (``capturable`` is
not supported), a Tensor ``lr`` (its value), and the step of ``fused=True`` state, which
torch keeps on the device (``docs/optimizers.md`` lists them). The first step of a
MaskedTensor gradient pattern also computes its positions once (no host read either).

Note [Lazy weight decay]
~~~~~~~~~~~~~~~~~~~~~~~~
torch refuses ``weight_decay`` with sparse gradients (Adagrad raises; SGD and Adam would
densify the step). Here weight decay follows the lazy rule: the L2 term
``weight_decay * param`` is added to the specified entries of the gradient only (SGD,
Adagrad, Adam), and AdamW's decoupled decay ``param *= 1 - lr * weight_decay`` shrinks only
the parameters whose gradient is specified. Rows of an embedding that a batch does not
touch are therefore not decayed in that step -- the usual choice for sparse embeddings,
whose rows would otherwise all be rewritten at every step.

Note [Adam and SparseAdam]
~~~~~~~~~~~~~~~~~~~~~~~~~~
``adam`` keeps the moments exactly as ``SparseAdam`` does (``m += (1 - beta1) * (g - m)``
written as a sparse increment) and applies the update as ``torch.optim.Adam`` does,
``lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``. ``sparse_adam`` is
``torch.optim.SparseAdam``'s step operation for operation: ``eps`` is added *before* the
bias correction, ``lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps)``, i.e. Adam with
``eps * sqrt(bc2)``. The two agree where ``sqrt(v)`` dwarfs ``eps / sqrt(bc2)`` (3.2e-7
at the first step with ``beta2 = 0.999``); below that -- embedding gradients of ~1e-7, or
the rare tiny entry of larger ones -- their updates differ by a large fraction of ``lr``
(``docs/optimizers.md``, ``tests/optim/test_optim_parity.py``). ``Adam`` / ``AdamW`` keep Adam's
placement so that on dense gradients they are the dense torch algorithms; ``SparseAdam`` is
the drop-in for ``torch.optim.SparseAdam``.

Note [SGD without state]
~~~~~~~~~~~~~~~~~~~~~~~~
SGD with neither momentum nor weight decay on a torch sparse COO gradient of a plain CPU
parameter is ``param.add_(grad, alpha=-lr)``: torch's own lazy step (only the stored
entries move), ``torch.optim.SGD``'s very numbers, in O(nnz) and without coalescing --
duplicates are added one by one. Elsewhere it is the lazy step of every other case (Note
[Lazy steps on gathered entries]): ``torch.optim.sgd.sgd`` adds the gathered gradient to the
gathered entries, the same numbers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim import adagrad as _torch_adagrad
from torch.optim import adam as _torch_adam
from torch.optim import sgd as _torch_sgd

import layouts

from .._tensor import MaskedTensor
from . import _same_pattern, _scatter
from ._dense import has_complex, split, switches
from ._entries import Entries, entries_for

__all__ = ["adagrad", "adam", "sgd", "sparse_adam"]


def _check_steps(steps: list[Any], where: str) -> None:
    for step_t in steps:
        if not isinstance(step_t, torch.Tensor):
            raise TypeError(f"{where}: state_steps must hold tensors (updated in place), got "
                            f"{type(step_t).__name__}")


def _is_plain_coo_pair(param: torch.Tensor, grad: object) -> bool:
    return (isinstance(grad, torch.Tensor) and not isinstance(grad, MaskedTensor)
            and not isinstance(param, MaskedTensor) and grad.layout == torch.sparse_coo
            and grad.shape == param.shape)


def _at(items: list[Any], positions: list[int]) -> list[Any]:
    """``items`` at ``positions`` (ascending), a new list."""
    if len(positions) == len(items):  # all of them (the usual dense group)
        return list(items)
    return [items[i] for i in positions]


class _Lazy:
    """The lazy pairs of one step, gathered at their entries (Note [Lazy steps on gathered
    entries]): ``params`` and ``grads`` to hand to torch, :meth:`gather` for each state list,
    :meth:`write_back` once torch has stepped them."""

    def __init__(self, params: list[torch.Tensor], grads: list[Any], positions: list[int],
                 where: str) -> None:
        self.positions = positions
        self.sites = [entries_for(params[i], grads[i], where) for i in positions]
        self.params = [e.gather(t) for t, e in self.sites]
        self.grads = [e.grad for _, e in self.sites]
        self._masks = [p._storage.mask if isinstance(p, MaskedTensor) else None
                       for p in _at(params, positions)]
        self._writes: list[tuple[torch.Tensor, Entries, torch.Tensor]] = [
            (t, e, p) for (t, e), p in zip(self.sites, self.params)]
        self._tagged: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __bool__(self) -> bool:
        return bool(self.positions)

    def gather(self, states: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """The states of the lazy pairs at their entries, written back by :meth:`write_back`
        (None stays None). A masked parameter's state known to be 0 at its unspecified
        entries stays known so: the step writes inside the mask only."""
        out: list[torch.Tensor | None] = []
        for i, (_, e), mask in zip(self.positions, self.sites, self._masks):
            state = states[i]
            if state is None:
                out.append(None)
                continue
            if mask is not None and _same_pattern.is_known_zero_outside(state, mask):
                self._tagged.append((state, mask))
            gathered = e.gather(state)
            self._writes.append((state, e, gathered))
            out.append(gathered)
        return out

    def adopt(self, k: int, gathered: torch.Tensor) -> torch.Tensor:
        """A dense state for the ``k``-th lazy pair, 0 but at its entries, where it holds
        ``gathered`` (a buffer torch created from the gathered gradient)."""
        target, e = self.sites[k]
        state = torch.zeros_like(target, memory_format=torch.preserve_format)
        e.scatter_(state, gathered)
        if self._masks[k] is not None:
            _same_pattern.mark(state, self._masks[k])
        return state

    def write_back(self) -> None:
        for target, e, stepped in self._writes:
            e.scatter_(target, stepped)
        for state, mask in self._tagged:
            _same_pattern.mark(state, mask)


def _runs(dense: list[int], lazy: _Lazy, full: list[int],
          decay: bool) -> list[tuple[list[int], bool, list[int], bool]]:
    """The calls of torch's functional optimizer: ``(dense, with lazy, full, fold)``.

    Without weight decay, one call for every route; with it, the full masked parameters
    go apart, their decay and ``maximize`` folded into their gradients (``fold``), so that
    torch's decay cannot reach their unspecified entries (Note [Gradients over the
    parameter's pattern]). Dense and gathered tensors are decayed by torch itself (the
    gathered ones at their entries only: Note [Lazy weight decay])."""
    runs = ([(dense, True, full, False)] if not decay
            else [(dense, True, [], False), ([], False, full, True)])
    return [r for r in runs if r[0] or r[2] or (r[1] and lazy)]


def _torch_lists(run: tuple[list[int], bool, list[int], bool], params: list[torch.Tensor],
                 grads: list[Any], lazy: _Lazy, values: dict[int, torch.Tensor],
                 states: list[list[Any]], steps: list[Any] | None, maximize: bool,
                 weight_decay: float) -> tuple[list[Any], list[Any], list[list[Any]], list[Any]]:
    """``(params, grads, states, steps)`` for one torch call: the dense pairs as they are,
    the gathered lazy ones, then the full masked parameters' values with their filled
    gradients. Each of ``states`` is a list of state tensors aligned with ``params``;
    ``steps`` (the step counters) pass as they are."""
    dense, with_lazy, full, fold = run
    ps, gs = _at(params, dense), _at(grads, dense)
    out = [_at(st, dense) for st in states]
    counters = _at(steps, dense) if steps is not None else []
    if with_lazy and lazy:
        ps += lazy.params
        gs += lazy.grads
        for o, st in zip(out, states):
            o += lazy.gather(st)
        counters += _at(steps, lazy.positions) if steps is not None else []
    for i in full:
        ps.append(_same_pattern.target_and_mask(params[i])[0])
        gs.append(_same_pattern.filled_grad(params[i], values[i], negate=fold and maximize,
                                            weight_decay=weight_decay if fold else 0))
    for o, st in zip(out, states):
        o += _at(st, full)
    counters += _at(steps, full) if steps is not None else []
    return ps, gs, out, counters


def _ready(params: list[torch.Tensor], full: list[int],
           states: list[list[torch.Tensor | None]]) -> tuple[list[int], list[int]]:
    """``(ready, held)`` of ``full``: the parameters whose ``states`` are known to be 0 at
    every unspecified entry (Note [Gradients over the parameter's pattern]), and the
    others, which take the lazy route."""
    ready: list[int] = []
    held: list[int] = []
    for i in full:
        mask = _same_pattern.target_and_mask(params[i])[1]
        (ready if all(_same_pattern.zero_outside(st[i], mask) for st in states) else held).append(i)
    return ready, held


def adagrad(params: list[torch.Tensor], grads: list[torch.Tensor],
            state_sums: list[torch.Tensor], state_steps: list[torch.Tensor],
            foreach: bool | None = None, fused: bool | None = None, *, lr: float,
            lr_decay: float, weight_decay: float, eps: float, maximize: bool) -> None:
    """Adagrad on dense, sparse or masked gradients (lazy for sparse ones).

    ``state_sums[i]`` has the shape of ``params[i]`` (of its stored values for a
    MaskedTensor parameter); ``state_steps[i]`` is a 0-d tensor, incremented in place.
    Every route ends in ``torch.optim.adagrad.adagrad`` with ``foreach`` / ``fused``.

    >>> import torch, masked_sparse as ms
    >>> param, state_sum = torch.zeros(4), torch.zeros(4)
    >>> grad = torch.sparse_coo_tensor([[1, 3]], [2., -1.], (4,))
    >>> ms.optim.functional.adagrad([param], [grad], [state_sum], [torch.tensor(0.)], lr=0.1,
    ...                             lr_decay=0, weight_decay=0, eps=1e-10, maximize=False)
    >>> param
    tensor([ 0.0000, -0.1000,  0.0000,  0.1000])
    """
    _check_steps(state_steps, "adagrad")
    dense, rest = split(params, grads)
    full, rest, values = _same_pattern.full_pairs(params, grads, rest)
    lazy = _Lazy(params, grads, rest, "adagrad")
    for run in _runs(dense, lazy, full, weight_decay != 0):
        fold = run[3]
        ps, gs, (sums,), steps = _torch_lists(run, params, grads, lazy, values, [state_sums],
                                              state_steps, maximize, weight_decay)
        _torch_adagrad.adagrad(ps, gs, sums, steps, has_complex=has_complex(ps),
                               **switches(foreach, fused, lr), lr=lr,
                               weight_decay=0 if fold else weight_decay, lr_decay=lr_decay,
                               eps=eps, maximize=maximize and not fold)
    lazy.write_back()


def _sgd_in_one_pass(params: list[torch.Tensor], full: list[int],
                     values: dict[int, torch.Tensor],
                     buffers: list[torch.Tensor | None], **hyper: Any) -> list[int]:
    """Steps the full masked parameters (Note [Gradients over the parameter's pattern])
    that the native SGD momentum step takes (Note [SGD momentum in one pass] in
    ``layouts/_sgd.py``: no fill of the gradient, which it never reads where the mask is
    False) and returns the others, for torch's step."""
    left: list[int] = []
    for i in full:
        target, mask = _same_pattern.target_and_mask(params[i])
        buf = layouts.sgd_momentum_(target, values[i], buffers[i], mask, **hyper)
        if buf is None:
            left.append(i)
        else:
            buffers[i] = buf
            _same_pattern.mark(buf, mask)
    return left


def sgd(params: list[torch.Tensor], d_p_list: list[torch.Tensor],
        momentum_buffer_list: list[torch.Tensor | None], foreach: bool | None = None,
        fused: bool | None = None, *, weight_decay: float, momentum: float, lr: float,
        dampening: float, nesterov: bool, maximize: bool) -> None:
    """SGD with momentum, dampening, Nesterov and weight decay (lazy for sparse gradients).

    ``momentum_buffer_list[i]`` is None before the first step; it is then created (dense,
    shaped like the parameter's target, 0 but where the gradient is specified) and stored
    back into the list, as torch does. A lazy step keeps the buffer at the specified
    entries only, so an entry the gradient skips keeps its buffer. Every route ends in
    ``torch.optim.sgd.sgd`` with ``foreach`` / ``fused``, but the stateless lazy step, which
    adds the gradient where it is specified (Note [SGD without state]), and with momentum
    on the CPU the masked parameters whose gradient covers their pattern, stepped in one
    native pass (:func:`_sgd_in_one_pass`).

    >>> import torch, masked_sparse as ms
    >>> param = torch.ones(3)
    >>> ms.optim.functional.sgd([param], [torch.sparse_coo_tensor([[2]], [1.], (3,))], [None],
    ...                         weight_decay=0, momentum=0, lr=0.5, dampening=0,
    ...                         nesterov=False, maximize=False)
    >>> param
    tensor([1.0000, 1.0000, 0.5000])
    """
    dense, rest = split(params, d_p_list)
    full, rest, values = _same_pattern.full_pairs(params, d_p_list, rest)
    full, held = _ready(params, full, [momentum_buffer_list] if momentum else [])
    rest = sorted(rest + held)
    if momentum != 0 and fused is not True and not isinstance(lr, torch.Tensor):
        full = _sgd_in_one_pass(params, full, values, momentum_buffer_list, lr=lr,
                                momentum=momentum, dampening=dampening,
                                weight_decay=weight_decay, nesterov=nesterov,
                                maximize=maximize)
    if momentum == 0 and weight_decay == 0:  # Note [SGD without state]
        added = [i for i in rest if _is_plain_coo_pair(params[i], d_p_list[i])
                 and _scatter.on_cpu(d_p_list[i])]
        for i in added:
            params[i].add_(d_p_list[i], alpha=lr if maximize else -lr)
        rest = [i for i in rest if i not in added]
    lazy = _Lazy(params, d_p_list, rest, "sgd")
    for run in _runs(dense, lazy, full, weight_decay != 0):
        d, with_lazy, f, fold = run
        ps, gs, (buffers,), _ = _torch_lists(run, params, d_p_list, lazy, values,
                                             [momentum_buffer_list], None, maximize,
                                             weight_decay)
        _torch_sgd.sgd(ps, gs, buffers, **switches(foreach, fused, lr),
                       weight_decay=0 if fold else weight_decay, momentum=momentum, lr=lr,
                       dampening=dampening, nesterov=nesterov, maximize=maximize and not fold)
        created = iter(buffers)
        for i in d:
            momentum_buffer_list[i] = next(created)
        for k, i in enumerate(lazy.positions if with_lazy else ()):
            buf = next(created)
            if momentum_buffer_list[i] is None and buf is not None:
                momentum_buffer_list[i] = lazy.adopt(k, buf)
        for i in f:
            momentum_buffer_list[i] = next(created)
            _same_pattern.mark(momentum_buffer_list[i],
                               _same_pattern.target_and_mask(params[i])[1])
    lazy.write_back()


def adam(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
         exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor],
         state_steps: list[torch.Tensor], foreach: bool | None = None,
         fused: bool | None = None, decoupled_weight_decay: bool = False, *, amsgrad: bool,
         beta1: float, beta2: float, lr: float, weight_decay: float, eps: float,
         maximize: bool) -> None:
    """Adam / AdamW (``decoupled_weight_decay=True``), lazy for sparse gradients.

    See Note [Adam and SparseAdam] for how it relates to ``torch.optim.SparseAdam``.
    ``max_exp_avg_sqs`` is only read when ``amsgrad`` is True. Every route ends in
    ``torch.optim.adam.adam`` with ``foreach`` / ``fused``.

    >>> import torch, masked_sparse as ms
    >>> param, m, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    >>> grad = torch.sparse_coo_tensor([[0]], [2.], (3,))
    >>> ms.optim.functional.adam([param], [grad], [m], [v], [], [torch.tensor(0.)],
    ...                          amsgrad=False, beta1=0.9, beta2=0.999, lr=0.1,
    ...                          weight_decay=0, eps=1e-8, maximize=False)
    >>> param
    tensor([-0.1000,  0.0000,  0.0000])
    """
    _check_steps(state_steps, "adam")
    dense, rest = split(params, grads)
    full, rest, values = _same_pattern.full_pairs(params, grads, rest)
    full, held = _ready(params, full, [exp_avgs, exp_avg_sqs])
    lazy = _Lazy(params, grads, sorted(rest + held), "adam")
    states = [exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad else [])
    if full and decoupled_weight_decay and weight_decay != 0:
        # AdamW's decay first, as torch: 1 at the unspecified entries.
        targets, masks = zip(*(_same_pattern.target_and_mask(params[i]) for i in full))
        torch._foreach_mul_(list(targets), [
            _same_pattern.decay_factor(m, 1 - lr * weight_decay, t)
            for t, m in zip(targets, masks)])
    for run in _runs(dense, lazy, full, weight_decay != 0):
        fold = run[3]
        ps, gs, sts, steps = _torch_lists(run, params, grads, lazy, values, states,
                                          state_steps, maximize,
                                          0 if decoupled_weight_decay else weight_decay)
        _torch_adam.adam(ps, gs, sts[0], sts[1], sts[2] if amsgrad else [], steps,
                         **switches(foreach, fused, lr), has_complex=has_complex(ps),
                         decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad,
                         beta1=beta1, beta2=beta2, lr=lr,
                         weight_decay=0 if fold else weight_decay, eps=eps,
                         maximize=maximize and not fold)
    for i in full:
        mask = _same_pattern.target_and_mask(params[i])[1]
        _same_pattern.mark(exp_avgs[i], mask)
        _same_pattern.mark(exp_avg_sqs[i], mask)
    lazy.write_back()


def sparse_adam(params: list[torch.Tensor], grads: list[torch.Tensor],
                exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                state_steps: list[int], *, eps: float, beta1: float, beta2: float, lr: float,
                maximize: bool) -> None:
    """``torch.optim.SparseAdam``'s step for every gradient form (Note [Adam and SparseAdam]).

    The operations of ``torch.optim._functional.sparse_adam``, in its order, on the
    specified entries (Note [Lazy steps on gathered entries]): on a COO gradient the same
    numbers. ``state_steps[i]`` is the step count after this step (an int, incremented by
    the caller, as torch does). A dense gradient is specified everywhere; a MaskedTensor
    gradient where its mask says.

    >>> import torch, masked_sparse as ms
    >>> param, m, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    >>> grad = torch.sparse_coo_tensor([[0]], [2.], (3,))
    >>> ms.optim.functional.sparse_adam([param], [grad], [m], [v], [1], eps=1e-8,
    ...                                 beta1=0.9, beta2=0.999, lr=0.1, maximize=False)
    >>> param
    tensor([-0.1000,  0.0000,  0.0000])
    """
    for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
        target, e = entries_for(param, grad, "sparse_adam")
        g = -e.grad if maximize else e.grad
        m, v = e.read(exp_avgs[i]), e.read(exp_avg_sqs[i])
        dm = (g - m) * (1 - beta1)
        dv = (g.pow(2) - v) * (1 - beta2)
        numer, v = dm + m, dv + v
        denom = v.sqrt() + eps
        step = state_steps[i]
        step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        update = (numer / denom) * -step_size
        e.scatter_(exp_avgs[i], numer)  # m + dm
        e.scatter_(exp_avg_sqs[i], v)  # v + dv
        e.scatter_(target, e.read(target) + update)
