"""Matrix products with masked operands: ``mm``, ``mv``, ``bmm``, ``matmul`` / ``@``,
``addmm``, ``baddbmm``, ``F.linear`` and two-operand ``einsum``, on every layout.

Semantics (docs/design.md), written once here for every layout -- *unspecified means absent from
the sum*:

- ``out[..., i, j]`` sums ``a[..., i, l] * b[..., l, j]`` over the ``l`` where every masked
  factor is specified; it is specified iff at least one such ``l`` exists. So for a masked
  ``a`` and a plain ``b`` the row ``i`` is specified iff row ``i`` of ``a`` has a specified
  element, for a plain ``a`` and a masked ``b`` the column ``j`` likewise, and for two
  masked factors the output mask is the boolean product of the masks. A fully masked row is
  unspecified, never 0 and never NaN.
- ``addmm`` / ``baddbmm`` / ``F.linear``'s ``input`` / ``bias`` add to the specified outputs
  (a plain tensor broadcasts and takes the product's mask; a masked one must match it).
- Gradients: a masked operand's gradient has its mask and layout (for a sparse operand the
  sampled product ``G @ B.T`` at its stored positions, ``layouts._linalg`` Note [Sampled
  gradient]); a plain operand's gradient is ``A_filled_with_0.T @ G`` where ``G`` is 0 at
  unspecified outputs (:func:`masked_sparse._autograd.on_values`).

Note [Products by zero filling]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Filling unspecified values with 0 (``torch.where``, so garbage and NaN under the mask reach
neither the sum nor the gradient) turns the masked sum into an ordinary product: strided
operands use ``torch.matmul``, a sparse operand the layout's ``aten.mm`` kernel on its
stored values (:func:`layouts.sparse_mm`, torch's sparse matmul). Only the output *mask*
needs masked reasoning, and it comes from the mask pattern alone: "row ``i`` has a
specified element" (:func:`layouts.specified_lines`, O(nnz)) for one masked factor, the
product of the 0/1 masks for two. A sparse operand is never densified; the result is
strided, except for sparse @ sparse (the product's stored pattern is exactly its specified
set: in the left operand's layout when it needs no format options, else COO).

>>> import torch, masked_sparse as ms
>>> a = ms.masked_tensor(torch.tensor([[1., 2.], [3., 4.]]),
...                      torch.tensor([[True, False], [False, False]]))
>>> a @ torch.ones(2, 2)
MaskedTensor(
  [
    [  1.0000,   1.0000],
    [      --,       --]
  ]
)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch._C import DisableTorchFunctionSubclass

import layouts
from layouts import Storage

from .._autograd import _backward_with_graph, grad_on, on_values
from .._fill import all_specified, is_zero_filled, zero_fill
from .._id_tags import IdTags
from .._registry import implements
from .._tensor import MaskedTensor, _wrap, requires_grad_of

Operand = Storage | torch.Tensor
_STRIDED = layouts.get_layout(torch.strided)


# -- the product on storages (run under on_values) -----------------------------------------
def _is_sparse(x: Operand) -> bool:
    return isinstance(x, Storage) and bool(x.index)


def zero_filled_operand(x: Operand, partial: bool = False) -> Operand:
    """A product's operand with its unspecified values read as 0: filled, unless nothing is
    unspecified or the values are known zero filled (Note [Known zero fill]). ``partial``:
    the caller already knows that some element is unspecified (no second look at the mask)."""
    if (not isinstance(x, Storage) or is_zero_filled(x.values, x.mask)
            or (not partial and all_specified(x.mask))):  # nothing to fill: one pass saved
        return x
    return x.with_values(zero_fill(x.values, x.mask))


def _dense(x: Operand, transpose: bool = False) -> torch.Tensor:
    t = x.values if isinstance(x, Storage) else x
    return t.mT if transpose else t


def _sparse_left(s: Storage, dense: torch.Tensor) -> torch.Tensor:
    """``S @ dense`` for a 2-D sparse ``S`` and ``dense`` of shape ``(..., k, n)``."""
    if dense.dim() == 2:
        return layouts.sparse_mm(s, dense)
    batch, n = dense.shape[:-2], dense.shape[-1]
    flat = dense.movedim(-2, 0).reshape(dense.shape[-2], -1)  # (k, batch * n)
    out = layouts.sparse_mm(s, flat)
    return out.reshape((s.shape[0],) + tuple(batch) + (n,)).movedim(0, -2)


def _sparse_right(dense: torch.Tensor, s: Storage, transpose: bool) -> torch.Tensor:
    """``dense @ S`` (``dense @ S.T``) for ``dense`` of shape ``(..., m, k)`` and 2-D ``S``."""
    flat = dense if dense.dim() == 2 else dense.reshape(-1, dense.shape[-1])  # (batch * m, k)
    out = layouts.sparse_mm(s, flat.t(), transpose=not transpose).t()
    return out if dense.dim() == 2 else out.reshape(dense.shape[:-1] + out.shape[-1:])


def _values_product(a: Operand, b: Operand, transpose_b: bool) -> torch.Tensor:
    """The product of two operands with at most one sparse storage, as a dense tensor."""
    if _is_sparse(a):
        return _sparse_left(a, _dense(b, transpose_b))
    if _is_sparse(b):
        return _sparse_right(_dense(a), b, transpose_b)
    return torch.matmul(_dense(a), _dense(b, transpose_b))


_LINES = IdTags()  # mask -> {dim: (version, lines)}


def _any(mask: torch.Tensor, dim: int) -> torch.Tensor:
    """``mask.any(dim)`` as a uint8 ``amax`` (bool reductions are slow in torch), over the
    stored elements only of a mask broadcast over some dims (the result broadcasts back).

    Compiled code takes ``any``: Inductor's CPU code cannot vectorize the bool view of a
    uint8 reduction, and fuses ``any`` itself.

    A weight's mask is the same object from step to step: above a thousand elements the answer is
    kept per mask object, dim and version (as :func:`._fill.all_specified`)."""
    if mask.shape[dim] == 0:  # an empty sum: no term
        return mask.new_zeros(mask.shape[:dim] + mask.shape[dim:][1:])
    if torch.compiler.is_compiling():
        return layouts.broadcast_part(mask).any(dim)
    keep = (mask.numel() > 1 << 10 and not mask.is_inference()
            and not torch._C._are_functorch_transforms_active())
    if keep:
        entry = (_LINES.get(mask) or {}).get(dim)
        if entry is not None and entry[0] == mask._version and entry[2] == entry[1]._version:
            return entry[1]  # (nor was the answer written since)
    lines = layouts.broadcast_part(mask).view(torch.uint8).amax(dim).view(torch.bool)
    if keep:
        per_dim = _LINES.get(mask)
        if per_dim is None:
            per_dim = {}
            _LINES.set(mask, per_dim)
        per_dim[dim] = (mask._version, lines, lines._version)
    return lines


def _as_counts(x: Storage, dtype: torch.dtype, keep: int) -> Operand:
    """``x``'s mask as 0/1 numbers: a sparse storage over its own pattern, a strided mask
    with its broadcast dims cut to size 1 except ``keep``, the summed one (Note [Output mask
    of two masked factors])."""
    if x.index:
        return x.with_values(x.mask.to(dtype))
    mask = x.mask
    return layouts.broadcast_part(mask, keep=keep % mask.dim()).to(dtype)


def _output_mask(a: Operand, b: Operand, transpose_b: bool, shape: torch.Size,
                 dtype: torch.dtype) -> torch.Tensor:
    """Where the product has at least one term (Note [Products by zero filling]).

    Note [Output mask of two masked factors]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    With two masked factors the output mask is the boolean product of the masks, computed
    as a product of 0/1 counts. A strided mask broadcast over some dims -- the output of a
    masked layer is specified per feature, the same for every sample of the batch -- is
    multiplied at its stored size (its stride-0 dims cut to 1, the summed dim kept), and the
    counts broadcast back: for ``linear(h, W)`` after a masked layer that is one vector
    times ``W``'s pattern instead of a second product as large as the layer's own.
    """
    if isinstance(a, Storage) and isinstance(b, Storage):
        # A strided factor specified everywhere adds no condition: the mask is the other's.
        if not a.index and all_specified(a.mask):
            a = a.values
        elif not b.index and all_specified(b.mask):
            b = b.values
    if isinstance(a, Storage) and isinstance(b, Storage):
        counts = _values_product(_as_counts(a, dtype, -1),
                                 _as_counts(b, dtype, -1 if transpose_b else -2), transpose_b)
        return (counts > 0).expand(*shape)
    if isinstance(a, Storage):  # rows of a that hold a specified element
        rows = layouts.specified_lines(a, 0) if a.index else _any(a.mask, -1)
        return rows.unsqueeze(-1).expand(*shape)
    col_dim = 0 if transpose_b else 1  # columns of b: rows of the stored b.T
    if b.index:
        cols = layouts.specified_lines(b, col_dim)
    else:
        cols = _any(b.mask, -1 if transpose_b else -2)
    return cols.unsqueeze(-2).expand(*shape)


def _as_dense(x: Operand) -> Operand:
    """A sparse operand dense enough for its device as its dense buffer (Note [Products
    chosen per device and density] in ``layouts._dense_operand``), else itself."""
    if not _is_sparse(x):
        return x
    dense = layouts.dense_operand(x)
    return x if dense is None else dense


def _product(operands: list[Operand], transpose_b: bool) -> Storage:
    a, b = (zero_filled_operand(x) for x in operands[:2])
    if _is_sparse(a) and _is_sparse(b):
        out = layouts.sparse_sparse_mm(a, b, transpose_b)
        return out if a.layout.options_of(a) else a.layout.from_coo(out)
    a, b = _as_dense(a), _as_dense(b)
    if len(operands) == 3 and not _is_sparse(a) and not _is_sparse(b) and \
            _dense(a).dim() == 2 and _dense(b).dim() == 2:
        # linear's plain bias (Note [Linear's bias]) in the product's own kernel, as torch
        values = torch.addmm(operands[2], _dense(a), _dense(b, transpose_b))
    else:
        values = _values_product(a, b, transpose_b)
        if len(operands) == 3:
            values = values + operands[2]
    count_dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    mask = _output_mask(operands[0], operands[1], transpose_b, values.shape, count_dtype)
    return _STRIDED.build((), values, mask, values.shape)


def _mat1_grad(g: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The gradient of ``left`` in ``left @ right``, as torch's ``mm`` backward computes it
    (in ``left``'s memory order)."""
    if left.stride(0) == 1 and left.stride(1) == left.shape[0] and left.shape[0] > 1:
        return torch.mm(right, g.t()).t()
    return torch.mm(g, right.t())


