"""Provides `LAMB`, the layer-wise adaptive moments optimizer of the MLPerf BERT reference."""

from __future__ import annotations

import math
from collections.abc import Iterable

import keras
import tensorflow as tf

from mlperf_tf.optimizers import base
from mlperf_tf.optimizers.base import check_number, dense_gradient, l2_norm, tf_variable

DEFAULT_LAMB_EXCLUDE = ("LayerNorm", "layer_norm", "bias")


def _one_minus_power(beta: float, step):
    """1 - beta**step for a Python float beta in [0, 1) and a float tensor step >= 1."""
    if beta == 0.0:
        return tf.ones_like(step)
    # -expm1(t log b) keeps full relative precision where 1 - b**t would cancel.
    return -tf.math.expm1(step * tf.cast(math.log(beta), step.dtype))


@keras.saving.register_keras_serializable(package="mlperf_tf")
@base.document_base_keyword_args
class LAMB(base.Optimizer):
    """LAMB with the formula of the MLPerf BERT reference (MLPerf log key `opt_name: lamb`).

    For each variable w with (cross-replica summed) gradient g at step t = iterations + 1,
    learning rate lr, beta_1 b1 (`opt_lamb_beta_1`), beta_2 b2 (`opt_lamb_beta_2`), epsilon eps
    (`opt_epsilon` / `opt_lamb_epsilon`) and weight decay wd (`opt_lamb_weight_decay_rate`):

        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        r = (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)   # Adam, bias-corrected
        r = r + wd * w               unless w matches `exclude_from_weight_decay`
        trust = |w| / |r|            if |w| > 0 and |r| > 0, else 1;
                                     1 if w matches `exclude_from_layer_adaptation`
        w = w - lr * trust * r

    where |.| is the L2 norm over the whole variable. Sources: You et al. 2019, "Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes" (arXiv:1904.00962), Algorithm 2
    with phi = identity; the bias-corrected `LAMBOptimizer` of the MLPerf BERT submissions
    (NVIDIA's TensorFlow one, derived from Google's `lamb_optimizer.py` for BERT, whose default
    exclusions are "LayerNorm", "layer_norm", "bias"); and the Model Garden's
    `official.modeling.optimization.lamb.LAMB` (the tensorflow-addons one). The formula is the
    Model Garden's; the differences are that `get_config` here keeps both exclusion lists,
    patterns are matched against Keras 3 variable paths, and `bias_correction=False` gives
    Google's original BERT `lamb_optimizer.py` (no 1 - b**t terms). With wd = 0 and no
    exclusions it is `keras.optimizers.Lamb`.

    `weight_decay` means what it means for every optimizer here (`mlperf_tf.optimizers.base`):
    the rate wd of a term added inside this update (to r above); Keras' decoupled decay stays
    off. Exclusion patterns are regular expressions matched with `re.search` against each
    variable's Keras `path` (e.g. "encoder/layer_norm/gamma", "dense/bias"; see
    `mlperf_tf.optimizers.base.variable_path`), decided once in `build`.

    Under `tf.distribute`, Keras sums the gradients across replicas before `update_step`, which
    runs in the update (cross-replica) context once per variable.

    Implementation: the bias corrections are folded into two scalars (see `update_step`), the
    norms use one fused reduction each (`tf.nn.l2_loss`) and the final step is the fused
    `ResourceApplyGradientDescent` kernel; 1 - b and 1 - b**t are formed without float32
    cancellation. This needs the TensorFlow backend, like the rest of this suite.
    """

    uses_layer_norms = True
    config_arguments = ("beta_1", "beta_2", "epsilon", "bias_correction")

    def __init__(
        self,
        learning_rate,
        *,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        exclude_from_layer_adaptation: Iterable[str] | None = None,
        bias_correction: bool = True,
        exclude_from_weight_decay: Iterable[str] | None = DEFAULT_LAMB_EXCLUDE,
        name: str = "LAMB",
        **kwargs,
    ):
        """Creates the optimizer.

        Args:
          learning_rate: float, or a `keras.optimizers.schedules.LearningRateSchedule` (per
            step), e.g. `WarmupPolynomialDecay` (`opt_base_learning_rate` etc.).
          beta_1: b1 in [0, 1) (`opt_lamb_beta_1`).
          beta_2: b2 in [0, 1) (`opt_lamb_beta_2`).
          epsilon: eps >= 0 (`opt_epsilon`; the BERT reference uses 1e-6).
          exclude_from_layer_adaptation: regular expressions; matching variables get trust
            ratio 1. None (the default) means the same list as `exclude_from_weight_decay`, as in
            the reference; `()` means adapt every variable.
          bias_correction: divide the moments by (1 - b1**t) and (1 - b2**t) (Adam's bias
            correction); False reproduces Google's original BERT `lamb_optimizer.py`.
          {{base_keyword_args}}

        Raises:
          ValueError: a hyperparameter is out of range or a pattern does not compile.
        """
        super().__init__(
            learning_rate,
            exclude_from_weight_decay=exclude_from_weight_decay,
            name=name,
            **kwargs,
        )
        self.beta_1 = check_number("beta_1", beta_1, high=1.0)
        self.beta_2 = check_number("beta_2", beta_2, high=1.0)
        self.epsilon = check_number("epsilon", epsilon)
        self.bias_correction = bool(bias_correction)
        # None is remembered (not resolved) so that get_config round-trips it.
        self.exclude_from_layer_adaptation_patterns = (
            None
            if exclude_from_layer_adaptation is None
            else base.compile_exclusion_patterns(
                "exclude_from_layer_adaptation", exclude_from_layer_adaptation
            )
        )

    @property
    def layer_adaptation_patterns(self) -> tuple[str, ...]:
        """The patterns that turn layer adaptation off (after resolving None)."""
        if self.exclude_from_layer_adaptation_patterns is None:
            return self.exclude_patterns
        return self.exclude_from_layer_adaptation_patterns

    def build(self, var_list):
        """Creates the two moment slots per variable and decides its exclusions once.

        Args:
          var_list: the model's trainable variables (Keras variables). Under a strategy, call
            this inside `strategy.scope()` before the first step.
        """
        if self.built:
            return
        super().build(var_list)
        self._momentums = [self.add_variable_from_reference(v, name="m") for v in var_list]
        self._velocities = [self.add_variable_from_reference(v, name="v") for v in var_list]
        # Python bools per variable index (the base class made `_decay`): update_step branches
        # at trace time.
        self._adapt = [
            not base.matches_any(self.layer_adaptation_patterns, base.variable_path(v))
            for v in var_list
        ]

    def whole_norm_terms(self, gradient, variable):
        """The tensors whose whole-tensor L2 norms this variable's update needs: [w, r'] (the
        trust ratio's |w| / |r'|, r' as in `update_step`), or None (not adapted).

        For a variable split across replicas (`mlperf_tf.parallel.layout`): each replica
        computes these on its shard in replica context, reading its slots without changing them;
        the runner sums their squares over the shards and passes the norms to
        `update_step_with_norms`. The optimizer declares what it needs; the collectives stay
        generic.
        """
        index = self._get_variable_index(variable)
        if not self._adapt[index]:
            return None
        var = tf.convert_to_tensor(tf_variable(variable))
        g = dense_gradient(gradient, var.dtype)
        m = tf.convert_to_tensor(tf_variable(self._momentums[index]))
        v = tf.convert_to_tensor(tf_variable(self._velocities[index]))
        m, v = self._moments(m, v, g)
        r, _ = self._direction(self._decay[index], m, v, var)
        return [var, r]

    def _moments(self, m, v, g):
        """The new moments m - (1 - b1) (m - g), v - (1 - b2) (v - g**2), as tensors."""
        dtype = g.dtype
        m = m - tf.cast(1.0 - self.beta_1, dtype) * (m - g)
        v = v - tf.cast(1.0 - self.beta_2, dtype) * (v - tf.square(g))
        return m, v

    def _direction(self, decay: bool, m, v, var):
        """(r', a): the step is a * r' with r' = m / (sqrt(v) + eps') (+ (wd / a) * w); see
        `_update` for the folding of the bias corrections into a and eps'."""
        scale, epsilon = self._scale_and_epsilon(var.dtype)
        r = m / (tf.sqrt(v) + epsilon)
        if decay:
            r = r + (tf.cast(self.weight_decay_rate, var.dtype) / scale) * var
        return r, scale

    def _step_size(self, adapt: bool, lr, scale, w_norm, r_norm):
        """The alpha of w -= alpha * r': lr * |w| / |r'| (the trust ratio) when adapted and both
        norms are positive, else lr * a."""
        if not adapt:
            return lr * scale
        safe_r_norm = tf.where(r_norm > 0, r_norm, tf.ones_like(r_norm))
        return tf.where(
            tf.logical_and(w_norm > 0, r_norm > 0), lr * w_norm / safe_r_norm, lr * scale
        )

    def _scale_and_epsilon(self, dtype):
        epsilon = tf.cast(self.epsilon, dtype)
        if self.bias_correction:
            step = tf.cast(self.iterations + 1, dtype)
            sqrt_c2 = tf.sqrt(_one_minus_power(self.beta_2, step))
            return sqrt_c2 / _one_minus_power(self.beta_1, step), epsilon * sqrt_c2
        return tf.ones([], dtype), epsilon

    def update_step_with_norms(self, gradient, variable, learning_rate, norms):
        """`update_step` with the whole-tensor norms [|w|, |r'|] given (`whole_norm_terms`)."""
        self._update(gradient, variable, learning_rate, norms)

    def update_step(self, gradient, variable, learning_rate):
        """Applies one LAMB step to one variable (update context, summed gradient)."""
        self._update(gradient, variable, learning_rate, None)

    def _update(self, gradient, variable, learning_rate, norms):
        index = self._get_variable_index(variable)
        var = tf_variable(variable)
        m = tf_variable(self._momentums[index])
        v = tf_variable(self._velocities[index])
        dtype = var.dtype
        lr = tf.cast(learning_rate, dtype)
        g = dense_gradient(gradient, dtype)
        # m -= (1 - b1) * (m - g), v -= (1 - b2) * (v - g**2), each one fused in-place kernel;
        # 1 - b is formed in float64 (in float32, 1 - 0.999 is off by 1.3e-5 relative, which
        # shows on unadapted variables).
        tf.raw_ops.ResourceApplyGradientDescent(
            var=m.handle, alpha=tf.cast(1.0 - self.beta_1, dtype), delta=m - g, use_locking=False
        )
        tf.raw_ops.ResourceApplyGradientDescent(
            var=v.handle,
            alpha=tf.cast(1.0 - self.beta_2, dtype),
            delta=v - tf.square(g),
            use_locking=False,
        )
        # With c1 = 1 - b1**t and c2 = 1 - b2**t, the bias-corrected Adam step is
        #   m/c1 / (sqrt(v/c2) + eps) = a * u,  a = sqrt(c2) / c1,  u = m / (sqrt(v) + eps'),
        # eps' = eps * sqrt(c2): the scalars fold into a and eps' and save whole-tensor passes;
        # r = a * r' with r' = u + (wd / a) * w.
        # Reads of m and v come after their updates (tf.function orders ops on a resource).
        r, scale = self._direction(self._decay[index], m, v, var)
        w_norm = r_norm = None
        if self._adapt[index]:
            # trust * lr * r = (|w| / (a |r'|)) * lr * a * r' = lr * |w| / |r'| * r'.
            if norms is None:
                w_norm, r_norm = l2_norm(var), l2_norm(r)
            else:
                w_norm, r_norm = tf.cast(norms[0], dtype), tf.cast(norms[1], dtype)
        alpha = self._step_size(self._adapt[index], lr, scale, w_norm, r_norm)
        # w -= alpha * r', one fused kernel.
        tf.raw_ops.ResourceApplyGradientDescent(
            var=var.handle, alpha=alpha, delta=r, use_locking=False
        )

    def sharded_update(self, variables) -> base.ShardedUpdate:
        """LAMB on 1/N pieces (weight-update sharding): the formula above, its trust ratio
        from the whole variable's norms [|w|, |r'|]."""
        return _LAMBPieces(self, variables)

    def get_config(self):
        """Returns every constructor argument (both exclusion lists included)."""
        config = super().get_config()
        adaptation = self.exclude_from_layer_adaptation_patterns
        config["exclude_from_layer_adaptation"] = None if adaptation is None else list(adaptation)
        return config


