"""The core's zero fill, ``zero_fill(values, mask)``: exact, fast and differentiable; and
what the core remembers about fills (a result already filled, a mask with nothing to fill).

``zero_fill`` is the layouts' exact fill (``layouts.zero_unspecified``) with three things
the core needs around it: a mask that broadcasts to the values (an attention mask shared by
heads: Note [Zero fill by bits]); the fast fill under autograd too (``_ZeroFill``: the
differentiable route of the layouts' fill is ``torch.where``, which takes a slow path on
CPU for its bool condition in the forward and again in its backward, where this Function
fills by the fast exact route both ways); and the tag of a filled result, so that a product
after a softmax does not fill it again (Note [Known zero fill]). Kernels, whose results are
not tagged, call ``layouts.zero_unspecified`` / ``layouts.fill_unspecified`` directly.

>>> import torch
>>> zero_fill(torch.tensor([1.0, float("nan")]), torch.tensor([True, False]))
tensor([1., 0.])
"""

from __future__ import annotations

import torch

import layouts

from ._id_tags import IdTags
from ._shapes import broadcasts_to

_ZERO_FILLED = IdTags()  # values -> (mask, version): Note [Known zero fill]
_ALL_SPECIFIED = IdTags()  # mask -> (version, answer)
_DIRECT = 1 << 14  # masks up to this many stored elements are compared with a kept all-True


def _fills_by_bits(dtype: torch.dtype) -> bool:
    """A float dtype with a same-width integer view (float16, bfloat16, float32, float64)."""
    return dtype.is_floating_point and dtype in layouts.SAME_WIDTH_INT


def _bitwise_zero_fill(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, values, 0)`` exactly: for a full-size mask the layouts' one
    exact fill (``layouts.zero_unspecified``), for a broadcast mask an integer product with
    the compacted mask (Note [Zero fill by bits])."""
    small = layouts.broadcast_part(mask)
    if small is mask:
        return layouts.zero_unspecified(values, mask)
    return (values.view(layouts.SAME_WIDTH_INT[values.dtype]) * small).view(values.dtype)


class _ZeroFill(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, mask):  # type: ignore[override]
        ctx.save_for_backward(mask)
        return _bitwise_zero_fill(values, mask)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: stay differentiable (Note [Double backward])
            return layouts.zero_unspecified(grad, mask), None
        return mark_zero_filled(_bitwise_zero_fill(grad, mask), mask), None


def zero_fill(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with unspecified entries set to 0 (NaN and inf under the mask included);
    differentiable, the gradient is 0 at unspecified entries.

    Note [Zero fill by bits]
    ~~~~~~~~~~~~~~~~~~~~~~~~
    ``values * mask`` keeps NaN and inf under the mask; ``torch.where`` is exact but takes a
    slow path on CPU for its bool condition. A full-size mask takes the layouts' exact fill
    (``layouts.fill_unspecified``: one native pass on CPU, else ``where``). A mask
    broadcast over some dims (stride 0, e.g. an attention mask expanded over heads) is read
    once per stored element: the float's *bits*, viewed as an integer of the same width, are
    multiplied by the compacted 0/1 mask, which is exact (the bits survive or become +0.0).
    Other dtypes (integers, complex), a mask that ``values`` would have to broadcast to,
    compiled code (where Inductor fuses the ``where`` into the kernel that computes
    ``values``) and ``torch.func`` transforms take the layouts' fill as it is.
    """
    if (not _fills_by_bits(values.dtype) or mask.dtype != torch.bool
            or torch.compiler.is_compiling()
            or (mask.shape != values.shape
                and not broadcasts_to(tuple(mask.shape), tuple(values.shape)))
            or torch._C._are_functorch_transforms_active()):  # Note [MaskedTensors in torch.func]
        out = layouts.zero_unspecified(values, mask)
    elif torch.is_grad_enabled() and values.requires_grad:
        out = _ZeroFill.apply(values, mask)
    else:
        out = _bitwise_zero_fill(values, mask)
    return mark_zero_filled(out, mask)


