"""Conversions whose result cannot fit raise MemoryError before allocating (Note [Memory rule]
in masked_sparse/_memory.py): shapes needing more than a petabyte, on every conversion that
grows with the shape, while the ops that stay sparse keep working on the same tensor."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import masked_sparse as ms
from masked_sparse import _memory

HUGE = 2**50  # rows: a strided float32 result needs ~22 PB, CSR row pointers ~9 PB


def _huge_coo(shape=(HUGE, 4)):
    i = torch.tensor([[0, 1, shape[0] - 1], [0, 1, shape[1] - 1]])
    data = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0]), shape)
    mask = torch.sparse_coo_tensor(i, torch.tensor([True, True, False]), shape)
    return ms.masked_tensor(data, mask)


CONVERSIONS = {
    "to_sparse_csr": (lambda mt: mt.to_sparse_csr(), ["sparse_csr", "keep it in sparse_coo"]),
    "to_dense": (lambda mt: mt.to_dense(), ["strided", "keep it in sparse_coo"]),
    "to_layout_strided": (lambda mt: ms.to_layout(mt, torch.strided), ["strided"]),
    "to_tensor_fill": (lambda mt: mt.to_tensor(1.0), ["to_tensor(1.0)", "to_tensor(0)"]),
    "to_numpy": (lambda mt: ms.to_numpy(mt), ["to_numpy", "ms.to_scipy"]),
    "csr_to_dense": (lambda mt: mt.to_sparse_csr().to_dense(), ["strided"]),
}


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_conversions_that_cannot_fit_raise_memory_error(name):
    fn, words = CONVERSIONS[name]
    mt = _huge_coo((HUGE, 4) if name != "csr_to_dense" else (4, HUGE))
    with pytest.raises(MemoryError) as info:
        fn(mt)
    message = str(info.value)
    assert "PB" in message and "bytes" in message and "available" in message
    for word in words:
        assert word in message, (word, message)


def test_csc_pointers_of_a_huge_width():
    with pytest.raises(MemoryError, match="sparse_csc"):
        _huge_coo((4, HUGE)).to_sparse_csc()


def test_sparse_ops_still_work_on_the_huge_tensor():
    mt = _huge_coo()
    assert float(mt.sum().to_tensor(0)) == 3.0
    assert mt.sum(1).layout == torch.sparse_coo
    assert mt.to_tensor(0).layout == torch.sparse_coo
    assert "shape=(1125899906842624, 4)" in repr(mt)


def test_from_scipy_strided_that_cannot_fit():
    m = sp.coo_array((np.ones(3), (np.array([0, 1, 2]), np.array([0, 5, 7]))),
                     shape=(2**30, 2**30))
    with pytest.raises(MemoryError, match=r"from_scipy\(layout='strided'\).*PB"):
        ms.from_scipy(m, layout="strided")
    assert ms.from_scipy(m).layout == torch.sparse_coo  # the default stays sparse


def test_the_rule_uses_available_memory(monkeypatch):
    # 2**12 x 2**12 float32: 80 MiB as a strided masked tensor (values + mask bytes)
    mt = _huge_coo((2**12, 2**12))
    monkeypatch.setattr(_memory, "available_bytes", lambda device: 50 << 20)
    with pytest.raises(MemoryError, match="83886080 bytes"):
        mt.to_dense()
    monkeypatch.setattr(_memory, "available_bytes", lambda device: None)  # unknown: allowed
    assert mt.to_dense().shape == (2**12, 2**12)
    small = _huge_coo((100, 100))  # under 64 MiB: never checked, even with no memory left
    monkeypatch.setattr(_memory, "available_bytes", lambda device: 0)
    assert small.to_dense().shape == (100, 100)


def test_available_bytes_reads_the_machine():
    have = _memory.available_bytes(torch.device("cpu"))
    assert have is None or have > 0
