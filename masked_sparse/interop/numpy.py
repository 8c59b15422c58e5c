"""numpy.ma interop: ``from_numpy`` / ``to_numpy``, and the dtype maps shared with scipy.

Note [Two mask conventions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
``numpy.ma`` marks *invalid* elements with True; a MaskedTensor marks *specified* (valid)
ones. A ``numpy.ma.MaskedArray`` is therefore read with its mask inverted (``nomask``
meaning "everything specified"), while the ``mask=`` given next to a plain ndarray follows
this package's convention (True = specified), exactly as in ``ms.masked_tensor(data,
mask)``. ``to_numpy`` always returns a MaskedArray, with numpy's convention.

Both directions copy: the MaskedTensor never aliases the caller's arrays (as
``masked_tensor`` copies its inputs), so in-place ops cannot change them behind their back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import layouts

from .._memory import check_fits
from .._tensor import MaskedTensor, _wrap

# numpy's (kind, itemsize) -> torch dtype: independent of byte order and of C type aliases.
_FROM_NUMPY: dict[tuple[str, int], torch.dtype] = {
    ("b", 1): torch.bool,
    ("u", 1): torch.uint8, ("u", 2): torch.uint16, ("u", 4): torch.uint32,
    ("u", 8): torch.uint64,
    ("i", 1): torch.int8, ("i", 2): torch.int16, ("i", 4): torch.int32, ("i", 8): torch.int64,
    ("f", 2): torch.float16, ("f", 4): torch.float32, ("f", 8): torch.float64,
    ("c", 8): torch.complex64, ("c", 16): torch.complex128,
}
_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    t: np.dtype(np.bool_) if k == "b" else np.dtype(f"{k}{n}") for (k, n), t in _FROM_NUMPY.items()
}


def torch_dtype(dtype: np.dtype, where: str) -> torch.dtype:
    """The torch dtype for a numpy dtype; ``TypeError`` naming it if torch has none."""
    dtype = np.dtype(dtype)
    found = _FROM_NUMPY.get((dtype.kind, dtype.itemsize)) if dtype.fields is None else None
    if found is None:
        raise TypeError(f"{where}: unsupported dtype {dtype} (numpy {dtype.str!r}); a "
                        f"MaskedTensor holds bool, (u)int8-64, float16/32/64 or complex64/128 "
                        f"data: convert first, e.g. with .astype(np.float64)")
    return found


def numpy_dtype(dtype: torch.dtype, where: str) -> np.dtype:
    """The numpy dtype for a torch dtype; ``TypeError`` naming it if numpy has none."""
    found = _TO_NUMPY.get(dtype)
    if found is None:
        raise TypeError(f"{where}: numpy has no dtype for {dtype}; convert the MaskedTensor "
                        f"first, e.g. mt.to(torch.float32)")
    return found


def array_to_tensor(array: np.ndarray, where: str, dtype: torch.dtype | None = None
                    ) -> torch.Tensor:
    """A torch tensor owning a native-byte-order, contiguous copy of ``array``."""
    torch_dtype(array.dtype, where)
    native = np.array(array, dtype=array.dtype.newbyteorder("="), copy=True, order="C")
    out = torch.from_numpy(native)
    return out if dtype is None else out.to(dtype)


def tensor_to_array(t: torch.Tensor, where: str) -> np.ndarray:
    """``t`` as a numpy array (detached, on the CPU, conj/neg bits resolved)."""
    numpy_dtype(t.dtype, where)
    return t.detach().cpu().resolve_conj().resolve_neg().numpy()


def from_numpy(array: Any, *, mask: Any = None, layout: Any = torch.strided,
               dtype: torch.dtype | None = None) -> MaskedTensor:
    """A MaskedTensor from a ``numpy.ma.MaskedArray``, or from an ndarray and a mask.

    Parameters
    ----------
    array : numpy.ma.MaskedArray or numpy.ndarray
        A MaskedArray's mask means *invalid* (numpy's convention) and is inverted;
        ``nomask`` means every element is specified.
    mask : numpy.ndarray of bool, optional
        Only with a plain ndarray: True = specified (this package's convention), same shape
        as ``array``. Omitted: every element is specified.
    layout : torch.layout or str, optional
        Any registered layout; sparse layouts store only the specified elements.
    dtype : torch.dtype, optional
        Cast the data to this dtype.

    Raises
    ------
    TypeError
        For other inputs and unsupported dtypes (object, str, datetime, structured,
        longdouble).
    ValueError
        For a mask of the wrong shape.

    Examples
    --------
    >>> import numpy as np, masked_sparse as ms
    >>> a = np.ma.masked_array([1., 2., 3.], mask=[False, True, False])
    >>> ms.from_numpy(a).to_tensor(0)
    tensor([1., 0., 3.], dtype=torch.float64)
    >>> ms.from_numpy(np.arange(3), mask=np.array([True, False, True])).get_mask()
    tensor([ True, False,  True])
    """
    where = "from_numpy"
    if isinstance(array, np.ma.MaskedArray):
        if mask is not None:
            raise TypeError(f"{where}: got a numpy.ma.MaskedArray and mask=; the array "
                            f"carries its own mask (pass array.data with mask= instead)")
        data = np.asarray(array.data)
        torch_dtype(data.dtype, where)
        valid = ~np.ma.getmaskarray(array)
    elif isinstance(array, np.ndarray):
        data = array
        torch_dtype(data.dtype, where)
        if mask is None:
            valid = np.ones(data.shape, dtype=bool)
        else:
            valid = np.asarray(mask)
            if valid.dtype != np.bool_:
                raise TypeError(f"{where}: mask must be a bool array (True = specified), got "
                                f"dtype {valid.dtype}; pass mask.astype(bool)")
            if valid.shape != data.shape:
                raise ValueError(f"{where}: mask of shape {valid.shape} does not match the "
                                 f"data's shape {data.shape}")
    else:
        raise TypeError(f"{where}: expected a numpy.ma.MaskedArray or a numpy.ndarray, got "
                        f"{type(array).__module__}.{type(array).__qualname__}; use "
                        f"ms.masked_tensor(data, mask) for torch tensors")
    values = array_to_tensor(data, where, dtype)
    storage = layouts.get_layout(torch.strided).build(
        (), values, torch.from_numpy(np.array(valid, dtype=bool, copy=True)), values.shape)
    out = _wrap(layouts.convert(storage, layout))
    if isinstance(array, np.ma.MaskedArray):  # Note [numpy.ma round trip]
        with np.errstate(over="ignore"):  # numpy's default (1e20) overflows float16
            fill = array.fill_value
            if fill != np.ma.default_fill_value(array):
                out._numpy_fill_value = fill
    return out


def to_numpy(mt: MaskedTensor, fill_value: Any = None) -> np.ma.MaskedArray:
    """``mt`` as a ``numpy.ma.MaskedArray`` (dense; mask True = masked out).

    The data under the mask is ``mt``'s data there (0 where a sparse layout stores
    nothing); ``fill_value`` becomes the array's ``fill_value``, so ``to_numpy(mt,
    v).filled()`` equals ``mt.to_tensor(v)``. Omitted, it is the ``fill_value`` of the
    array ``mt`` was read from by :func:`from_numpy`, else numpy's default: a round trip
    keeps both (Note [numpy.ma round trip]). The result is a copy, detached from autograd.
    Sparse layouts are densified: numpy.ma is dense, and asking for it is asking for a
    dense result.

    Note [numpy.ma round trip]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~
    ``from_numpy`` keeps the array's ``fill_value`` on the MaskedTensor it returns (a plain
    Python attribute: not part of the storage, so op results and copies do not carry it,
    as numpy.ma's own results often fall back to the default), and a strided MaskedTensor
    keeps the data under the mask; so ``to_numpy(from_numpy(a))`` equals ``a`` in data,
    mask and ``fill_value``.

    Examples
    --------
    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([1., 2.]), torch.tensor([True, False]))
    >>> ms.to_numpy(mt, fill_value=-1.0)
    masked_array(data=[1.0, --],
                 mask=[False,  True],
           fill_value=-1.0,
                dtype=float32)
    """
    if not isinstance(mt, MaskedTensor):
        raise TypeError(f"to_numpy: expected a MaskedTensor, got {type(mt).__name__}; use "
                        f"t.numpy() for plain tensors")
    s = mt._storage
    numpy_dtype(s.values.dtype, "to_numpy")
    check_fits(f"to_numpy of a {s.layout.name} MaskedTensor", "strided", s.shape,
               s.values.numel(), s.values.dtype, s.values.device,
               "numpy.ma is dense: keep it sparse (ms.to_scipy for scipy.sparse), or reduce or "
               "slice it first")
    with torch.no_grad():
        data = tensor_to_array(s.densify(s.values, 0), "to_numpy")
        valid = tensor_to_array(s.densify(s.mask, False), "to_numpy")
    if fill_value is None:
        fill_value = mt.__dict__.get("_numpy_fill_value")
    return np.ma.MaskedArray(np.array(data, copy=True), mask=~valid, fill_value=fill_value,
                             shrink=False)
