"""Shape arithmetic on plain tuples of ints, without torch's Python reference code."""

from __future__ import annotations

import functools

import torch


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True when ``shape`` broadcasts to ``target`` exactly (the result has ``target``).

    The same answer as ``torch.broadcast_shapes(shape, target) == target``, which runs a
    Python reference implementation on every call; this compares the dims directly (it is
    on every binary op's route: ``python -m benchmarks.profile_overhead``).

    >>> broadcasts_to((3, 1), (2, 3, 4)), broadcasts_to((2, 4), (3, 4))
    (True, False)
    """
    if _dynamo_compiling():  # (Dynamo traces the comparison, not the cache)
        return _broadcasts_to(shape, target)
    try:
        return _broadcasts_to_cached(shape, target)  # (a binary op's shapes repeat)
    except TypeError:  # symbolic sizes (AOTAutograd's tracing) are not hashable
        return _broadcasts_to(shape, target)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


_broadcasts_to_cached = functools.lru_cache(maxsize=1024)(_broadcasts_to)
_dynamo_compiling = torch.compiler.is_dynamo_compiling
