"""``torch.einsum`` with MaskedTensor operands: two-operand contractions as masked products.

An equation with two operands is rewritten as one batched matrix product (the masked
semantics of :mod:`masked_sparse.ops.linalg`): labels in both operands and the output are
batch dims, labels in both operands only are contracted (merged into one ``k``), labels of
one operand kept in the output are its free dims (merged into ``m`` or ``n``), and a label of
one operand absent from the output is summed out first with the masked ``sum`` (a term
exists iff one of the summed elements is specified, so the two steps agree). Operands are
permuted / reshaped only when the equation needs it, so ``"ij,jk->ik"`` and
``"ik,jk->ij"`` reach a sparse operand unchanged (the second as a transposed product).

A sparse operand with dense dims (a hybrid COO tensor: one index, values ``(nnz, heads)``)
contracts per head over one of its sparse dims: ``"ijh,jhf->ihf"`` is ``A[:, :, h] @ X[:, h]``
for every head ``h``, the index read once (:func:`per_head`; Note [One index for every
head]).

>>> import torch, masked_sparse as ms
>>> q = ms.masked_tensor(torch.ones(1, 2, 3), torch.tensor([[[True] * 3, [False] * 3]]))
>>> torch.einsum("bqd,bkd->bqk", q, torch.ones(1, 4, 3)).get_mask()[0, :, 0].tolist()
[True, False]
"""

from __future__ import annotations

import functools
import string
from typing import Any

import torch

import layouts
from layouts import Storage

from .. import _func
from .._autograd import _backward_with_graph, grad_values, on_values
from .._fill import all_specified
from .._registry import implements
from .._tensor import MaskedTensor, _wrap, ndim_of, requires_grad_of
from .linalg import matmul, zero_filled_operand

_STRIDED = layouts.get_layout(torch.strided)
_COO = layouts.get_layout(torch.sparse_coo)


def _unsupported(equation: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"einsum({equation!r}) with MaskedTensor operands: {why}; use "
                               f"the operands' .to_tensor(0) for plain einsum")


def _expand_ellipsis(spec: str, ndim: int, width: int, spare: str, equation: str) -> str:
    if "..." not in spec:
        if len(spec) != ndim:
            raise ValueError(f"einsum({equation!r}): subscripts {spec!r} do not match an operand "
                             f"with {ndim} dims")
        return spec
    covered = ndim - (len(spec) - 3)
    if covered < 0:
        raise ValueError(f"einsum({equation!r}): subscripts {spec!r} have more labels than the "
                         f"operand's {ndim} dims")
    return spec.replace("...", spare[width - covered:width])


def _parse(equation: str, a: torch.Tensor, b: torch.Tensor) -> tuple[str, str, str]:
    return _parse_dims(equation, _ndim(a), _ndim(b))


def _ndim(x: torch.Tensor) -> int:
    return ndim_of(x) if type(x) is MaskedTensor else x.dim()


