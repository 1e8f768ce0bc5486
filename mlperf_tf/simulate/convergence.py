"""Provides epochs to target as a function of global batch: MLPerf's RCPs, or a stated model.

MLPerf's reference convergence points (RCPs, shipped in `mlperf_logging/rcp_checker/training_*/
rcps_*.json`) give, per reference global batch, the epochs (samples for BERT) of 10-20 converged
reference runs. The simulator takes their mean at each batch and interpolates linearly in the
batch between reference batches, holds the smallest batch's value below it, and extrapolates the
last two points' line above the largest (stated, since large batches converge ever slower).

Which RCP file and entries are a benchmark's is its declaration (`Benchmark.convergence`:
`facts.Rcp`); where no RCP exists (the Transformer, retired before RCPs began with MLPerf 1.0)
it declares a stated model with its source (`facts.StatedConvergence`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import statistics

from mlperf_tf.errors import UserError
from mlperf_tf.facts import Rcp, StatedConvergence, convergence_from_dict
from mlperf_tf.simulate import cache


@dataclasses.dataclass(frozen=True)
class ConvergenceCurve:
    """Epochs (or samples) to target at reference batches, and where they come from."""

    batches: tuple[int, ...]
    values: tuple[float, ...]
    in_samples: bool
    source: str

    def at(self, batch: float) -> float:
        """Epochs (or samples) to target at global batch `batch` (see the module docstring)."""
        b, v = self.batches, self.values
        if len(b) == 1 or batch <= b[0]:
            return v[0]
        i = bisect.bisect_left(b, batch)
        if i >= len(b):
            i = len(b) - 1  # extrapolate the last segment's line
        lo, hi = i - 1, i
        slope = (v[hi] - v[lo]) / (b[hi] - b[lo])
        return v[lo] + slope * (batch - b[lo])

    def range_note(self, batch: float) -> str:
        """Nothing for a batch inside the reference batches; else what `at` assumed there (a
        plan at a batch no reference run used is a guess, and the output says so)."""
        b = self.batches
        if (len(b) > 1 and b[0] <= batch <= b[-1]) or (len(b) == 1 and batch == b[0]):
            return ""
        if batch < b[0]:
            return f" (batch {batch:g} is below its smallest, {b[0]}: that batch's value held)"
        if len(b) == 1:
            return f" (batch {batch:g} is not its one batch, {b[0]}: that batch's value held)"
        return (f" (batch {batch:g} is above its largest, {b[-1]}: the line through its last "
                "two batches extrapolated)")  # fmt: skip


def rcp_folder() -> str:
    import mlperf_logging

    return os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker")


def curve(benchmark: str, preset: str = "mlperf") -> ConvergenceCurve:
    """The convergence curve the benchmark declares (`Benchmark.convergence`, cached with its
    FLOPs; `cache.benchmark_facts`).

    Raises:
      UserError: it declares no RCP and no stated model.
    """
    declared = convergence_from_dict(cache.benchmark_facts(benchmark, preset).get("convergence"))
    return curve_of(declared, benchmark)


def curve_of(declared: Rcp | StatedConvergence | None, benchmark: str) -> ConvergenceCurve:
    """The curve of a declaration: the mean of each reference batch's RCP runs, or the stated
    points.

    Raises:
      UserError: `declared` is None (no RCP, no stated model: give `--epochs`).
    """
    if isinstance(declared, Rcp):
        path = os.path.join(rcp_folder(), declared.file)
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        by_batch: dict[int, list[float]] = {}
        for key, entry in table.items():
            if key.startswith(declared.prefix):
                # Most RCP files say "Epochs to converge"; some that count samples say
                # "samples to converge" (flux1; the official rcp_checker reads either).
                runs = entry.get("Epochs to converge", entry.get("samples to converge"))
                by_batch.setdefault(int(entry["BS"]), []).append(statistics.mean(runs))
        batches = tuple(sorted(by_batch))
        values = tuple(statistics.mean(by_batch[b]) for b in batches)
        return ConvergenceCurve(
            batches, values, declared.in_samples, f"RCP mlperf_logging/{declared.file}"
        )
    if isinstance(declared, StatedConvergence):
        return ConvergenceCurve(
            tuple(p[0] for p in declared.points),
            tuple(p[1] for p in declared.points),
            False,
            declared.source,
        )
    raise UserError(
        f"no convergence data for benchmark '{benchmark}' (it declares no RCP and no stated "
        "model: give --epochs)"
    )
