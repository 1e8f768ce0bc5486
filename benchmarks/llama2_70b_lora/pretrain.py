"""Provides `pretrain_base`: the `mini` preset's base model, a small Llama 2-shaped decoder
pretrained on the mini's docstring text and written as a suite checkpoint (what MLPerf's given
Llama 2 70B checkpoint is to the `mlperf` preset: made before the run, untimed, cached).

Why a base of its own rather than the `llama31_8b` mini's: that one is Llama 3.1 (RoPE with
Llama 3.1's scaling, another tokenizer) and is only trained by a timed run; this one has Llama
2's exact architecture (plain RoPE 10,000, the fused-qkv form the adapters attach to), so the
import, the adapters and the loader are exercised on the real layout, and it needs no other
benchmark's data.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks.llama2_70b_lora import checkpoint
from benchmarks.llama2_70b_lora.config import ModelConfig
from mlperf_tf.lm import loss as loss_lib
from mlperf_tf.lm.attention import split_qkv
from mlperf_tf.lm.decoder import DecoderModel
from mlperf_tf.optimizers import WarmupCosineDecay
from mlperf_tf.optimizers.adamw import AdamW
from mlperf_tf.optimizers.base import clipped_update
from mlperf_tf.spmd import MoEConfig

BATCH = 16
PEAK_LR = 2e-3
WARMUP = 50
SEED = 1234


def base_tensors(model: DecoderModel, config: ModelConfig):
    """(suite name, whole tensor) of a built, unsplit base (the inverse of `model.load_base`)."""
    yield "embed_tokens", model.token_embedding.embeddings.numpy()
    for i, block in enumerate(model.decoder_layers):
        p = f"layers.{i}."
        yield p + "input_layernorm", block.attention_norm.scale.numpy()
        attention = block.attention
        if config.fused_qkv:
            q, k, v = split_qkv(
                attention.qkv_proj.kernel.numpy(), num_heads=config.num_attention_heads,
                num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
            )  # fmt: skip
            yield from ((p + "q_proj", q), (p + "k_proj", k), (p + "v_proj", v))
        else:
            for name in ("q_proj", "k_proj", "v_proj"):
                yield p + name, getattr(attention, name).kernel.numpy()
        yield p + "o_proj", attention.o_proj.kernel.numpy()
        yield p + "post_attention_layernorm", block.mlp_norm.scale.numpy()
        for name in ("gate_proj", "up_proj", "down_proj"):
            yield p + name, getattr(block.mlp, name).kernel.numpy()
    yield "norm", model.final_norm.scale.numpy()
    yield "lm_head", model.lm_head.kernel.numpy()


def summary_loss(model: DecoderModel, examples, vocab_size: int, length: int) -> float:
    """The eval loss of `examples` ((input_ids, labels) lists) as the benchmark computes it: the
    mean over examples of the mean cross-entropy over their summary tokens."""
    ids = np.zeros((len(examples), length), np.int32)
    labels = np.full((len(examples), length), -100, np.int32)
    for row, (x, y) in enumerate(examples):
        ids[row, : len(x)] = x[:length]
        shifted = y[1 : length + 1]
        labels[row, : len(shifted)] = shifted
    per_sequence = []
    for start in range(0, len(examples), 32):
        logits = model(tf.constant(ids[start : start + 32]))
        batch_labels = tf.constant(labels[start : start + 32])
        losses = loss_lib.token_cross_entropy(logits, batch_labels, vocab_size=vocab_size)
        weights = tf.cast(batch_labels >= 0, tf.float32)
        per_sequence.append(tf.reduce_sum(losses * weights, 1) / tf.reduce_sum(weights, 1))
    return float(tf.reduce_mean(tf.concat(per_sequence, 0)))


def pretrain_base(stream: np.ndarray, config: ModelConfig, out_dir: str, *, steps: int,
                  sequence_length: int, eval_examples) -> dict:  # fmt: skip
    """Trains a `DecoderModel` of `config` on random windows of the token `stream` (next-token
    loss, AdamW 0.9/0.95/1e-8 wd 0.1, peak LR 2e-3 after 50 warm-up steps, cosine to 10 %),
    then writes it as the suite checkpoint `out_dir`.

    Returns:
      {"pretrain_steps", "pretrain_seconds", "pretrain_loss" (mean of the last 50 steps),
       "base_eval_loss" (the eval examples' loss before any fine-tuning)}.
    """
    keras.utils.set_random_seed(SEED)
    model = DecoderModel(config, name="llama2")
    model.build()
    schedule = WarmupCosineDecay(PEAK_LR, warmup_steps=WARMUP, decay_steps=max(1, steps - WARMUP),
                                 end_learning_rate=0.1 * PEAK_LR)  # fmt: skip
    optimizer = AdamW(schedule, beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(SEED)
    window = sequence_length + 1

    @tf.function
    def step(tokens):
        with tf.GradientTape() as tape:
            logits = model(tokens[:, :-1], training=True)
            losses = loss_lib.token_cross_entropy(
                logits, tokens[:, 1:], vocab_size=config.vocab_size
            )
            loss = tf.reduce_mean(losses)
        grads = tape.gradient(loss, model.trainable_variables)
        clipped_update(optimizer, grads, model.trainable_variables, 1.0)
        return loss

    begin = time.monotonic()
    losses = []
    for _ in range(steps):
        starts = rng.integers(0, len(stream) - window, BATCH)
        batch = np.stack([stream[s : s + window] for s in starts])
        losses.append(float(step(tf.constant(batch))))
        if not math.isfinite(losses[-1]):
            raise RuntimeError(f"the mini base's pretraining diverged (loss {losses[-1]})")
    seconds = time.monotonic() - begin
    base_eval = summary_loss(model, eval_examples, config.vocab_size, sequence_length)
    checkpoint.write(
        ((name, tf.constant(value)) for name, value in base_tensors(model, config)),
        out_dir, config, source="pretrained",
    )  # fmt: skip
    return {
        "pretrain_steps": steps, "pretrain_seconds": round(seconds, 1),
        "pretrain_loss": round(float(np.mean(losses[-50:])), 4),
        "base_eval_loss": round(base_eval, 4),
    }  # fmt: skip


def pretrain_in_child(stream: np.ndarray, config: ModelConfig, out_dir: str, *, steps: int,
                      sequence_length: int, eval_examples, work_dir: str) -> dict:  # fmt: skip
    """`pretrain_base` in a child Python process (the inputs passed as files in `work_dir`,
    removed after), so the process that then runs the benchmark starts from a clean Keras and
    TensorFlow state: a run that pretrained in its own process failed to trace its steps
    (TypeError in the warm-up, 2026-11-27; not understood), and MLPerf's base checkpoint is made
    outside the run too.

    Raises:
      DataError: the child failed (its last line of error output).
    """
    from mlperf_tf.errors import DataError  # noqa: PLC0415

    stream_path = f"{work_dir}/pretrain_stream.npy"
    eval_path = f"{work_dir}/pretrain_eval.json"
    np.save(stream_path, stream)
    with open(eval_path, "w", encoding="utf-8") as handle:
        json.dump([[list(map(int, x)), list(map(int, y))] for x, y in eval_examples], handle)
    command = [sys.executable, "-m", "benchmarks.llama2_70b_lora.pretrain", f"--stream={stream_path}",
               f"--eval={eval_path}", f"--out_dir={out_dir}", f"--steps={steps}",
               f"--sequence_length={sequence_length}",
               f"--model={json.dumps(checkpoint._as_json(config))}"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        for path in (stream_path, eval_path):
            with contextlib.suppress(OSError):
                os.remove(path)
    if done.returncode:
        lines = (done.stderr or "").strip().splitlines() or ["no output"]
        raise DataError(f"the mini base's pretraining failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    """The child of `pretrain_in_child`: prints `pretrain_base`'s report as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("stream", "eval", "out_dir", "model"):
        parser.add_argument(f"--{flag}", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--sequence_length", type=int, required=True)
    args = parser.parse_args(argv)
    fields = json.loads(args.model)
    fields["moe"] = MoEConfig(**fields["moe"])
    config = ModelConfig(**fields)
    with open(args.eval, encoding="utf-8") as handle:
        evals = [tuple(pair) for pair in json.load(handle)]
    report = pretrain_base(np.load(args.stream), config, args.out_dir, steps=args.steps,
                           sequence_length=args.sequence_length, eval_examples=evals)  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
