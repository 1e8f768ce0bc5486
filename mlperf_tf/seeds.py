"""Provides `LayerSeeds`: a distinct initializer seed per layer of a model, derived from the run's seed."""

from __future__ import annotations


class LayerSeeds:
    """Hands out seeds `1000 seed + 1, + 2, ...` in the order layers ask: a model built twice
    from one run seed gets the same weights, and no two of its layers share an initializer seed."""

    def __init__(self, seed: int):
        self._next = seed * 1000

    def __call__(self) -> int:
        self._next += 1
        return self._next
