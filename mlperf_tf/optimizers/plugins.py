"""Provides the registry plug-ins of the first-order optimizers the MLPerf references use.

SGD-momentum (ResNet-50, SSD), LARS (ResNet-50), LAMB (BERT), Adam (Transformer) and AdamW (Llama 3.1), each an
`OptimizerPlugin` registered in setup.py's `mlperf_tf.optimizers` entry points. Hyperparameter
fields are named after the MLPerf log keys; `alias` lists the other names a benchmark config uses
for the same setting. Weight decay of plain SGD stays where the benchmarks put it (an L2 term in
their loss), so the SGD plug-in has none.
"""

from __future__ import annotations

import dataclasses

import keras

from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.optimizers.adamw import AdamW
from mlperf_tf.optimizers.lamb import DEFAULT_LAMB_EXCLUDE, LAMB
from mlperf_tf.optimizers.lars import DEFAULT_LARS_EXCLUDE, LARS
from mlperf_tf.optimizers.registry import OptimizerPlugin, alias, fields_as_arguments


@dataclasses.dataclass(frozen=True, kw_only=True)
class SGDHparams:
    """SGD with classic momentum (Keras' `SGD`: velocity = mu * velocity - lr * g; w += velocity)."""

    sgd_opt_momentum: float = alias(0.9, "momentum", "opt_momentum")
    sgd_opt_nesterov: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class LARSHparams:
    """`LARS` (MLPerf ResNet-50); `lars_eeta` is not an MLPerf key but the resnet50 config's."""

    lars_opt_momentum: float = alias(0.9, "momentum", "opt_momentum")
    lars_opt_weight_decay: float = alias(1e-4, "opt_weight_decay")
    lars_epsilon: float = 0.0
    lars_eeta: float = 0.001
    lars_exclude_from_weight_decay: tuple[str, ...] = DEFAULT_LARS_EXCLUDE


@dataclasses.dataclass(frozen=True, kw_only=True)
class LAMBHparams:
    """`LAMB` (MLPerf BERT)."""

    opt_lamb_beta_1: float = 0.9
    opt_lamb_beta_2: float = 0.999
    opt_epsilon: float = alias(1e-6, "opt_lamb_epsilon")
    opt_lamb_weight_decay_rate: float = alias(0.01, "opt_weight_decay", argument="weight_decay")
    opt_lamb_exclude_from_weight_decay: tuple[str, ...] = DEFAULT_LAMB_EXCLUDE


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamHparams:
    """Keras' `Adam`, as `FusedAdam` (MLPerf Transformer)."""

    opt_adam_beta_1: float = 0.9
    opt_adam_beta_2: float = 0.997
    opt_adam_epsilon: float = 1e-9


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamWHparams:
    """`AdamW` (MLPerf llama31_8b; PyTorch's formula). The keys are the closed rules' names."""

    opt_adamw_beta_1: float = 0.9
    opt_adamw_beta_2: float = 0.95
    opt_adamw_epsilon: float = 1e-5
    opt_adamw_weight_decay: float = alias(0.1, "opt_weight_decay")


# Variable paths (re.search) without weight decay: Megatron-core's `_get_param_groups` exempts
# biases and every 1-D parameter (norm scales); this suite's layers name theirs ".../bias",
# ".../scale", ".../gamma", ".../beta".
ADAMW_EXCLUDE = (r"/bias$", r"/scale$", r"/gamma$", r"/beta$")

# Each plug-in passes its fields to the optimizer by keyword, less the MLPerf key's prefix
# (`registry.fields_as_arguments`): `lars_opt_momentum` is LARS' `momentum`.
SGD = OptimizerPlugin(
    hparams_class=SGDHparams,
    make=fields_as_arguments(keras.optimizers.SGD, "sgd_opt_"),
    log_name="sgd",
)
LARS_PLUGIN = OptimizerPlugin(
    hparams_class=LARSHparams, make=fields_as_arguments(LARS, "lars_opt_", "lars_"), log_name="lars"
)
LAMB_PLUGIN = OptimizerPlugin(
    hparams_class=LAMBHparams, make=fields_as_arguments(LAMB, "opt_lamb_", "opt_"), log_name="lamb"
)
# Keras' Adam, one fused kernel per variable (mlperf_tf/optimizers/adam.py).
ADAM = OptimizerPlugin(
    hparams_class=AdamHparams, make=fields_as_arguments(FusedAdam, "opt_adam_"), log_name="adam"
)
# 1-D variables (norm scales, biases) get no decay, as Megatron's param groups.
ADAMW = OptimizerPlugin(
    hparams_class=AdamWHparams,
    make=fields_as_arguments(AdamW, "opt_adamw_", exclude_from_weight_decay=ADAMW_EXCLUDE),
    log_name="adamw",
)
