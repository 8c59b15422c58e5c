"""Storage layouts for masked tensors: a registry and one module per layout.

This package knows nothing of ``MaskedTensor``: its kernels take and return plain tensors
(a :class:`Storage` is index tensors + values + mask values + shape), so it can be used
and tested alone. ``masked_sparse`` routes every op to the table of its operand's layout.

>>> import torch, layouts
>>> [lay.name for lay in layouts.registered_layouts()][:3]
['strided', 'sparse_coo', 'sparse_csr']
"""

from . import strided  # noqa: F401  (registered first: the default layout)

# isort: split
from . import sparse_coo  # noqa: F401  (the hub of conversions)

# isort: split
from . import sparse_csr  # noqa: F401

# isort: split
from . import sparse_csc  # noqa: F401

# isort: split
from . import (
    kernels,  # the kernel families (registers torch.ops.masked_sparse.*)
    sparse_bsr,  # noqa: F401
)
from ._compact import compact_rows
from ._dense_operand import THRESHOLDS as PRODUCT_DENSITY_THRESHOLDS
from ._dense_operand import chosen as dense_chosen
from ._dense_operand import dense_buffer, dense_operand, set_product_density_threshold
from ._fill import (
    SAME_WIDTH_INT,  # dtype -> the integer dtype of its bits
    broadcast_part,
    fill_unspecified,
    identity,
    plain_eager,
    zero_unspecified,
)
from ._grouping import Grouping
from ._index import all_true, linearize
from ._linalg import sparse_mm, sparse_sparse_mm, specified_lines
from ._lines import Lines, lines_along
from ._native import NativeKernelsWarning
from ._native import disabled as native_disabled
from ._native import status as native_status
from ._per_head import per_head_dot, per_head_mm, per_head_specified
from ._reduce_sparse import group_by
from ._sampled import sampled_mm
from ._sgd import sgd_momentum_
from ._size import storage_nbytes
from ._validate import check_sparse_input
from .convert import (
    add_stored,
    convert,
    drop_unspecified,
    expand_specified,
    read_at,
    read_broadcast,
    read_stored,
    stack_storages,
    sum_back,
)
from .registry import (
    Kernel,
    Layout,
    Storage,
    get_layout,
    register_layout,
    registered_layouts,
    takes_layout,
    unregister_layout,
)

node_backward = kernels.node_backward

__all__ = [
    "all_true",
    "broadcast_part",
    "compact_rows",
    "Grouping",
    "Kernel",
    "Layout",
    "Lines",
    "NativeKernelsWarning",
    "SAME_WIDTH_INT",
    "Storage",
    "check_sparse_input",
    "convert",
    "dense_buffer",
    "dense_chosen",
    "dense_operand",
    "drop_unspecified",
    "expand_specified",
    "fill_unspecified",
    "identity",
    "per_head_dot",
    "per_head_mm",
    "per_head_specified",
    "get_layout",
    "kernels",
    "read_at",
    "add_stored",
    "read_stored",
    "read_broadcast",
    "sampled_mm",
    "set_product_density_threshold",
    "group_by",
    "lines_along",
    "linearize",
    "native_disabled",
    "native_status",
    "sgd_momentum_",
    "node_backward",
    "PRODUCT_DENSITY_THRESHOLDS",
    "plain_eager",
    "register_layout",
    "registered_layouts",
    "sparse_mm",
    "sparse_sparse_mm",
    "specified_lines",
    "stack_storages",
    "sum_back",
    "storage_nbytes",
    "takes_layout",
    "unregister_layout",
    "zero_unspecified",
]
