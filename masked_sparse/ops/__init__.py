"""Op families. Importing a module registers its handlers in ``masked_sparse._registry``.

``basic`` (properties, copies, casts), ``pointwise`` (the generic elementwise kernel),
``conversion`` (get_data, to_tensor, layouts), ``where``, ``reductions``, ``softmax``,
``shape`` / ``indexing`` / ``joining`` (ops that move elements), ``exits``, ``foreach``
(``torch._foreach_*`` lists), ``scans`` and ``order`` (cumulative ops, sorting), ``linalg``
(matrix products) and ``einsum`` (two-operand contractions as matrix products).
"""

from . import (  # noqa: F401
    basic,
    conversion,
    einsum,
    embedding,
    exits,
    foreach,
    indexing,
    joining,
    linalg,
    order,
    pointwise,
    reductions,
    scans,
    shape,
    softmax,
    where,
)