def _mat2_grad(g: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The gradient of ``right`` in ``left @ right``, as torch's ``mm`` backward computes it
    (a transposed weight -- ``linear`` -- gets ``g.T @ left``, contiguous)."""
    if right.stride(0) == 1 and right.stride(1) == right.shape[0] and right.shape[0] > 1:
        return torch.mm(g.t(), left).t()
    return torch.mm(left.t(), g)


def _plain_if_full(s: Operand) -> Operand:
    """A strided factor specified everywhere as its plain values, else itself."""
    return s.values if isinstance(s, Storage) and not s.index and all_specified(s.mask) else s


def _strided_partial(x: Operand) -> bool:
    """A strided factor that :func:`_plain_if_full` kept as a storage: partly specified."""
    return isinstance(x, Storage) and not x.index


def _buffer_of(f: Operand, s: Operand) -> tuple[Operand, torch.Tensor | None]:
    """A (filled) sparse factor ``f`` of storage ``s`` that multiplies as dense on its device
    as its dense buffer, kept per ``s``'s values object and written when they or the mask
    change, and the stored positions (Note [Products chosen per device and density] in
    ``layouts._dense_operand``); any other factor as it is."""
    if not _is_sparse(f) or not layouts.dense_chosen(s):
        return f, None
    return layouts.dense_buffer(f, s.values, (s.values._version, s.mask._version))


def _one_node_sparse(x: Any) -> bool:
    """A 2-D sparse MaskedTensor operand of :class:`_MatrixProduct`: one value per stored
    element (COO, CSR, CSC; not blocks or dense dims, which take the generic route)."""
    return x.dim() == 2 and x._storage.values.dim() == 1


def _sparse_factor_grads(sparse: Storage, other: torch.Tensor, g: torch.Tensor, a_sparse: bool,
                         transpose_b: bool, need: tuple[bool, bool]) -> list[Any]:
    """The gradients ``[grad_a, grad_b]`` of ``a @ b`` (``a @ b.T``) with one sparse factor,
    its (filled) storage ``sparse``, and ``other`` the dense one as given: the sparse
    factor's is the sampled product at its stored positions (Note [Sampled gradient] in
    ``layouts._linalg``), shaped like its values; the dense one's a product with the sparse
    factor, both as the generic route's inner graph computes them."""
    need_a, need_b = need
    if a_sparse:  # S @ B, B = other (.T): dS = G @ B.T at S, dB = S.T @ G
        right = other.mT if transpose_b else other
        grad_b = layouts.sparse_mm(sparse, g, transpose=True) if need_b else None
        return [layouts.sampled_mm(sparse, g, right.mT) if need_a else None,
                grad_b.mT if grad_b is not None and transpose_b else grad_b]
    # A @ S.T (A @ S), A = other: dA = G @ S (G @ S.T), dS = G.T @ A (A.T @ G) at S
    grad_s = None
    if need_b:
        grad_s = (layouts.sampled_mm(sparse, g.mT, other) if transpose_b
                  else layouts.sampled_mm(sparse, other.mT, g))
    return [_sparse_right(g, sparse, not transpose_b) if need_a else None, grad_s]


