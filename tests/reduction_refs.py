"""Independent references for reductions: brute force per group, numpy.ma, torch.where.

``ref_groups`` loops over the output elements in Python: each group's specified elements
are gathered into a 1-D tensor and reduced with torch's own op, so it shares no code (and
no vectorized trick) with the implementation under test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

import masked_sparse as ms


def norm_dims(dim, ndim):
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % ndim for d in dims}) if ndim else []


def out_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if d in dims else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def ref_groups(fn, data, mask, dim, keepdim, min_count=1, dtype=None):
    """``(values, mask)`` of ``fn(selected, positions)`` per group of a reduction over ``dim``.

    ``positions`` are the row-major indices of the selected elements within the reduced
    dims; groups with fewer than ``min_count`` specified elements are unspecified.
    """
    nd = data.dim()
    dims = norm_dims(dim, nd)
    kept = [d for d in range(nd) if d not in dims]
    size = math.prod(data.shape[d] for d in dims)
    groups = math.prod(data.shape[d] for d in kept)
    flat = data.permute(kept + dims).reshape(groups, size)
    fmask = mask.permute(kept + dims).reshape(groups, size)
    vals, spec = [], []
    for row, mrow in zip(flat, fmask):
        sel = row[mrow]
        if sel.numel() >= min_count:
            vals.append(torch.as_tensor(fn(sel, torch.arange(size)[mrow])))
            spec.append(True)
        else:
            vals.append(None)
            spec.append(False)
    if dtype is None:
        with warnings.catch_warnings():  # a 1-element var warns about degrees of freedom
            warnings.simplefilter("ignore")
            probe = fn(torch.ones(1, dtype=data.dtype), torch.zeros(1, dtype=torch.long))
        dtype = torch.as_tensor(probe).dtype
    vals = [torch.zeros((), dtype=dtype) if v is None else v.to(dtype) for v in vals]
    shape = out_shape(data.shape, dims, keepdim)
    values = torch.stack(vals).reshape(shape) if vals else torch.zeros(shape, dtype=dtype)
    return values, torch.tensor(spec, dtype=torch.bool).reshape(shape)


def ref_numpy_ma(name, data, mask, dim, keepdim, **kwargs):
    """``(values, mask)`` of the numpy.ma reduction (its mask means the opposite)."""
    nd = data.dim()
    axis = tuple(norm_dims(dim, nd))
    arr = np.ma.masked_array(data.cpu().numpy(), ~mask.cpu().numpy())
    out = getattr(np.ma, name)(arr, axis=axis, keepdims=keepdim, **kwargs)
    shape = out_shape(data.shape, list(axis), keepdim)
    values = np.ma.getdata(out).reshape(shape)
    invalid = np.ma.getmaskarray(out).reshape(shape)
    return (torch.from_numpy(np.array(values)).to(data.device),
            ~torch.from_numpy(np.array(invalid)).to(data.device))


def expected_layout(layout, shape, dims, keepdim):
    """The result layout of a reduction (docs/reductions.md): full -> strided 0-d;
    COO stays COO; CSR stays CSR for a 2-D keepdim result, else COO."""
    if layout == torch.strided:
        return torch.strided
    if not keepdim and len(dims) == len(shape):
        return torch.strided
    if layout == torch.sparse_csr and keepdim:
        return torch.sparse_csr
    return torch.sparse_coo


def check_result(out, values, mask, *, rtol=None, atol=None):
    """``out`` specifies exactly ``mask`` and matches ``values`` there (dtype included)."""
    s = out._storage
    got = s.densify(s.values, 0)
    got_mask = s.densify(s.mask, False)
    assert tuple(got.shape) == tuple(values.shape), (got.shape, values.shape)
    assert torch.equal(got_mask, mask), (got_mask, mask)
    assert got.dtype == values.dtype, (got.dtype, values.dtype)
    zero = torch.zeros((), dtype=values.dtype)
    torch.testing.assert_close(torch.where(mask, got, zero), torch.where(mask, values, zero),
                               rtol=rtol, atol=atol, equal_nan=True)


def hybrid_coo(data, mask, seed=0):
    """A COO MaskedTensor with sparse_dim = ndim - 1 (one dense trailing dim)."""
    g = torch.Generator().manual_seed(seed)
    stored = mask.any(-1) | (torch.rand(mask.shape[:-1], generator=g) < 0.3)
    idx = stored.nonzero().t()
    sd = torch.sparse_coo_tensor(idx, data[stored], data.shape).coalesce()
    sm = torch.sparse_coo_tensor(idx, mask[stored], mask.shape).coalesce()
    return ms.masked_tensor(sd, sm)
