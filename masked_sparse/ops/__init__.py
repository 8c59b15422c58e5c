"""Op families. Importing a module registers its handlers in ``masked_sparse._registry``."""

from . import basic, conversion, pointwise  # noqa: F401
from . import where  # noqa: F401
from . import reductions, softmax  # noqa: F401
from . import indexing, joining, shape  # noqa: F401
