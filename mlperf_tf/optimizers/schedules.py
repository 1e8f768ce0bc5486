"""Provides the learning-rate schedules of the MLPerf references as Keras `LearningRateSchedule`s.

Every schedule maps the optimizer's step (`optimizer.iterations`: 0 for the first update, an
integer count of applied updates, the same on every replica) to a float32 learning rate.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import keras
from keras import ops


def _check_int(name: str, value, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"`{name}` ({value!r}) must be an integer >= {low}.")
    return value


def _check_float(name: str, value, *, low: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` ({value!r}) must be a number.")
    if value < low or (strict and value == low):
        raise ValueError(f"`{name}` ({value!r}) must be {'>' if strict else '>='} {low}.")
    return float(value)


def scale_learning_rate(
    base_learning_rate: float, global_batch_size: int, reference_batch_size: int
) -> float:
    """The linear scaling rule (Goyal et al. 2017): base LR x global batch / reference batch.

    Args:
      base_learning_rate: the LR tuned for `reference_batch_size` (> 0).
      global_batch_size: examples per step summed over all replicas (> 0).
      reference_batch_size: the batch size `base_learning_rate` was tuned for (> 0), e.g. 256
        for ResNet-50 SGD, 32 for the SSD reference.

    Returns:
      The scaled learning rate (what MLPerf logs as `opt_base_learning_rate` when a reference
      scales it).

    Raises:
      ValueError: an argument is not positive.
    """
    base = _check_float("base_learning_rate", base_learning_rate, strict=True)
    batch = _check_int("global_batch_size", global_batch_size, low=1)
    reference = _check_int("reference_batch_size", reference_batch_size, low=1)
    return base * batch / reference


class _Schedule(keras.optimizers.schedules.LearningRateSchedule):
    """What this module's schedules share: the peak (base) LR b > 0, checked first; a name scope
    around the float32 step; and a `get_config` of every constructor argument, read from the
    attributes of the same names (so a new argument cannot be left out of it).

    A subclass calls `super().__init__(base_learning_rate, name)`, stores each other argument
    under its own name, and implements `rate(step)`; a constructor argument named like no
    attribute would fail `get_config` (every schedule's round trip is tested).
    """

    def __init__(self, base_learning_rate: float, name: str):
        super().__init__()
        self.base_learning_rate = _check_float(
            "base_learning_rate", base_learning_rate, strict=True
        )
        self.name = name

    def __call__(self, step):
        """Returns the float32 LR for `step` (scalar int or float tensor)."""
        with keras.name_scope(self.name):
            return self.rate(ops.cast(step, "float32"))

    def rate(self, step):
        """The LR at `step` (a float32 tensor), inside the schedule's name scope."""
        raise NotImplementedError

    def get_config(self):
        """Returns every constructor argument (lists copied)."""
        names = list(inspect.signature(type(self).__init__).parameters)[1:]  # all but self
        config = {name: getattr(self, name) for name in names}
        return {k: list(v) if isinstance(v, list) else v for k, v in config.items()}


class _WarmupThenDecay(_Schedule):
    """A schedule that warms up to its peak b in W >= 0 steps, then decays over D >= 1 steps
    to an end LR e in [0, b]; these four are checked in that order."""

    def __init__(self, base_learning_rate, warmup_steps, decay_steps, end_learning_rate, name):
        super().__init__(base_learning_rate, name)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, low=0)
        self.decay_steps = _check_int("decay_steps", decay_steps, low=1)
        self.end_learning_rate = _check_float("end_learning_rate", end_learning_rate)
        if self.end_learning_rate > self.base_learning_rate:
            raise ValueError(
                f"`end_learning_rate` ({end_learning_rate!r}) must be <= "
                f"`base_learning_rate` ({base_learning_rate!r})."
            )


