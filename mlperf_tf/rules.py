"""Provides MLPerf rule formulas shared by the benchmarks and the checker, in plain Python.

`compliance/` imports this module, so it must stay free of TensorFlow (and of anything that
imports it): the runner side and the checker side then compute a rule the same way.
"""

from __future__ import annotations

import math

BERT_EVAL_RULES = ("v0.7", "v1.0")


def bert_eval_interval_samples(rule: str, global_batch_size: int) -> int:
    """Training samples between BERT evaluations under MLPerf's rules.

    v1.0 (MLCommons reference README, "Stopping criteria"):
    `floor(0.05 * (230.23 * global_batch_size + 3,000,000) / 25,000) * 25,000`, starting from 0
    samples; at global batch 6912 that is 225,000, which Google's v1.0 submission ran as 33 steps
    (228,096 samples: the benchmark rounds the interval up to whole steps). v0.7: every 500,000
    samples (the interval of the v0.7 submissions, e.g. 62 steps x 8192 in Google's TPU log).

    Raises:
      ValueError: unknown rule or non-positive batch size.
    """
    if global_batch_size <= 0:
        raise ValueError(f"`global_batch_size` ({global_batch_size}) must be positive.")
    if rule == "v1.0":
        return int(math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000)
    if rule == "v0.7":
        return 500_000
    raise ValueError(f"`eval_rule` ({rule!r}) must be one of {', '.join(BERT_EVAL_RULES)}.")
