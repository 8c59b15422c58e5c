"""scipy.sparse interop: ``from_scipy`` / ``to_scipy``, O(nnz), never densifying.

Note [Stored means specified]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A scipy sparse matrix has no mask, only a set of stored entries. ``from_scipy`` makes the
stored entries the specified ones -- explicit zeros included, since storing a 0 is how
scipy says "this 0 is a value" -- and every other position unspecified. Duplicates are
summed as scipy's canonical form does (``sum_duplicates`` on a private copy; the caller's
matrix is never touched). The stored entries of each format are the ones ``nnz`` counts:

- ``coo``/``csr``/``csc``/``lil``/``dok``: their index arrays / keys;
- ``bsr``: every element of every stored block (zeros inside a block included);
- ``dia``: every in-bounds position of every stored diagonal (scipy's own ``tocoo``
  drops the zeros there, so DIA is read directly from ``offsets`` and ``data``).

``to_scipy`` stores exactly the specified elements (masked-out ones are dropped, specified
zeros are kept). BSR output uses 1x1 blocks and DIA output stores whole diagonals: those
are the only ways these formats can hold an arbitrary pattern, so a DIA round trip
specifies the in-bounds positions of every diagonal that holds a specified element.

Indices become int64 torch tensors (torch's own index dtype); values keep their dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import layouts
from layouts import Storage

from .._memory import check_fits
from .._tensor import MaskedTensor, _wrap
from .numpy import array_to_tensor, numpy_dtype, tensor_to_array, torch_dtype

FORMATS = ("coo", "csr", "csc", "bsr", "dok", "lil", "dia")
# Formats read as CSR (their default masked layout is sparse_csr when 2-D).
_CSR_LIKE = frozenset({"csr", "csc", "bsr", "lil"})
# scipy.sparse refuses float16 values; every other dtype of _FROM_NUMPY it accepts.
_NO_SCIPY = frozenset({torch.float16})


def _sparse_module() -> Any:
    import scipy.sparse

    return scipy.sparse


def _index(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.int64))


def _dia_as_coo(m: Any) -> Any:
    """A DIA matrix's stored entries (in-bounds positions of its diagonals) as COO."""
    sp = _sparse_module()
    nrows, ncols = m.shape
    cols = np.arange(min(m.data.shape[1], ncols))
    offsets = np.asarray(m.offsets).reshape(-1, 1)
    rows = cols[None, :] - offsets
    keep = (rows >= 0) & (rows < nrows)
    data = m.data[:, : cols.size][keep]
    return sp.coo_array((data, (rows[keep], np.broadcast_to(cols, keep.shape)[keep])),
                        shape=m.shape)


def _compressed_storage(m: Any, dtype: torch.dtype | None, layout: Any) -> Storage:
    """``m`` read in the layout asked for when scipy has its format -- torch's ``sparse_X``
    is scipy's X for csr and csc, with the same ``indptr`` / ``indices`` -- else as CSR
    (converted after): no sort in torch, scipy converts between its formats in O(nnz)."""
    target = layouts.get_layout(torch.sparse_csr if layout is None else layout)
    fmt = str(target.torch_layout).removeprefix("torch.sparse_")
    if fmt not in ("csr", "csc"):
        target, fmt = layouts.get_layout(torch.sparse_csr), "csr"
    m = m.asformat(fmt, copy=True)
    m.sum_duplicates()
    values = array_to_tensor(m.data, "from_scipy", dtype)
    return target.build((_index(m.indptr), _index(m.indices)), values,
                        torch.ones(values.shape, dtype=torch.bool), m.shape)


def _coo_storage(m: Any, dtype: torch.dtype | None) -> Storage:
    coo = _dia_as_coo(m) if m.format == "dia" else m.asformat("coo", copy=True)
    if _sorted_unique(coo):  # scipy's copy forgets that it is: skip its sort
        coo.has_canonical_format = True
    coo.sum_duplicates()
    coords = np.stack(coo.coords)
    values = array_to_tensor(coo.data, "from_scipy", dtype)
    return layouts.get_layout(torch.sparse_coo).build(
        (_index(coords),), values, torch.ones(values.shape, dtype=torch.bool), m.shape)


