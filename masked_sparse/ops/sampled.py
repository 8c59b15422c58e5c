"""The masked sampled product: ``torch.sparse.sampled_addmm(R, U, V.T)`` on a masked ``R``,
and :func:`sampled_matmul` from a bare mask.

Semantics, the same in every layout: the result has ``R``'s storage -- its index tensors and
its mask, the same objects -- and at each stored position ``(i, j)`` the value
``alpha * (U @ V.T)[i, j] + beta * R[i, j]``. ``beta == 0`` does not read ``R``'s values (NaN
under them stays out, torch's convention). Only the stored positions are computed: O(nnz * k)
for a sparse ``R``, never the ``m x n`` product (a strided ``R`` stores every position: the
dense ``addmm``).

Gradients: ``U`` and ``V`` are plain tensors and get plain gradients, ``G @ V`` and
``G.T @ U`` with ``G`` the incoming gradient at ``R``'s specified positions (0 at the
unspecified ones); ``R``'s values get ``beta * G`` with ``R``'s mask. How the stored pattern
is read without a sort per step is ``layouts._sampled``'s Note [Sampled product].

>>> import torch, masked_sparse as ms
>>> mask = torch.tensor([[True, False], [False, True]]).to_sparse_csr()
>>> out = ms.sampled_matmul(torch.ones(2, 3), torch.ones(3, 2), mask)
>>> out.layout, out.to_tensor(0).to_dense().tolist()
(torch.sparse_csr, [[3.0, 0.0], [0.0, 3.0]])
"""

from __future__ import annotations

from typing import Any

import torch

import layouts
from layouts import Storage

from .._autograd import on_values
from .._id_tags import IdTags
from .._registry import implements
from .._tensor import MaskedTensor, _wrap

aten = torch.ops.aten


def _describe(x: Any) -> str:
    if isinstance(x, MaskedTensor):
        return f"{x._storage.layout.name} MaskedTensor {tuple(x.shape)}"
    if isinstance(x, torch.Tensor):
        return f"{x.layout} Tensor {tuple(x.shape)}"
    return type(x).__name__


def _check_factor(op: str, x: Any, what: str) -> None:
    if isinstance(x, MaskedTensor):
        raise NotImplementedError(
            f"{op}(): {what} must be a plain strided tensor, got a {_describe(x)}; a masked "
            f"factor is absent from the sum where unspecified: pass {what}.to_tensor(0)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}(): {what} must be a Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise NotImplementedError(f"{op}(): {what} must be a strided tensor, got a "
                                  f"{_describe(x)}; pass {what}.to_dense()")
    if x.dim() != 2:
        raise ValueError(f"{op}(): {what} must be 2-D, got {_describe(x)}")


def check_operands(op: str, s: Storage, left: Any, right: Any) -> None:
    """Shapes, dtypes and devices of a sampled product over storage ``s``."""
    _check_factor(op, left, "mat1")
    _check_factor(op, right, "mat2")
    if len(s.shape) != 2:
        raise ValueError(f"{op}(): the sampled pattern must be 2-D, got shape "
                         f"{tuple(s.shape)}")
    m, n = s.shape
    if left.shape[1] != right.shape[0]:
        raise ValueError(f"{op}(): shapes cannot be multiplied: mat1 {tuple(left.shape)} @ "
                         f"mat2 {tuple(right.shape)} (inner dimensions {left.shape[1]} and "
                         f"{right.shape[0]} differ); pass V.T as mat2 for U @ V.T")
    if (left.shape[0], right.shape[1]) != (m, n):
        raise ValueError(f"{op}(): mat1 @ mat2 is {(left.shape[0], right.shape[1])} but the "
                         f"sampled pattern is {(m, n)}")
    if left.dtype != right.dtype:
        raise ValueError(f"{op}(): expected mat1 and mat2 to have the same dtype, got "
                         f"{left.dtype} and {right.dtype}; cast one with .to()")
    if not left.dtype.is_floating_point and not left.dtype.is_complex:
        raise TypeError(f"{op}(): expected floating point factors, got {left.dtype}")
    devices = {left.device, right.device, s.mask.device}
    if len(devices) > 1:
        raise ValueError(f"{op}(): operands on different devices "
                         f"({', '.join(sorted(map(str, devices)))}); move them to one")


