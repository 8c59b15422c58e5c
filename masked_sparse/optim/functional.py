"""Functional optimizers: one code path per algorithm, for every gradient form and layout.

Each function has the signature of its ``torch.optim`` counterpart (without the
``foreach`` / ``fused`` switches) and reads like the dense algorithm: the gradient
becomes a MaskedTensor once (:func:`~masked_sparse.optim.as_masked_grad`), the state is
read where it is specified (:func:`~masked_sparse.optim.read_at`), masked ops compute the
update and :func:`~masked_sparse.optim.add_at_` writes it back. Nothing asks for the
layout, so dense, torch sparse COO (uncoalesced, hybrid) and MaskedTensor gradients in
strided, COO, CSR -- or any registered layout -- go through the same lines.

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
``lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``. ``SparseAdam`` adds ``eps`` before the
bias correction (``sqrt(v) + eps``), i.e. uses ``eps * sqrt(bc2)`` in Adam's formula; the
two agree exactly for ``eps = 0`` and to O(eps) otherwise. Adam's placement is kept so
that ``Adam`` / ``AdamW`` on dense gradients are the dense torch algorithms.
"""

from __future__ import annotations

import math

import torch

from ._scatter import add_at_, grad_for, read_at

__all__ = ["adagrad", "adam", "sgd"]


def _step_value(step_t: torch.Tensor, where: str) -> float:
    if not isinstance(step_t, torch.Tensor):
        raise TypeError(f"{where}: state_steps must hold tensors (updated in place), got "
                        f"{type(step_t).__name__}")
    step_t += 1
    return float(step_t)


def adagrad(params: list[torch.Tensor], grads: list[torch.Tensor],
            state_sums: list[torch.Tensor], state_steps: list[torch.Tensor], *, lr: float,
            lr_decay: float, weight_decay: float, eps: float, maximize: bool) -> None:
    """Adagrad on dense, sparse or masked gradients (lazy for sparse ones).

    ``state_sums[i]`` has the shape of ``params[i]`` (of its stored values for a
    MaskedTensor parameter); ``state_steps[i]`` is a 0-d tensor, incremented in place.

    >>> import torch, masked_sparse as ms
    >>> param, state_sum = torch.zeros(4), torch.zeros(4)
    >>> grad = torch.sparse_coo_tensor([[1, 3]], [2., -1.], (4,))
    >>> ms.optim.functional.adagrad([param], [grad], [state_sum], [torch.tensor(0.)], lr=0.1,
    ...                             lr_decay=0, weight_decay=0, eps=1e-10, maximize=False)
    >>> param
    tensor([ 0.0000, -0.1000,  0.0000,  0.1000])
    """
    for param, grad, state_sum, step_t in zip(params, grads, state_sums, state_steps,
                                              strict=True):
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
        momentum_buffer_list: list[torch.Tensor | None], *, weight_decay: float,
        momentum: float, lr: float, dampening: float, nesterov: bool, maximize: bool) -> None:
    """SGD with momentum, dampening, Nesterov and weight decay (lazy for sparse gradients).

    ``momentum_buffer_list[i]`` is None before the first step; it is then created (dense,
    shaped like the parameter's target) and stored back into the list, as torch does. The
    first step copies the gradient into the buffer; later ones apply
    ``buf = momentum * buf + (1 - dampening) * g`` at the specified entries, written as an
    increment so that the stored buffer is exactly the one used for the update.

    >>> import torch, masked_sparse as ms
    >>> param = torch.ones(3)
    >>> ms.optim.functional.sgd([param], [torch.sparse_coo_tensor([[2]], [1.], (3,))], [None],
    ...                         weight_decay=0, momentum=0, lr=0.5, dampening=0,
    ...                         nesterov=False, maximize=False)
    >>> param
    tensor([1.0000, 1.0000, 0.5000])
    """
    for i, (param, grad) in enumerate(zip(params, d_p_list, strict=True)):
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
         state_steps: list[torch.Tensor], *, amsgrad: bool, beta1: float, beta2: float,
         lr: float, weight_decay: float, eps: float, maximize: bool,
         decoupled_weight_decay: bool = False) -> None:
    """Adam / AdamW (``decoupled_weight_decay=True``), lazy for sparse gradients.

    See Note [Adam and SparseAdam] for how it relates to ``torch.optim.SparseAdam``.
    ``max_exp_avg_sqs`` is only read when ``amsgrad`` is True.

    >>> import torch, masked_sparse as ms
    >>> param, m, v = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    >>> grad = torch.sparse_coo_tensor([[0]], [2.], (3,))
    >>> ms.optim.functional.adam([param], [grad], [m], [v], [], [torch.tensor(0.)],
    ...                          amsgrad=False, beta1=0.9, beta2=0.999, lr=0.1,
    ...                          weight_decay=0, eps=1e-8, maximize=False)
    >>> param
    tensor([-0.1000,  0.0000,  0.0000])
    """
    for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
        param, g = grad_for(param, grad, "adam")
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
