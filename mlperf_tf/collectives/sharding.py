"""Provides the sharded optimizer updates: SGD (momentum), LARS and LAMB on a 1/N shard of each tensor.

With weight-update sharding each replica holds the summed gradient and the optimizer slots of
its shard only (Kumar et al. 2019, "Scale MLPerf-0.6 models on Google TPU-v3 Pods"). The
formulas are the optimizers' own (see `keras.optimizers.SGD`, `mlperf_tf.optimizers.LARS` and
`mlperf_tf.optimizers.LAMB`, whose docstrings give them); what changes is where the whole-tensor
L2 norms come from: each replica computes the sums of squares of its shards, and one small
all-reduce of a [num_tensors, 2] table gives every replica every tensor's norms. Tests check
that 10 sharded steps end at the weights of the unsharded optimizer.

Rules run in replica context; `update` returns each tensor's new weight shard and assigns the
slot shards (sync-on-read variables: one [k] copy per replica, different on each).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.optimizers import LAMB, LARS
from mlperf_tf.optimizers.base import matches_any, variable_path

# Keras features the sharded rules do not reproduce: refused up front rather than ignored.
_UNSUPPORTED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema",
                "gradient_accumulation_steps")  # fmt: skip


class ShardRule:
    """One optimizer's update on shards. Subclasses name their slots and do the math."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, optimizer, variables):
        self.optimizer = optimizer
        self.paths = [variable_path(v) for v in variables]

    def norms_needed(self) -> bool:
        return False

    def direction(self, index, w, g, slots, step):
        """Phase 1: updates slots that need no norm; returns (state, [a, b]) whose squares'
        sums over all shards are the norms phase 2 needs (or (state, None))."""
        raise NotImplementedError

    def finish(self, index, state, w, slots, lr, norms):
        """Phase 2: the new weight shard, given the whole-tensor norms (a [2] tensor or None)."""
        raise NotImplementedError


def _assign(slot, value):
    slot.assign(value)
    return value


class SGDRule(ShardRule):
    """`keras.optimizers.SGD`: velocity = mu * velocity - lr * g; w += velocity (Nesterov:
    w += mu * velocity - lr * g); without momentum w -= lr * g."""

    def __init__(self, optimizer, variables):
        super().__init__(optimizer, variables)
        self.momentum = float(optimizer.momentum)
        self.nesterov = bool(optimizer.nesterov)
        self.slot_names = ("momentum",) if self.momentum else ()

    def direction(self, index, w, g, slots, step):
        return g, None

    def finish(self, index, g, w, slots, lr, norms):
        if not self.momentum:
            return w - lr * g
        mu = tf.cast(self.momentum, w.dtype)
        velocity = _assign(slots[0], slots[0] * mu - g * lr)
        return w + (velocity * mu - g * lr if self.nesterov else velocity)


class LARSRule(ShardRule):
    """`mlperf_tf.optimizers.LARS`: trust = eeta |w| / (|g| + wd |w| + eps) unless excluded."""

    slot_names = ("momentum",)

    def __init__(self, optimizer, variables):
        super().__init__(optimizer, variables)
        self.adapt = [not matches_any(optimizer.exclude_patterns, p) for p in self.paths]
        self.decay = [
            bool(optimizer.weight_decay_rate) and not matches_any(optimizer.exclude_patterns, p)
            for p in self.paths
        ]

    def norms_needed(self):
        return True

    def direction(self, index, w, g, slots, step):
        return g, [w, g] if self.adapt[index] else None

    def finish(self, index, g, w, slots, lr, norms):
        opt = self.optimizer
        dtype = w.dtype
        if self.adapt[index]:
            w_norm, g_norm = norms[0], norms[1]
            wd = tf.cast(opt.weight_decay_rate, dtype)
            denom = g_norm + wd * w_norm + tf.cast(opt.epsilon, dtype)
            safe = tf.where(denom > 0, denom, tf.ones_like(denom))
            trust = tf.where(
                tf.logical_and(w_norm > 0, g_norm > 0),
                tf.cast(opt.eeta, dtype) * w_norm / safe,
                tf.ones_like(w_norm),
            )
            lr = lr * trust
            if self.decay[index]:
                g = g + wd * w
        mu = tf.cast(opt.momentum, dtype)
        velocity = _assign(slots[0], slots[0] * mu - lr * g)
        return w + (velocity * mu - lr * g if opt.nesterov else velocity)


class LAMBRule(ShardRule):
    """`mlperf_tf.optimizers.LAMB`: Adam direction r (+ wd w), trust = |w| / |r| unless excluded."""

    slot_names = ("m", "v")

    def __init__(self, optimizer, variables):
        super().__init__(optimizer, variables)
        self.decay = [
            bool(optimizer.weight_decay_rate) and not matches_any(optimizer.exclude_patterns, p)
            for p in self.paths
        ]
        self.adapt = [not matches_any(optimizer.layer_adaptation_patterns, p) for p in self.paths]

    def norms_needed(self):
        return True

    def direction(self, index, w, g, slots, step):
        opt = self.optimizer
        dtype = w.dtype
        m = _assign(slots[0], slots[0] - tf.cast(1.0 - opt.beta_1, dtype) * (slots[0] - g))
        v = _assign(slots[1], slots[1] - tf.cast(1.0 - opt.beta_2, dtype) * (slots[1] - g * g))
        if opt.bias_correction:
            step = tf.cast(step, tf.float64)
            c1 = tf.cast(1.0 - tf.pow(tf.constant(opt.beta_1, tf.float64), step), dtype)
            c2 = tf.cast(1.0 - tf.pow(tf.constant(opt.beta_2, tf.float64), step), dtype)
            r = (m / c1) / (tf.sqrt(v / c2) + tf.cast(opt.epsilon, dtype))
        else:
            r = m / (tf.sqrt(v) + tf.cast(opt.epsilon, dtype))
        if self.decay[index]:
            r = r + tf.cast(opt.weight_decay_rate, dtype) * w
        return r, [w, r] if self.adapt[index] else None

    def finish(self, index, r, w, slots, lr, norms):
        if self.adapt[index]:
            w_norm, r_norm = norms[0], norms[1]
            safe = tf.where(r_norm > 0, r_norm, tf.ones_like(r_norm))
            lr = tf.where(tf.logical_and(w_norm > 0, r_norm > 0), lr * w_norm / safe, lr)
        return w - lr * r


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


def rule_for(optimizer, variables) -> ShardRule:
    """The sharded rule of `optimizer`'s class.

    Raises:
      UserError: the optimizer has no sharded rule.
    """
    check_optimizer(optimizer, "--weight_update_sharding")
    for cls, rule in ((LARS, LARSRule), (LAMB, LAMBRule), (keras.optimizers.SGD, SGDRule)):
        if type(optimizer) is cls:
            return rule(optimizer, variables)
    raise UserError(
        f"--weight_update_sharding supports SGD, LARS and LAMB, not {type(optimizer).__name__}"
    )