class _MatrixProduct(torch.autograd.Function):
    """Note [One Function for a matrix product]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    The product of two 2-D operands (at least one masked, at most one sparse) plus linear's
    plain bias -- a pruned ``nn.Linear`` with a strided or sparse masked weight -- is
    differentiated by hand instead of through :func:`on_values`' inner graph, which costs a
    nested autograd run and an autograd node per fill at every layer of every step.
    Forward: each masked factor filled once (:func:`zero_filled_operand`), a sparse one
    dense enough for its device as its kept dense buffer, then ``addmm`` / ``mm``, or the
    layout's sparse kernel (``layouts.sparse_mm``) for a sparse factor below its device's
    threshold; the output mask as :func:`_output_mask` says. Backward: the incoming gradient
    read at the output as ``on_values`` reads it, then torch's own ``mm`` backward formulas,
    or for a sparse factor the product with it and its sampled gradient
    (:func:`_sparse_factor_grads`); each masked factor's gradient filled with its mask
    exactly when its forward was filled, wrapped over the factor's storage (its mask and
    layout); the bias's gradient is the plain column sum. So values, masks and gradients are
    those of the generic route (``tests/autograd/test_train_linear.py``), and ``python -m
    benchmarks.bench_training`` times the step. A backward that builds a graph
    (``create_graph=True``) takes the generic route's double backward (Note [Double
    backward]).
    """

    @staticmethod
    def forward(ctx, transpose_b: bool, a: Any, b: Any, bias: Any) -> Any:  # type: ignore[override]
        sa = a._storage if isinstance(a, MaskedTensor) else a
        sb = b._storage if isinstance(b, MaskedTensor) else b
        # A strided factor specified everywhere is plain for the fill and the output mask
        # alike (as in zero_filled_operand and _output_mask, asked once here).
        ma, mb = _plain_if_full(sa), _plain_if_full(sb)
        fa_in, fb_in = ma, mb
        fa = zero_filled_operand(ma, partial=_strided_partial(ma))
        fb = zero_filled_operand(mb, partial=_strided_partial(mb))
        filled = (fa is not fa_in, fb is not fb_in)
        # A sparse factor (dense enough for its device) as its kept dense buffer.
        (fa, flat_a), (fb, flat_b) = _buffer_of(fa, sa), _buffer_of(fb, sb)
        if _is_sparse(fa) or _is_sparse(fb):  # the layout's sparse kernel
            sparse, other = (fa, _dense(fb)) if _is_sparse(fa) else (fb, _dense(fa))
            values = _values_product(fa, fb, transpose_b)
            if bias is not None:
                values = values + bias
            ctx.save_for_backward(other, sparse.values)
            ctx.sparse = (sparse, _is_sparse(fa))
        else:
            left, right = _dense(fa), _dense(fb, transpose_b)
            values = torch.mm(left, right) if bias is None else torch.addmm(bias, left, right)
            ctx.save_for_backward(left, right)
            ctx.sparse = None
        count_dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
        if not (isinstance(ma, Storage) or isinstance(mb, Storage)):
            ma, mb = sa, sb  # (the mask of a factor specified everywhere, by _output_mask)
        out = _STRIDED.build((), values, _output_mask(ma, mb, transpose_b, values.shape,
                                                      count_dtype), values.shape)
        ctx.storages, ctx.out, ctx.transpose_b = (sa, sb), out, transpose_b
        ctx.filled, ctx.flats = filled, (flat_a, flat_b)
        ctx.tensors = (a, b, bias)
        return _wrap(out)

    @staticmethod
    def backward(ctx, grad: Any) -> Any:  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: Note [Double backward]
            inputs = [t for t in ctx.tensors if t is not None]
            got = _backward_with_graph(_product, (ctx.transpose_b,), inputs, [ctx.out], [grad])
            return (None, *got, None) if len(inputs) == 2 else (None, *got)
        values, mask = grad_on(grad, ctx.out)  # unspecified outputs contribute nothing
        g = (layouts.zero_unspecified(values, mask)
             if isinstance(grad, MaskedTensor) and not all_specified(mask) else values)
        _, need_a, need_b, need_bias = ctx.needs_input_grad
        if ctx.sparse is not None:
            other, sparse_values = ctx.saved_tensors
            sparse, a_sparse = ctx.sparse
            grads = _sparse_factor_grads(sparse.with_values(sparse_values), other, g, a_sparse,
                                         ctx.transpose_b, (need_a, need_b))
        else:
            left, right = ctx.saved_tensors
            grads = [_mat1_grad(g, left, right) if need_a else None,
                     _mat2_grad(g, left, right) if need_b else None]
            if need_b and ctx.transpose_b:
                grads[1] = grads[1].mT
        result: list[Any] = [None, *grads, g.sum(0) if need_bias else None]
        for i, (s, filled, flat) in enumerate(zip(ctx.storages, ctx.filled, ctx.flats),
                                              start=1):
            if result[i] is not None and isinstance(s, Storage):
                gv = result[i]
                if flat is not None:  # a sparse factor's buffer: read at its stored positions
                    gv = gv.reshape(-1).index_select(0, flat)
                gv = zero_fill(gv, s.mask) if filled else gv
                result[i] = _wrap(s.with_values(gv))
        return tuple(result)


