"""Provides epochs to target as a function of global batch: MLPerf's RCPs, or a stated model.

MLPerf's reference convergence points (RCPs, shipped in `mlperf_logging/rcp_checker/training_*/
rcps_*.json`) give, per reference global batch, the epochs (samples for BERT) of 10-20 converged
reference runs. The simulator takes their mean at each batch and interpolates linearly in the
batch between reference batches, holds the smallest batch's value below it, and extrapolates the
last two points' line above the largest (stated, since large batches converge ever slower).

Where no RCP exists (the Transformer, retired before RCPs began with MLPerf 1.0), the model is
stated in `STATED_MODELS` with its source.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import statistics

from mlperf_tf.errors import UserError

# Per simulator benchmark: the RCP file (relative to mlperf_logging's rcp_checker folder), the
# key prefix of the entries that match this suite's model, and whether RCP values are samples.
RCP_SOURCES = {
    "resnet50": ("training_4.0.0/rcps_resnet.json", "resnet_ref_", False),
    "bert": ("training_4.0.0/rcps_bert.json", "bert_ref_", True),
    # SSD-ResNet34 (this suite's SSD) has RCPs up to MLPerf 1.1; later "ssd" is RetinaNet.
    "ssd": ("training_1.1.0/rcps_ssd.json", "ssd_ref_", False),
    # Llama 3.1 8B: samples (sequences of 8,192 tokens) to log perplexity 3.3, BS 16 ... 128.
    "llama31_8b": ("training_5.1.0/rcps_llama31_8b.json", "llama31_8b_ref_", True),
}

# Stated models where no RCP exists: (batch, epochs) points, same interpolation rules.
STATED_MODELS = {
    # Transformer-big (batch in tokens): MLPerf v0.6 TPU-v3 result logs converged in 2-3 epochs
    # at global batch 512 and in 5 at 2048 (training_results_v0.6 Google/results/
    # tpu-v3-{32,2048}/transformer); their batch unit is taken as 512 tokens (an assumption: a
    # padded pair), giving the points below. A stated model, not a measurement.
    "transformer": ((262144, 3.0), (1048576, 5.0)),
}


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


def rcp_folder() -> str:
    import mlperf_logging

    return os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker")


def curve(benchmark: str) -> ConvergenceCurve:
    """The convergence curve of a simulator benchmark name (resnet50, bert, ssd, transformer,
    llama31_8b).

    Raises:
      UserError: no RCP and no stated model exist for it.
    """
    if benchmark in RCP_SOURCES:
        relative, prefix, in_samples = RCP_SOURCES[benchmark]
        path = os.path.join(rcp_folder(), relative)
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        by_batch: dict[int, list[float]] = {}
        for key, entry in table.items():
            if key.startswith(prefix):
                by_batch.setdefault(int(entry["BS"]), []).append(
                    statistics.mean(entry["Epochs to converge"])
                )
        batches = tuple(sorted(by_batch))
        values = tuple(statistics.mean(by_batch[b]) for b in batches)
        return ConvergenceCurve(batches, values, in_samples, f"RCP mlperf_logging/{relative}")
    if benchmark in STATED_MODELS:
        points = STATED_MODELS[benchmark]
        return ConvergenceCurve(
            tuple(p[0] for p in points),
            tuple(p[1] for p in points),
            False,
            "stated model (no RCP): mlperf_tf/simulate/convergence.py STATED_MODELS",
        )
    raise UserError(f"no convergence data for benchmark '{benchmark}' (no RCP, no stated model)")