class _LAMBPieces(base.ShardedUpdate):
    """`LAMB` on a flat piece of each variable (`base.ShardedUpdate`): the moments of the piece
    and its direction r' in phase 1, the step `LAMB._step_size` of the whole norms in phase 2."""

    slot_names = ("m", "v")

    def __init__(self, optimizer: LAMB, variables):
        super().__init__(optimizer, variables)
        opt = optimizer
        self.adapt = [not base.matches_any(opt.layer_adaptation_patterns, p) for p in self.paths]
        self.decay = [
            bool(opt.weight_decay_rate) and not base.matches_any(opt.exclude_patterns, p)
            for p in self.paths
        ]

    def direction(self, index, w, g, slots, step):
        m, v = self.optimizer._moments(slots[0], slots[1], g)  # noqa: SLF001
        m, v = base.assign(slots[0], m), base.assign(slots[1], v)
        r, scale = self.optimizer._direction(self.decay[index], m, v, w)  # noqa: SLF001
        return (r, scale), [w, r] if self.adapt[index] else None

    def finish(self, index, state, w, slots, lr, norms):
        r, scale = state
        w_norm, r_norm = (None, None) if norms is None else (norms[0], norms[1])
        alpha = self.optimizer._step_size(self.adapt[index], lr, scale, w_norm, r_norm)  # noqa: SLF001
        return w - alpha * r
