"""Measures our Transformer train step against the Model Garden's and against Keras `model.fit`.

Contestants, one train step each = forward (teacher-forced), label-smoothed cross-entropy over
the non-pad target tokens, backward, Adam with linear warmup and rsqrt decay; all fp32, no XLA
(the fast CPU setting), on the same fixed synthetic batch (`input.synthetic_train_dataset` of the
preset: pairs of random length, padded to the preset's maximum length), or with
`--config.data_dir=DIR` on real training batches of that folder (length buckets, so less
padding): the first `--steps` batches of its pipeline, read once and then cycled, so that every
contestant trains on the same batches in every round (`fixed_batches`); `--lengths=full` fills
the synthetic batch's padding with tokens (no padding: what skipping it costs when there is none):

  mlperf_tf     `TransformerBenchmark` (model, `compute_loss`, `build_optimizer`) in the runner's
                compiled host loop (`mlperf_tf.runner.Trainer`), as `mlperf-tf run` trains it.
  model_garden  the Model Garden's `official.nlp.modeling.models.Seq2SeqTransformer` (tf_keras)
                built as `official/nlp/tasks/translation.py` `TranslationTask.build_model` builds
                it (pre-norm blocks, attention without biases), its loss
                (`translation._padded_cross_entropy_loss`: one-hot smoothed targets), and the
                optimizer its `wmt_transformer/large` experiment configures
                (`official/nlp/configs/wmt_transformer_experiments.py`: Adam beta_2 0.997,
                epsilon 1e-9, `power` -0.5 decay with `linear` warmup), in a custom `tf.range`
                loop of one `tf.function`, as the Model Garden's trainer runs its train step.
                Skipped when tf-models-official (the `peers` extra) is not installed.
  keras_fit     the same model, loss and optimizer as mlperf_tf in Keras' default
                `model.fit` loop (`tools/peers/bench_fit.py`).

Ablations, only when named in `--contestants`: `mlperf_tf_keras_adam` (Keras' Adam instead of
`FusedAdam`), `mlperf_tf_gather_loss` (the loss as log-softmax and gather instead of the fused
one-hot kernel), `mlperf_tf_before` (both: the step before these two changes) and
`mlperf_tf_padded` (every layer, the vocabulary projection and the loss over every slot,
padding included, as under `--xla` or on TPUs) and `mlperf_tf_packed_logits` (only the
projection and the loss skip the padding).

Equal settings on both models: vocabulary, layers, hidden size, heads, filter size, dropout 0.1
(residual, attention, ReLU), label smoothing, Adam's betas and epsilon, the schedule's base
rate and warmup, batch and length. Rounds interleave the contestants (`tools/harness.py`).
With `--profile=DIR`, each contestant instead runs `--steps` steps under TF's profiler and the
op time per step is printed by op type (`tools/profile_ops.py`).

    python tools/peers/bench_transformer.py [--preset=mini] [--steps=3] [--rounds=6] [--lengths=full]
        [--contestants=mlperf_tf,model_garden,keras_fit] [--profile=DIR] [--config.KEY=VALUE ...]

`--config.model.*`, `--config.global_batch_size` (tokens) and
`--config.data.max_sequence_length` set the shapes of both models, e.g. Transformer-base
(hidden 512, 6+6 layers, filter 2048, 8 heads) with `--config.model.hidden_size=512
--config.model.num_layers=6 --config.model.filter_size=2048 --config.model.num_heads=8`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # what `mlperf-tf` sets (see design.md)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.transformer.benchmark import label_smoothed_cross_entropy  # noqa: E402
from mlperf_tf.config import split_config_overrides  # noqa: E402
from tools import harness, profile_ops  # noqa: E402
from tools.harness import require_positive  # noqa: E402
from tools.peers import bench_fit  # noqa: E402


def model_garden_contestant(benchmark):
    """The Model Garden's Seq2SeqTransformer, loss and Adam schedule in a custom loop.

    Raises:
      ImportError: tf-models-official is not installed.
    """
    from official.modeling import optimization
    from official.nlp.modeling import models
    from official.nlp.tasks import translation

    m, opt = benchmark.config.model, benchmark.config.optimizer
    # As TranslationTask.build_model, from its EncDecoder config with our sizes.
    stack = translation.EncDecoder(
        num_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        intermediate_size=m.filter_size,
        dropout_rate=m.dropout,
        attention_dropout_rate=m.attention_dropout,
        intermediate_dropout=m.relu_dropout,
    ).as_dict()
    model = models.Seq2SeqTransformer(
        vocab_size=m.vocab_size,
        embedding_width=m.hidden_size,
        dropout_rate=m.dropout,
        encoder_layer=models.TransformerEncoder(**stack),
        decoder_layer=models.TransformerDecoder(**stack),
    )
    # As wmt_transformer_experiments.wmt_transformer_large, with our base rate and warmup.
    factory = optimization.OptimizerFactory(
        optimization.OptimizationConfig(
            {
                "optimizer": {
                    "type": "adam",
                    "adam": {
                        "beta_1": opt.opt_adam_beta_1,
                        "beta_2": opt.opt_adam_beta_2,
                        "epsilon": opt.opt_adam_epsilon,
                    },
                },
                "learning_rate": {
                    "type": "power",
                    "power": {
                        "initial_learning_rate": opt.opt_base_learning_rate * m.hidden_size**-0.5,
                        "power": -0.5,
                    },
                },
                "warmup": {
                    "type": "linear",
                    "linear": {
                        "warmup_steps": opt.opt_learning_rate_warmup_steps,
                        "warmup_learning_rate": 0.0,
                    },
                },
            }
        )
    )
    optimizer = factory.build_optimizer(factory.build_learning_rate())
    iterator = iter(benchmark.train_dataset(tf.distribute.InputContext()))

    def token_mean_loss(model, batch):
        # TranslationTask.train_step: token-mean loss over non-pad targets, one replica.
        logits = model(batch, training=True)
        xentropy, weights = translation._padded_cross_entropy_loss(
            logits, batch["targets"], opt.label_smoothing, m.vocab_size
        )
        return tf.reduce_sum(xentropy) / tf.reduce_sum(weights)

    return harness.custom_loop(model, optimizer, iterator, token_mean_loss)


def keras_adam(benchmark):
    """Keras' own Adam on the benchmark's schedule and settings (before `FusedAdam`)."""
    opt = benchmark.config.optimizer
    return keras.optimizers.Adam(
        learning_rate=benchmark.learning_rate_schedule(),
        beta_1=opt.opt_adam_beta_1,
        beta_2=opt.opt_adam_beta_2,
        epsilon=opt.opt_adam_epsilon,
    )


class _Ablation:
    """A benchmark with one method replaced (an ablation): everything else is the wrapped one's."""

    def __init__(self, benchmark):
        self._benchmark = benchmark

    def __getattr__(self, name):
        return getattr(self._benchmark, name)


