"""A short tour: ``python -m masked_sparse``.

Builds one masked matrix in every registered layout, runs the same ops on each, prints
the results and checks that every layout agrees with the strided one.
"""

from __future__ import annotations

import torch

import layouts
import masked_sparse as ms


def _tour_matrix() -> ms.MaskedTensor:
    data = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]])
    mask = torch.tensor([[False, True, False, True], [True, False, False, False],
                         [False, False, True, True]])
    return ms.masked_tensor(data, mask)


def _grad_of_weighted_sum(mt: ms.MaskedTensor) -> ms.MaskedTensor:
    leaf = mt.detach().requires_grad_()
    (leaf * leaf).sum().backward()
    return leaf.grad


def _ops(mt: ms.MaskedTensor) -> dict[str, ms.MaskedTensor]:
    return {
        "sqrt(mt)": torch.sqrt(mt),
        "mt * mt.exp()": mt * mt.exp(),
        "mt + dense row": mt + torch.arange(4.0),
        "mt.sum(1)": mt.sum(1),
        "mt.amax(0)": mt.amax(0),
        "mt.mean()": mt.mean(),
        "softmax(mt, 1)": torch.softmax(mt, 1),
        "grad of (mt*mt).sum()": _grad_of_weighted_sum(mt),
    }


def main() -> None:
    base = _tour_matrix()
    print("A masked 3x4 matrix (-- marks unspecified elements):")
    print(base)
    reference = {name: out.to_tensor(float("nan")) for name, out in _ops(base).items()}
    for layout in layouts.registered_layouts():
        if layout.torch_layout is None:
            continue
        mt = ms.to_layout(base, layout)
        summary = (layout.doc.strip().splitlines() or [""])[0]
        index = ", ".join(f"{n} {tuple(i.shape)}"
                          for n, i in zip(layout.index_names, mt._storage.index))
        print(f"\n== layout {layout.name}: {summary}\n   stores "
              f"{mt._storage.values.numel()} values, index tensors: {index or 'none'}")
        for name, out in _ops(mt).items():
            index = out._storage.index
            same_index = (len(index) == len(mt._storage.index)
                          and all(a is b for a, b in zip(index, mt._storage.index))) if index \
                else "-"
            dense = out.to_tensor(float("nan")).to_dense()
            agrees = torch.allclose(dense, reference[name], equal_nan=True)
            print(f"{name:>22}: layout {str(out.layout):<18} shares input's index: "
                  f"{same_index!s:<5}  agrees with strided: {agrees}")
            assert agrees, name
        print(" " * 12, "to_tensor(0) stays", mt.to_tensor(0).layout)
    print("\nsqrt(mt) in sparse_csr:")
    print(torch.sqrt(base.to_sparse_csr()))
    print("\nAll layouts agree.")


if __name__ == "__main__":
    main()
