"""Op families. Importing a module registers its handlers in ``masked_sparse._registry``.

``basic`` (properties, copies, casts), ``pointwise`` (the generic elementwise kernel),
``conversion`` (get_data, to_tensor, layouts), ``where``, ``reductions``, ``softmax``,
``shape`` / ``indexing`` / ``joining`` (ops that move elements), ``exits``, ``foreach``
(``torch._foreach_*`` lists), ``scans`` and ``order`` (cumulative ops, sorting), ``linalg``
(matrix products), ``einsum`` (two-operand contractions as matrix products),
``plain_operands`` (plain operands that require grad get plain gradients), ``sampled``
(the sampled product ``torch.sparse.sampled_addmm``), ``losses`` and ``_class_losses``
(``torch.nn.functional``'s losses; those over a class dim), ``attention`` (masked attention
through ``F.scaled_dot_product_attention``: ``ms.attention``), ``zero_derivative`` (pointwise
ops whose torch derivative is a plain zero), ``unary_node`` (a unary pointwise op under
autograd as one node).
"""

from . import (  # noqa: F401
    _class_losses,
    attention,
    basic,
    conversion,
    einsum,
    embedding,
    exits,
    foreach,
    indexing,
    joining,
    linalg,
    losses,
    order,
    plain_operands,
    pointwise,
    reductions,
    sampled,
    scans,
    shape,
    softmax,
    unary_node,
    where,
    zero_derivative,
)
