"""Provides the large-batch optimizers (LARS, LAMB) and learning-rate schedules of the MLPerf references."""

from mlperf_tf.optimizers.lamb import LAMB
from mlperf_tf.optimizers.lars import LARS
from mlperf_tf.optimizers.schedules import (
    PiecewiseConstantWithWarmup,
    WarmupPolynomialDecay,
    WarmupRsqrtDecay,
    scale_learning_rate,
)

__all__ = [
    "LAMB",
    "LARS",
    "PiecewiseConstantWithWarmup",
    "WarmupPolynomialDecay",
    "WarmupRsqrtDecay",
    "scale_learning_rate",
]
