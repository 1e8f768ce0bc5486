"""Measures sequences/s of our BERT train step against the Model Garden's BERT at equal shapes.

One train step = forward (encoder, masked-LM head over the masked positions, next-sentence
head), the MLPerf loss, backward and a LAMB update (weight decay 0.01, LayerNorm and biases
excluded), in one `tf.function` per side:

- ours: `benchmarks.bert` (Keras 3) — `BertBenchmark.compute_loss` and `mlperf_tf.optimizers.LAMB`;
- peer: the Model Garden's `official.nlp.modeling.networks.BertEncoder` (tf_keras) with its
  `layers.MaskedLM` (tied to the encoder's embedding table), a 2-way dense head on the pooled
  output, the same loss, and `official.modeling.optimization.lamb.LAMB`.

Both get the same synthetic batch: full-length sequences (`--lengths=full`, no padding), or
sequences of random length in [seq_length/2, seq_length] (`--lengths=random`, as the suite's
synthetic data and real pretraining data, which are not all full). Ours skips the padding in its
encoder blocks unless `--jit_compile` (XLA needs static shapes); `--padded_ours` adds ours in the
padded form as a third side (ablation). Repetitions of the sides are interleaved in one run (the
order alternates), and each ratio is taken within a repetition, so machine noise cancels in the
ratio. The peer side needs the `peers` extra (tf-models-official); without it only ours is timed.

    python tools/peers/bench_bert.py [--layers=12] [--seq_length=128] [--batch_size=8]
        [--predictions=20] [--repeats=5] [--steps=5] [--lengths=full|random] [--padded_ours]
        [--jit_compile]

Defaults are BERT-base (12 layers, hidden 768, vocab 30522) at a reduced sequence length and
batch, so the run takes a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.bert import config as config_lib  # noqa: E402
from benchmarks.bert.benchmark import LAMB_EXCLUDE, BertBenchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402

WEIGHT_DECAY = 0.01
LEARNING_RATE = 1e-4


def make_batch(args, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A synthetic batch with the MLPerf structure: full-length sequences, or (`--lengths=random`)
    lengths uniform in [seq/2, seq] with the masked positions inside each sequence."""
    rng = np.random.default_rng(seed)
    b, s, p = args.batch_size, args.seq_length, args.predictions
    lengths = np.full(b, s) if args.lengths == "full" else rng.integers(s // 2, s + 1, b)
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, n), size=p, replace=False) for n in lengths]), axis=1
    )
    mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    return {
        "input_ids": rng.integers(5, vocab_size, (b, s)).astype(np.int32) * mask,
        "input_mask": mask,
        "segment_ids": (np.arange(s)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": rng.integers(5, vocab_size, (b, p)).astype(np.int32),
        "masked_lm_weights": np.ones((b, p), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
    }


def ours_step(args, model_config, padded: bool = False):
    """Our train step (a compiled tf.function); `padded`: the static-shape form (ablation)."""
    config = dataclasses.replace(
        config_lib.smoke(),
        global_batch_size=args.batch_size,
        model=model_config,
        data=config_lib.DataConfig(
            max_seq_length=args.seq_length, max_predictions_per_seq=args.predictions
        ),
    )
    bench = BertBenchmark(config, context=RunContext(static_shapes=padded or args.jit_compile))
    model = bench.build_model()
    from mlperf_tf.optimizers import LAMB

    optimizer = LAMB(
        LEARNING_RATE, weight_decay=WEIGHT_DECAY, exclude_from_weight_decay=LAMB_EXCLUDE
    )
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=args.jit_compile)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = bench.compute_loss(model, batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def garden_encoder(c, **settings):
    """The Model Garden's `networks.BertEncoder` of our model config `c`: its sizes, the
    tanh-approximated GELU and its dropouts; `settings` override or add BertEncoder arguments
    (its initializer, `dict_outputs`). Needs the `peers` extra (tf-models-official)."""
    from official.nlp.modeling import networks  # noqa: PLC0415 (the peers extra)

    settings = {
        "output_dropout": c.hidden_dropout_prob,
        "attention_dropout": c.attention_probs_dropout_prob,
        **settings,
    }
    return networks.BertEncoder(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        max_sequence_length=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size,
        inner_dim=c.intermediate_size,
        inner_activation=lambda x: tf.nn.gelu(x, approximate=True),
        **settings,
    )


def garden_step(args, model_config):
    """The Model Garden's train step, or None when tf-models-official is not installed."""
    try:
        import tf_keras
        from official.modeling.optimization import lamb as garden_lamb
        from official.nlp.modeling import layers as garden_layers
    except ImportError as e:
        print(f"Model Garden not importable ({e}); timing ours only.")
        return None
    c = model_config

    def init(seed):
        return tf_keras.initializers.TruncatedNormal(stddev=c.initializer_range, seed=seed)

    encoder = garden_encoder(c, initializer=init(1), dict_outputs=True)
    mlm = garden_layers.MaskedLM(
        embedding_table=encoder.get_embedding_table(),
        activation=lambda x: tf.nn.gelu(x, approximate=True),
        initializer=init(2),
    )
    nsp = tf_keras.layers.Dense(2, kernel_initializer=init(3))
    optimizer = garden_lamb.LAMB(
        LEARNING_RATE,
        weight_decay_rate=WEIGHT_DECAY,
        exclude_from_weight_decay=list(LAMB_EXCLUDE),
    )
    micro = args.batch_size

    def loss_fn(batch):
        out = encoder(
            {
                "input_word_ids": batch["input_ids"],
                "input_mask": batch["input_mask"],
                "input_type_ids": batch["segment_ids"],
            },
            training=True,
        )
        logits = tf.cast(mlm(out["sequence_output"], batch["masked_lm_positions"]), tf.float32)
        w = batch["masked_lm_weights"]
        token = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=batch["masked_lm_ids"], logits=logits
        )
        mlm_loss = tf.reduce_sum(token * w) / (tf.reduce_sum(w) + 1e-5)
        nsp_logits = tf.cast(nsp(out["pooled_output"]), tf.float32)
        nsp_loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=batch["next_sentence_labels"], logits=nsp_logits
            )
        )
        return (mlm_loss + nsp_loss) * (batch["input_ids"].shape[0] / micro)

    loss_fn({k: tf.constant(v) for k, v in make_batch(args, c.vocab_size).items()})  # build
    variables = encoder.trainable_variables + mlm.trainable_variables + nsp.trainable_variables

    @tf.function(jit_compile=args.jit_compile)
    def step(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(batch)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return step


def time_steps(step, batch, steps: int, cpu_seconds: list | None = None) -> float:
    """Seconds per step over `steps` steps (the loss is fetched once at the end).

    Appends the process CPU seconds per step to `cpu_seconds` when given: CPU time is what a step
    costs the machine, which other jobs' load distorts far less than the wall time.
    """
    begin, cpu_begin = time.perf_counter(), time.process_time()
    loss = None
    for _ in range(steps):
        loss = step(batch)
    float(loss)
    if cpu_seconds is not None:
        cpu_seconds.append((time.process_time() - cpu_begin) / steps)
    return (time.perf_counter() - begin) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--jit_compile", action="store_true")
    parser.add_argument("--lengths", choices=("full", "random"), default="full")
    parser.add_argument("--padded_ours", action="store_true", help="add ours, padded (ablation)")
    args = parser.parse_args(argv)

    model_config = dataclasses.replace(
        config_lib.bert_base(),
        num_hidden_layers=args.layers,
        max_position_embeddings=max(512, args.seq_length),
    )
    batch = {k: tf.constant(v) for k, v in make_batch(args, model_config.vocab_size).items()}
    sides = {"ours": ours_step(args, model_config)}
    garden = garden_step(args, model_config)
    if garden is not None:
        sides["model_garden"] = garden
    if args.padded_ours:
        sides["ours_padded"] = ours_step(args, model_config, padded=True)
    for name, step in sides.items():  # compile and warm up outside the timing
        step(batch)
        time_steps(step, batch, 1)
        print(f"warmed up {name}", flush=True)

    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        this = {name: time_steps(sides[name], batch, args.steps, cpu[name]) for name in order}
        for name, value in this.items():
            seconds[name].append(value)
        line = "  ".join(f"{n} {args.batch_size / t:7.2f} seq/s" for n, t in this.items())
        print(f"repeat {repeat + 1}/{args.repeats}: {line}", flush=True)

    real = int(batch["input_mask"].numpy().sum())
    shape = (
        f"BERT L={args.layers} H={model_config.hidden_size} seq={args.seq_length} "
        f"batch={args.batch_size} predictions={args.predictions} lengths={args.lengths} "
        f"({real} real tokens of {batch['input_mask'].shape.num_elements()}) "
        f"xla={'on' if args.jit_compile else 'off'}"
    )
    print(f"\n{shape}")
    for name, values in seconds.items():
        print(
            f"{name:>13}: {args.batch_size / statistics.median(values):8.2f} sequences/s (median)"
        )
    for other in [name for name in sides if name != "ours"]:
        ratios = [o / u for o, u in zip(seconds[other], seconds["ours"])]  # >1: ours is faster
        pooled = sum(seconds[other]) / sum(seconds["ours"])
        cpu_ratios = [o / u for o, u in zip(cpu[other], cpu["ours"])]
        print(
            f"ours / {other} sequences/s: {statistics.median(ratios):.3f} "
            f"(median of per-repeat ratios; min {min(ratios):.3f}, max {max(ratios):.3f}); "
            f"pooled {pooled:.3f}"
        )
        print(
            f"by CPU time per step: {other} / ours {sum(cpu[other]) / sum(cpu['ours']):.3f}"
            f" total, {statistics.median(cpu_ratios):.3f} median of per-repeat ratios"
        )
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
