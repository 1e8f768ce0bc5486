"""Provides LoRA (Hu et al. 2021) as PEFT applies it: `LoraConfig`, the `LoraAdapter` layer that
adds its low-rank term to a projection, tensor-parallel as Megatron's LoRA splits it, and the
helpers that freeze a base model and count what stays trainable.

The form is PEFT's `LoraLayer` (peft/tuners/lora/layer.py, `Linear.forward`), which the MLPerf
`llama2_70b_lora` reference trains (`mlcommons/training` `llama2_70b_lora/scripts/utils.py`,
`LoraConfig(r, lora_alpha, lora_dropout, bias="none")`):

    y = x W + (alpha / r) * dropout(x) A B

with W [in, out] frozen, A [in, r] drawn as PEFT draws it (`nn.init.kaiming_uniform_(a=sqrt(5))`:
uniform in +-1/sqrt(in)), B [r, out] zeros, so the adapted model equals the base at step 0, and
dropout on the adapter's input only (the base path sees x undropped). On a fused q/k/v projection
(the MLCommons checkpoint's `qkv_proj`) one A is shared by q, k and v and B spans all three.

Why not Keras' own `Dense.enable_lora` / `EinsumDense.enable_lora`: it has the same two matrices
and the same alpha / r scale (`lora_alpha` defaults to the rank there), but (1) it has no dropout,
and the reference's 0.1 on the adapter input cannot be written on its form, which (2) merges the
adapter into the kernel on every call (`kernel + scale * A @ B`: an [in, out] product and, in the
backward pass, an [in, out] gradient that a frozen base does not otherwise need), and (3) it
draws A with `he_uniform` (+-sqrt(6 / in), 2.4x PEFT's bound). With dropout 0 and the same A and
B it computes the same function: the tests hold our adapter to it at that point.

Tensor parallelism (the ambient mesh's `model` axis, M > 1), as Megatron's LoRA adapters
(Megatron-Bridge `LoRALinear`, NeMo's `ParallelLinearAdapter`) follow the projection they adapt:

| projection | A [in, r] | B [r, out] | collectives |
|---|---|---|---|
| column (out split) | replicated, read through f | split along out | A's gradient all-reduced |
| row (in split) | split along in | replicated, read through f | B's gradient all-reduced |
| replicated | replicated, read through f | replicated, read through f | both gradients all-reduced |

In a column projection the input x reaches the adapter already through the block's f (identity
forward, all-reduce of dx backward) and the adapter returns this shard's out/M columns, so its
share of dx is a partial sum that f completes; A's own gradient is likewise a partial sum over
the shards' B columns, which reading A through f completes. In a row projection the adapter's
[..., out] term is a partial sum (x's in/M features times A's rows) added to the kernel's before
the projection's one all-reduce (g), so nothing more is sent forward; B sees a partial product,
and reading it through f sums its gradient. The rank is never split, so it need not divide M.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Sequence

import keras
import tensorflow as tf

from mlperf_tf.config import ConfigError, require
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.parallel.layout import REPLICATED, add_split_weight, model_split

PARALLEL_KINDS = ("column", "row", "replicated", None)
# Names of the adapter's weights (PEFT's `lora_A`, `lora_B`): how a variable path is known to
# belong to an adapter (`is_adapter_variable`).
A_NAME = "lora_a"
B_NAME = "lora_b"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA's settings, named as PEFT's `LoraConfig` and the MLPerf log keys (`lora_rank`,
    `lora_alpha`).

    Attributes:
      rank: r, the inner dimension of A [in, r] and B [r, out].
      alpha: the adapter's output is scaled by alpha / r.
      dropout: the rate of the dropout on the adapter's input (training only).
      targets: names of the projections that get an adapter (the reference's
        `--lora_target_modules "qkv_proj,o_proj"`).
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.1
    targets: tuple[str, ...] = ("qkv_proj", "o_proj")

    def __post_init__(self):
        require(self, prefix="lora.", positive_int=("rank",), positive=("alpha",),
                fraction=("dropout",))  # fmt: skip
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ConfigError(f"`lora.targets` ({self.targets!r}) must name projections.")

    @property
    def scaling(self) -> float:
        """alpha / r (PEFT's `scaling`; rsLoRA's alpha / sqrt(r) is not the reference's)."""
        return self.alpha / self.rank

    def adapter_parameters(self, in_features: int, out_features: int) -> int:
        """Trainable parameters of one adapter: r (in + out)."""
        return self.rank * (in_features + out_features)


def peft_a_initializer(seed=None) -> keras.initializers.Initializer:
    """PEFT's A: `kaiming_uniform_(a=sqrt(5))` on torch's [r, in] weight, i.e. uniform in
    +-sqrt(6 / ((1 + 5) in)) = +-1/sqrt(in); on Keras' [in, r] layout the fan-in is dimension 0,
    so it is `VarianceScaling(1/3, "fan_in", "uniform")` (limit sqrt(3 * scale / fan_in))."""
    return keras.initializers.VarianceScaling(
        scale=1.0 / 3.0, mode="fan_in", distribution="uniform", seed=seed
    )


class LoraAdapter(keras.layers.Layer):
    """The low-rank term (alpha / r) dropout(x) A B of one projection, this shard's part of it.

    Called with the projection's input as the projection sees it (column: the whole [..., in]
    after the block's f; row: this shard's [..., in/M]), it returns what to add to the
    projection's product before its row all-reduce and bias (`Linear.project`): column, this
    shard's [..., out/M]; row, a partial [..., out] that g sums with the kernel's.

    Args:
      units: the projection's whole output width (out).
      rank: r.
      alpha: the scale's numerator (scale alpha / r).
      dropout: rate of the dropout on the adapter input (0: none).
      parallel: the adapted projection's split ("column", "row", "replicated", None).
      axis: the projection's `ModelAxis` (its f reads the replicated matrix); None: no
        tensor parallelism.
      seed: seeds A's initializer and the dropout (None: Keras' global seeding).
    """

    def __init__(self, units: int, *, rank: int, alpha: float, dropout: float = 0.0,
                 parallel: str | None = None, axis=None, seed: int | None = None,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if parallel not in PARALLEL_KINDS:
            raise ValueError(f"parallel {parallel!r} must be one of {PARALLEL_KINDS}")
        self.units = int(units)
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.scaling = self.alpha / self.rank
        self.parallel = parallel
        self.axis = axis
        self.a_initializer = peft_a_initializer(seed)
        self.dropout = keras.layers.Dropout(dropout, seed=seed) if dropout > 0 else None

    def build(self, input_shape):
        """`input_shape`: the projection's whole input shape [..., in] (also for "row")."""
        in_features = int(input_shape[-1])
        a_layout = model_split(0) if self.parallel == "row" else REPLICATED
        b_layout = model_split(1) if self.parallel == "column" else REPLICATED
        self.lora_a = add_split_weight(
            self, name=A_NAME, shape=(in_features, self.rank), initializer=self.a_initializer,
            layout=a_layout, mesh=None,
        )  # fmt: skip
        self.lora_b = add_split_weight(
            self, name=B_NAME, shape=(self.rank, self.units), initializer="zeros",
            layout=b_layout, mesh=None,
        )  # fmt: skip
        self.built = True

    def _read(self, weight, replicated: bool):
        value = tf.cast(weight, self.compute_dtype)
        split = self.axis is not None and self.axis.size > 1
        return self.axis.copy(value) if split and replicated else value

    def call(self, x, training=None):
        """(alpha / r) dropout(x) A B, with both scales (alpha / r and dropout's 1 / (1 - rate))
        applied to B [r, out] rather than to the [..., in] input and the [..., out] product:
        the same function, without two full-size multiplies forward and two backward per
        adapter. The mask is the one `self.dropout` (a Keras `Dropout`) would draw: the same
        seed generator, the same uniform draw compared with the rate."""
        scale = self.scaling
        if self.dropout is not None and training:
            rate = self.dropout.rate
            noise = keras.random.uniform(
                tf.shape(x), dtype=x.dtype, seed=self.dropout.seed_generator
            )
            x = tf.where(noise >= rate, x, tf.zeros([], x.dtype))
            scale /= 1.0 - rate
        a = self._read(self.lora_a, replicated=self.parallel != "row")
        b = self._read(self.lora_b, replicated=self.parallel != "column")
        return token_matmul(token_matmul(x, a), b * tf.cast(scale, b.dtype))


def is_adapter_variable(variable) -> bool:
    """Whether `variable` is an adapter's A or B (by its path's last part)."""
    name = getattr(variable, "path", None) or getattr(variable, "name", "")
    return name.rsplit("/", 1)[-1].split(":")[0] in (A_NAME, B_NAME)


def freeze_base(model: keras.Model) -> tuple[int, int]:
    """Makes every variable of `model` but the adapters' non-trainable: no gradient is taken for
    them and the optimizer builds no slots for them (Keras builds slots for
    `trainable_variables` only).

    Returns:
      (trainable, total) parameter counts of this replica's variables (shard shapes under
      tensor parallelism).
    """
    trainable = total = 0
    for variable in model.variables:
        size = math.prod(variable.shape)
        total += size
        if is_adapter_variable(variable):
            trainable += size
        elif variable.trainable:
            variable.trainable = False
    return trainable, total


def trainable_parameters(config: LoraConfig, projections: Iterable[tuple[str, int, int]]) -> int:
    """Adapter parameters over `projections` (name, in, out) whose name is in `config.targets`,
    from shapes alone (nothing allocated)."""
    return sum(
        config.adapter_parameters(n_in, n_out)
        for name, n_in, n_out in projections
        if name in config.targets
    )


def check_targets(config: LoraConfig, available: Sequence[str]) -> None:
    """Raises ConfigError when `config.targets` names a projection the model does not have."""
    unknown = [t for t in config.targets if t not in available]
    if unknown:
        raise ConfigError(
            f"`lora.targets` names {', '.join(unknown)}, which the model does not have "
            f"(projections: {', '.join(available)})."
        )


def attach(linear, config: LoraConfig, *, seed: int | None = None) -> LoraAdapter:
    """Gives `linear` (an `mlperf_tf.lm.layers.Linear`, before it is built) an adapter:
    `linear.lora`, added to its `project` (this shard's product, before the row all-reduce and
    the bias), the extension point the block library names. The adapter matches the
    projection's split (`linear.parallel`) and reads through its `ModelAxis`.

    Build the adapter after the projection with `build_adapter` (`Linear.build` makes the
    kernel only).
    """
    adapter = LoraAdapter(
        linear.units, rank=config.rank, alpha=config.alpha, dropout=config.dropout,
        parallel=linear.parallel, axis=linear.axis, seed=seed, name="lora",
    )  # fmt: skip
    linear.lora = adapter
    base_project = linear.project

    def project(x):
        return base_project(x) + tf.cast(adapter(x), linear.compute_dtype)

    linear.project = project
    return adapter


def build_adapter(linear, in_features: int) -> None:
    """Builds `linear.lora` for the whole input width `in_features`, its weights named under the
    projection's path (`.../qkv_proj/lora/lora_a`), as if the projection had built it: paths
    name optimizer slots and collectives, and must be unique in the model."""
    scopes = linear.kernel.path.split("/")[:-1]
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(keras.name_scope(scope))
        linear.lora.build((None, None, in_features))
