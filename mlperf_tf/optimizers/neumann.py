"""Provides `Neumann`, the Neumann optimizer of Krishnan, Xiao and Saurous (2017)."""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import ops

from mlperf_tf.optimizers import base
from mlperf_tf.optimizers.registry import (
    OptimizerPlugin,
    fields_as_arguments,
    hparams_from_arguments,
)

# What |w - v| is taken over (see `Neumann`): all trainable variables at once, or each variable.
NORM_SCOPES = ("model", "variable")


@keras.saving.register_keras_serializable(package="mlperf_tf")
@base.document_base_keyword_args
class Neumann(base.Optimizer):
    """The practical Neumann optimizer (Algorithm 2 of Krishnan et al. 2017, arXiv:1712.03298).

    The paper solves the mini-batch Newton system by a Neumann series whose Hessian-vector
    products are replaced by gradients at displaced weights, and convexifies the mini-batch loss
    with a cubic regularizer (alpha / 3) |w - v|^3 and a repulsive one beta / |w - v| around a
    moving average v of the weights. With step t counted from the end of the warm-up
    (t = 0, 1, ...), learning rate eta(t) (the one hyperparameter; the benchmark's schedule) and
    gradient g_t at the stored (displaced) weights w, for each variable:

        warm-up (the first `warmup_steps` optimizer steps, "run vanilla SGD"):
            w = w - eta * g;   m = 0;   v = w
        reset step (t mod K == 0; Algorithm 2, line 7):
            d_t = g_t;   m_t = -eta * g_t
        other steps (lines 9-10):
            d_t = g_t + (alpha |w - v|^2 - beta / |w - v|^2) (w - v) / |w - v|
            m_t = mu(t) m_{t-1} - eta d_t
        every step after warm-up (lines 11-12):
            w_t = w_{t-1} + mu(t) m_t - eta d_t
            v_t = w_t + gamma (v_{t-1} - w_t)

    The stored weights are displaced by mu m (the point where the next gradient is taken);
    Algorithm 2 returns w - mu m, which `finalize_variable_values` applies. Our reading of the
    algorithm: lines 11-12 run on reset steps too (the reset only restarts the Neumann iterate),
    and the regularizer term is 0 where |w - v| = 0 (e.g. right after the warm-up).

    `norm_scope` says what w is in |w - v| and in beta = `repulsive_regularizer` x n (the
    paper's beta = 1e-5 x number of variables):
      "model" (default): Algorithm 2 is written for one parameter vector w in R^n, so |w - v|
        is one norm over all trainable variables and n counts all their elements; the
        direction (w - v) / |w - v| is that of the whole vector. This is our reading of the
        paper (its text was not at hand when this was written: a secondary summary gives
        "beta = 1e-5 x n, n = number of parameters").
      "variable": each variable is its own w, with its own |w - v| and n = its elements. This
        diverges: right after the warm-up or a reset, |w - v| of a variable is about
        eta (1 + mu) |g| of that variable, and where |g| is small (a kernel in front of a
        zero-initialised batch-norm gamma: |g| ~ 1e-5, |w - v| ~ 1e-6) the repulsive force
        beta / |w - v|^2 reaches ~1e12 against |g| ~ 1 (ResNet-50 at width 16,
        `tools/studies/probe_neumann.py`), and the next loss is NaN. Kept for comparison.
    Over the model, the norm is computed once per step before any variable is updated: every
    replica computes it from its own copies (`distance`, a scalar slot), which are equal after
    Keras' summed-gradient update, so it costs no communication. The repulsive force is still
    large on the first step after the warm-up, where |w - v| is one step's length (on the
    model above: 648 against |g| 1.3 at |w - v| = 0.15, a move of 57 in w); it falls below
    1e-2 once |w - v| is past sqrt(beta / |g|).

    The paper's defaults: alpha = 1e-7, gamma = 0.99, the momentum mu(t) rising from 0.5 to
    0.9 as 1 - 1 / (2 + t / `momentum_ramp_steps`) (the paper counts t in epochs), and K
    doubled over training (here K is fixed per run).
    Weight decay, when set, is added to g_t (an L2 term) before all of the above.

    Under `tf.distribute`, Keras sums the gradients across replicas before `update_step`: every
    replica applies the same update to its copy of w, m and v.
    """

    config_arguments = (
        "cubic_regularizer",
        "repulsive_regularizer",
        "moving_average",
        "reset_interval",
        "warmup_steps",
        "momentum_max",
        "momentum_ramp_steps",
        "norm_scope",
    )

    def __init__(
        self,
        learning_rate,
        *,
        cubic_regularizer: float = 1e-7,
        repulsive_regularizer: float = 1e-5,
        moving_average: float = 0.99,
        reset_interval: int = 100,
        warmup_steps: int = 0,
        momentum_max: float = 0.9,
        momentum_ramp_steps: int = 100,
        norm_scope: str = "model",
        name: str = "Neumann",
        **kwargs,
    ):
        """Creates the optimizer.

        Args:
          learning_rate: eta(t): a float or a `keras.optimizers.schedules.LearningRateSchedule`.
          cubic_regularizer: alpha >= 0.
          repulsive_regularizer: beta per element >= 0 (beta = this x elements in the norm's
            scope: all trainable variables, or the variable).
          moving_average: gamma in [0, 1) of the weights' moving average v.
          reset_interval: K >= 1, steps between resets of the Neumann iterate m.
          warmup_steps: optimizer steps of plain SGD before the Neumann steps (>= 0).
          momentum_max: the cap of mu(t), in [0.5, 1).
          momentum_ramp_steps: steps per unit of t in mu(t) = 1 - 1 / (2 + t / ramp) (>= 1).
          norm_scope: "model" (one |w - v| over all trainable variables, the paper's) or
            "variable" (one per variable); see the class docstring.
          {{base_keyword_args}}

        Raises:
          ValueError: a hyperparameter is out of range, or `norm_scope` is unknown.
        """
        super().__init__(learning_rate, name=name, **kwargs)
        self.cubic_regularizer = base.check_number("cubic_regularizer", cubic_regularizer)
        self.repulsive_regularizer = base.check_number(
            "repulsive_regularizer", repulsive_regularizer
        )
        self.moving_average = base.check_number("moving_average", moving_average, high=1.0)
        self.reset_interval = base.check_positive_int("reset_interval", reset_interval)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"`warmup_steps` ({warmup_steps!r}) must be an integer >= 0.")
        self.warmup_steps = warmup_steps
        self.momentum_max = base.check_number("momentum_max", momentum_max, low=0.5, high=1.0)
        self.momentum_ramp_steps = base.check_positive_int(
            "momentum_ramp_steps", momentum_ramp_steps
        )
        if norm_scope not in NORM_SCOPES:
            raise ValueError(f"`norm_scope` ({norm_scope!r}) must be one of {NORM_SCOPES}.")
        self.norm_scope = norm_scope

    def build(self, var_list):
        """Creates the Neumann iterate m (zeros) and the moving average v (= w) per variable,
        and with `norm_scope="model"` the scalar slot `distance` (|w - v| over all of them)."""
        if self.built:
            return
        super().build(var_list)
        self._iterates = [self.add_variable_from_reference(v, name="iterate") for v in var_list]
        self._averages = [self.add_variable_from_reference(v, name="average") for v in var_list]
        for average, variable in zip(self._averages, var_list):
            average.assign(variable)
        # Elements in the norm's scope when it is the model (Python: fixed at build time).
        self._model_size = float(max(1, sum(math.prod(v.shape) for v in var_list)))
        self._distance = None
        if self.norm_scope == "model":
            self._distance = self.add_variable((), dtype="float32", name="distance")

    def _model_distance(self) -> tf.Tensor:
        """|w - v| over all trainable variables, from this device's copies (float32 scalar)."""
        deltas = [
            tf.cast(ops.convert_to_tensor(w) - ops.convert_to_tensor(v), "float32")
            for w, v in zip(self._trainable_variables, self._averages)
        ]
        return tf.linalg.global_norm(deltas)

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        """Stores the model-wide |w - v| before any variable moves, then updates each variable.

        Runs in cross-replica context (Keras' TensorFlow optimizer calls it after summing the
        gradients). `distribution.extended.update` runs the norm once per device, where reading
        a mirrored variable gives that device's copy: a local computation, no all-reduce.
        """
        if self._distance is not None:
            distribution.extended.update(
                base.tf_variable(self._distance),
                lambda distance: distance.assign(self._model_distance()),
                group=False,
            )
        super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)

    def momentum(self, step):
        """mu(t) for optimizer step `step` (a tensor; t = step - warmup_steps, from 0)."""
        t = ops.maximum(ops.cast(step, "float32") - self.warmup_steps, 0.0)
        mu = 1.0 - 1.0 / (2.0 + ops.floor(t / self.momentum_ramp_steps))
        return ops.minimum(mu, self.momentum_max)

    def update_step(self, gradient, variable, learning_rate):
        """Applies one step of Algorithm 2 to one variable (update context, summed gradient)."""
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        w = ops.convert_to_tensor(variable)
        g = ops.cast(base.dense_gradient(gradient, dtype), dtype)
        if self._decay[index]:
            g = g + ops.cast(self.weight_decay_rate, dtype) * w
        lr = ops.cast(learning_rate, dtype)
        m_var, v_var = self._iterates[index], self._averages[index]
        m, v = ops.convert_to_tensor(m_var), ops.convert_to_tensor(v_var)
        step = self.iterations
        mu = ops.cast(self.momentum(step), dtype)
        t = step - self.warmup_steps
        warmup = t < 0
        reset = ops.equal(ops.mod(ops.maximum(t, 0), self.reset_interval), 0)

        delta = w - v
        if self._distance is not None:  # norm_scope "model": this step's norm, stored above
            norm = ops.cast(ops.convert_to_tensor(self._distance), dtype)
            size = self._model_size
        else:
            norm = ops.sqrt(ops.sum(ops.square(delta)))
            size = float(max(1, math.prod(variable.shape)))
        safe = ops.where(norm > 0, norm, ops.ones_like(norm))
        alpha = self.cubic_regularizer
        beta = self.repulsive_regularizer * size
        coefficient = ops.where(norm > 0, (alpha * safe**2 - beta / safe**2) / safe, 0.0)
        d = ops.where(reset, g, g + ops.cast(coefficient, dtype) * delta)
        m_new = ops.where(reset, -lr * g, mu * m - lr * d)
        w_new = w + mu * m_new - lr * d
        v_new = w_new + self.moving_average * (v - w_new)

        sgd = w - lr * g
        self.assign(variable, ops.where(warmup, sgd, w_new))
        self.assign(m_var, ops.where(warmup, ops.zeros_like(m), m_new))
        self.assign(v_var, ops.where(warmup, sgd, v_new))

    def finalize_variable_values(self, var_list):
        """Returns the weights to w - mu m (Algorithm 2's output), after Keras' own EMA step."""
        super().finalize_variable_values(var_list)
        mu = self.momentum(self.iterations - 1)
        for variable in var_list:
            index = self._get_variable_index(variable)
            iterate = self._iterates[index]
            variable.assign(variable - ops.cast(mu, variable.dtype) * iterate)


# `neumann_cubic_regularizer` ... `neumann_norm_scope`, with the constructor's defaults.
NeumannHparams = hparams_from_arguments(Neumann, "neumann_")


PLUGIN = OptimizerPlugin(
    hparams_class=NeumannHparams, make=fields_as_arguments(Neumann, "neumann_"), log_name="neumann"
)
