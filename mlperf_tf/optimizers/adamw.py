"""Provides `AdamW`: Adam with decoupled weight decay, in PyTorch's (and Megatron's) formula."""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.optimizers.base import (
    Optimizer,
    ShardedUpdate,
    assign,
    check_number,
    dense_gradient,
    document_base_keyword_args,
    matches_any,
)


@document_base_keyword_args
class AdamW(Optimizer):
    """AdamW (Loshchilov & Hutter 2019) as `torch.optim.AdamW` and Megatron/Apex's fused Adam
    (`adam_w_mode=True`) compute it, which the MLPerf `llama31_8b` reference (NeMo) runs.

    For each variable w with (cross-replica summed) gradient g at step t = iterations + 1,
    learning rate lr, betas b1, b2, epsilon eps and weight decay wd:

        w = w - lr * wd * w                         (decoupled; skipped for excluded variables)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        w = w - lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

    eps is added to the bias-corrected sqrt(v), as PyTorch does. Keras' `AdamW` adds it to the
    uncorrected sqrt(v) (an effective eps / sqrt(1 - b2**t), 4.5x larger at t = 1 for b2 =
    0.95): that is why this is not `keras.optimizers.AdamW`.

    Args:
      learning_rate: a float or a `LearningRateSchedule`.
      beta_1: b1 in [0, 1).
      beta_2: b2 in [0, 1).
      epsilon: eps >= 0.
      {{base_keyword_args}}
    """

    config_arguments = ("beta_1", "beta_2", "epsilon")

    def __init__(
        self,
        learning_rate=1e-3,
        *,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay: float = 0.01,
        name: str = "adamw",
        **kwargs,
    ):
        super().__init__(learning_rate, weight_decay=weight_decay, name=name, **kwargs)
        self.beta_1 = check_number("beta_1", beta_1, high=1.0)
        self.beta_2 = check_number("beta_2", beta_2, high=1.0)
        self.epsilon = check_number("epsilon", epsilon)

    def build(self, var_list):
        """Creates the first and second moments (zeros, the variables' shapes and dtypes)."""
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )

    def update_step(self, gradient, variable, learning_rate):
        """One AdamW step of one variable (update context, summed gradient)."""
        index = self._get_variable_index(variable)
        self.update_with(index, gradient, variable, learning_rate,
                         self._momentums[index], self._velocities[index])  # fmt: skip

    def update_with(self, index, gradient, variable, learning_rate, m, v):
        """`formula` on `variable` with the moment slots `m` and `v` (a subclass that keeps
        its slots elsewhere, e.g. `AdamWRowWiseAdagrad`, passes its own)."""
        dtype = variable.dtype
        w, m_new, v_new = self.formula(
            self._decay[index],
            tf.convert_to_tensor(variable),
            dense_gradient(gradient, dtype),
            tf.convert_to_tensor(m),
            tf.convert_to_tensor(v),
            tf.cast(learning_rate, dtype),
            self.iterations + 1,
        )
        m.assign(m_new)
        v.assign(v_new)
        variable.assign(w)

    def formula(self, decay: bool, w, g, m, v, lr, step):
        """The formula above on tensors: (new w, new m, new v), for the whole variable or a
        piece of it (weight-update sharding); `step` is t, `decay` whether wd applies."""
        dtype = w.dtype
        step = tf.cast(step, dtype)
        if decay:
            w = w - w * (lr * tf.cast(self.weight_decay_rate, dtype))
        m = m + (g - m) * (1.0 - self.beta_1)
        v = v + (tf.square(g) - v) * (1.0 - self.beta_2)
        correction_1 = 1.0 - tf.pow(tf.cast(self.beta_1, dtype), step)
        correction_2 = 1.0 - tf.pow(tf.cast(self.beta_2, dtype), step)
        denominator = tf.sqrt(v) / tf.sqrt(correction_2) + self.epsilon
        return w - m * (lr / correction_1) / denominator, m, v

    def sharded_update(self, variables) -> ShardedUpdate:
        """AdamW on 1/N pieces (weight-update sharding): element-wise, so no norms."""
        return _AdamWPieces(self, variables)


class _AdamWPieces(ShardedUpdate):
    """`AdamW.formula` on a flat piece of each variable, with the piece's moments."""

    slot_names = ("momentum", "velocity")

    def __init__(self, optimizer: AdamW, variables):
        super().__init__(optimizer, variables)
        self.decay = [
            bool(optimizer.weight_decay_rate) and not matches_any(optimizer.exclude_patterns, p)
            for p in self.paths
        ]

    def direction(self, index, w, g, slots, step):
        return (g, step), None

    def finish(self, index, state, w, slots, lr, norms):
        g, step = state
        w, m, v = self.optimizer.formula(self.decay[index], w, g, slots[0], slots[1], lr, step)
        assign(slots[0], m)
        assign(slots[1], v)
        return w
