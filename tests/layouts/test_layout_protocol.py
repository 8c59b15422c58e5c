"""The layout protocol itself: registration checks, the core's ignorance of any particular
layout, the custom-layout tutorial, and an optimizer that runs unchanged on the layouts
added through the registry (CSC, BSR)."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from conftest import make_masked

import layouts
import masked_sparse as ms
from layouts import _native, registry
from masked_sparse.optim import functional

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "masked_sparse"
COO = layouts.get_layout("sparse_coo")


# -- registration ---------------------------------------------------------------------------
def _variant(**changes):
    return dataclasses.replace(COO, **{"name": "variant", "torch_layout": None, **changes})


@pytest.mark.parametrize("primitive", registry._REQUIRED)
def test_registration_requires_every_primitive(primitive):
    with pytest.raises(TypeError, match=rf"missing required primitives \['{primitive}'\]"):
        layouts.register_layout(_variant(**{primitive: None}))
    with pytest.raises(TypeError, match="missing required primitives"):
        layouts.register_layout(_variant(**{primitive: "not callable"}))
    assert "variant" not in [lay.name for lay in layouts.registered_layouts()]


@pytest.mark.parametrize(("changes", "message"), [
    ({"format_options": 3}, "format_options must be callable"),
    ({"unary": [1]}, r"kernel tables \['unary'\] must be mappings"),
    ({"reduction": None, "conversions": ()}, r"\['reduction', 'conversions'\]"),
    ({"torch_layout": "sparse_coo"}, "torch_layout must be a torch.layout"),
    ({"name": ""}, "non-empty str name"),
])
def test_registration_checks_the_record(changes, message):
    with pytest.raises(TypeError, match=message):
        layouts.register_layout(_variant(**changes))
    with pytest.raises(TypeError, match="expected a layouts.Layout"):
        layouts.register_layout("sparse_coo")


def test_taken_keys_and_replace():
    before = layouts.registered_layouts()
    with pytest.raises(ValueError, match="'sparse_coo' is already registered"):
        layouts.register_layout(dataclasses.replace(COO, torch_layout=None))
    with pytest.raises(ValueError, match="torch.sparse_coo is already registered"):
        layouts.register_layout(dataclasses.replace(COO, name="coo2"))
    # replace=True takes both keys over, leaving nothing stale; restoring puts COO back.
    new = layouts.register_layout(dataclasses.replace(COO, name="coo2"), replace=True)
    try:
        assert layouts.get_layout(torch.sparse_coo) is new
        with pytest.raises(NotImplementedError):
            layouts.get_layout("sparse_coo")
        assert layouts.registered_layouts().index(new) == before.index(COO)  # same place
    finally:
        layouts.register_layout(COO, replace=True)
    assert layouts.registered_layouts() == before
    with pytest.raises(NotImplementedError):
        layouts.get_layout("coo2")
    assert layouts.get_layout(torch.sparse_coo) is COO
    with pytest.raises(NotImplementedError):
        layouts.unregister_layout("never_registered")


def test_protocol_is_documented():
    doc = registry.__doc__
    for name in registry._REQUIRED + ("format_options",) + registry._TABLES:
        assert f"``{name}" in doc, name
    for lay in layouts.registered_layouts():
        assert lay.name in doc  # the table of layouts


# -- the core names no layout ---------------------------------------------------------------
# torch's own conversion methods are generic handlers that pass their arguments on.
_ALLOWED = re.compile(r"\bto_sparse_(?:csr|csc|bsr|bsc)\b")
_FORBIDDEN = re.compile(r"sparse_(?:csc|bsr|bsc)|ccol_indices|row_indices|\bSPARSE_[A-Z]+\b")


def _core_files():
    return sorted(CORE.rglob("*.py"))


def test_core_names_no_layout_added_through_the_registry():
    hits = []
    for path in _core_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _FORBIDDEN.search(_ALLOWED.sub("", line)):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
    # the check can fail: the layout modules themselves are full of such names
    assert _FORBIDDEN.search((ROOT / "layouts" / "sparse_csc.py").read_text())


def test_core_uses_only_the_public_layouts_api():
    public = set(layouts.__all__)
    bad = []
    for path in _core_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "layouts" or node.module.startswith("layouts.")):
                names = {a.name for a in node.names}
                if node.module != "layouts" or not names <= public:
                    bad.append(f"{path.name}: from {node.module} import {sorted(names)}")
            elif isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names
                        if a.name.startswith("layouts.")]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "layouts" and node.attr not in public):
                bad.append(f"{path.name}:{node.lineno}: layouts.{node.attr}")
    assert not bad, bad


# -- the tutorial ---------------------------------------------------------------------------
def test_custom_layout_tutorial_runs():
    path = ROOT / "tutorials" / "custom_layout.py"
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "registered layouts:" in out.stdout
    assert "agrees with the dense reference" in out.stdout


# -- an optimizer written once runs on the registered layouts -------------------------------
def _reference_adagrad(param, data, mask, steps, lr, weight_decay, eps):
    """Dense Adagrad applied at the specified entries only (lazy), with torch.where."""
    p, state = param.clone(), torch.zeros_like(param)
    for _ in range(steps):
        g = torch.where(mask, data + weight_decay * p, 0)
        state = state + g * g
        p = torch.where(mask, p - lr * g / (state.sqrt() + eps), p)
    return p, state


@pytest.mark.parametrize("form", ["masked_csc", "masked_bsr", "torch_csc", "torch_bsr"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_functional_adagrad_on_csc_and_bsr_gradients(form, weight_decay):
    mt, data, mask = make_masked((4, 6), torch.strided, seed=21, density=0.4)
    grad = {"masked_csc": lambda: mt.to_sparse_csc(),
            "masked_bsr": lambda: mt.to_sparse_bsr((2, 3)),
            "torch_csc": lambda: torch.where(mask, data, 0).to_sparse_csc(),
            "torch_bsr": lambda: torch.where(mask, data, 0).to_sparse_bsr((2, 3))}[form]()
    dense = torch.where(mask, data, 0)
    if form == "torch_bsr":
        # A plain BSR gradient specifies every element of its stored blocks (those torch
        # stores: the 2 x 3 blocks holding a nonzero).
        blocks = (dense != 0).reshape(2, 2, 2, 3).any(3).any(1)
        mask = blocks.repeat_interleave(2, 0).repeat_interleave(3, 1)
    elif form == "torch_csc":
        mask = dense != 0  # a plain sparse gradient specifies its stored entries
    param = torch.linspace(-1, 1, 24).reshape(4, 6)
    p, state, step = param.clone(), torch.zeros(4, 6), torch.tensor(0.0)
    for _ in range(3):
        functional.adagrad([p], [grad], [state], [step], lr=0.1, lr_decay=0.0,
                           weight_decay=weight_decay, eps=1e-10, maximize=False)
    ref_p, ref_state = _reference_adagrad(param, dense, mask, 3, 0.1, weight_decay, 1e-10)
    torch.testing.assert_close(p, ref_p)
    torch.testing.assert_close(state, ref_state)
    assert float(step) == 3


@pytest.mark.parametrize("layout", ["sparse_csc", "sparse_bsr"])
def test_adagrad_matches_torch_sparse_adagrad(layout):
    mt, data, mask = make_masked((6, 6), torch.strided, seed=22, density=0.5)
    options = {"blocksize": (3, 2)} if layout == "sparse_bsr" else {}
    grad = ms.to_layout(mt, layout, **options)
    # torch's own sparse Adagrad on the COO gradient of the same specified entries
    ref = torch.nn.Parameter(torch.ones(6, 6))
    opt = torch.optim.Adagrad([ref], lr=0.5)
    p, state, step = torch.ones(6, 6), torch.zeros(6, 6), torch.tensor(0.0)
    for _ in range(4):
        ref.grad = torch.sparse_coo_tensor(mask.nonzero().t(), data[mask], (6, 6))
        opt.step()
        functional.adagrad([p], [grad], [state], [step], lr=0.5, lr_decay=0.0,
                           weight_decay=0.0, eps=1e-10, maximize=False)
    torch.testing.assert_close(p, ref.detach())


def test_adagrad_class_on_csc_and_bsr_gradients_matches_strided():
    base, _, _ = make_masked((4, 6), torch.strided, seed=23, density=0.5)
    results = {}
    for layout, options in [("strided", {}), ("sparse_csc", {}),
                            ("sparse_bsr", {"blocksize": (2, 2)})]:
        p = torch.nn.Parameter(torch.ones(4, 6))
        opt = ms.optim.Adagrad([p], lr=0.1, weight_decay=0.01)
        for _ in range(3):
            p.grad = ms.to_layout(base, layout, **options)
            opt.step()
        results[layout] = p.detach()
    torch.testing.assert_close(results["sparse_csc"], results["strided"])
    torch.testing.assert_close(results["sparse_bsr"], results["strided"])
    assert not torch.equal(results["strided"], torch.ones(4, 6))


def test_the_core_compares_no_layout_name():
    import ast
    import pathlib

    names = {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr"}
    root = pathlib.Path(ms.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value in names
                    for c in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


# -- reading a plain operand at the stored positions -----------------------------------------
@pytest.mark.parametrize("operand", [(1, 5), (4, 1), (4, 5), (5,), ()],
                         ids=["row", "column", "full", "trailing", "scalar"])
@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr", "sparse_csc",
                                  "sparse_bsr"])
@pytest.mark.parametrize("take_up_to", [1 << 15, 0], ids=["take", "index_select"])
def test_read_stored_is_the_layouts_gather(name, operand, take_up_to, monkeypatch):
    """``layouts.read_stored`` (the cached flat positions ``sum_back`` sums back to) reads
    what the layout's own ``gather`` reads, in the values' shape, every call alike: by one
    ``take`` (small reads) and by ``index_select`` (large ones)."""
    monkeypatch.setattr(sys.modules["layouts.convert"], "_TAKE_UP_TO", take_up_to)
    mt = make_masked((4, 5), torch.strided, seed=3)[0]
    mt = {"sparse_coo": mt.to_sparse_coo, "sparse_csr": mt.to_sparse_csr,
          "sparse_csc": mt.to_sparse_csc, "sparse_bsr": lambda: mt.to_sparse_bsr((1, 1)),
          "strided": lambda: mt}[name]()
    s = mt._storage
    dense = torch.randn(operand, generator=torch.Generator().manual_seed(1))
    want = s.layout.gather(s, dense).expand(s.values.shape)
    for _ in range(2):  # computed, then cached
        got = layouts.read_stored(s, dense)
        assert got.shape == s.values.shape
        assert torch.equal(got, want)


@pytest.mark.parametrize("operand", [(1, 5), (4, 1), (4, 5), ()],
                         ids=["row", "column", "full", "scalar"])
@pytest.mark.parametrize("name", ["strided", "sparse_coo", "sparse_csr", "sparse_csc",
                                  "sparse_bsr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_add_stored_is_the_values_plus_the_read(name, operand, dtype, native):
    """``layouts.add_stored`` (the sum of a masked and a plain operand: one native pass on
    the CPU) is the values plus, minus or subtracted from :func:`read_stored`'s read, bit
    for bit (one addition either way), NaN and inf included."""
    mt = make_masked((4, 5), torch.strided, seed=3, dtype=dtype)[0]
    mt = {"sparse_coo": mt.to_sparse_coo, "sparse_csr": mt.to_sparse_csr,
          "sparse_csc": mt.to_sparse_csc, "sparse_bsr": lambda: mt.to_sparse_bsr((1, 1)),
          "strided": lambda: mt}[name]()
    s = mt._storage
    dense = torch.randn(operand, generator=torch.Generator().manual_seed(1), dtype=dtype)
    if dense.dim():
        dense.view(-1)[0] = float("nan")
        dense.view(-1)[-1] = float("inf")
    read = layouts.read_stored(s, dense)
    wants = {"add": s.values + read, "sub": s.values - read, "rsub": read - s.values}
    with nullcontext() if native else layouts.native_disabled():
        for op, want in wants.items():
            got = layouts.add_stored(s, dense, op)
            assert got.shape == s.values.shape and got.dtype == dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_add_stored_reads_every_head_and_no_entry():
    """A per-node vector broadcast over the heads of a hybrid COO ``(N, N, H)``, and a
    storage with no entries."""
    indices = torch.tensor([[0, 0, 2], [1, 2, 0]])
    s = COO.build((indices,), torch.arange(6.).view(3, 2), torch.ones(3, 2, dtype=torch.bool),
                  torch.Size([3, 3, 2]))
    per_head = torch.tensor([[1., 2.], [3., 4.], [5., 6.]])
    for operand in (per_head[:, None, :], per_head[None, :, :], per_head[:, None, :1]):
        want = s.values - layouts.read_stored(s, operand)
        assert torch.equal(layouts.add_stored(s, operand, "sub"), want)
    empty = COO.build((torch.zeros(2, 0, dtype=torch.long),), torch.zeros(0, 2),
                      torch.zeros(0, 2, dtype=torch.bool), torch.Size([3, 3, 2]))
    assert layouts.add_stored(empty, per_head[:, None, :]).shape == (0, 2)


@pytest.mark.skipif(not _native.available(), reason=f"native kernels: {_native.status()}")
def test_add_stored_refuses_a_position_out_of_range():
    """A flat position outside the plain operand (an index modified after construction) is
    an error naming the way out, and nothing is written; a plain operand the kernel does
    not read (another dtype, not contiguous) takes the torch ops."""
    values, dense = torch.ones(3), torch.arange(4.)
    at = torch.tensor([0, 4, 1])
    with pytest.raises(ValueError, match="rebuild the tensor"):
        _native.gather_add(values, dense, at)
    assert _native.gather_add(values, dense.double(), torch.tensor([0, 3, 1])) is None
    assert _native.gather_add(values, torch.arange(8.)[::2], torch.tensor([0, 3, 1])) is None
    s = COO.build((torch.tensor([[0, 1]]),), torch.ones(2), torch.ones(2, dtype=torch.bool),
                  torch.Size([3]))
    with pytest.raises(ValueError, match="op must be one of"):
        layouts.add_stored(s, torch.ones(3), "mul")


def test_read_stored_reads_every_head():
    """A per-node vector broadcast over the heads of a hybrid COO ``(N, N, H)``."""
    indices = torch.tensor([[0, 0, 2], [1, 2, 0]])
    s = COO.build((indices,), torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool),
                  torch.Size([3, 3, 2]))
    per_head = torch.tensor([[1., 2.], [3., 4.], [5., 6.]])
    assert layouts.read_stored(s, per_head[:, None, :]).tolist() == [[1., 2.], [1., 2.],
                                                                      [5., 6.]]
    assert layouts.read_stored(s, per_head[None, :, :]).tolist() == [[3., 4.], [5., 6.],
                                                                      [1., 2.]]
    assert layouts.read_stored(s, per_head[:, None, :1]).tolist() == [[1., 1.], [1., 1.],
                                                                       [5., 5.]]
