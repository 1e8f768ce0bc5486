"""Provides the benchmark registry: built-in benchmarks by name, plus third-party entry points.

Built-ins are listed explicitly (import path strings, so one benchmark's import error does not
hide the others). A third-party package adds a benchmark with an entry point in the group
`mlperf_tf.benchmarks`, e.g. in its setup.py:

    entry_points={"mlperf_tf.benchmarks": ["my_model = my_pkg.benchmark:MyBenchmark"]}
"""

from __future__ import annotations

import importlib
import importlib.metadata

from mlperf_tf.errors import UserError

ENTRY_POINT_GROUP = "mlperf_tf.benchmarks"

BUILTIN_BENCHMARKS = {
    "resnet50": "benchmarks.resnet50.benchmark:ResNet50Benchmark",
    "ssd": "benchmarks.ssd.benchmark:SSDBenchmark",
    "transformer": "benchmarks.transformer.benchmark:TransformerBenchmark",
    "bert": "benchmarks.bert.benchmark:BertBenchmark",
}


class UnknownBenchmarkError(UserError, KeyError):
    """No benchmark is registered under the requested name."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


def _load(target: str):
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def available() -> dict[str, str]:
    """Maps every registered name to its import target ("module:Class"); built-ins first."""
    names = dict(BUILTIN_BENCHMARKS)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(entry_point.name, entry_point.value)
    return names


def get(name: str):
    """Returns the Benchmark class registered under `name`.

    Raises:
      UnknownBenchmarkError: no benchmark has that name (the message lists the known ones).
    """
    targets = available()
    if name not in targets:
        raise UnknownBenchmarkError(
            f"unknown benchmark '{name}' (registered: {', '.join(sorted(targets))})"
        )
    return _load(targets[name])