# ``Function.apply`` less its Python layer (no setup_context; _fuses rules out torch.compile
# and torch.func transforms), as for the sum with a plain operand (ops/plain_operands.py)
_PRODUCT_APPLY = super(torch.autograd.Function, _MatrixProduct).apply  # _FunctionBase.apply


def _fuses(a: torch.Tensor, b: torch.Tensor, bias: Any) -> bool:
    """True for :class:`_MatrixProduct`: two 2-D operands, at most one sparse (one value per
    stored element), eager autograd."""
    sparse_a = isinstance(a, MaskedTensor) and bool(a._storage.index)
    sparse_b = isinstance(b, MaskedTensor) and bool(b._storage.index)
    return (a.dim() == 2 and b.dim() == 2 and torch.is_grad_enabled()
            and not (sparse_a and sparse_b)
            and not (sparse_a and not _one_node_sparse(a))
            and not (sparse_b and not _one_node_sparse(b))
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and (requires_grad_of(a) or requires_grad_of(b)
                 or (bias is not None and requires_grad_of(bias))))


def _operand(x: Any) -> bool:
    """A 2-D operand of :class:`_MatrixProduct` (read without ``__torch_function__``)."""
    if isinstance(x, MaskedTensor):
        return x.dim() == 2 and (not x._storage.index or _one_node_sparse(x))
    return type(x) in _PLAIN and x.layout == torch.strided and x.dim() == 2


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(a: Any, b: Any, transpose_b: bool, bias: Any) -> bool:
    """True when ``a @ b`` (``a @ b.T``, plus ``bias``) is a valid product for
    :class:`_MatrixProduct`, decided from the wrappers' metadata in one pass
    (Note [One Function for a matrix product]): a step of a pruned MLP then reads no
    property of a MaskedTensor through ``__torch_function__``. Anything else -- and every
    error message -- takes the checks of :func:`matmul`."""
    with DisableTorchFunctionSubclass():
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and _operand(a) and _operand(b) and a.dtype == b.dtype
                and a.shape[1] == b.shape[1 if transpose_b else 0]):
            return False
        if bias is not None and not (
                type(bias) in _PLAIN and bias.layout == torch.strided and bias.dim() == 1
                and bias.shape[0] == b.shape[0] and bias.dtype == a.dtype):
            return False
        return _fuses(a, b, bias)


