"""Provides `FusedAdam`: Keras' Adam whose per-variable update is TF's one fused Adam kernel."""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.optimizers.base import ShardedUpdate, assign, tf_variable


@keras.saving.register_keras_serializable(package="mlperf_tf")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` (same arguments, slots, checkpoints and config), fused per variable.

    For each variable w with (cross-replica summed) dense gradient g at step t = iterations + 1,
    learning rate lr, beta_1 b1, beta_2 b2 and epsilon eps, the update Keras writes as separate
    ops (`keras/src/optimizers/adam.py`):

        alpha = lr * sqrt(1 - b2**t) / (1 - b1**t)
        m = m + (g - m) * (1 - b1)
        v = v + (g**2 - v) * (1 - b2)
        w = w - m * alpha / (sqrt(v) + eps)

    is here one `ResourceApplyAdam` kernel (TF's `training_ops`, which computes the same four
    lines in this order). Why: Keras' Adam runs about 25 small ops per variable (two powers, a
    square root and several reads of the scalars each time); on the Transformer `mini` model
    (65 variables) the TF profiler counted 1,698 executed optimizer ops per step, 398 here (65
    fused kernels plus each variable's scalar powers and casts) and 81 for the Model Garden's
    tf_keras Adam. On 2 CPU cores that saved about 2 % of the step's CPU time, within noise (`benchmarks/transformer/README.md`, "Step speed"); the op count matters more
    where per-op dispatch is dear. The kernel forms 1 - b1 in the variable's dtype where Keras
    rounds the float64 difference, so the two agree to float32 rounding, not bit for bit.
    Sparse gradients (`IndexedSlices`) and `amsgrad=True` take Keras' own update, which is right
    only for rows listed once (the runner's `Trainer` merges duplicates first; see the README).
    """

    def update_step(self, gradient, variable, learning_rate):
        """Applies one Adam step to one variable (update context, summed gradient)."""
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            super().update_step(gradient, variable, learning_rate)
            return
        index = self._get_variable_index(variable)
        var = tf_variable(variable)
        scalars = self._step_scalars(var.dtype, learning_rate)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=tf_variable(self._momentums[index]).handle,
            v=tf_variable(self._velocities[index]).handle,
            grad=tf.cast(gradient, var.dtype),
            use_locking=False,
            **scalars,
        )

    def sharded_update(self, variables) -> ShardedUpdate | None:
        """Adam on 1/N pieces (weight-update sharding): the four lines above on each piece
        (element-wise, so no norms); None with `amsgrad` (not reproduced)."""
        if self.amsgrad:
            return None
        return _AdamPieces(self, variables)

    def _step_scalars(self, dtype, learning_rate) -> dict:
        """The kernel's scalar inputs, built once per step, dtype and graph, not per variable.

        Per variable they were 2 `Pow`, a read, an add and a cast of `iterations`: about 900 of
        the 3,800 ops a Transformer-base step executed (184 variables).
        """
        # `apply` empties the cache for each step; the graph keys it because a tensor of one
        # graph (say, a loop body) cannot feed another.
        key = (tf.compat.v1.get_default_graph(), dtype)
        cache = self.__dict__.setdefault("_step_scalar_cache", {})
        if key not in cache:
            step = tf.cast(self.iterations + 1, dtype)
            beta_1 = tf.cast(self.beta_1, dtype)
            beta_2 = tf.cast(self.beta_2, dtype)
            cache[key] = {
                "beta1_power": tf.pow(beta_1, step),
                "beta2_power": tf.pow(beta_2, step),
                "lr": tf.cast(learning_rate, dtype),
                "beta1": beta_1,
                "beta2": beta_2,
                "epsilon": tf.cast(self.epsilon, dtype),
            }
        return cache[key]

    def apply(self, grads, trainable_variables=None):
        """Keras' `apply`; the scalar cache lives for this one call (one step's trace)."""
        self.__dict__["_step_scalar_cache"] = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self.__dict__["_step_scalar_cache"] = {}


class _AdamPieces(ShardedUpdate):
    """`FusedAdam`'s formula (Keras' Adam) on a flat piece of each variable, with the piece's
    moments, in the order of the class docstring's four lines."""

    slot_names = ("momentum", "velocity")

    def direction(self, index, w, g, slots, step):
        return (g, step), None

    def finish(self, index, state, w, slots, lr, norms):
        g, step = state
        opt = self.optimizer
        dtype = w.dtype
        step = tf.cast(step, dtype)
        alpha = lr * tf.sqrt(1.0 - tf.pow(tf.cast(opt.beta_2, dtype), step))
        alpha = alpha / (1.0 - tf.pow(tf.cast(opt.beta_1, dtype), step))
        m = assign(slots[0], slots[0] + (g - slots[0]) * (1.0 - opt.beta_1))
        v = assign(slots[1], slots[1] + (tf.square(g) - slots[1]) * (1.0 - opt.beta_2))
        return w - m * alpha / (tf.sqrt(v) + opt.epsilon)
