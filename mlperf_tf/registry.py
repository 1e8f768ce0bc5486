"""Provides the benchmark registry: every benchmark by name, from `mlperf_tf.benchmarks` entry points.

Built-ins and third-party packages register the same way, with an entry point in the group
`mlperf_tf.benchmarks` (the built-ins in this repository's setup.py), e.g.:

    entry_points={"mlperf_tf.benchmarks": ["my_model = my_pkg.benchmark:MyBenchmark"]}

so adding a benchmark never edits this module. Targets stay import strings until `get`, so one
benchmark's import error does not hide the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from mlperf_tf.errors import UserError

ENTRY_POINT_GROUP = "mlperf_tf.benchmarks"


class UnknownBenchmarkError(UserError, KeyError):
    """No benchmark is registered under the requested name."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


def _load(target: str):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def available() -> dict[str, str]:
    """Maps every registered name to its import target ("module:Class"), sorted by name.

    When two installed packages register one name, the first found wins.
    """
    names: dict[str, str] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(entry_point.name, entry_point.value)
    return dict(sorted(names.items()))


def get(name: str):
    """Returns the Benchmark class registered under `name`.

    Raises:
      UnknownBenchmarkError: no benchmark has that name (the message lists the known ones).
    """
    targets = available()
    if name not in targets:
        registered = ", ".join(targets) or "none: is mlperf-tf installed? (pip install -e .)"
        raise UnknownBenchmarkError(f"unknown benchmark '{name}' (registered: {registered})")
    return _load(targets[name])
