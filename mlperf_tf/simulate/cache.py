"""Provides the simulator's reader of the benchmark facts cache: per-sample FLOPs, parameter
counts, preset sizes and each benchmark's declarations (`simulator_shape()`, `convergence`).

The step model (`model`) and the convergence model (`convergence`) both read it; it reads neither,
so `simulate/` stands in one direction: cache <- convergence <- model <- cli. No TensorFlow is
imported unless a registered benchmark is missing from every cache (it is then counted now).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from mlperf_tf import paths
from mlperf_tf.errors import UserError
from mlperf_tf.facts import SimulatorShape

FLOPS_CACHE = os.path.join(os.path.dirname(__file__), "data", "flops.json")


def _flops_table() -> dict[str, Any]:
    """The committed FLOPs cache, updated with the user's (plug-in benchmarks) when it exists."""
    table = dict(_committed_flops())
    user = paths.user_flops_cache()
    if os.path.isfile(user):
        try:
            with open(user, encoding="utf-8") as f:
                table.update(json.load(f))
        except (OSError, ValueError) as e:
            raise UserError(f"the FLOPs cache {user!r} cannot be read: {e}") from None
    return table


@functools.cache
def _committed_flops() -> dict[str, Any]:
    with open(FLOPS_CACHE, encoding="utf-8") as f:
        return json.load(f)


def benchmark_facts(benchmark: str, preset: str = "mlperf") -> dict[str, Any]:
    """The FLOPs, parameters, sizes and declarations of a benchmark preset (see `mlperf_tf.flops`):
    cached, or for a registered benchmark the cache does not hold, counted now.

    Raises:
      UserError: the benchmark is neither cached nor registered, or has no such preset.
    """
    table = _flops_table()
    if benchmark not in table:
        table = {benchmark: _counted_now(benchmark, preset)}
    if preset not in table[benchmark]:
        raise UserError(
            f"benchmark '{benchmark}' has no preset '{preset}' "
            f"(presets: {', '.join(sorted(table[benchmark]))})"
        )
    return table[benchmark][preset]


@functools.cache
def _counted_now(benchmark: str, preset: str) -> dict[str, Any]:
    """{preset: entry} of a registered benchmark that no cache holds (imports TensorFlow; a
    small model is traced, so `python -m mlperf_tf.flops --write NAME` once saves the time)."""
    from mlperf_tf import flops, registry

    if benchmark not in registry.available():
        cached = ", ".join(sorted(_flops_table()))
        raise UserError(
            f"unknown benchmark '{benchmark}' for simulate (cached: {cached}; registered: "
            f"{', '.join(registry.available())})"
        )
    return flops.build_cache([benchmark], presets=[preset])[benchmark]


def shape_of(facts: dict[str, Any]) -> SimulatorShape:
    """The benchmark's declared `simulator_shape()` in a cache entry."""
    return SimulatorShape.from_dict(facts.get("shape"))


def family(kind: str) -> list[str]:
    """The cached benchmarks whose `mlperf` shape declares `kind` ("blocks" or "convs")."""
    return [
        name
        for name, presets in _flops_table().items()
        if (presets.get("mlperf") or {}).get("shape", {}).get(kind)
    ]