# -- argument checks -------------------------------------------------------------------------
def _describe(x: torch.Tensor) -> str:
    kind = (f"{x._storage.layout.name} MaskedTensor" if isinstance(x, MaskedTensor)
            else f"{x.layout} Tensor")
    return f"{kind} {tuple(x.shape)}"


def _check_operand(op: str, x: Any, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}(): {what} must be a Tensor or MaskedTensor, got "
                        f"{type(x).__name__}")
    if not isinstance(x, MaskedTensor) and x.layout != torch.strided:
        raise NotImplementedError(
            f"{op}(): a plain {x.layout} tensor cannot be multiplied with a MaskedTensor; wrap "
            f"it with ms.masked_tensor(t, mask) or pass t.to_dense()")
    if isinstance(x, MaskedTensor) and x._storage.index and x.dim() != 2:
        raise NotImplementedError(
            f"{op}(): a {x._storage.layout.name} MaskedTensor operand must be 2-D, got shape "
            f"{tuple(x.shape)}; batch it as a strided MaskedTensor (.to_dense()) or loop over "
            f"the batch")


def matmul(op: str, a: torch.Tensor, b: torch.Tensor, transpose_b: bool = False,
           bias: torch.Tensor | None = None) -> Any:
    """The masked product ``a @ b`` (``a @ b.mT``) of operands with at least 2 dims, plus a
    plain ``bias`` on the specified outputs (Note [Linear's bias])."""
    _check_operand(op, a, "the first operand")
    _check_operand(op, b, "the second operand")
    if a.dtype != b.dtype:  # ValueError: operators turn a TypeError into NotImplemented
        raise ValueError(f"{op}(): expected both operands to have the same dtype, got {a.dtype} "
                        f"and {b.dtype}; cast one with .to()")
    b_shape = b.shape[:-2] + (b.shape[-1], b.shape[-2]) if transpose_b else b.shape
    if a.shape[-1] != b_shape[-2]:
        raise ValueError(f"{op}(): shapes cannot be multiplied: {_describe(a)} @ "
                         f"{'(transposed) ' if transpose_b else ''}{_describe(b)} (inner "
                         f"dimensions {a.shape[-1]} and {b_shape[-2]} differ)")
    if not all(x == y or x == 1 or y == 1
               for x, y in zip(reversed(a.shape[:-2]), reversed(b_shape[:-2]))):
        raise ValueError(f"{op}(): batch dimensions do not broadcast: {_describe(a)} and "
                         f"{_describe(b)}")
    if _fuses(a, b, bias):  # Note [One Function for a matrix product]
        return _PRODUCT_APPLY(transpose_b, a, b, bias)
    return on_values(_product, [a, b] if bias is None else [a, b, bias], transpose_b)


