"""Op families. Importing a module registers its handlers in ``masked_sparse._registry``.

``basic`` (properties, copies, casts), ``pointwise`` (the generic elementwise kernel),
``conversion`` (get_data, to_tensor, layouts), ``where``, ``reductions``, ``softmax``,
``shape`` / ``indexing`` / ``joining`` (ops that move elements), ``exits``, ``foreach``
(``torch._foreach_*`` lists), ``scans`` and ``order`` (cumulative ops, sorting), ``linalg``
(matrix products and two-operand ``einsum``), ``sampled`` (the sampled product
``torch.sparse.sampled_addmm``), ``losses`` (``torch.nn.functional``'s losses).
"""

from . import (  # noqa: F401
    basic,
    conversion,
    embedding,
    exits,
    foreach,
    indexing,
    joining,
    linalg,
    losses,
    order,
    pointwise,
    reductions,
    sampled,
    scans,
    shape,
    softmax,
    where,
)