def _kernel(storages: list, alpha: Any, beta: Any) -> Storage:
    s, left, right = storages
    return s.with_values(layouts.sampled_mm(s, left, right, alpha=alpha, beta=beta))


@implements(torch.sparse.sampled_addmm, aten.sparse_sampled_addmm.default)
def sampled_addmm(op: Any, input: Any, mat1: Any, mat2: Any, *, beta: Any = 1.0,
                  alpha: Any = 1.0, out: Any = None) -> MaskedTensor:
    """``torch.sparse.sampled_addmm`` with a masked ``input`` (module docstring)."""
    name = "sampled_addmm"
    if out is not None:
        raise TypeError(f"{name}(): out= is not supported with a MaskedTensor; use the result")
    if not isinstance(input, MaskedTensor):
        # Here only because a factor is masked: its error says what to pass instead.
        _check_factor(name, mat1, "mat1")
        _check_factor(name, mat2, "mat2")
        raise TypeError(f"{name}(): input must be a MaskedTensor or a torch sparse CSR tensor, "
                        f"got {_describe(input)}")
    s = input._storage
    check_operands(name, s, mat1, mat2)
    if s.values.dtype != mat1.dtype:
        raise ValueError(f"{name}(): expected input and the factors to have the same dtype, "
                         f"got {s.values.dtype} and {mat1.dtype}; cast one with .to()")
    return on_values(_kernel, [input, mat1, mat2], alpha, beta)


_MASKS = IdTags()  # mask -> (version, storage)


def _mask_storage(name: str, mask: torch.Tensor) -> Storage:
    """The storage of a bool mask (checked), the same one while the mask object lives
    unchanged: its index tensors are then the same objects from call to call, so the
    patterns of Note [Sampled product] are computed once (torch's accessors of a sparse
    tensor's indices return new tensor objects at every call)."""
    entry = _MASKS.get(mask)
    if entry is not None and entry[0] == mask._version:
        return entry[1]
    if not torch.compiler.is_compiling():
        layouts.check_sparse_input(name, data=mask, mask=mask)
    s = layouts.get_layout(mask.layout).from_torch(mask, mask)
    if not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()
            or mask.is_inference()):
        _MASKS.set(mask, (mask._version, s))
    return s


def sampled_matmul(mat1: torch.Tensor, mat2: torch.Tensor, mask: torch.Tensor, *,
                   alpha: float = 1.0) -> MaskedTensor:
    """``alpha * (mat1 @ mat2)`` at the True positions of a bool ``mask``, as a MaskedTensor
    of the mask's layout.

    Differentiable with respect to ``mat1`` and ``mat2`` (plain gradients, 0 from
    unspecified positions). ``torch.sparse.sampled_addmm(R, U, V.T)`` does the same over the
    storage of a MaskedTensor ``R``, adding ``beta * R``.

    Parameters
    ----------
    mat1 : Tensor
        Dense ``m x k``.
    mat2 : Tensor
        Dense ``k x n`` (pass ``V.T`` for ``U @ V.T``).
    mask : Tensor
        Bool ``m x n``: sparse (COO, CSR, CSC, BSR or any registered layout) or strided.
        Only its stored positions are computed, in O(nnz k); the result shares its pattern.
    alpha : float
        Scales the product.

    Examples
    --------
    >>> import torch, masked_sparse as ms
    >>> mask = torch.tensor([[True, False, True]]).to_sparse_coo()
    >>> ms.sampled_matmul(torch.tensor([[2.]]), torch.tensor([[1., 2., 3.]]), mask)
    MaskedTensor(
      [
        [  2.0000,       --,   6.0000]
      ]
    )
    """
    name = "sampled_matmul"
    if isinstance(mask, MaskedTensor) or not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}(): mask must be a plain bool tensor, got {_describe(mask)}"
                        + ("; pass mt.get_mask(), or torch.sparse.sampled_addmm(mt, mat1, "
                           "mat2) to add mt" if isinstance(mask, MaskedTensor) else ""))
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}(): mask must have dtype torch.bool, got {mask.dtype}; pass "
                        f"mask != 0")
    s = _mask_storage(name, mask)
    check_operands(name, s, mat1, mat2)
    base = _wrap(s.with_values(s.values.to(mat1.dtype)))  # not read: beta = 0
    return on_values(_kernel, [base, mat1, mat2], alpha, 0)