@functools.lru_cache(maxsize=256)
def _parse_dims(equation: str, a_dim: int, b_dim: int) -> tuple[str, str, str]:
    """The operands' and the output's labels, ellipses expanded (a function of the
    equation and the operands' dims alone: cached, it runs on every call)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    specs = lhs.split(",")
    if len(specs) != 2:
        raise ValueError(f"einsum({equation!r}): expected subscripts for 2 operands")
    spare = "".join(c for c in string.ascii_uppercase + string.ascii_lowercase if c not in eq)
    width = max(a_dim - (len(specs[0]) - 3) if "..." in specs[0] else 0,
                b_dim - (len(specs[1]) - 3) if "..." in specs[1] else 0)
    sa = _expand_ellipsis(specs[0], a_dim, width, spare, equation)
    sb = _expand_ellipsis(specs[1], b_dim, width, spare, equation)
    if not arrow:  # torch's implicit output: labels seen once, in alphabetical order
        once = sorted(c for c in set(sa + sb) if (sa + sb).count(c) == 1 and c not in spare)
        out = spare[:width] + "".join(once)
    else:
        out = out.replace("...", spare[:width])
    for spec in (sa, sb, out):
        if len(set(spec)) != len(spec):
            raise _unsupported(equation, "a label repeated within one term (a diagonal)")
    if set(out) - set(sa + sb):
        raise ValueError(f"einsum({equation!r}): output labels {sorted(set(out) - set(sa + sb))} "
                         f"appear in no operand")
    return sa, sb, out


def _sum_out(x: torch.Tensor, spec: str, keep: str) -> tuple[torch.Tensor, str]:
    """Sum (masked) the labels of ``spec`` that are not in ``keep``."""
    dims = tuple(i for i, c in enumerate(spec) if c not in keep)
    if not dims:
        return x, spec
    return x.sum(dims), "".join(c for c in spec if c in keep)


def _arrange(x: torch.Tensor, spec: str, order: str) -> torch.Tensor:
    """``x`` permuted from ``spec`` to ``order`` (no op when they agree)."""
    if spec == order:
        return x
    return x.permute([spec.index(c) for c in order])


@implements(torch.einsum)
def einsum(op: Any, equation: str, *operands: Any) -> Any:
    """``torch.einsum`` for two operands, at least one of them masked (module docstring)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) != 2:
        raise _unsupported(equation, f"{len(operands)} operands (two are supported)")
    a, b = operands
    sa, sb, out = _parse(equation, a, b)
    for sparse, dense, ss, sd in ((a, b, sa, sb), (b, a, sb, sa)):
        if _has_dense_dims(sparse):
            return per_head(equation, sparse, ss, dense, sd, out)
    a, sa = _sum_out(a, sa, sb + out)
    b, sb = _sum_out(b, sb, sa + out)
    size = {c: n for spec, x in ((sa, a), (sb, b)) for c, n in zip(spec, x.shape)}
    for c in set(sa) & set(sb):
        if a.shape[sa.index(c)] != b.shape[sb.index(c)]:
            raise _unsupported(equation, f"label {c!r} has sizes {a.shape[sa.index(c)]} and "
                                         f"{b.shape[sb.index(c)]} (broadcasting a label)")
    batch = "".join(c for c in out if c in sa and c in sb)
    contract = "".join(c for c in sa if c in sb and c not in out)
    free_a = "".join(c for c in out if c in sa and c not in sb)
    free_b = "".join(c for c in out if c in sb and c not in sa)

    def flat(x: torch.Tensor, spec: str, groups: tuple[str, ...]) -> torch.Tensor:
        x = _arrange(x, spec, "".join(groups))
        shape = [size[c] for c in batch] + [_numel(g, size) for g in groups[1:]]
        return x if list(x.shape) == shape else x.reshape(shape)

    left = flat(a, sa, (batch, free_a, contract))
    transpose_b = sb == batch + free_b + contract and sb != batch + contract + free_b
    right = flat(b, sb, (batch, free_b, contract) if transpose_b else (batch, contract, free_b))
    product = matmul("einsum", left, right, transpose_b)
    full = [size[c] for c in batch + free_a + free_b]
    if list(product.shape) != full:
        product = product.reshape(full)
    return _arrange(product, batch + free_a + free_b, out)


def _numel(labels: str, size: dict[str, int]) -> int:
    n = 1
    for c in labels:
        n *= size[c]
    return n


# Note [One index for every head]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Multi-head attention over a graph has one pattern (the edges) and H values per stored
# position. torch's hybrid COO tensor stores exactly that: an index over the two sparse
# dims, values (nnz, H). Its softmax, broadcasting and reductions are the ordinary masked
# ops (each kernel works on the values, whatever their trailing dims); the product with
# per-head features is an einsum over the sparse dims with the heads as a batch label:
# gather the features at the stored column of each entry, multiply by the entry's H
# values, add into its row -- O(nnz * H * F) with the index stored and read once, not
# repeated per head as a block-diagonal (H*N x H*N) matrix would. An output element
# (i, h, f...) is specified iff row i holds a specified entry for head h (a term exists),
# as in every masked product.


def _has_dense_dims(x: Any) -> bool:
    """True for a sparse MaskedTensor of more than 2 dims whose values have dense dims (a
    hybrid tensor). A 2-D operand has none to check: the common product pays nothing."""
    if not isinstance(x, MaskedTensor) or _ndim(x) <= 2 or not x._storage.index:
        return False
    return _coo(x._storage).values.dim() > 1


def _coo(storage: Storage) -> Storage:
    return storage if storage.layout is _COO else layouts.convert(storage, _COO)


def per_head(equation: str, a: MaskedTensor, sa: str, b: Any, sb: str, out: str) -> Any:
    """``einsum`` of a hybrid masked operand ``a`` (2 sparse dims, then dense dims: the
    heads) and a plain ``b``, contracting one sparse dim per head (Note [One index for
    every head]).

    >>> import torch, masked_sparse as ms
    >>> i = torch.tensor([[0, 1], [1, 0]])                  # edges 0 -> 1 and 1 -> 0
    >>> v = torch.tensor([[1., 2.], [3., 4.]])               # 2 heads
    >>> def coo(values):
    ...     return torch.sparse_coo_tensor(i, values, (2, 2, 2), check_invariants=True)
    >>> a = ms.masked_tensor(coo(v), coo(v > 0))
    >>> torch.einsum("ijh,jhf->ihf", a, torch.ones(2, 2, 1)).to_tensor(0).flatten().tolist()
    [1.0, 2.0, 3.0, 4.0]
    """
    storage = a._storage
    coo = _coo(storage)
    n_sparse = coo.index[0].shape[0]
    if isinstance(b, MaskedTensor) or n_sparse != 2:
        raise _unsupported(equation, f"a {n_sparse}-D sparse operand with dense dims times "
                                     f"a {'masked' if isinstance(b, MaskedTensor) else 'plain'}"
                                     " operand (per-head products take 2 sparse dims and a "
                                     "plain operand)")
    contract, right_order, produced, n_free = _per_head_plan(equation, sa, sb, out)
    right = _arrange(b, sb, right_order)
    if (coo is storage and torch.is_grad_enabled()  # (its gradient: a's storage, new values)
            and (right.requires_grad or requires_grad_of(a))
            and not torch.compiler.is_compiling() and not _func.active()):
        # filled once, for the product and its backward; recorded nowhere (values that
        # require grad: a gradient being differentiated)
        if coo.values.requires_grad:
            with torch.no_grad():
                filled = zero_filled_operand(coo)
        else:
            filled = zero_filled_operand(coo)
        result = _PRODUCT_APPLY(a, right, contract, n_free, filled)
    else:  # nothing to record, or a tracer: the generic route
        result = on_values(_per_head_kernel, [a, right], contract, n_free)
    return _arrange(result, produced, out)


