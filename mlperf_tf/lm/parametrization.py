"""Provides `ScaledWeights`, a Keras model mixin that stores every trainable weight divided by a
declared scale s and multiplies it back in the forward pass.

Why: the closed rules fix learning rates made for hundreds of billions of parameters (e.g.
DeepSeek-V3's 2.4e-5 sqrt(GBS / 16,384), Qwen3.5 GRPO's 1e-6 sqrt(GBS / 256)), which move the
`mini` presets' few-million-parameter models nothing in a few minutes. With each weight w stored
as v = w / s and read as s v, the function is the plain model's, the gradient of v is s times
the gradient of w, and Adam (invariant to the gradient's scale, but for its epsilon, which the
larger gradient makes relatively smaller) moves v by the rules' rate, so w moves as Adam at s
times that rate would move it. The loss, the optimizer and the logged learning rate are the
rules'; a benchmark declares s in its config (`model.weight_scale`).

What does change with s: AdamW's decoupled weight decay shrinks v by lr x wd a step, so w
shrinks by the same factor: the decay of the rules' rate, i.e. wd / s relative to the effective
rate s x lr. A gradient clip rescales the s-times-larger gradient (its norm is s times the
plain one), which Adam's normalization then largely undoes.

How: the mixin wraps the model's forward methods (`scaled_methods`, e.g. `call`, `with_mtp`,
`decode`) in a `keras.StatelessScope` that maps each trainable variable to s times its value,
so every layer reads the effective weight and the tape differentiates through the product.
Variables the forward assigns inside that scope would not be assigned: the models it serves
assign none there (the MoE selection bias moves outside the forward,
`LanguageModelBenchmark.after_update`).
"""

from __future__ import annotations

import contextlib
import functools

import keras

from mlperf_tf.config import ConfigError
from mlperf_tf.parallel.layout import divide_shards


class ScaledWeights:
    """Mixin before a Keras model class: trainable weights stored / `weight_scale` (see the
    module). `build` stores the initializers' weights so (the initial function is the plain
    model's); after loading a plain model's weights, call `store_scaled` once.

    A subclass lists its forward methods in `scaled_methods` (each runs with the effective
    weights; nested calls, e.g. `with_mtp` calling `call`, scale once) and passes
    `weight_scale=s` to the constructor.
    """

    scaled_methods: tuple[str, ...] = ("call",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.scaled_methods:
            # Its own, or the next class's in the MRO (the model's; keeps its signature, which
            # Keras reads for `training`).
            method = cls.__dict__.get(name) or getattr(super(cls, cls), name)
            if not getattr(method, "_scaled", False):
                setattr(cls, name, _with_effective_weights(method))

    def __init__(self, *args, weight_scale: float, **kwargs):
        if not weight_scale > 0:
            raise ConfigError(f"`model.weight_scale` ({weight_scale!r}) must be positive.")
        super().__init__(*args, **kwargs)
        self.weight_scale = float(weight_scale)
        self._reading_effective = False

    def effective_weights(self) -> keras.StatelessScope:
        """A scope in which every trainable variable reads as its effective weight s x v."""
        scale = self.weight_scale
        return keras.StatelessScope(
            state_mapping=[(v, v.value * scale) for v in self.trainable_variables]
        )

    def build(self, input_shape=None):
        """Builds the model, then stores its initial weights divided by s (once: a second
        `build` call leaves the stored weights as they are)."""
        first = not self.built
        super().build(input_shape)
        if first:
            self.store_scaled()

    @contextlib.contextmanager
    def stored_weights(self):
        """A scope in which the forward reads the stored weights v as they are: for a model
        whose layers create their weights at its first call (Keras creates no variable inside
        the `StatelessScope` of `effective_weights`), that call runs here, then `store_scaled`.
        """
        outer, self._reading_effective = self._reading_effective, True
        try:
            yield
        finally:
            self._reading_effective = outer

    def store_scaled(self) -> None:
        """Divides the trainable variables, holding effective weights (the initializers', or a
        plain model's just loaded), by s: the stored form (each replica its own shard of a
        split variable)."""
        for v in self.trainable_variables:
            divide_shards(v, self.weight_scale)

    def effective_values(self) -> list:
        """The effective weights s x v, in `trainable_variables`' order (for an export in the
        plain model's form)."""
        return [v * self.weight_scale for v in self.trainable_variables]


def _with_effective_weights(method):
    """`method` run inside `effective_weights()` unless an outer scaled method already is."""

    @functools.wraps(method)
    def scaled(self, *args, **kwargs):
        if self._reading_effective:
            return method(self, *args, **kwargs)
        self._reading_effective = True
        try:
            with self.effective_weights():
                return method(self, *args, **kwargs)
        finally:
            self._reading_effective = False

    scaled._scaled = True
    return scaled


def scaled_class(model_class: type, methods: tuple[str, ...] = ("call",)) -> type:
    """`model_class` with `ScaledWeights` (a subclass named `Scaled<name>`, forward `methods`)."""
    return type(f"Scaled{model_class.__name__}", (ScaledWeights, model_class), {
        "scaled_methods": methods, "__module__": model_class.__module__,
    })  # fmt: skip
