"""A sparse matrix operand multiplied as dense above a density threshold, per device type.

Note [Products chosen per device and density]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A sparse kernel does work in proportion to the stored elements, a dense one (cuBLAS, MKL)
in proportion to the whole matrix but many times faster per element. Above some fraction
of stored elements -- a property of the device far more than of the shapes -- the dense
product of a buffer holding the stored values (0 elsewhere) wins. :data:`THRESHOLDS` holds
that fraction per device type; :func:`dense_operand` returns the buffer when the storage's
stored fraction (``values.numel() / (m * n)``: shapes only, no host sync) reaches it, else
``None`` (the caller takes the sparse kernels).

The buffer is kept per values tensor (a weight's storage keeps its values object from step
to step) and written again -- one ``index_copy_`` of the stored values into their flat
positions, the rest of the buffer staying 0 -- only when the values' version counter moved
(an optimizer step): no allocation per step, and a weight used several times in one graph
(an RNN, a tied layer) is written once, so what earlier products saved stays valid. An
in-place write after the values changed bumps the buffer's version, so a graph that saved
the old buffer refuses to run backward, as it would for a dense weight written in place.
The buffer is differentiable with respect to the values: its gradient read at the stored
positions (a gather of the dense gradient, ``grad.view(-1)[flat]``), so a product's weight
gradient is the dense product gathered at the positions -- above the threshold that costs
less than the sampled product (``python -m benchmarks.bench_products``). Nothing is kept
under a torch.func transform or in inference mode (a fresh buffer per call).

Where the values come from: ``cpu`` from ``python -m benchmarks.bench_products`` (density
swept over the 784-512-512-10 MLP's train step and a 4096 x 4096 linear at batch 512,
one thread: the fraction where the dense route starts to win). ``cuda`` is an estimate
from one H200 run of ``python -m benchmarks.gpu`` (a 4096 x 4096 linear, 10% stored:
cuBLAS on the dense product several times faster than cuSPARSE), to be re-measured with
the crossover rows of ``python -m benchmarks.gpu``. Other devices (``"other"``) have no
measurement and keep the sparse kernels (a threshold above 1) until one is set. Under
torch.compile the sparse route runs too (torch cannot trace its sparse products: the
error says what works), so a compiled function never densifies an operand eager code
would not. Override with :func:`set_product_density_threshold` (or the
``MASKED_SPARSE_PRODUCT_DENSITY`` environment variable, ``"cpu=0.1,cuda=0.02"``, read at
import); a threshold above 1 keeps every product sparse, 0 makes every one dense.

>>> import torch, layouts
>>> csr = layouts.get_layout("sparse_csr")
>>> s = csr.from_strided(torch.tensor([[1., 0.], [0., 2.]]), torch.eye(2, dtype=torch.bool))
>>> dense_operand(s, threshold=0.5).tolist()
[[1.0, 0.0], [0.0, 2.0]]
>>> dense_operand(s, threshold=0.6) is None
True
"""

from __future__ import annotations

import os

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._index import cached
from ._sampled import coordinates
from .registry import Storage

#: device type -> stored fraction of a sparse matrix operand from which it multiplies as
#: dense (Note [Products chosen per device and density]; ``python -m
#: benchmarks.bench_products`` measures ``cpu``, ``python -m benchmarks.gpu`` ``cuda``).
THRESHOLDS: dict[str, float] = {
    "cpu": 0.2,
    "cuda": 0.02,  # an estimate from the H200 figures: re-measure
    "other": 2.0,  # not measured: the sparse kernels, as before (set a value to use buffers)
}
_DEFAULTS = dict(THRESHOLDS)
_ENV = "MASKED_SPARSE_PRODUCT_DENSITY"


def set_product_density_threshold(device_type: str, value: float | None) -> None:
    """Set the stored fraction from which a sparse matrix operand on ``device_type``
    (``"cpu"``, ``"cuda"``, or ``"other"`` for every other device) multiplies as dense
    (Note [Products chosen per device and density]); ``None`` restores the default.

    >>> set_product_density_threshold("cpu", 2.0)   # every CPU product sparse
    >>> set_product_density_threshold("cpu", None)  # back to the measured default
    """
    if not isinstance(device_type, str) or device_type not in THRESHOLDS:
        raise ValueError(f"set_product_density_threshold(): device_type must be one of "
                         f"{sorted(THRESHOLDS)}, got {device_type!r}")
    if value is None:
        THRESHOLDS[device_type] = _DEFAULTS[device_type]
        return
    if not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValueError(f"set_product_density_threshold(): value must be a number >= 0 "
                         f"(above 1: always sparse, 0: always dense), got {value!r}")
    THRESHOLDS[device_type] = float(value)