@functools.lru_cache(maxsize=256)
def _per_head_plan(equation: str, sa: str, sb: str, out: str) -> tuple[int, str, str, int]:
    """``(contract, right, produced, n_free)`` of a per-head product (a function of the
    labels alone: cached, it runs on every call): the sparse dim summed, the plain
    operand's label order (summed, heads, features), the result's, and the number of
    feature labels; raises where the labels are not a per-head product."""
    rows, heads = sa[:2], sa[2:]
    summed = [c for c in rows if c in sb and c not in out]
    kept = [c for c in rows if c in out]
    free = "".join(c for c in sb if c not in sa)
    if (len(summed) != 1 or len(kept) != 1 or any(c not in sb or c not in out for c in heads)
            or any(c not in out for c in free) or set(sb) - set(summed[0] + heads + free)):
        raise _unsupported(equation, "a hybrid sparse operand contracts one sparse dim with a "
                                     "plain operand holding its dense dims as batch labels "
                                     "(e.g. 'ijh,jhf->ihf')")
    return rows.index(summed[0]), summed[0] + heads + free, kept[0] + heads + free, len(free)


def _per_head_kernel(storages: list, contract: int, n_free: int) -> Storage:
    """The per-head product of a hybrid COO storage and a plain tensor of ``n_free``
    feature dims: a strided storage whose mask says which output lines hold a term."""
    return _per_head_filled(_coo(zero_filled_operand(storages[0])), storages[1], contract,
                            n_free)


def _per_head_filled(s: Storage, dense: torch.Tensor, contract: int, n_free: int) -> Storage:
    """:func:`_per_head_kernel` of a COO storage ``s`` whose unspecified values are 0."""
    values = layouts.per_head_mm(s, s.values, dense, contract=contract)
    features = tuple(values.shape[values.dim() - n_free:]) if n_free else ()
    mask = layouts.per_head_specified(s, contract=contract, features=features)
    return _STRIDED.build((), values, mask, values.shape)


class _PerHeadProduct(torch.autograd.Function):
    """:func:`per_head` recorded as one node whose backward is the per-head kernels (the
    values' gradient a sampled dot, the plain operand's a transposed product: Note [The
    per-head product's kernels]), not an inner graph run by the engine, as ``on_values``
    would record it: on a small graph that run cost more than the kernels. With
    ``create_graph`` the backward is ``on_values``' own (Note [Double backward]). Applied
    only eagerly, outside torch.func transforms (:func:`per_head` checks), so it is a plain
    Function applied without torch's per-call binding (``_PRODUCT_APPLY``)."""

    @staticmethod
    def forward(ctx, a: MaskedTensor, right: torch.Tensor, contract: int,  # type: ignore[override]
                n_free: int, filled: Storage) -> Any:
        # ``filled``: a's COO storage with its unspecified values zeroed (known zero filled,
        # so the kernel fills nothing again)
        out = _per_head_filled(filled, right, contract, n_free)
        ctx.contract, ctx.n_free, ctx.storage = contract, n_free, filled
        ctx.inputs, ctx.out = (a, right), out
        return _wrap(out)

    @staticmethod
    def backward(ctx, grad: Any) -> tuple:
        extra = (ctx.contract, ctx.n_free)
        if torch.is_grad_enabled():  # create_graph=True
            return (*_backward_with_graph(_per_head_kernel, extra, ctx.inputs, [ctx.out],
                                          [grad]), None, None, None)
        s, (a, right) = ctx.storage, ctx.inputs
        g = grad_values(grad, ctx.out)
        grad_a = grad_right = None
        if ctx.needs_input_grad[0]:
            values = layouts.per_head_dot(s, g, right, contract=ctx.contract)
            if not all_specified(s.mask):
                values = layouts.zero_unspecified(values, s.mask)
            if values.dtype is not s.values.dtype:
                values = values.to(s.values.dtype)
            grad_a = _wrap(a._storage.with_values(values))
        if ctx.needs_input_grad[1]:
            grad_right = layouts.per_head_mm(s, s.values, g, contract=1 - ctx.contract)
        return grad_a, grad_right, None, None, None


_PRODUCT_APPLY = super(torch.autograd.Function, _PerHeadProduct).apply  # _FunctionBase.apply
