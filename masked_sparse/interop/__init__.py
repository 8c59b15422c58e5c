"""Getting data in and out: ``scipy.sparse`` (:mod:`.scipy`) and ``numpy.ma`` (:mod:`.numpy`).

>>> import numpy as np, masked_sparse as ms
>>> a = np.ma.masked_array([[1., 0.], [0., 4.]], mask=[[False, True], [True, False]])
>>> ms.to_scipy(ms.from_numpy(a), "coo").nnz
2
"""

from .numpy import from_numpy, to_numpy
from .scipy import from_scipy, to_scipy

__all__ = ["from_numpy", "from_scipy", "to_numpy", "to_scipy"]