def _sorted_unique(coo: Any) -> bool:
    """True when the coordinates of a scipy COO array are in row-major order without a
    duplicate (scipy's canonical format), checked in O(nnz).

    >>> import numpy as np, scipy.sparse as sp
    >>> _sorted_unique(sp.coo_array((np.ones(2), ([1, 0], [0, 1])), shape=(2, 2)))
    False
    """
    try:
        keys = np.ravel_multi_index(coo.coords, coo.shape)
    except ValueError:  # more elements than one int64 key counts: let scipy sort
        return False
    return bool(np.all(keys[1:] > keys[:-1]))


def from_scipy(m: Any, *, layout: Any = None, dtype: torch.dtype | None = None
               ) -> MaskedTensor:
    """A MaskedTensor whose specified elements are the stored entries of a scipy matrix.

    Parameters
    ----------
    m : scipy sparse array or matrix
        Any format (``coo``, ``csr``, ``csc``, ``bsr``, ``dok``, ``lil``, ``dia``), either
        the ``*_array`` or the ``*_matrix`` class; 1-D and n-D ``coo_array`` too. Explicit
        zeros are specified; duplicates are summed; ``m`` itself is not modified.
    layout : torch.layout or str, optional
        Any registered layout. Default: ``torch.sparse_csr`` for 2-D csr/csc/bsr/lil input,
        ``torch.sparse_coo`` otherwise.
    dtype : torch.dtype, optional
        Cast the values to this dtype.

    O(nnz) time and memory (plus the row pointers of CSR); nothing is densified unless
    ``layout=torch.strided`` is asked for. Raises ``TypeError`` for a non-scipy object or
    an unsupported dtype (object, str, longdouble).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, masked_sparse as ms
    >>> m = sp.csr_array((np.array([1., 0.]), (np.array([0, 1]), np.array([1, 0]))),
    ...                  shape=(2, 2))
    >>> mt = ms.from_scipy(m)          # the stored 0 at (1, 0) is specified
    >>> mt.layout, mt.get_mask().to_dense().tolist()
    (torch.sparse_csr, [[False, True], [True, False]])
    """
    sp = _sparse_module()
    if not sp.issparse(m):
        hint = (" (use ms.from_numpy for numpy arrays)" if isinstance(m, np.ndarray) else "")
        raise TypeError(f"from_scipy: expected a scipy.sparse array or matrix, got "
                        f"{type(m).__module__}.{type(m).__qualname__}{hint}")
    torch_dtype(m.dtype, f"from_scipy({type(m).__name__})")
    if layout is not None:
        target = layouts.get_layout(layout)
        check_fits(f"from_scipy(layout={target.name!r})", target.name, m.shape, m.nnz,
                   dtype or torch_dtype(m.dtype, "from_scipy"), torch.device("cpu"),
                   "leave layout= out to stay sparse (CSR/COO)")
    csr_like = m.format in _CSR_LIKE and m.ndim == 2
    storage = _compressed_storage(m, dtype, layout) if csr_like else _coo_storage(m, dtype)
    storage.layout.validate(storage, full=True)
    if layout is not None:
        storage = layouts.convert(storage, layout)
    return _wrap(storage)


