"""Provides the FLUX.1 input: preprocessed embeddings (TFRecords or synthetic) to per-replica
batches of clean latents, noise, timesteps and text encodings.

A record (written by prepare.py) is one sample of the reference's preprocessed set: the
autoencoder posterior's `mean` and `logvar` [C, H, W], the T5 token encodings `t5` [T, t] and the
pooled CLIP vector `clip` [v], each as raw little-endian bfloat16 bytes (the reference stores
them as bfloat16 too), an `index` (its position in the set) and, in the eval set, its
`timestep` k in 0..7. All randomness of a training sample is drawn here, by stateless ops from
the run's seed and the batch's number, so replicas sharing a batch (a `model` group) share it:

- the latent: mean + exp(logvar / 2) x eps, then (latent - shift) x scale (`train.py`,
  `autoencoder_utils.generate_unscaled_latent_from_mean_logvar`);
- the text dropout for classifier-free guidance: with probability `cfg_prob` the T5 and CLIP
  encodings are the empty caption's (`flux_dataset.py`, `empty_encodings_path`);
- the timestep t ~ U[0, 1) (`torch.rand`) and the noise ~ N(0, 1).

An eval sample keeps its fixed timestep k / 8 and draws its eps and noise from its `index`, so
every evaluation sees the same noised latents.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from benchmarks.flux1.config import EVAL_TIMESTEPS, FluxConfig
from mlperf_tf.data import pipeline, synthetic
from mlperf_tf.errors import DataError

EVAL_SEED = 0x5EED  # the eval set's fixed noise (not the run's seed: every run sees the same)
KEYS = ("mean", "logvar", "t5", "clip")


def shapes(config: FluxConfig) -> dict[str, tuple[int, ...]]:
    """The stored arrays' shapes (the latent channels-first, as the reference stores it)."""
    d = config.data
    latent = (d.latent_channels, d.latent_size, d.latent_size)
    return {
        "mean": latent,
        "logvar": latent,
        "t5": (d.t5_length, d.t5_width),
        "clip": (d.clip_width,),
    }


def feature_spec() -> dict:
    return {
        **{key: tf.io.FixedLenFeature([], tf.string) for key in KEYS},
        "index": tf.io.FixedLenFeature([], tf.int64),
        "timestep": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }


def decode_bf16(data: tf.Tensor, shape) -> tf.Tensor:
    """Raw little-endian bfloat16 bytes -> float32 `shape` (a wrong length fails the reshape)."""
    bits = tf.io.decode_raw(data, tf.uint16, little_endian=True)
    return tf.reshape(tf.cast(tf.bitcast(bits, tf.bfloat16), tf.float32), shape)


def make_parse_fn(config: FluxConfig):
    """Serialized record -> {mean, logvar, t5, clip (float32), index, timestep (int32)}."""
    spec, array_shapes = feature_spec(), shapes(config)

    def parse(serialized):
        features = tf.io.parse_single_example(serialized, spec)
        example = {key: decode_bf16(features[key], array_shapes[key]) for key in KEYS}
        example["index"] = tf.cast(features["index"], tf.int32)
        example["timestep"] = tf.cast(features["timestep"], tf.int32)
        return example

    return parse


def clean_latent(config: FluxConfig, mean, logvar, eps) -> tf.Tensor:
    """The scaled latent sample [..., H, W, C] from the posterior [..., C, H, W]."""
    d = config.data
    latent = (mean + tf.exp(0.5 * logvar) * eps - d.autoencoder_shift) * d.autoencoder_scale
    rank = latent.shape.rank
    return tf.transpose(latent, list(range(rank - 3)) + [rank - 2, rank - 1, rank - 3])


def load_empty_encodings(config: FluxConfig) -> tuple[np.ndarray, np.ndarray]:
    """The empty caption's (t5 [T, t], clip [v]) float32, from `data_dir/empty_encodings`
    (synthetic runs: zeros)."""
    array_shapes = shapes(config)
    if not config.data_dir:
        return np.zeros(array_shapes["t5"], np.float32), np.zeros(array_shapes["clip"], np.float32)
    path = os.path.join(config.data_dir, config.data.empty_encodings)
    try:
        with np.load(path) as data:
            t5, clip = data["t5"].astype(np.float32), data["clip"].astype(np.float32)
    except (OSError, KeyError, ValueError) as error:
        raise DataError(f"cannot read the empty encodings '{path}' ({error})") from None
    if t5.shape != array_shapes["t5"] or clip.shape != array_shapes["clip"]:
        raise DataError(
            f"the empty encodings '{path}' have shapes {t5.shape} and {clip.shape}, not the "
            f"config's {array_shapes['t5']} and {array_shapes['clip']}"
        )
    return t5, clip


