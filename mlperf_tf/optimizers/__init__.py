"""Provides the large-batch optimizers (LARS, LAMB, Neumann, NLCG, K-FAC), a fused Adam, AdamW, their registry and learning-rate schedules of the MLPerf references."""

from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.optimizers.adamw import AdamW
from mlperf_tf.optimizers.kfac import KFAC
from mlperf_tf.optimizers.lamb import LAMB
from mlperf_tf.optimizers.lars import LARS
from mlperf_tf.optimizers.neumann import Neumann
from mlperf_tf.optimizers.nlcg import NLCG
from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad
from mlperf_tf.optimizers.schedules import (
    PiecewiseConstantWithWarmup,
    WarmupCosineDecay,
    WarmupPolynomialDecay,
    WarmupRsqrtDecay,
    scale_learning_rate,
)

__all__ = [
    "AdamW",
    "AdamWRowWiseAdagrad",
    "FusedAdam",
    "KFAC",
    "LAMB",
    "LARS",
    "NLCG",
    "Neumann",
    "PiecewiseConstantWithWarmup",
    "WarmupCosineDecay",
    "WarmupPolynomialDecay",
    "WarmupRsqrtDecay",
    "scale_learning_rate",
]
