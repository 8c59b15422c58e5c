"""Functional optimizers: one code path per algorithm, for every gradient form and layout.

Each function has the signature of its ``torch.optim`` counterpart and reads like the
dense algorithm: the gradient becomes a MaskedTensor once
(:func:`~masked_sparse.optim.as_masked_grad`), the state is read where it is specified
(:func:`~masked_sparse.optim.read_at`), masked ops compute the update and
:func:`~masked_sparse.optim.add_at_` writes it back. Nothing asks for the
layout, so dense, torch sparse COO (uncoalesced, hybrid) and MaskedTensor gradients in
strided, COO, CSR -- or any registered layout -- go through the same lines. Dense
gradients of plain parameters are first handed to torch's own multi-tensor optimizers
(Note [Dense gradients] in ``_dense.py``): same numbers, torch's speed.

Note [Lazy updates]
~~~~~~~~~~~~~~~~~~~
Only the specified entries of a gradient take part in a step: the parameter and every
state tensor are read and written there only, as torch's sparse Adagrad and
``SparseAdam`` do. An entry that is not specified is not "a zero gradient": its moments
do not decay and its parameter does not move. A dense gradient is specified everywhere,
so on dense gradients these are the ordinary algorithms.

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
SGD with neither momentum nor weight decay on a torch sparse COO gradient of a plain
parameter is ``param.add_(grad, alpha=-lr)``: torch's own lazy step (only the stored
entries move), in O(nnz), without coalescing -- duplicates are added one by one, as
``torch.optim.SGD`` adds them. Any other sparse or masked case takes the masked path.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim import adagrad as _torch_adagrad
from torch.optim import adam as _torch_adam
from torch.optim import sgd as _torch_sgd

from .._tensor import MaskedTensor
from . import _same_pattern
from ._dense import has_complex, split, switches
from ._scatter import add_at_, grad_for, read_at

__all__ = ["adagrad", "adam", "sgd", "sparse_adam"]


def _step_value(step_t: torch.Tensor, where: str) -> float:
    if not isinstance(step_t, torch.Tensor):
        raise TypeError(f"{where}: state_steps must hold tensors (updated in place), got "
                        f"{type(step_t).__name__}")
    step_t += 1
    return float(step_t)


def _is_plain_coo_pair(param: torch.Tensor, grad: object) -> bool:
    return (isinstance(grad, torch.Tensor) and not isinstance(grad, MaskedTensor)
            and not isinstance(param, MaskedTensor) and grad.layout == torch.sparse_coo
            and grad.shape == param.shape)


def _runs(dense: list[int], full: list[int],
          decay: bool) -> list[tuple[list[int], list[int], bool]]:
    """The calls of torch's functional optimizer: ``(dense, masked, fold)`` positions.

    Without weight decay, one call for both kinds (Note [Gradients over the parameter's
    pattern]); with it, the masked parameters go apart, their decay and ``maximize`` folded
    into their gradients (``fold``), so that torch's decay cannot reach their unspecified
    entries."""
    runs = [(dense, full, False)] if not decay else [(dense, [], False), ([], full, True)]
    return [r for r in runs if r[0] or r[1]]


def _at(items: list[Any], positions: list[int]) -> list[Any]:
    return [items[i] for i in positions]


def _torch_lists(params: list[torch.Tensor], grads: list[Any], dense: list[int],
                 full: list[int], fold: bool, maximize: bool,
                 weight_decay: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Parameters and gradients for torch: the dense pairs as they are, then the masked
    parameters' values with their filled gradients."""
    ps = [params[i] for i in dense]
    gs = [grads[i] for i in dense]
    for i in full:
        ps.append(_same_pattern.target_and_mask(params[i])[0])
        gs.append(_same_pattern.filled_grad(params[i], grads[i], negate=fold and maximize,
                                            weight_decay=weight_decay if fold else 0))
    return ps, gs


