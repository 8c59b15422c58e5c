"""Compiled masked training steps on sparse layouts, against the same step run eagerly.

The matrix factorisation step (a rating matrix ``R`` observed at a mask: ``U @ V.T`` read at
its positions through the masked sampled product or ``as_masked_tensor``, minus broadcast
plain biases, a masked MSE, backward, an optimizer step), a GAT-style attention layer
(per-edge scores, a masked softmax along rows, the product with the node features), and a
small closure over a sparse masked tensor. Every compiled loss and gradient is compared with
eager's (itself tested against dense references elsewhere). Kept small: tiny shapes,
``dynamic=False``, the ``aot_eager`` backend, a Dynamo reset around every test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import masked_sparse as ms

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # a clean Dynamo state per test

LAYOUTS = ["strided", "sparse_coo", "sparse_csr"]
N, M, K = 6, 5, 3


def compiled(fn, fullgraph=False):
    return torch.compile(fn, fullgraph=fullgraph, dynamic=False, backend="aot_eager")


def ratings(layout):
    """A masked (N, M) rating matrix with an empty row and an empty column."""
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(N, M, generator=g) > 0.4
    mask[2] = False
    mask[:, 4] = False
    mask[0, 0] = True
    r = ms.masked_tensor(torch.randn(N, M, generator=g), mask)
    return r if layout == "strided" else ms.to_layout(r, layout)


def parameters():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in
            ((N, K), (M, K), (N,), (M,))]


def plain(t):
    """A gradient as a dense plain tensor (0 where a masked gradient is unspecified)."""
    if isinstance(t, ms.MaskedTensor):
        return t.to_dense().to_tensor(0)
    return t


def predict(route, R, U, V, bu=None, bi=None):
    if route == "sampled":
        pred = torch.sparse.sampled_addmm(R, U, V.T, beta=0)
    else:
        pred = ms.as_masked_tensor(U @ V.T, R.get_mask())
    if bu is not None:
        pred = pred - bu[:, None] - bi[None, :]
    return pred


LOSSES = {"mse_loss": lambda pred, R: F.mse_loss(pred, R),
          "squared mean": lambda pred, R: ((pred - R) ** 2).mean()}


def check_step(step, R, fullgraph=False):
    """``step(R, *params)`` (it returns the loss; backward outside) compiled equals eager."""
    eager_params, compiled_params = parameters(), parameters()
    loss = step(R, *eager_params)
    loss.backward()
    got = compiled(step, fullgraph)(R, *compiled_params)
    got.backward()
    torch.testing.assert_close(plain(got), plain(loss))
    for p, q in zip(compiled_params, eager_params):
        torch.testing.assert_close(plain(p.grad), plain(q.grad))


# (layout, biases): COO and CSR, each with and without the broadcast biases between them
@pytest.mark.parametrize(("layout", "biases"), [("sparse_csr", True), ("sparse_coo", False),
                                                ("strided", True)])
def test_matrix_factorisation_through_as_masked_tensor_equals_eager(layout, biases):
    """``as_masked_tensor(U @ V.T, R.get_mask())``: the torch sparse mask runs outside the
    graph (Note [Construction under torch.compile]); the ops around it compile."""
    def step(R, U, V, bu, bi):
        pred = predict("as_masked_tensor", R, U, V, *((bu, bi) if biases else ()))
        return LOSSES["squared mean"](pred, R)

    check_step(step, ratings(layout))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sampled_matrix_factorisation_compiles_in_one_graph(layout):
    """Every shape in the sampled step is known from the index: one graph, the bias
    gradients' line sums included (Note [Lines while tracing])."""
    def step(R, U, V, bu, bi):
        return F.mse_loss(predict("sampled", R, U, V, bu, bi), R)

    check_step(step, ratings(layout), fullgraph=True)


@pytest.mark.parametrize("layout", ["sparse_csr"])
def test_compiled_training_steps_with_optimizers_equal_eager(layout):
    """Two training steps: the compiled loss and backward (graph breaks allowed), then
    ``ms.optim.Adagrad`` on the factors and ``torch.optim.Adam`` on the plain biases."""
    R = ratings(layout)

    def loss_and_backward(U, V, bu, bi):
        loss = F.mse_loss(predict("sampled", R, U, V, bu, bi), R)
        loss.backward()
        return loss

    def run(step):
        U, V, bu, bi = parameters()
        factors = ms.optim.Adagrad([U, V], lr=0.1)
        biases = torch.optim.Adam([bu, bi], lr=0.1)
        losses = []
        for _ in range(2):
            factors.zero_grad()
            biases.zero_grad()
            losses.append(plain(step(U, V, bu, bi)).detach())
            for p in (bu, bi):  # (a masked gradient of a plain bias, as a plain one)
                p.grad = plain(p.grad)
            factors.step()
            biases.step()
        return losses, [U.detach(), V.detach(), bu.detach(), bi.detach()]

    eager_losses, eager_params = run(loss_and_backward)
    got_losses, got_params = run(compiled(loss_and_backward))
    torch.testing.assert_close(got_losses, eager_losses)
    torch.testing.assert_close(got_params, eager_params)


