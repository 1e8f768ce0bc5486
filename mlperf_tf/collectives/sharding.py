"""Provides the sharded optimizer update's rule: the optimizer's own, or Keras' SGD's.

With weight-update sharding each replica holds the summed gradient and the optimizer slots of a
1/N piece of every variable (Kumar et al. 2019, "Scale MLPerf-0.6 models on Google TPU-v3
Pods"). What the update of a piece is belongs to the optimizer: the suite's optimizers declare
it (`sharded_update`, a `mlperf_tf.optimizers.base.ShardedUpdate`: the slots it keeps per piece,
the tensors whose whole-variable norms it needs, and the math), and the summer only moves the
pieces and sums the norms' squares (`summer.py`). This package imports no optimizer of the
suite. Keras' own `SGD` cannot declare a rule, so its formula is here, on the same interface.

Rules run in replica context; `finish` returns each tensor's new weight piece and assigns the
slot pieces (sync-on-read variables: one [k] copy per replica, different on each).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.errors import UserError

# Keras features the sharded rules do not reproduce: refused up front rather than ignored.
_UNSUPPORTED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema",
                "gradient_accumulation_steps")  # fmt: skip


class KerasSGDPieces:
    """`keras.optimizers.SGD` on pieces (the interface of `ShardedUpdate`): velocity =
    mu * velocity - lr * g; w += velocity (Nesterov: w += mu * velocity - lr * g); without
    momentum w -= lr * g. No norms."""

    def __init__(self, optimizer: keras.optimizers.SGD, variables):
        del variables
        self.momentum = float(optimizer.momentum)
        self.nesterov = bool(optimizer.nesterov)
        self.slot_names = ("momentum",) if self.momentum else ()

    def direction(self, index, w, g, slots, step):
        return g, None

    def finish(self, index, g, w, slots, lr, norms):
        if not self.momentum:
            return w - lr * g
        mu = tf.cast(self.momentum, w.dtype)
        velocity = slots[0] * mu - g * lr
        slots[0].assign(velocity)
        return w + (velocity * mu - g * lr if self.nesterov else velocity)


def check_optimizer(optimizer, setting: str) -> None:
    """Refuses what the summer's own apply does not reproduce of Keras' `apply_gradients`.

    Raises:
      UserError: fp16 loss scaling, or a Keras option (decoupled weight decay, clipping, EMA,
        gradient accumulation) set on the optimizer.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise UserError(f"{setting} does not support fp16 loss scaling (--dtype=fp16)")
    used = [k for k in _UNSUPPORTED if getattr(optimizer, k, None)]
    if used:
        raise UserError(
            f"{setting} does not support the Keras option(s) {', '.join(used)} of the optimizer "
            f"{type(optimizer).__name__}"
        )


def declared_rule(optimizer, variables):
    """The rule on pieces `optimizer` declares (`sharded_update`), or Keras' SGD's; None: it
    has none. Its `slot_names` are the optimizer's own slot names (the stage-local update's
    checkpoint keys are the optimizer's slots', `GradientSummer.slot_paths`)."""
    declare = getattr(optimizer, "sharded_update", None)
    rule = declare(variables) if callable(declare) else None
    if rule is None and type(optimizer) is keras.optimizers.SGD:
        rule = KerasSGDPieces(optimizer, variables)
    return rule


def rule_for(optimizer, variables):
    """The sharded rule `optimizer` declares (`sharded_update`), or Keras' SGD's.

    Raises:
      UserError: the optimizer has no sharded rule, or sets a Keras option `check_optimizer`
        refuses.
    """
    check_optimizer(optimizer, "--weight_update_sharding")
    rule = declared_rule(optimizer, variables)
    if rule is None:
        raise UserError(
            "--weight_update_sharding supports Keras' SGD and the suite's LARS, LAMB, FusedAdam "
            f"and AdamW, not {type(optimizer).__module__}.{type(optimizer).__name__} (an "
            "optimizer shards its update by declaring `sharded_update`)"
        )
    return rule
