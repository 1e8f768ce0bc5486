"""Provides the reference convergence points (RCPs) shipped with the pinned mlperf-logging: a
benchmark's reference hyperparameters (learning rate, warm-up, ...) at a global batch size.

MLPerf's closed division lets a submission use the hyperparameters of an RCP of its batch size
(or borrow and justify others), so a benchmark whose learning rate is not set in its config takes
it from here, and a batch size with no RCP is a one-line error rather than an interpolation.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable

from mlperf_tf.config import ConfigError

# The config settings that a benchmark taking its learning rate and warm-up from the RCPs leaves
# unset (base LR 0, warm-up -1) and a user sets instead.
LR_AND_WARMUP = "`optimizer.opt_base_learning_rate` and `optimizer.opt_learning_rate_warmup_steps`"


@functools.cache
def hyperparameters(rcp_file: str) -> dict[int, dict]:
    """Batch size -> the `Hyperparams` of its RCP in `rcp_file` (a path inside the installed
    `mlperf_logging` package, e.g. "rcp_checker/training_6.0.0/rcps_gpt_oss_20b.json")."""
    import mlperf_logging  # noqa: PLC0415 (only where the RCPs are read)

    path = os.path.join(os.path.dirname(mlperf_logging.__file__), rcp_file)
    with open(path, encoding="utf-8") as handle:
        rcps = json.load(handle)
    return dict(sorted((int(e["BS"]), dict(e["Hyperparams"])) for e in rcps.values()))


def at_batch(rcp_file: str, benchmark: str, global_batch_size: int, *, settings: str) -> dict:
    """The RCP hyperparameters of `benchmark` at `global_batch_size`.

    Args:
      rcp_file: the RCP file (see `hyperparameters`).
      benchmark: the benchmark's name, for the message.
      global_batch_size: the run's global batch.
      settings: the config settings a user sets instead (named in the message).

    Raises:
      ConfigError: no RCP has this batch size (no interpolation: the rules accept the RCPs'
        hyperparameters, or ones a submitter borrows and justifies).
    """
    points = hyperparameters(rcp_file)
    if global_batch_size not in points:
        raise ConfigError(
            f"`global_batch_size` ({global_batch_size}) has no {benchmark} reference convergence "
            f"point (batch sizes {', '.join(map(str, points))}); set {settings}."
        )
    return points[global_batch_size]


def lr_and_warmup(optimizer, from_rcp: Callable[[], tuple[float, int]]) -> tuple[float, int]:
    """(base LR, warm-up steps): `optimizer`'s `opt_base_learning_rate` and
    `opt_learning_rate_warmup_steps`, each left unset (LR 0, warm-up -1) taken from `from_rcp()`,
    the RCP's pair for the run's global batch size.

    Raises:
      ConfigError: one is unset and `from_rcp` finds no RCP for the batch size.
    """
    lr, warmup_steps = optimizer.opt_base_learning_rate, optimizer.opt_learning_rate_warmup_steps
    if not lr or warmup_steps < 0:
        rcp_lr, rcp_warmup = from_rcp()
        lr = lr or rcp_lr
        warmup_steps = rcp_warmup if warmup_steps < 0 else warmup_steps
    return lr, warmup_steps


def check_warmup_steps(warmup_steps: int) -> None:
    """Raises ConfigError unless `optimizer.opt_learning_rate_warmup_steps` is >= 0 or -1 (from
    the RCP)."""
    if warmup_steps < -1:
        raise ConfigError(
            f"`optimizer.opt_learning_rate_warmup_steps` ({warmup_steps}) must be >= 0 "
            "(or -1: from the RCP)."
        )