# -- graph attention ------------------------------------------------------------------
def graph(layout, zero=False):
    """A masked (N, N) adjacency (mask = edge) with an isolated node (a fully masked row)."""
    g = torch.Generator().manual_seed(2)
    adj = torch.rand(N, N, generator=g) > 0.6
    adj[3] = False
    adj[0, 1] = True
    data = torch.zeros(N, N) if zero else torch.randn(N, N, generator=g)
    a = ms.masked_tensor(data, adj)
    return a if layout == "strided" else ms.to_layout(a, layout)


def gat_layer(A0, h, a_dst, a_src):
    """Scores ``LeakyReLU(a_dst . h_i + a_src . h_j)`` at the edges (``A0`` is 0 there:
    the broadcast pattern, whose plain vectors get plain gradients: Note [Plain operands
    under torch.compile]), a masked softmax along the rows, the attention-weighted sum of
    the features (0 for an isolated node)."""
    scores = A0 + (h @ a_dst)[:, None] + (h @ a_src)[None, :]
    att = F.leaky_relu(scores, 0.2).softmax(1)
    return (att @ h).to_tensor(0)


def gat_inputs():
    g = torch.Generator().manual_seed(3)
    shapes = [(N, K), (K,), (K,)]  # the features, a_dst, a_src
    return [torch.randn(shape, generator=g).requires_grad_() for shape in shapes]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gat_layer_values_and_gradients_equal_eager(layout):
    A0 = graph(layout, zero=True)
    fn = lambda *x: gat_layer(A0, *x)  # noqa: E731
    eager_in, compiled_in = gat_inputs(), gat_inputs()
    ref = fn(*eager_in)
    ref.square().sum().backward()
    got = compiled(fn)(*compiled_in)
    got.square().sum().backward()
    torch.testing.assert_close(got, ref)
    for mine, theirs in zip(compiled_in, eager_in):  # the features and both score vectors
        assert type(mine.grad) is torch.Tensor
        torch.testing.assert_close(mine.grad, theirs.grad)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_closure_over_sparse_masked_product(layout, fullgraph):
    """``(A @ h).to_tensor(0)`` over a sparse masked ``A`` captured by the function: the
    product is traced from the index (Note [Sparse products under torch.compile])."""
    A = graph(layout)
    fn = lambda h: (A @ h).to_tensor(0)  # noqa: E731
    h_eager, h_compiled = gat_inputs()[0], gat_inputs()[0]
    ref = fn(h_eager)
    ref.sin().sum().backward()
    got = compiled(fn, fullgraph)(h_compiled)
    got.sin().sum().backward()
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(h_compiled.grad, h_eager.grad)


# -- data-dependent steps under fullgraph ---------------------------------------------
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_fullgraph_names_the_way_out_of_a_torch_sparse_result(layout):
    """``get_mask()`` of a sparse MaskedTensor is a torch sparse tensor, which no graph
    holds: under ``fullgraph=True`` Dynamo's error carries the library's explanation and
    the way out, never a guard on a data-dependent size."""
    R = ratings(layout)
    fn = compiled(lambda U, V: ms.as_masked_tensor(U @ V.T, R.get_mask()).sum(), True)
    U, V, _, _ = parameters()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="to_tensor\\(value\\)") as info:
        fn(U, V)
    assert "data-dependent" not in str(info.value)


def test_fullgraph_names_the_way_out_of_a_data_dependent_reduction():
    """A hypersparse COO reduced to its rows (far more rows than stored elements: too many
    to list, Note [Lines while tracing]) has an output size that depends on the data:
    under ``fullgraph=True`` the library's NotImplementedError naming the way out, never
    a guard on a data-dependent expression; without it, a graph break and eager's
    result."""
    rows = torch.tensor([[3, 700, 5000], [0, 2, 1]])
    mt = ms.masked_tensor(torch.sparse_coo_tensor(rows, torch.tensor([1.0, 2.0, 3.0]),
                                                  (6000, 3)).coalesce(),
                          torch.sparse_coo_tensor(rows, torch.tensor([True, False, True]),
                                                  (6000, 3)).coalesce())
    fn = lambda m: m.sum(1).to_dense().to_tensor(0)  # noqa: E731
    with pytest.raises(torch._dynamo.exc.Unsupported,
                       match="compile without fullgraph=True") as info:
        compiled(fn, True)(mt)
    assert isinstance(info.value.__cause__, NotImplementedError)
    assert "Could not guard" not in str(info.value)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(fn)(mt), fn(mt))


# -- tangents of another form ---------------------------------------------------------
@pytest.mark.parametrize(("got", "expected"), [("sparse_coo", "sparse_csr"),
                                               ("sparse_csr", "sparse_coo"),
                                               ("strided", "sparse_csr")])
def test_tangent_of_another_layout_is_converted(got, expected):
    g = ratings(got)
    ref = ratings(expected)
    meta = ref.__tensor_flatten__()[1]
    out = g.__coerce_same_metadata_as_tangent__(meta, ms.MaskedTensor)
    assert ms.layout_of(out) is ms.layout_of(ref)
    torch.testing.assert_close(plain(out), plain(g))
    assert out.__tensor_flatten__()[1] == meta


def test_masked_tangent_of_a_plain_output_is_plain():
    g = ratings("sparse_csr")
    out = g.__coerce_same_metadata_as_tangent__(None, torch.Tensor)
    assert type(out) is torch.Tensor and out.layout == torch.strided
    torch.testing.assert_close(out, plain(g))