def train_transform(config: FluxConfig, seed: int, empty):
    """(batch number, parsed batch) -> training batch {latents, noise, t, t5, clip}."""
    empty_t5, empty_clip = (tf.constant(e) for e in empty)

    def transform(number, batch):
        size = tf.shape(batch["mean"])[0]
        seeds = tf.random.experimental.stateless_split(
            tf.stack([tf.constant(seed, tf.int64), tf.cast(number, tf.int64)]), 4
        )
        eps = tf.random.stateless_normal(tf.shape(batch["mean"]), seeds[0])
        latents = clean_latent(config, batch["mean"], batch["logvar"], eps)
        drop = tf.random.stateless_uniform([size], seeds[1]) < config.data.cfg_prob
        t5 = tf.where(drop[:, None, None], empty_t5[None], batch["t5"])
        clip = tf.where(drop[:, None], empty_clip[None], batch["clip"])
        return {
            "latents": latents,
            "noise": tf.random.stateless_normal(tf.shape(latents), seeds[2]),
            "t": tf.random.stateless_uniform([size], seeds[3]),
            "t5": t5,
            "clip": clip,
        }

    return transform


def eval_transform(config: FluxConfig):
    """Parsed example -> eval example at its fixed timestep k / 8 with fixed eps and noise."""

    def transform(example):
        seed = tf.stack([tf.constant(EVAL_SEED, tf.int32), example["index"]])
        seeds = tf.random.experimental.stateless_split(seed, 2)
        eps = tf.random.stateless_normal(tf.shape(example["mean"]), seeds[0])
        latents = clean_latent(config, example["mean"], example["logvar"], eps)
        return {
            "latents": latents,
            "noise": tf.random.stateless_normal(tf.shape(latents), seeds[1]),
            "t": tf.cast(example["timestep"], tf.float32) / float(EVAL_TIMESTEPS),
            "t5": example["t5"],
            "clip": example["clip"],
        }

    return transform


def _with_noise(config: FluxConfig, batches: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    transform = train_transform(config, seed, load_empty_encodings(config))
    batches = batches.enumerate().map(transform, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)


def synthetic_example(config: FluxConfig, seed) -> dict[str, tf.Tensor]:
    """A random sample in the parsed layout (logvar -8: a nearly sharp posterior)."""
    op_seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(11, tf.int32)])
    seeds = tf.random.experimental.stateless_split(op_seed, 3)
    s = shapes(config)
    return {
        "mean": tf.random.stateless_normal(s["mean"], seeds[0]),
        "logvar": tf.fill(s["mean"], -8.0),
        "t5": tf.random.stateless_normal(s["t5"], seeds[1]),
        "clip": tf.random.stateless_normal(s["clip"], seeds[2]),
        "index": tf.cast(seed, tf.int32),
        "timestep": tf.math.floormod(tf.cast(seed, tf.int32), EVAL_TIMESTEPS),
    }


# ---- the standard input hooks (`Benchmark.input_module`) ----------------------------------------


def synthetic_train_dataset(config: FluxConfig, *, batch_size: int, seed: int) -> tf.data.Dataset:
    """One fixed batch of random embeddings, with fresh latent samples, noise and timesteps
    every step."""
    batches = synthetic.synthetic_dataset(
        lambda s: {k: v for k, v in synthetic_example(config, s).items() if k in KEYS},
        batch_size=batch_size,
        seed=seed,
    )
    return _with_noise(config, batches, seed)


def synthetic_eval_dataset(config: FluxConfig, *, batch_size: int, num_batches: int, seed: int):
    """`eval_examples` random samples at timesteps index mod 8, padded to `num_batches`."""
    del seed  # the eval set is fixed, as the real one
    count = min(config.eval_examples, batch_size * num_batches)
    transform = eval_transform(config)
    examples = tf.data.Dataset.range(count).map(
        lambda i: transform(synthetic_example(config, tf.cast(i, tf.int32) + 1_000_000))
    )
    return pipeline.pad_eval_dataset(examples, batch_size=batch_size, num_batches=num_batches)


def _files(config: FluxConfig, pattern: str, what: str) -> list[str]:
    return pipeline.list_files(
        os.path.join(config.data_dir, pattern), what=f"flux1 {what} TFRecord"
    )


def train_dataset(config: FluxConfig, *, input_context, batch_size: int, seed: int,
                  skip_bad_records: bool = False) -> tf.data.Dataset:  # fmt: skip
    """Endless shuffled training batches of this pipeline's shard of the files."""
    batches = pipeline.training_pipeline(
        _files(config, config.data.train_pattern, "train"),
        input_context=input_context,
        parse_fn=make_parse_fn(config),
        transform_fn=None,
        batch_size=batch_size,
        shuffle_buffer=config.data.shuffle_buffer,
        seed=seed,
        skip_bad_records=skip_bad_records,
    )
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    return _with_noise(config, batches, seed + synthetic.SHARD_SEED_STRIDE * pipeline_id)


def eval_dataset(config: FluxConfig, *, input_context, batch_size: int, num_batches: int,
                 skip_bad_records: bool = False) -> tf.data.Dataset:  # fmt: skip
    """`num_batches` eval batches of this pipeline's shard, in file order, with `valid`."""
    return pipeline.eval_pipeline(
        _files(config, config.data.eval_pattern, "eval"),
        input_context=input_context,
        parse_fn=make_parse_fn(config),
        transform_fn=eval_transform(config),
        batch_size=batch_size,
        num_batches=num_batches,
        skip_bad_records=skip_bad_records,
    )