def _vector_matmul(op: str, a: torch.Tensor, b: torch.Tensor, transpose_b: bool = False,
                   bias: torch.Tensor | None = None) -> Any:
    """``matmul`` with torch's 1-D rules: a vector is a row (left) or a column (right)."""
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"{op}(): both arguments need at least 1 dimension, got "
                         f"{_describe(a)} and {_describe(b)}")
    left, right = a.dim() == 1, b.dim() == 1
    out = matmul(op, a.unsqueeze(0) if left else a, b.unsqueeze(-1) if right else b,
                 transpose_b and not right, None if right else bias)
    if right:
        out = out.squeeze(-1)
    if left:
        out = out.squeeze(-2)
    return out


def _need_dims(op: str, x: torch.Tensor, n: int, what: str) -> None:
    if x.dim() != n:
        raise ValueError(f"{op}(): {what} must be {n}-D, got {_describe(x)}")


def _scaled(x: torch.Tensor, factor: Any) -> torch.Tensor:
    return x if isinstance(factor, (int, float)) and factor == 1 else x * factor


def _add_input(op: str, product: Any, input: Any, beta: Any, alpha: Any) -> Any:
    """``beta * input + alpha * product`` on the product's specified outputs."""
    out = _scaled(product, alpha)
    if input is None or (isinstance(beta, (int, float)) and beta == 0):
        return out  # torch ignores input when beta == 0 (even NaN)
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}(): input must be a Tensor, got {type(input).__name__}")
    return out + _scaled(input, beta)