def mark_zero_filled(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values``, which hold 0 at every element ``mask`` leaves unspecified (``zero_fill``'s
    result, or a kernel's that wrote the zeros itself), tagged as such: a later
    ``zero_fill`` with this mask is skipped (Note [Known zero fill]).

    >>> import torch
    >>> m = torch.tensor([True, False])
    >>> is_zero_filled(mark_zero_filled(torch.tensor([1., 0.]), m), m)
    True
    """
    # An inference tensor has no version counter to read (it cannot be written in place
    # outside inference mode either): it is not tagged.
    if not torch.compiler.is_dynamo_compiling() and not torch.is_inference(values):
        _ZERO_FILLED.set(values, (mask, values._version))
    return values


def carry_zero_fill(source: torch.Tensor, alias: torch.Tensor) -> torch.Tensor:
    """``alias`` (``source.detach()``: the same elements and version counter) tagged as
    zero filled when ``source`` is (Note [Known zero fill]): autograd's detached copies of
    ``softmax``'s result keep the tag, so ``softmax(scores) @ v`` fills once under autograd
    as well.

    >>> import torch
    >>> m = torch.tensor([True, False])
    >>> x = mark_zero_filled(torch.tensor([1., 0.]), m)
    >>> is_zero_filled(carry_zero_fill(x, x.detach()), m)
    True
    """
    if not _ZERO_FILLED:  # (nothing tagged: no lookup)
        return alias
    tag = _ZERO_FILLED.get(source)
    if tag is not None and tag[1] == source._version and not torch.compiler.is_dynamo_compiling():
        _ZERO_FILLED.set(alias, (tag[0], alias._version))
    return alias


def is_zero_filled(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """True when ``values`` came out of ``zero_fill(..., mask)`` (this very mask object) and
    has not been written since.

    Note [Known zero fill]
    ~~~~~~~~~~~~~~~~~~~~~~
    ``softmax`` ends with ``zero_fill`` and a matrix product starts with one: in attention,
    ``softmax(scores) @ v`` would fill the same large tensor twice. ``zero_fill`` tags its
    result with the mask object and the tensor's version counter, in a table keyed weakly by
    tensor identity (nothing is stored on the tensor, so nothing is pickled); a later fill
    with that mask is skipped while the version is unchanged (any in-place write bumps it).
    A result that was copied, loaded or rebuilt is a new tensor without the tag, so the
    worst case is one fill too many, never one too few; autograd's own detached aliases
    (``on_values``) take the tag along (:func:`carry_zero_fill`). While torch.compile
    traces, AOTAutograd runs this code on fake tensors, which are tagged the same way
    (the compiled attention fills its softmax output once); only Dynamo's own bytecode
    tracing (``is_dynamo_compiling``) skips the table.
    """
    if torch.is_inference(values) or torch.compiler.is_dynamo_compiling():
        return False
    tag = _ZERO_FILLED.get(values)
    return tag is not None and tag[0] is mask and tag[1] == values._version


def _all_true(small: torch.Tensor) -> bool:
    """``bool(small.all())`` for a CPU bool tensor of at most ``_DIRECT`` elements: compared
    with a kept all-True tensor of its shape (``torch.equal`` compares the bytes of two
    contiguous tensors at once; ``all`` is a reduction, with a larger fixed cost, which a
    small ``amax(dim)`` pays on every call: ``benchmarks/profile_overhead.py --fixed``). A
    byte other than 0 and 1 (a bool view of other bytes) reads as not all True: at worst a
    fill with nothing to do."""
    ones = _ONES.get(small.shape)
    if ones is None:
        with torch.inference_mode(False):  # (a normal tensor, whatever the mode)
            ones = torch.ones(small.shape, dtype=torch.bool)
        if len(_ONES) >= 64:  # bounded: at most 64 x _DIRECT bytes
            _ONES.clear()
        _ONES[small.shape] = ones
    return torch.equal(small, ones)


_ONES: dict[torch.Size, torch.Tensor] = {}  # shape -> all-True CPU bool tensor


def all_specified(mask: torch.Tensor) -> bool:
    """True when every element of the bool ``mask`` is True: then a zero fill has nothing
    to do (a sparse weight stores only its kept entries; a layer whose every output feature
    has a term). A mask broadcast over some dims is read at its stored size; the answer is
    kept per mask object and version (an op reads it for each operand it could fill). False
    off the CPU (the answer would be a host sync), while compiling, under a ``torch.func``
    transform or a dispatch mode (fake tensors, ``make_fx``), where it would be
    data-dependent control flow.

    >>> all_specified(torch.tensor([True, True]).expand(3, 2)), all_specified(torch.tensor([False]))
    (True, False)
    """
    if (mask.dtype != torch.bool or not mask.is_cpu or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active()
            or torch._C._len_torch_dispatch_stack()):  # (elsewhere: a host sync)
        return False
    if mask.is_inference():  # (no version counter to key on)
        return _all_true_at(layouts.broadcast_part(mask))
    entry = _ALL_SPECIFIED.get(mask)
    if entry is not None and entry[0] == mask._version:
        return entry[1]
    answer = _all_true_at(layouts.broadcast_part(mask))
    _ALL_SPECIFIED.set(mask, (mask._version, answer))
    return answer


def _all_true_at(small: torch.Tensor) -> bool:
    return _all_true(small) if small.numel() <= _DIRECT else bool(small.all())