def _read_env() -> None:
    text = os.environ.get(_ENV, "").strip()
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, number = part.partition("=")
        try:
            set_product_density_threshold(name.strip(), float(number))
        except ValueError as e:
            raise ValueError(f"{_ENV}={text!r}: expected 'device_type=fraction,...' with "
                             f"device types {sorted(THRESHOLDS)}: {e}") from None


_read_env()


def threshold_for(device: torch.device) -> float:
    """The density threshold of ``device``'s type (``"other"`` when not listed)."""
    return THRESHOLDS.get(device.type, THRESHOLDS["other"])


def _flat_positions(storage: Storage) -> torch.Tensor:
    """``row * n + col`` of every stored element in the values' order, cached per index."""
    n = storage.shape[1]

    def compute() -> torch.Tensor:
        rows, cols = coordinates(storage)
        return rows * n + cols

    owner, data = storage.index[-1], (storage.index[0] if len(storage.index) > 1 else None)
    return cached(owner, ("flat positions", tuple(storage.shape)), compute, data=data)


class _Scattered(torch.autograd.Function):
    """The buffer holding ``values`` at ``flat`` (written when ``write``); its gradient read
    at ``flat``."""

    @staticmethod
    def forward(ctx, values, flat, buffer, write):  # type: ignore[override]
        if write:
            buffer.view(-1).index_copy_(0, flat, values.reshape(-1))
        ctx.save_for_backward(flat)
        ctx.values_shape = values.shape
        return buffer.view(buffer.shape)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (flat,) = ctx.saved_tensors
        return grad.reshape(-1).index_select(0, flat).view(ctx.values_shape), None, None, None


_BUFFERS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # owner -> (stamp, buffer)


def _keeps(values: torch.Tensor) -> bool:
    return not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()
                or values.is_inference() or torch._C._are_functorch_transforms_active())


def chosen(storage: Storage, threshold: float | None = None) -> bool:
    """True when the 2-D sparse ``storage`` multiplies as dense on its device: its stored
    fraction reaches ``threshold`` (default: the device type's, :data:`THRESHOLDS`)."""
    values = storage.values
    if (not storage.index or len(storage.shape) != 2 or values.dim() != 1
            or torch.compiler.is_compiling()):
        return False
    m, n = storage.shape
    limit = threshold_for(values.device) if threshold is None else threshold
    return m * n > 0 and values.numel() >= limit * (m * n)


def dense_buffer(storage: Storage, owner: torch.Tensor | None = None,
                 stamp: object = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer, flat)``: an ``(m, n)`` matrix holding ``storage.values`` at their flat
    positions ``flat`` (0 elsewhere), not differentiable. With ``owner`` the buffer is kept
    per ``owner`` object and written again only when ``stamp`` (the versions of what the
    values were computed from) changes (Note [Products chosen per device and density]).
    """
    values = storage.values
    flat = _flat_positions(storage)
    if owner is None or not _keeps(values):
        buffer = values.new_zeros(tuple(storage.shape))
        buffer.view(-1).index_copy_(0, flat, values.detach())
        return buffer, flat
    entry = _BUFFERS.get(owner)
    if entry is not None and entry[0] == stamp and entry[1].shape == storage.shape:
        return entry[1], flat
    buffer = (entry[1] if entry is not None and entry[1].shape == storage.shape
              else values.new_zeros(tuple(storage.shape)))
    buffer.view(-1).index_copy_(0, flat, values.detach())
    _BUFFERS[owner] = (stamp, buffer)
    return buffer, flat


def dense_operand(storage: Storage, threshold: float | None = None) -> torch.Tensor | None:
    """The 2-D sparse ``storage`` as a fresh dense matrix (its stored values, 0 elsewhere),
    differentiable with respect to ``storage.values`` (the gradient read at the stored
    positions), when :func:`chosen`; else ``None``.

    Unspecified stored values are written as they are: the caller zeroes them first.
    """
    if not chosen(storage, threshold):
        return None
    values = storage.values
    flat = _flat_positions(storage)
    return _Scattered.apply(values, flat, values.new_zeros(tuple(storage.shape)), True)
