"""DataLoader batching of MaskedTensor samples in every layout (``default_collate``), in the
main process and in worker processes, against ``torch.stack`` of the dense references."""

from __future__ import annotations

import pytest
import torch
from conftest import dense_of, make_masked
from torch.utils.data import DataLoader, Dataset, default_collate

import masked_sparse as ms

LAYOUTS = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_csr,
           "csc": "sparse_csc", "bsr": "sparse_bsr"}
# the batch's layout: the samples' one, COO where the layout cannot be 3-D
BATCH_LAYOUT = {"strided": torch.strided, "coo": torch.sparse_coo, "csr": torch.sparse_coo,
                "csc": torch.sparse_coo, "bsr": torch.sparse_coo}


def _sample(name: str, i: int) -> ms.MaskedTensor:
    mt = make_masked((3, 4), torch.sparse_coo if name != "strided" else torch.strided,
                     seed=i)[0]
    return ms.to_layout(mt, LAYOUTS[name])


class _Samples(Dataset):
    def __init__(self, name: str, n: int = 6) -> None:
        self.items = [(_sample(name, i), i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def _check_batch(batch: ms.MaskedTensor, samples: list[ms.MaskedTensor], name: str) -> None:
    assert isinstance(batch, ms.MaskedTensor)
    assert batch.shape == (len(samples), 3, 4)
    assert batch.layout == BATCH_LAYOUT[name]
    data, mask = dense_of(batch)
    refs = [dense_of(s) for s in samples]
    assert torch.equal(mask, torch.stack([m for _, m in refs]))
    assert torch.equal(torch.where(mask, data, 0),
                       torch.stack([torch.where(m, d, 0) for d, m in refs]))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_default_collate(name):
    samples = [_sample(name, i) for i in range(3)]
    _check_batch(default_collate(samples), samples, name)
    nested = default_collate([{"x": s, "y": i} for i, s in enumerate(samples)])
    _check_batch(nested["x"], samples, name)
    assert torch.equal(nested["y"], torch.arange(3))


def test_stack_and_cat_accept_out_none():
    mt = _sample("strided", 0)
    assert torch.stack([mt, mt], out=None).shape == (2, 3, 4)
    assert torch.cat([mt, mt], 0, out=None).shape == (6, 4)
    with pytest.raises(TypeError, match="out="):
        torch.stack([mt, mt], out=torch.empty(2, 3, 4))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_workers(workers):
    names = ["strided", "coo", "csr"] if workers else list(LAYOUTS)
    for name in names:
        ds = _Samples(name)
        loader = DataLoader(ds, batch_size=3, num_workers=workers,
                            persistent_workers=False)
        got = list(loader)
        assert len(got) == 2
        for k, (batch, ids) in enumerate(got):
            assert torch.equal(ids, torch.arange(3 * k, 3 * k + 3))
            _check_batch(batch, [ds.items[i][0] for i in ids.tolist()], name)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_batches_part_by_part_like_plain_pairs(name, monkeypatch):
    # The batch equals the plain (data, mask) collation, and no torch.stack / torch.cat call
    # receives the MaskedTensor samples themselves (one stack or cat per part instead).
    samples = [_sample(name, i) for i in range(5)]
    pairs = [dense_of(s) for s in samples]
    ref_data, ref_mask = default_collate(pairs)
    seen = []
    for fn in ("stack", "cat"):
        real = getattr(torch, fn)

        def spy(tensors, *args, _real=real, **kwargs):
            seen.append(any(isinstance(t, ms.MaskedTensor) for t in tensors))
            return _real(tensors, *args, **kwargs)

        monkeypatch.setattr(torch, fn, spy)
    batch = default_collate(samples)
    monkeypatch.undo()
    assert seen and not any(seen)
    assert batch.layout == BATCH_LAYOUT[name]
    data, mask = dense_of(batch)
    assert torch.equal(mask, ref_mask)
    assert torch.equal(torch.where(mask, data, 0), torch.where(ref_mask, ref_data, 0))
    batch._storage.layout.validate(batch._storage, full=True)


def test_samples_that_require_grad_keep_the_differentiable_stack():
    samples = [_sample("strided", i).requires_grad_() for i in range(3)]
    batch = default_collate(samples)
    assert batch.requires_grad
    (batch.to_tensor(0) * 2).sum().backward()
    for s in samples:
        assert torch.equal(dense_of(s.grad)[0], torch.where(dense_of(s)[1], 2.0, 0.0))
