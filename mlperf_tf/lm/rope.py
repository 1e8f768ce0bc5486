"""Provides rotary position embeddings (RoPE, Su et al. 2021): plain, Llama 3.1-scaled and YaRN.

The frequencies are computed once in float64 NumPy (`inverse_frequencies`), the cos/sin tables
per call in float32 (`RotaryEmbedding.tables`), and `apply_rope` rotates pairs (i, i + d/2), the
Hugging Face / keras-hub "rotate half" layout.

YaRN (Peng et al. 2023) follows the paper's code (jquesnelle/yarn `_yarn_find_correction_range`,
Hugging Face's `_compute_yarn_parameters`): the ramp's ends are clamped to [0, head_dim - 1].
keras-hub's `RotaryEmbedding(rope_type="yarn")` clamps the upper end to head_dim / 2 - 1 instead,
and with `truncate=True` caps the positions rather than rounding the ramp's ends: the two agree
whenever the upper end is below head_dim / 2 - 1 and `truncate` is False (GPT-OSS: ends 8.1 and
17.4 at head_dim 64).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from mlperf_tf.layers.context_parallel import ContextAxis


def llama3_inverse_frequencies(
    inv: np.ndarray,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position: int,
) -> np.ndarray:
    """Llama 3.1's scaling of plain inverse frequencies `inv` (Meta's `apply_scaling`, Hugging
    Face's "llama3" rope type): low frequencies (wavelength above `original_max_position /
    low_freq_factor`) divided by `factor`, high ones (wavelength below `original_max_position /
    high_freq_factor`) kept, interpolated between with `smooth = (original_max_position /
    wavelength - low) / (high - low)`."""
    if factor == 1.0:
        return inv
    wavelength = 2 * math.pi / inv
    low_wavelength = original_max_position / low_freq_factor
    high_wavelength = original_max_position / high_freq_factor
    smooth = (original_max_position / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * inv / factor + smooth * inv
    scaled = np.where(wavelength > low_wavelength, inv / factor, inv)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return np.where(medium, smoothed, scaled)


def yarn_inverse_frequencies(
    head_dim: int,
    *,
    theta: float,
    factor: float,
    original_max_position: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> tuple[np.ndarray, float]:
    """YaRN's "NTK-by-parts" frequencies and attention factor.

    Dimension pair i keeps its frequency (extrapolates) where it turns more than `beta_fast`
    times over the original context, is divided by `factor` (interpolates) where it turns less
    than `beta_slow` times, and ramps linearly between; the attention factor (which multiplies
    cos and sin, so the logits by its square) is `0.1 ln(factor) + 1`.

    Returns:
      (inverse frequencies [head_dim / 2] float64, attention factor).
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if factor == 1.0:
        return inv, 1.0

    def correction_dim(rotations):
        return (head_dim * math.log(original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolate = 1.0 - ramp
    frequencies = (inv / factor) * (1 - extrapolate) + inv * extrapolate
    return frequencies, 0.1 * math.log(factor) + 1.0


class RotaryEmbedding:
    """The rotary tables of one model (no weights: a plain object the model keeps).

    Under context parallelism (the ambient mesh's `context` axis, made when the model is) a
    replica holds 2 of each sequence's 2C chunks: `tables` gives the rotations of its tokens'
    true positions (`ContextAxis.positions`), so the model's blocks need not know of the split.

    Args:
      head_dim: the rotated width.
      theta: the base.
      rope_type: "default", "llama3" or "yarn".
      scaling_factor: Llama 3.1's or YaRN's factor (1: plain).
      low_freq_factor, high_freq_factor: Llama 3.1's.
      original_max_position: Llama 3.1's and YaRN's original context.
      beta_fast, beta_slow, truncate: YaRN's.
      scale_tables: YaRN's temperature multiplies the tables (False: 1; multi-head latent
        attention puts it into its softmax scale, `mlperf_tf.lm.mla`).
    """

    def __init__(self, head_dim: int, *, theta: float, rope_type: str = "default",
                 scaling_factor: float = 1.0, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0, original_max_position: int = 8192,
                 beta_fast: float = 32.0, beta_slow: float = 1.0,
                 truncate: bool = True, scale_tables: bool = True):  # fmt: skip
        self.attention_factor = 1.0
        if rope_type == "yarn":
            inv, self.attention_factor = yarn_inverse_frequencies(
                head_dim, theta=theta, factor=scaling_factor,
                original_max_position=original_max_position, beta_fast=beta_fast,
                beta_slow=beta_slow, truncate=truncate,
            )  # fmt: skip
        else:
            inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
            if rope_type == "llama3":
                inv = llama3_inverse_frequencies(
                    inv, factor=scaling_factor, low_freq_factor=low_freq_factor,
                    high_freq_factor=high_freq_factor,
                    original_max_position=original_max_position,
                )  # fmt: skip
            elif rope_type != "default":
                raise ValueError(f"rope_type {rope_type!r} must be default, llama3 or yarn")
        self.inverse_frequencies = inv  # float64 [head_dim / 2]
        self.context = ContextAxis("rotary")
        if not scale_tables:  # the temperature goes elsewhere (MLA: into the softmax scale)
            self.attention_factor = 1.0

    @classmethod
    def from_config(cls, config) -> RotaryEmbedding:
        """The tables of a `DecoderConfig` (over its `rope_head_dim`)."""
        c = config
        return cls(
            c.rope_head_dim, theta=c.rope_theta, scale_tables=c.attention != "mla", rope_type=c.rope_type,
            scaling_factor=c.rope_scaling_factor, low_freq_factor=c.rope_low_freq_factor,
            high_freq_factor=c.rope_high_freq_factor,
            original_max_position=c.rope_original_max_position, beta_fast=c.rope_beta_fast,
            beta_slow=c.rope_beta_slow, truncate=c.rope_truncate,
        )  # fmt: skip

    def tables(self, seq) -> tuple[tf.Tensor, tf.Tensor]:
        """(cos, sin) [seq, head_dim] in float32 for positions 0..seq-1, or under context
        parallelism for this replica's `seq` tokens' true positions (times the attention factor:
        YaRN's temperature)."""
        if self.context.size > 1:
            return self.tables_at(self.context.positions(seq))
        return self.tables_at(tf.range(seq))

    def tables_at(self, positions) -> tuple[tf.Tensor, tf.Tensor]:
        """(cos, sin) [n, head_dim] in float32 for the int `positions` [n]."""
        positions = tf.cast(positions, tf.float32)
        inv = tf.constant(self.inverse_frequencies.astype(np.float32))
        angles = positions[:, None] * inv[None, :]
        angles = tf.concat([angles, angles], axis=-1)
        cos, sin = tf.cos(angles), tf.sin(angles)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin


def apply_rope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Rotates `x` [batch, seq, ..., head_dim] by position: x cos + rotate_half(x) sin.

    `cos`, `sin` are [seq, head_dim] (each half repeats the frequencies), broadcast over the
    axes between seq and head_dim, or [batch, seq, head_dim]: each row's own positions
    (generation continuing rows of different lengths, `HybridDecoderModel.extend`).
    """
    extra = len(x.shape) - 3  # axes between seq and head_dim
    lead = [d if d is not None else -1 for d in cos.shape[:-1]]
    if len(lead) == 2:  # per row: [batch, seq, 1, ..., head_dim]
        lead = [tf.shape(cos)[0], tf.shape(cos)[1]]
    shape = lead + [1] * extra + [cos.shape[-1]]
    cos = tf.reshape(tf.cast(cos, x.dtype), shape)
    sin = tf.reshape(tf.cast(sin, x.dtype), shape)
    x1, x2 = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-x2, x1], axis=-1) * sin