@keras.saving.register_keras_serializable(package="mlperf_tf")
class WarmupPolynomialDecay(_WarmupThenDecay):
    """Linear warmup, then polynomial decay (MLPerf ResNet LARS and BERT LAMB references).

    With base LR b (`lars_opt_base_learning_rate` / `opt_base_learning_rate`), end LR e
    (`lars_opt_end_learning_rate` / `opt_lamb_learning_rate_min`), power p
    (`lars_opt_learning_rate_decay_poly_power` / `opt_lamb_learning_rate_decay_poly_power`),
    W = `warmup_steps` (`opt_learning_rate_warmup_steps` / `num_warmup_steps`),
    s0 = `start_warmup_step` (BERT's `start_warmup_step`), D = `decay_steps`
    (`lars_opt_learning_rate_decay_steps` / `opt_learning_rate_training_steps`) and
    d0 = `decay_start_step`:

        step < s0 + W:  lr = b * max(step - s0, 0) / W                         (warmup)
        otherwise:      lr = (b - e) * (1 - min(max(step - d0, 0), D) / D)**p + e   (decay)

    `decay_start_step` defaults to s0 + W: the decay runs D steps after the warmup, as in the
    MLPerf ResNet-50 LARS reference (`PolynomialDecayWithWarmup`, where D = train steps - warmup
    steps). The MLPerf BERT reference (`optimization.py`, `tf.train.polynomial_decay` on the
    global step, D = `opt_learning_rate_training_steps`) decays from step 0: pass
    `decay_start_step=0`. The reference BERT warmup goes negative for step < s0; here it is
    clamped at 0. With W = 0 there is no warmup.
    """

    def __init__(
        self,
        base_learning_rate: float,
        *,
        warmup_steps: int,
        decay_steps: int,
        end_learning_rate: float = 0.0,
        power: float = 1.0,
        start_warmup_step: int = 0,
        decay_start_step: int | None = None,
        name: str = "WarmupPolynomialDecay",
    ):
        """Creates the schedule.

        Args:
          base_learning_rate: peak LR b (> 0), reached at the end of warmup.
          warmup_steps: W >= 0 steps of linear warmup.
          decay_steps: D >= 1 steps of polynomial decay, after which the LR stays at e.
          end_learning_rate: e in [0, b].
          power: p > 0 (1.0 is linear, 2.0 the MLPerf LARS rule).
          start_warmup_step: s0 (may be negative): the warmup ramps from 0 at step s0.
          decay_start_step: d0 >= 0, the step the decay's clock starts at; None means s0 + W.
          name: name scope of the ops.

        Raises:
          ValueError: an argument is out of range.
        """
        super().__init__(base_learning_rate, warmup_steps, decay_steps, end_learning_rate, name)
        self.power = _check_float("power", power, strict=True)
        if isinstance(start_warmup_step, bool) or not isinstance(start_warmup_step, int):
            raise ValueError(f"`start_warmup_step` ({start_warmup_step!r}) must be an integer.")
        self.start_warmup_step = start_warmup_step
        if decay_start_step is not None:
            _check_int("decay_start_step", decay_start_step, low=0)
        self.decay_start_step = decay_start_step

    def rate(self, step):
        warmup_end = self.start_warmup_step + self.warmup_steps
        d0 = warmup_end if self.decay_start_step is None else self.decay_start_step
        progress = ops.minimum(ops.maximum(step - float(d0), 0.0), float(self.decay_steps))
        decayed = (self.base_learning_rate - self.end_learning_rate) * ops.power(
            1.0 - progress / float(self.decay_steps), self.power
        ) + self.end_learning_rate
        if self.warmup_steps == 0:
            return decayed
        warm = (
            self.base_learning_rate
            * ops.maximum(step - float(self.start_warmup_step), 0.0)
            / float(self.warmup_steps)
        )
        return ops.where(step < float(warmup_end), warm, decayed)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class PiecewiseConstantWithWarmup(_Schedule):
    """Linear warmup with a warmup factor, then piecewise constant (MLPerf SSD reference).

    With base LR b (`opt_base_learning_rate`), W = `warmup_steps`
    (`opt_learning_rate_warmup_steps`), warmup factor f (`opt_learning_rate_warmup_factor`),
    boundaries B_1 < ... < B_k (`opt_learning_rate_decay_boundary_steps`, or the boundary epochs
    times steps per epoch) and multipliers M_0, ..., M_k:

        step < W:  lr = b * (1 - (W - step) / (W * 2**f))         (MLPerf SSD v0.7 warmup)
        otherwise: lr = b * M_j, j = number of boundaries B_i <= step

    f = 0 is a plain linear ramp from 0 (lr = b * step / W); a larger f starts higher, at
    b * (1 - 2**-f). This is the `lr_warmup` rule of the MLPerf SSD (ResNet-34) reference; the
    decay matches its `MultiStepLR` (the LR drops AT the boundary step) and the TF SSD
    reference's `tf.where(global_step < boundary, ...)`. `multipliers` may have k + 1 entries
    (M_0 applies from W to B_1), or k entries, in which case M_0 = 1 (the TF SSD reference's
    `[[1.0, warmup], [0.1, first_drop], [0.01, second_drop]]`). Warmup has priority over a
    boundary below W.
    """

    def __init__(
        self,
        base_learning_rate: float,
        *,
        warmup_steps: int,
        warmup_factor: float,
        boundaries: Sequence[int],
        multipliers: Sequence[float],
        name: str = "PiecewiseConstantWithWarmup",
    ):
        """Creates the schedule.

        Args:
          base_learning_rate: b > 0.
          warmup_steps: W >= 0 steps of warmup (0: none).
          warmup_factor: f >= 0, see the class docstring.
          boundaries: strictly increasing steps >= 1 at which the LR drops.
          multipliers: len(boundaries) + 1 or len(boundaries) non-negative factors of b.
          name: name scope of the ops.

        Raises:
          ValueError: an argument is out of range or the lengths do not fit.
        """
        super().__init__(base_learning_rate, name)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, low=0)
        self.warmup_factor = _check_float("warmup_factor", warmup_factor)
        boundaries = [_check_int("boundaries entry", b, low=1) for b in boundaries]
        if any(b2 <= b1 for b1, b2 in zip(boundaries, boundaries[1:])):
            raise ValueError(f"`boundaries` ({boundaries!r}) must be strictly increasing.")
        multipliers = [_check_float("multipliers entry", m) for m in multipliers]
        if len(multipliers) not in (len(boundaries), len(boundaries) + 1):
            raise ValueError(
                f"`multipliers` ({multipliers!r}) must have len(boundaries) + 1 = "
                f"{len(boundaries) + 1} entries (or {len(boundaries)}, with 1.0 implied first)."
            )
        self.boundaries = boundaries
        self.multipliers = multipliers

    def rate(self, step):
        multipliers = self.multipliers
        if len(multipliers) == len(self.boundaries):
            multipliers = [1.0] + multipliers
        lr = ops.convert_to_tensor(self.base_learning_rate * multipliers[0], "float32")
        for boundary, mult in zip(self.boundaries, multipliers[1:]):
            lr = ops.where(step >= float(boundary), self.base_learning_rate * mult, lr)
        if self.warmup_steps == 0:
            return lr
        w = float(self.warmup_steps)
        warm = self.base_learning_rate * (1.0 - (w - step) / (w * 2.0**self.warmup_factor))
        return ops.where(step < w, warm, lr)