def _specified_coo(storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major ``(indices (ndim, n), values (n,))`` of the specified elements only."""
    coo = storage.layout.to_coo(storage)
    (indices,) = coo.index
    values, mask = coo.values, coo.mask
    if values.dim() > 1:
        # Hybrid COO: the dense trailing dims become index dims of the scipy array.
        nz = mask.nonzero()
        return torch.cat([indices[:, nz[:, 0]], nz[:, 1:].t()]), values[mask]
    kept = mask.nonzero().squeeze(1)  # once; a boolean index would scan the mask per tensor
    return indices.gather(1, kept.expand(indices.shape[0], -1)), values.index_select(0, kept)


def _specified_csr(storage: Storage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """scipy's ``(data, indices, indptr)`` of the specified elements of a CSR storage, read
    directly in numpy (the result is numpy's anyway): the positions of the specified
    elements once, the new row pointers by a binary search of the old ones among them, the
    columns and values by two gathers -- no COO form, no sort in scipy. Indices are int32
    when they fit, as scipy would cast them itself (it would scan them first).

    >>> import torch, layouts
    >>> s = layouts.get_layout("sparse_csr").from_strided(
    ...     torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([[True, False], [True, True]]))
    >>> [a.tolist() for a in _specified_csr(s)]
    [[1.0, 3.0, 4.0], [0, 0, 1], [0, 1, 3]]
    """
    crow, col = (tensor_to_array(t, "to_scipy") for t in storage.index)
    kept = np.flatnonzero(tensor_to_array(storage.mask, "to_scipy"))
    index = np.int32 if max(kept.size, storage.shape[-1]) < 2 ** 31 else np.int64
    indptr = np.searchsorted(kept, crow).astype(index, copy=False)
    indices = col.take(kept).astype(index, copy=False)
    return tensor_to_array(storage.values, "to_scipy").take(kept), indices, indptr


def to_scipy(mt: MaskedTensor, format: str = "csr", *, matrix: bool = False) -> Any:
    """The specified elements of ``mt`` as a scipy sparse array (or matrix).

    Parameters
    ----------
    mt : MaskedTensor
        Any layout. Masked-out elements are not stored; specified zeros are stored as
        explicit zeros.
    format : str
        One of ``"coo", "csr", "csc", "bsr", "dok", "lil", "dia"``. Only ``coo`` holds more
        than 2 dims; ``coo``, ``csr`` and ``dok`` hold 1-D arrays.
    matrix : bool
        Return the legacy ``*_matrix`` class instead of the ``*_array`` one (2-D only).

    O(nnz) for sparse layouts. The result is a copy, detached from autograd.

    Examples
    --------
    >>> import torch, masked_sparse as ms
    >>> mt = ms.masked_tensor(torch.tensor([[0., 2.], [3., 4.]]),
    ...                       torch.tensor([[True, True], [False, True]])).to_sparse_csr()
    >>> a = ms.to_scipy(mt)
    >>> type(a).__name__, a.nnz, a.toarray().tolist()
    ('csr_array', 3, [[0.0, 2.0], [0.0, 4.0]])
    """
    sp = _sparse_module()
    if not isinstance(mt, MaskedTensor):
        raise TypeError(f"to_scipy: expected a MaskedTensor, got {type(mt).__name__}; wrap it "
                        f"with ms.masked_tensor(data, mask)")
    if format not in FORMATS:
        raise ValueError(f"to_scipy: unknown scipy.sparse format {format!r}; use one of "
                         f"{', '.join(FORMATS)}")
    s = mt._storage
    ndim = len(s.shape)
    if s.values.dtype in _NO_SCIPY:
        raise TypeError(f"to_scipy: scipy.sparse has no {s.values.dtype} values; convert "
                        f"first, e.g. mt.to(torch.float32)")
    numpy_dtype(s.values.dtype, "to_scipy")
    if ndim == 0 or (matrix and ndim != 2):
        kind = "scipy.sparse *_matrix classes hold" if matrix else "scipy.sparse holds"
        raise ValueError(f"to_scipy: {kind} no {ndim}-D data (got shape {tuple(s.shape)})"
                         + ("; pass matrix=False" if matrix and ndim else ""))
    if (format == "csr" and ndim == 2 and s.layout.torch_layout is torch.sparse_csr
            and s.values.dim() == 1):
        cls = sp.csr_matrix if matrix else sp.csr_array
        return cls(_specified_csr(s), shape=tuple(s.shape))
    with torch.no_grad():
        indices, values = _specified_coo(s)
    cls = sp.coo_matrix if matrix else sp.coo_array
    coo = cls((tensor_to_array(values, "to_scipy"),
               tuple(tensor_to_array(indices, "to_scipy"))), shape=tuple(s.shape))
    try:
        return coo.tobsr(blocksize=(1, 1)) if format == "bsr" else coo.asformat(format)
    except (ValueError, NotImplementedError) as e:
        raise ValueError(f"to_scipy: cannot store shape {tuple(s.shape)} in scipy format "
                         f"{format!r} ({e}); use format='coo'") from e