def _same_pattern_ready(params: list[torch.Tensor], full: list[int],
                   states: list[list[torch.Tensor | None]]) -> tuple[list[int], list[int]]:
    """``(ready, held)`` of ``full``: the parameters whose ``states`` are 0 at every
    unspecified entry (Note [Gradients over the parameter's pattern]), and the others."""
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
    Dense gradients of plain parameters run through ``torch.optim.adagrad.adagrad`` with
    ``foreach`` / ``fused`` (Note [Dense gradients]).

    >>> import torch, masked_sparse as ms
    >>> param, state_sum = torch.zeros(4), torch.zeros(4)
    >>> grad = torch.sparse_coo_tensor([[1, 3]], [2., -1.], (4,))
    >>> ms.optim.functional.adagrad([param], [grad], [state_sum], [torch.tensor(0.)], lr=0.1,
    ...                             lr_decay=0, weight_decay=0, eps=1e-10, maximize=False)
    >>> param
    tensor([ 0.0000, -0.1000,  0.0000,  0.1000])
    """
    dense, lazy = split(params, grads)
    full, lazy = _same_pattern.full_pairs(params, grads, lazy)
    for d, f, fold in _runs(dense, full, weight_decay != 0):
        ps, gs = _torch_lists(params, grads, d, f, fold, maximize, weight_decay)
        _torch_adagrad.adagrad(ps, gs, _at(state_sums, d + f), _at(state_steps, d + f),
                               has_complex=has_complex(ps), **switches(foreach, fused, lr),
                               lr=lr, weight_decay=0 if fold else weight_decay,
                               lr_decay=lr_decay, eps=eps, maximize=maximize and not fold)
    lr = float(lr)
    for i in lazy:
        param, grad, state_sum, step_t = params[i], grads[i], state_sums[i], state_steps[i]
        param, g = grad_for(param, grad, "adagrad")
        step = _step_value(step_t, "adagrad")
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + read_at(param, g) * weight_decay  # Note [Lazy weight decay]
        clr = lr / (1 + (step - 1) * lr_decay)
        add_at_(state_sum, g.pow(2))
        std = read_at(state_sum, g).sqrt().add(eps)
        add_at_(param, g / std, alpha=-clr)


def sgd(params: list[torch.Tensor], d_p_list: list[torch.Tensor],
        momentum_buffer_list: list[torch.Tensor | None], foreach: bool | None = None,
        fused: bool | None = None, *, weight_decay: float, momentum: float, lr: float,
        dampening: float, nesterov: bool, maximize: bool) -> None:
    """SGD with momentum, dampening, Nesterov and weight decay (lazy for sparse gradients).

    ``momentum_buffer_list[i]`` is None before the first step; it is then created (dense,
    shaped like the parameter's target) and stored back into the list, as torch does. The
    first step copies the gradient into the buffer; later ones apply
    ``buf = momentum * buf + (1 - dampening) * g`` at the specified entries, written as an
    increment so that the stored buffer is exactly the one used for the update. Dense
    gradients of plain parameters run through ``torch.optim.sgd.sgd`` with ``foreach`` /
    ``fused`` (Note [Dense gradients]), and a COO gradient without momentum or weight decay
    is added as torch adds it (Note [SGD without state]).

    >>> import torch, masked_sparse as ms
    >>> param = torch.ones(3)
    >>> ms.optim.functional.sgd([param], [torch.sparse_coo_tensor([[2]], [1.], (3,))], [None],
    ...                         weight_decay=0, momentum=0, lr=0.5, dampening=0,
    ...                         nesterov=False, maximize=False)
    >>> param
    tensor([1.0000, 1.0000, 0.5000])
    """
    dense, lazy = split(params, d_p_list)
    full, lazy = _same_pattern.full_pairs(params, d_p_list, lazy)
    full, held = _same_pattern_ready(params, full, [momentum_buffer_list] if momentum else [])
    lazy = sorted(lazy + held)
    for d, f, fold in _runs(dense, full, weight_decay != 0):
        ps, gs = _torch_lists(params, d_p_list, d, f, fold, maximize, weight_decay)
        buffers = _at(momentum_buffer_list, d + f)
        _torch_sgd.sgd(ps, gs, buffers, **switches(foreach, fused, lr),
                       weight_decay=0 if fold else weight_decay, momentum=momentum, lr=lr,
                       dampening=dampening, nesterov=nesterov, maximize=maximize and not fold)
        for i, buf in zip(d + f, buffers):
            momentum_buffer_list[i] = buf
        for i in f:
            _same_pattern.mark(momentum_buffer_list[i], _same_pattern.target_and_mask(params[i])[1])
    lr = float(lr)
    for i in lazy:
        param, grad = params[i], d_p_list[i]
        if momentum == 0 and weight_decay == 0 and _is_plain_coo_pair(param, grad):
            param.add_(grad, alpha=lr if maximize else -lr)  # Note [SGD without state]
            continue
        param, g = grad_for(param, grad, "sgd")
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + read_at(param, g) * weight_decay  # Note [Lazy weight decay]
        if momentum != 0:
            buf = momentum_buffer_list[i]
            first = buf is None
            if buf is None:
                buf = torch.zeros_like(param, memory_format=torch.preserve_format)
                momentum_buffer_list[i] = buf
            old = read_at(buf, g)
            delta = g if first else old * (momentum - 1) + g * (1 - dampening)
            b = old + delta
            g = g + b * momentum if nesterov else b
            add_at_(buf, delta)
        add_at_(param, g, alpha=-lr)


def adam(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
         exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor],
         state_steps: list[torch.Tensor], foreach: bool | None = None,
         fused: bool | None = None, decoupled_weight_decay: bool = False, *, amsgrad: bool,
         beta1: float, beta2: float, lr: float, weight_decay: float, eps: float,
         maximize: bool) -> None:
    """Adam / AdamW (``decoupled_weight_decay=True``), lazy for sparse gradients.

    See Note [Adam and SparseAdam] for how it relates to ``torch.optim.SparseAdam``.
    ``max_exp_avg_sqs`` is only read when ``amsgrad`` is True. Dense gradients of plain
    parameters run through ``torch.optim.adam.adam`` with ``foreach`` / ``fused`` (Note
    [Dense gradients]).

    >>> import torch, masked_sparse as ms
    >>> param, m, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    >>> grad = torch.sparse_coo_tensor([[0]], [2.], (3,))
    >>> ms.optim.functional.adam([param], [grad], [m], [v], [], [torch.tensor(0.)],
    ...                          amsgrad=False, beta1=0.9, beta2=0.999, lr=0.1,
    ...                          weight_decay=0, eps=1e-8, maximize=False)
    >>> param
    tensor([-0.1000,  0.0000,  0.0000])
    """
    dense, lazy = split(params, grads)
    full, lazy = _same_pattern.full_pairs(params, grads, lazy)
    full, held = _same_pattern_ready(params, full, [exp_avgs, exp_avg_sqs])
    lazy = sorted(lazy + held)
    if full and decoupled_weight_decay and weight_decay != 0:
        # AdamW's decay first, as torch: 1 at the unspecified entries.
        targets, masks = zip(*(_same_pattern.target_and_mask(params[i]) for i in full))
        torch._foreach_mul_(list(targets), [
            _same_pattern.decay_factor(m, 1 - lr * weight_decay, t)
            for t, m in zip(targets, masks)])
    for d, f, fold in _runs(dense, full, weight_decay != 0):
        ps, gs = _torch_lists(params, grads, d, f, fold, maximize,
                              0 if decoupled_weight_decay else weight_decay)
        _torch_adam.adam(ps, gs, _at(exp_avgs, d + f), _at(exp_avg_sqs, d + f),
                         _at(max_exp_avg_sqs, d + f) if amsgrad else [],
                         _at(state_steps, d + f), **switches(foreach, fused, lr),
                         has_complex=has_complex(ps),
                         decoupled_weight_decay=decoupled_weight_decay, amsgrad=amsgrad,
                         beta1=beta1, beta2=beta2, lr=lr,
                         weight_decay=0 if fold else weight_decay, eps=eps,
                         maximize=maximize and not fold)
    for i in full:
        mask = _same_pattern.target_and_mask(params[i])[1]
        _same_pattern.mark(exp_avgs[i], mask)
        _same_pattern.mark(exp_avg_sqs[i], mask)
    lr, beta1, beta2 = float(lr), float(beta1), float(beta2)
    for i in lazy:
        param, g = grad_for(params[i], grads[i], "adam")
        step = _step_value(state_steps[i], "adam")
        if maximize:
            g = -g
        p = read_at(param, g) if weight_decay != 0 else None
        if p is not None and not decoupled_weight_decay:
            g = g + p * weight_decay  # Note [Lazy weight decay]
        # The moments, read where g is specified and moved towards g (as SparseAdam does).
        m, v = read_at(exp_avgs[i], g), read_at(exp_avg_sqs[i], g)
        dm = (g - m) * (1 - beta1)
        dv = (g * g - v) * (1 - beta2)
        m, v = m + dm, v + dv
        add_at_(exp_avgs[i], dm)
        add_at_(exp_avg_sqs[i], dv)
        if amsgrad:
            v_max = read_at(max_exp_avg_sqs[i], g)
            dmax = (v - v_max).clamp_min(0)
            v = v_max + dmax
            add_at_(max_exp_avg_sqs[i], dmax)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
        denom = v.sqrt() / bias_correction2_sqrt + eps
        update = (m * (-lr / bias_correction1)) / denom
        if p is not None and decoupled_weight_decay:
            update = update - p * (lr * weight_decay)  # Note [Lazy weight decay]
        add_at_(param, update)


def sparse_adam(params: list[torch.Tensor], grads: list[torch.Tensor],
                exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                state_steps: list[int], *, eps: float, beta1: float, beta2: float, lr: float,
                maximize: bool) -> None:
    """``torch.optim.SparseAdam``'s step for every gradient form (Note [Adam and SparseAdam]).

    The operations of ``torch.optim._functional.sparse_adam``, in its order, on the
    specified entries: on a COO gradient the same numbers. ``state_steps[i]`` is the step
    count after this step (an int, incremented by the caller, as torch does). A dense
    gradient is specified everywhere; a MaskedTensor gradient where its mask says.

    >>> import torch, masked_sparse as ms
    >>> param, m, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    >>> grad = torch.sparse_coo_tensor([[0]], [2.], (3,))
    >>> ms.optim.functional.sparse_adam([param], [grad], [m], [v], [1], eps=1e-8,
    ...                                 beta1=0.9, beta2=0.999, lr=0.1, maximize=False)
    >>> param
    tensor([-0.1000,  0.0000,  0.0000])
    """
    for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
        param, g = grad_for(param, grad, "sparse_adam")
        if maximize:
            g = -g
        m, v = read_at(exp_avgs[i], g), read_at(exp_avg_sqs[i], g)
        dm = (g - m) * (1 - beta1)
        dv = (g.pow(2) - v) * (1 - beta2)
        # Both sums before the writes: for a strided g, m and v are the state itself.
        numer, denom = dm + m, (dv + v).sqrt() + eps
        add_at_(exp_avgs[i], dm)
        add_at_(exp_avg_sqs[i], dv)
        step = state_steps[i]
        step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        add_at_(param, (numer / denom) * -step_size)