class GatherLossBenchmark(_Ablation):
    """The benchmark with the loss as a log-softmax and a gather of the true ids (ablation).

    The same value as `label_smoothed_cross_entropy` (the fused one-hot kernel); kept here, not
    in the library, only to measure what the switch to the fused kernel bought.
    """

    def compute_loss(self, model, batch, training: bool = True) -> tf.Tensor:
        logits = tf.cast(model(batch, training=training), tf.float32)
        targets = batch["targets"]
        smoothing = self._benchmark.config.optimizer.label_smoothing
        vocab = tf.cast(tf.shape(logits)[-1], tf.float32)
        confidence, low = 1.0 - smoothing, smoothing / (vocab - 1.0)
        log_probs = tf.nn.log_softmax(logits)  # [b, l, v]
        true_log_prob = tf.gather(log_probs, targets, axis=-1, batch_dims=2)  # [b, l]
        others = tf.reduce_sum(log_probs, axis=-1) - true_log_prob
        xent = -(confidence * true_log_prob + low * others)
        entropy = -(confidence * tf.math.log(confidence)) - (vocab - 1.0) * (
            low * tf.math.log(low + 1e-20)
        )
        weights = tf.cast(targets > 0, tf.float32)
        return tf.reduce_sum((xent - entropy) * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def padded(benchmark):
    """The benchmark bound to static shapes: every layer, the vocabulary projection and the
    loss over every slot, padding included (what `--xla` and TPUs run; all of ours before
    2026-11-25)."""
    return benchmark.with_context(dataclasses.replace(benchmark.context, static_shapes=True))


class PackedLogitsBenchmark(_Ablation):
    """The benchmark with only the vocabulary projection and the loss over the real target tokens
    (ablation: the first of the two padding changes; the layers still run on every slot)."""

    def compute_loss(self, model, batch, training: bool = True) -> tf.Tensor:
        targets = batch["targets"]
        real = tf.not_equal(targets, 0)
        states = tf.boolean_mask(model.teacher_forced_states(batch, training=training), real)
        loss_sum, tokens = label_smoothed_cross_entropy(
            model.logits(states),
            tf.boolean_mask(targets, real),
            self._benchmark.config.optimizer.label_smoothing,
        )
        return loss_sum / tf.maximum(tokens, 1.0)


def fixed_batches(benchmark, batches: list):
    """`benchmark` whose training data is `batches`, cycled (kept through `with_context`).

    The real pipeline, read live by several contestants on two shared cores, stalls in some
    rounds and not in others; a fixed cycle of real batches takes the input out of the race.
    """

    class FixedBatches(type(benchmark)):
        def train_dataset(self, input_context=None):
            dataset = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
            return dataset.repeat()

    return FixedBatches(benchmark.config, context=benchmark.context)


def batches_to_fix(benchmark, args, overrides) -> list | None:
    """The batches every contestant cycles through (`fixed_batches`), or None for the
    benchmark's own synthetic batch: the first `--steps` real batches with `--config.data_dir`,
    or with `--lengths=full` the synthetic batch with every pad slot given a token."""
    dataset = benchmark.train_dataset(tf.distribute.InputContext())
    if overrides.get("data_dir"):
        return list(dataset.take(args.steps))
    if args.lengths == "full":
        vocab = benchmark.config.model.vocab_size
        batch = next(iter(dataset))
        fill = {k: tf.random.uniform(v.shape, 3, vocab, v.dtype) for k, v in batch.items()}
        return [{k: tf.where(v == 0, fill[k], v) for k, v in batch.items()}]
    return None


BUILDERS = {
    "mlperf_tf": bench_fit.mlperf_tf_contestant,
    "model_garden": model_garden_contestant,
    "keras_fit": bench_fit.keras_fit_contestant,
    # Ablations (only when named in --contestants): what each step-speed change bought.
    "mlperf_tf_keras_adam": lambda b: bench_fit.mlperf_tf_contestant(b, keras_adam),
    "mlperf_tf_gather_loss": lambda b: bench_fit.mlperf_tf_contestant(GatherLossBenchmark(b)),
    "mlperf_tf_before": lambda b: bench_fit.mlperf_tf_contestant(
        GatherLossBenchmark(b), keras_adam
    ),
    "mlperf_tf_padded": lambda b: bench_fit.mlperf_tf_contestant(padded(b)),
    "mlperf_tf_packed_logits": lambda b: bench_fit.mlperf_tf_contestant(PackedLogitsBenchmark(b)),
}
DEFAULT_CONTESTANTS = ("mlperf_tf", "model_garden", "keras_fit")


def main(argv=None) -> int:
    argv, overrides = split_config_overrides(list(sys.argv[1:] if argv is None else argv))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--steps", type=int, default=3, help="steps per contestant per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--contestants", default=",".join(DEFAULT_CONTESTANTS))
    parser.add_argument("--profile", default="", help="profile each contestant into this folder")
    parser.add_argument(
        "--lengths",
        choices=("random", "full"),
        default="random",
        help="synthetic pairs of random length (padded), or every pair at full length (no padding)",
    )
    args = parser.parse_args(argv)
    require_positive(parser, args, "steps", "rounds")
    wanted = [n for n in args.contestants.split(",") if n]
    unknown = sorted(set(wanted) - set(BUILDERS))
    if unknown or not wanted:
        parser.error(f"--contestants ({args.contestants!r}): choose from {', '.join(BUILDERS)}")

    keras.utils.set_random_seed(0)
    fixed = batches_to_fix(
        bench_fit.make_benchmark("transformer", args.preset, overrides), args, overrides
    )
    contestants = {}
    for name in wanted:
        benchmark = bench_fit.make_benchmark("transformer", args.preset, overrides)
        if fixed:
            benchmark = fixed_batches(benchmark, fixed)
        try:
            contestants[name] = BUILDERS[name](benchmark)
        except ImportError as e:
            print(f"{name}: skipped (tf-models-official not importable: {e})")
    config = benchmark.config
    batches = fixed or [next(iter(benchmark.train_dataset(tf.distribute.InputContext())))]
    shapes = " ".join(f"{b['targets'].shape[0]}x{b['targets'].shape[1]}" for b in batches)
    real = sum(int(tf.reduce_sum(tf.cast(b["targets"] > 0, tf.int32))) for b in batches)
    slots = sum(b["targets"].shape.num_elements() for b in batches)
    pairs = sum(b["targets"].shape[0] for b in batches) / len(batches)  # per step
    m = config.model
    shape = (
        f"Transformer vocab {m.vocab_size}, {m.num_layers}+{m.num_layers} layers, hidden "
        f"{m.hidden_size}, {m.num_heads} heads, filter {m.filter_size}, dropout {m.dropout}; "
        f"{'real' if overrides.get('data_dir') else 'synthetic'} batches (pairs x tokens) {shapes}: "
        f"{real} real target tokens of {slots} slots; fp32, no XLA; "
        f"TF {tf.__version__}, Keras {keras.__version__}, "
        f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}"
    )
    harness.warm_up(contestants)
    if fixed and len(fixed) > 1:  # each batch shape once more before the rounds
        for run in contestants.values():
            run(len(fixed))
    reference = "mlperf_tf" if "mlperf_tf" in contestants else next(iter(contestants))
    if args.profile:
        profiles = {}
        for name, run in contestants.items():
            profiles[name] = profile_ops.profile_ops(
                run, args.steps, os.path.join(args.profile, name)
            )
            print(f"profiled {name}: {profiles[name]['wall_s']:.3f} s/step", flush=True)
        print(f"\n{shape}; {args.steps} profiled steps each; load {os.getloadavg()}\n")
        print(profile_ops.markdown_table(profiles, "by_type", top=30))
        return 0
    result = harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=args.rounds, samples_per_step=pairs
    )
    print(f"\n{shape}; {args.steps} steps x {args.rounds} rounds\n")
    print(harness.report(result, reference, unit="pairs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
