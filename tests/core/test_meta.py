"""MaskedTensors on the meta device: strided ops infer shapes and dtypes as the same op on a
plain meta tensor, the repr prints no data, and sparse layouts refuse meta with an error
naming it."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    ALL_LAYOUT_IDS,
    ALL_LAYOUTS,
    make_masked,
    make_masked_in,
)

import masked_sparse as ms

META_OPS = {
    "sum": (lambda mt: mt.sum(1), lambda d: d.sum(1)),
    "full_sum": (lambda mt: mt.sum(), lambda d: d.sum()),
    "mean": (lambda mt: mt.mean(0, keepdim=True), lambda d: d.mean(0, keepdim=True)),
    "amax": (lambda mt: mt.amax(1), lambda d: d.amax(1)),
    "var": (lambda mt: mt.var(1), lambda d: d.var(1)),
    "argmax": (lambda mt: mt.argmax(1), lambda d: d.argmax(1)),
    "softmax": (lambda mt: mt.softmax(1), lambda d: d.softmax(1)),
    "logsumexp": (lambda mt: torch.logsumexp(mt, 1), lambda d: torch.logsumexp(d, 1)),
    "exp": (lambda mt: mt.exp(), lambda d: d.exp()),
    "add": (lambda mt: mt + mt, lambda d: d + d),
    "matmul": (lambda mt: mt @ torch.empty(4, 2, device="meta", dtype=mt.dtype),
               lambda d: d @ torch.empty(4, 2, device="meta", dtype=d.dtype)),
    "to_tensor": (lambda mt: mt.to_tensor(0), lambda d: d),
    "transpose": (lambda mt: mt.t(), lambda d: d.t()),
}


@pytest.mark.parametrize("op", list(META_OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_strided_meta_masked_tensor_infers_shapes(op, dtype):
    data = torch.empty(3, 4, device="meta", dtype=dtype)
    mt = ms.masked_tensor(data, torch.empty(3, 4, dtype=torch.bool, device="meta"))
    fn, ref = META_OPS[op]
    got, want = fn(mt), ref(data)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.device.type == "meta"


def test_meta_repr_says_meta_and_prints_no_data():
    mt = ms.masked_tensor(torch.empty(3, 4, device="meta"),
                          torch.empty(3, 4, dtype=torch.bool, device="meta"))
    assert repr(mt) == ("MaskedTensor(..., layout=strided, shape=(3, 4), dtype=torch.float32, "
                        "device='meta')")
    assert repr(mt.sum(0)).startswith("MaskedTensor(..., layout=strided, shape=(4,)")
    real, _, _ = make_masked((3, 4))
    assert "device='meta'" in repr(real.to("meta"))


@pytest.mark.parametrize("layout", ALL_LAYOUTS[1:], ids=ALL_LAYOUT_IDS[1:])
def test_sparse_meta_raises_not_implemented_naming_meta(layout):
    mt, _, _ = make_masked_in((3, 4), layout)
    with pytest.raises(NotImplementedError, match="meta device"):
        mt.to("meta")
    dense_meta = ms.masked_tensor(torch.empty(3, 4, device="meta"),
                                  torch.empty(3, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(NotImplementedError, match=f"meta device to {layout_name(layout)}"):
        ms.to_layout(dense_meta, layout)
    crow = torch.zeros(4, dtype=torch.long, device="meta")
    col = torch.zeros(5, dtype=torch.long, device="meta")
    data = torch.sparse_csr_tensor(crow, col, torch.zeros(5, device="meta"), (3, 4))
    mask = torch.sparse_csr_tensor(crow, col, torch.zeros(5, dtype=torch.bool, device="meta"),
                                   (3, 4))
    with pytest.raises(NotImplementedError, match="masked_tensor: a torch.sparse_csr "
                                                  "MaskedTensor on the meta device"):
        ms.masked_tensor(data, mask)


def layout_name(layout):
    return str(layout).removeprefix("torch.")
