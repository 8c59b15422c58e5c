"""Every layout gives the same answer on +inf, -inf and NaN (docs/design.md): each reduction and
softmax-like op, along each dim and in full, on rows and columns holding infinities and NaN
(specified, and under the mask), against the strided result and against torch's own op on
the specified elements of each group.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_masked
from reduction_refs import ref_groups

import masked_sparse as ms

INF, NAN = math.inf, math.nan
DATA = torch.tensor([
    [INF, 2.0, -INF, 1.0, 3.0],      # +inf and -inf: inf - inf in softmax, sum NaN
    [NAN, 1.0, 2.0, 3.0, 4.0],       # a specified NaN
    [-INF, -INF, -INF, 1.0, 0.0],    # all specified elements -inf (two masked below)
    [INF, INF, 1.0, 2.0, 3.0],       # two +inf
    [1.0, 2.0, NAN, INF, -INF],      # finite where specified, NaN / inf under the mask
    [NAN, INF, -INF, 0.0, 1.0],      # fully masked
    [-INF, 5.0, 0.5, INF, 0.0],
], dtype=torch.float64)
MASK = torch.tensor([
    [True, True, True, True, True],
    [True, True, False, True, True],
    [True, True, True, False, False],
    [True, True, True, True, False],
    [True, True, False, False, False],
    [False, False, False, False, False],
    [True, False, True, True, True],
])
LAYOUTS = ["strided", "sparse_coo", "sparse_csr", "sparse_csc"]


def _argext(sel, pos, largest):
    return pos[sel.argmax() if largest else sel.argmin()]


# name -> (masked op(mt, dim), torch's op on one group's specified values and positions,
#          minimum specified count)
OPS = {
    "sum": (lambda mt, d: torch.sum(mt, d), lambda s, p: s.sum(), 1),
    "nansum": (lambda mt, d: torch.nansum(mt, d), lambda s, p: s[~s.isnan()].sum(), 1),
    "mean": (lambda mt, d: torch.mean(mt, d), lambda s, p: s.mean(), 1),
    "prod": (lambda mt, d: torch.prod(mt, d), lambda s, p: s.prod(), 1),
    "amax": (lambda mt, d: torch.amax(mt, d), lambda s, p: s.amax(), 1),
    "amin": (lambda mt, d: torch.amin(mt, d), lambda s, p: s.amin(), 1),
    "max": (lambda mt, d: torch.max(mt, d).values, lambda s, p: s.max(), 1),
    "argmax": (lambda mt, d: torch.argmax(mt, d), lambda s, p: _argext(s, p, True), 1),
    "argmin": (lambda mt, d: torch.argmin(mt, d), lambda s, p: _argext(s, p, False), 1),
    "logsumexp": (lambda mt, d: torch.logsumexp(mt, d), lambda s, p: s.logsumexp(0), 1),
    "var": (lambda mt, d: torch.var(mt, d), lambda s, p: s.var(), 2),
    "std": (lambda mt, d: torch.std(mt, d, correction=0), lambda s, p: s.std(correction=0), 1),
    "norm2": (lambda mt, d: torch.linalg.vector_norm(mt, 2, d),
              lambda s, p: torch.linalg.vector_norm(s), 1),
    "norm1": (lambda mt, d: torch.linalg.vector_norm(mt, 1, d),
              lambda s, p: torch.linalg.vector_norm(s, 1), 1),
    "norm_inf": (lambda mt, d: torch.linalg.vector_norm(mt, INF, d),
                 lambda s, p: torch.linalg.vector_norm(s, INF), 1),
    "norm_ninf": (lambda mt, d: torch.linalg.vector_norm(mt, -INF, d),
                  lambda s, p: torch.linalg.vector_norm(s, -INF), 1),
    "norm0": (lambda mt, d: torch.linalg.vector_norm(mt, 0, d),
              lambda s, p: torch.linalg.vector_norm(s, 0), 1),
    "median": (lambda mt, d: torch.median(mt, d).values, lambda s, p: s.median(), 1),
    "nanmedian": (lambda mt, d: torch.nanmedian(mt, d).values,
                  lambda s, p: s.nanmedian(), 1),
    "count_nonzero": (lambda mt, d: torch.count_nonzero(mt, d),
                      lambda s, p: torch.count_nonzero(s), 1),
    "any": (lambda mt, d: torch.any(mt, d), lambda s, p: s.any(), 1),
    "all": (lambda mt, d: torch.all(mt, d), lambda s, p: s.all(), 1),
}
# elementwise-shaped: (masked op(mt, dim), torch's op on the -inf-filled dense data)
NORMALIZATIONS = {
    "softmax": (lambda mt, d: torch.softmax(mt, d),
                lambda x, m, d: torch.softmax(torch.where(m, x, -INF), d)),
    "log_softmax": (lambda mt, d: torch.log_softmax(mt, d),
                    lambda x, m, d: torch.log_softmax(torch.where(m, x, -INF), d)),
    "softmin": (lambda mt, d: ms.softmin(mt, d),
                lambda x, m, d: torch.softmax(torch.where(m, -x, -INF), d)),
}


def _masked(layout: str, data=DATA, mask=MASK) -> ms.MaskedTensor:
    if layout == "strided":
        return make_masked(tuple(data.shape), torch.strided, data=data, mask=mask)[0]
    coo = make_masked(tuple(data.shape), torch.sparse_coo, data=data, mask=mask)[0]
    return ms.to_layout(coo, layout)


def _dense(mt: ms.MaskedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = mt._storage
    return s.densify(s.values, 0), s.densify(s.mask, False)


def _assert_same(got, want):
    (gd, gm), (wd, wm) = got, want
    assert torch.equal(gm, wm), (gm, wm)
    zero = torch.zeros((), dtype=wd.dtype)
    torch.testing.assert_close(torch.where(gm, gd, zero), torch.where(wm, wd, zero),
                               equal_nan=True, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dim", [0, 1, None])
@pytest.mark.parametrize("name", sorted(OPS))
def test_reductions_agree_on_nonfinite(name, dim):
    op, ref, min_count = OPS[name]
    if dim is None and name in ("max", "median", "nanmedian"):
        call = {"max": torch.max, "median": torch.median, "nanmedian": torch.nanmedian}[name]
        op = lambda mt, d: call(mt)  # noqa: E731 (the full-reduction overload)
    elif dim is None:
        inner = op
        op = lambda mt, d: inner(mt, d) if name in ("count_nonzero",) else (  # noqa: E731
            inner(mt, tuple(range(mt.dim()))) if name not in ("prod", "argmax", "argmin")
            else getattr(torch, name)(mt))
    data = DATA.bool() if name in ("any", "all") else DATA
    values, spec = ref_groups(ref, data, MASK, dim, False, min_count)
    strided = _dense(op(_masked("strided", data), dim))
    _assert_same(strided, (values.to(strided[0].dtype), spec))   # torch's own op per group
    for layout in LAYOUTS[1:]:
        _assert_same(_dense(op(_masked(layout, data), dim)), strided)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_softmax_agrees_on_nonfinite(name, dim):
    op, ref = NORMALIZATIONS[name]
    want = ref(DATA, MASK, dim)
    strided = _dense(op(_masked("strided"), dim))
    _assert_same(strided, (want, MASK))
    for layout in LAYOUTS[1:]:
        _assert_same(_dense(op(_masked(layout), dim)), strided)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_of_a_row_with_inf_and_minus_inf_is_nan_as_torch(layout):
    x = torch.tensor([[INF, 2.0, -INF]])
    out = torch.softmax(_masked(layout, x, torch.ones(1, 3, dtype=torch.bool)), 1)
    assert torch.isnan(_dense(out)[0]).all()  # as torch.softmax: [nan, nan, nan]