# -- the torch-level entry points ------------------------------------------------------------
def _mm(input: torch.Tensor, mat2: torch.Tensor) -> Any:
    _need_dims("mm", input, 2, "input")
    _need_dims("mm", mat2, 2, "mat2")
    return matmul("mm", input, mat2)


def _bmm(input: torch.Tensor, mat2: torch.Tensor) -> Any:
    _need_dims("bmm", input, 3, "input")
    _need_dims("bmm", mat2, 3, "mat2")
    if input.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm(): batch sizes differ: {_describe(input)} and {_describe(mat2)}")
    return matmul("bmm", input, mat2)


@implements(torch.mm, torch.Tensor.mm)
def mm(op: Any, input: torch.Tensor, mat2: torch.Tensor) -> Any:
    return _mm(input, mat2)


@implements(torch.mv, torch.Tensor.mv)
def mv(op: Any, input: torch.Tensor, vec: torch.Tensor) -> Any:
    _need_dims("mv", input, 2, "input")
    _need_dims("mv", vec, 1, "vec")
    return _vector_matmul("mv", input, vec)


@implements(torch.bmm, torch.Tensor.bmm)
def bmm(op: Any, input: torch.Tensor, mat2: torch.Tensor) -> Any:
    return _bmm(input, mat2)


@implements(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def matmul_(op: Any, input: torch.Tensor, other: torch.Tensor) -> Any:
    if _direct(input, other, False, None):  # Note [One Function for a matrix product]
        return _PRODUCT_APPLY(False, input, other, None)
    return _vector_matmul("matmul", input, other)


@implements(torch.Tensor.__rmatmul__)
def rmatmul(op: Any, self: torch.Tensor, other: torch.Tensor) -> Any:
    return _vector_matmul("matmul", other, self)


@implements(torch.addmm, torch.Tensor.addmm)
def addmm(op: Any, input: Any, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1,
          alpha: Any = 1) -> Any:
    return _add_input("addmm", _mm(mat1, mat2), input, beta, alpha)


@implements(torch.baddbmm, torch.Tensor.baddbmm)
def baddbmm(op: Any, input: Any, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1,
            alpha: Any = 1) -> Any:
    return _add_input("baddbmm", _bmm(batch1, batch2), input, beta, alpha)


@implements(F.linear)
def linear(op: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any = None) -> Any:
    """``input @ weight.T + bias``; a sparse weight is multiplied without transposing it."""
    if _direct(input, weight, True, bias):  # Note [One Function for a matrix product]
        return _PRODUCT_APPLY(True, input, weight, bias)
    if weight.dim() not in (1, 2):
        raise ValueError(f"linear(): weight must be 1-D or 2-D, got {_describe(weight)}")
    if _folds(bias, input, weight):
        return _vector_matmul("linear", input, weight, True, bias)
    out = _vector_matmul("linear", input, weight, transpose_b=weight.dim() == 2)
    return _add_input("linear", out, bias, 1, 1)


def _folds(bias: Any, input: torch.Tensor, weight: torch.Tensor) -> bool:
    """Note [Linear's bias]
    ~~~~~~~~~~~~~~~~~~~~~~~
    A plain bias of ``F.linear`` -- a vector over the output features, what ``nn.Linear``
    holds -- is added to the product's values inside the product's own graph, so it takes
    the product's mask and gets a *plain* gradient (the sum of the incoming gradient over
    the specified outputs, 0 elsewhere) from torch's autograd, like the parameter it is. As
    a separate masked add it would get a MaskedTensor gradient through a masked reduction.
    """
    return (type(bias) in (torch.Tensor, torch.nn.Parameter) and bias.layout == torch.strided
            and weight.dim() == 2 and bias.dim() == 1 and bias.shape[0] == weight.shape[0]
            and bias.dtype == weight.dtype == input.dtype and input.dim() >= 1)