@keras.saving.register_keras_serializable(package="mlperf_tf")
class WarmupRsqrtDecay(_Schedule):
    """Linear warmup, then inverse-square-root decay (MLPerf Transformer reference).

    With base LR b (`opt_base_learning_rate`, 2.0 in the reference), W = `warmup_steps`
    (`opt_learning_rate_warmup_steps`) and a constant `factor` c:

        lr = b * c * min(1, step / W) * rsqrt(max(step, W))

    which is the reference's `get_learning_rate` (translation/tensorflow/transformer/
    transformer_main.py) with c = hidden_size**-0.5, and tensor2tensor's
    "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size". The peak, at step W, is
    b * c / sqrt(W); the Transformer benchmark passes `factor=hidden_size**-0.5`.
    """

    def __init__(
        self,
        base_learning_rate: float,
        *,
        warmup_steps: int,
        factor: float = 1.0,
        name: str = "WarmupRsqrtDecay",
    ):
        """Creates the schedule.

        Args:
          base_learning_rate: b > 0.
          warmup_steps: W >= 1.
          factor: c > 0, e.g. hidden_size**-0.5.
          name: name scope of the ops.

        Raises:
          ValueError: an argument is out of range.
        """
        super().__init__(base_learning_rate, name)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, low=1)
        self.factor = _check_float("factor", factor, strict=True)

    def rate(self, step):
        w = float(self.warmup_steps)
        return (
            self.base_learning_rate
            * self.factor
            * ops.minimum(1.0, step / w)
            * ops.rsqrt(ops.maximum(step, w))
        )


@keras.saving.register_keras_serializable(package="mlperf_tf")
class WarmupCosineDecay(_WarmupThenDecay):
    """Linear warmup, then cosine decay to an end LR (MLPerf `llama31_8b`: NeMo's
    `CosineAnnealing`, "cosine with linear warmup").

    With base LR b (`opt_base_learning_rate`), end LR e (`opt_end_learning_rate`), W =
    `warmup_steps` (`opt_learning_rate_warmup_steps`) and D = `decay_steps`
    (`opt_learning_rate_decay_steps`, the reference's max_steps - W), as NeMo's
    `nemo/core/optim/lr_scheduler.py` computes it on its step counter (0 for the first update):

        step <= W (W > 0):  lr = b * (step + 1) / (W + 1)
        W < step <= W + D:  lr = (b - e) * 0.5 * (1 + cos(pi * (step - W) / D)) + e
        step > W + D:       lr = e
    """

    def __init__(
        self,
        base_learning_rate: float,
        *,
        warmup_steps: int,
        decay_steps: int,
        end_learning_rate: float = 0.0,
        name: str = "WarmupCosineDecay",
    ):
        """Creates the schedule.

        Args:
          base_learning_rate: peak LR b (> 0).
          warmup_steps: W >= 0 steps of linear warmup.
          decay_steps: D >= 1 steps of cosine decay after the warmup.
          end_learning_rate: e in [0, b].
          name: name scope of the ops.

        Raises:
          ValueError: an argument is out of range.
        """
        super().__init__(base_learning_rate, warmup_steps, decay_steps, end_learning_rate, name)

    def rate(self, step):
        b, e, w = self.base_learning_rate, self.end_learning_rate, float(self.warmup_steps)
        progress = ops.clip((step - w) / float(self.decay_steps), 0.0, 1.0)
        decayed = (b - e) * 0.5 * (1.0 + ops.cos(math.pi * progress)) + e
        if self.warmup_steps == 0:
            return decayed
        warm = b * (step + 1.0) / (w + 1.0)
        return ops.where(step <= w, warm, decayed)
