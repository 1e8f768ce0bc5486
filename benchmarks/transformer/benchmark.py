"""Provides `TransformerBenchmark`: MLPerf's English->German translation with a Transformer."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.transformer import beam_search, bleu, prepare
from benchmarks.transformer import config as config_lib
from benchmarks.transformer import input as input_lib
from benchmarks.transformer import model as model_lib
from mlperf_tf.benchmark import Benchmark
from mlperf_tf.config import ConfigError
from mlperf_tf.data import pipeline, synthetic
from mlperf_tf.facts import Blocks, Calibration, SimulatorShape, StatedConvergence
from mlperf_tf.layers import moe
from mlperf_tf.optimizers import WarmupRsqrtDecay, registry
from mlperf_tf.spmd import vocab_parallel_cross_entropy


def label_smoothed_cross_entropy(
    logits: tf.Tensor, targets: tf.Tensor, smoothing: float
) -> tuple[tf.Tensor, tf.Tensor]:
    """Cross-entropy against label-smoothed targets, summed over non-pad target positions.

    The smoothed target puts `1 - smoothing` on the true id and spreads `smoothing` evenly over
    the other `vocab - 1` ids (tensorflow/models `transformer_loss`); the entropy of that
    distribution is subtracted, so a perfect prediction scores 0.

    Computed as the reference computes it: a dense smoothed one-hot target and TF's fused
    `softmax_cross_entropy_with_logits`, whose kernel also yields the gradient (softmax minus the
    target) in its one pass over [batch, length, vocab]. A log-softmax with a gather of the true
    ids gives the same value with more passes (the gather's gradient scatters into a zeroed
    [batch, length, vocab] tensor and the log-softmax's takes another exp over it); measured on
    the mini model the fused form costs about the same CPU time per step
    (`tools/peers/bench_transformer.py`, ablation `mlperf_tf_gather_loss`).

    Args:
      logits: [..., vocab] (cast to float32 here), e.g. [batch, length, vocab].
      targets: int [...], the logits' leading shape; 0 is padding and does not count.
      smoothing: label smoothing in [0, 1).

    Returns:
      (sum of the per-token losses, number of non-pad tokens), both float32 scalars.
    """
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    confidence = 1.0 - smoothing
    low = smoothing / tf.cast(vocab - 1, tf.float32)
    soft_targets = tf.one_hot(targets, vocab, on_value=confidence, off_value=low)  # [b, l, v]
    xent = tf.nn.softmax_cross_entropy_with_logits(labels=soft_targets, logits=logits)  # [b, l]
    # Minimum of the cross-entropy: the entropy of the smoothed target distribution.
    entropy = -(confidence * tf.math.log(confidence)) - tf.cast(vocab - 1, tf.float32) * (
        low * tf.math.log(low + 1e-20)
    )
    weights = tf.cast(tf.not_equal(targets, model_lib.PAD_ID), tf.float32)
    return tf.reduce_sum((xent - entropy) * weights), tf.reduce_sum(weights)


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    Calibration(("tpu-v3",), 0.3, "bf16", "assumed: a stated 0.3 (no published TPU v3 point)"),
)  # fmt: skip


class TransformerBenchmark(Benchmark):
    """WMT English->German with Transformer-big; quality: uncased BLEU (sacrebleu, intl) / 100."""

    name = "transformer"
    sample_unit = "token"  # its global batch counts tokens
    config_class = config_lib.TransformerConfig
    # No RCP exists (the Transformer retired before RCPs began with MLPerf 1.0): MLPerf v0.6
    # TPU-v3 result logs converged in 2-3 epochs at global batch 512 and in 5 at 2048
    # (training_results_v0.6 Google/results/tpu-v3-{32,2048}/transformer); their batch unit is
    # taken as 512 tokens (an assumption: a padded pair), giving these points in tokens.
    convergence = StatedConvergence(
        ((262144, 3.0), (1048576, 5.0)),
        "stated model (no RCP): benchmarks/transformer/benchmark.py TransformerBenchmark.convergence",
    )

    def simulator_shape(self) -> SimulatorShape:
        """For `--model_parallel` and `--expert_parallel`: the encoder's blocks all-reduce twice
        (attention, feed-forward), the decoder's three times (with cross-attention), averaged
        over all blocks; the batch counts tokens (1 a sample)."""
        m = self.config.model
        h, f, n = m.hidden_size, m.filter_size, m.num_layers
        blocks = Blocks(2 * n, (2 * n + 3 * n) / (2 * n), h, 1, 2 * h * f, 2.0 * 2 * h * f)
        return SimulatorShape(blocks=blocks, precision="bf16", calibration=SIMULATOR_CALIBRATION)

    @property
    def parallel_axes(self) -> tuple[str, ...]:
        """Data and model (tensor) parallelism; expert parallelism too when the config has MoE
        layers (a dense config refuses --expert_parallel in one line)."""
        return ("data", "model", "expert") if self.config.model.moe.enabled else ("data", "model")

    # ---- sizes (`per_replica_batch_size` is in tokens here) -------------------------------------
    @functools.cached_property
    def metadata(self) -> dict | None:
        """metadata.json of the prepared data, or None for synthetic data."""
        if self.config.synthetic:
            return None
        return prepare.load_metadata(self.config.data_dir)

    @property
    def steps_per_epoch(self) -> int:
        """Steps that consume one epoch of pairs, from the bucket layout and the data's lengths.

        Real data: from metadata.json's pair-length histogram (see `input_lib.steps_per_epoch`).
        Synthetic: `train_examples` over the pairs of one step. A step reads one batch per batch
        shard (`batch_shards`), not per replica: the replicas of a model group share theirs.
        """
        d = self.config.data
        gradient_accumulation = self.config.gradient_accumulation_steps
        if self.metadata is None:
            pairs = max(1, self.per_replica_batch_size // d.max_sequence_length) * self.batch_shards
            pairs *= gradient_accumulation
            return max(1, math.ceil(self.config.train_examples / pairs))
        sizes = input_lib.bucket_batch_sizes(
            d.buckets, self.per_replica_batch_size, d.batch_multiple
        )
        histogram = {int(k): v for k, v in self.metadata["train_length_histogram"].items()}
        micro_steps = input_lib.steps_per_epoch(
            histogram,
            bucket_lengths=d.buckets,
            batch_sizes=sizes,
            num_replicas=self.batch_shards,
            max_length=d.max_sequence_length,
            method=d.max_length_method,
        )
        return max(1, round(micro_steps / gradient_accumulation))

    def train_samples(self) -> int:
        return self.metadata["train_pairs"] if self.metadata else self.config.train_examples

    def eval_samples(self) -> int:
        return self.metadata["eval_pairs"] if self.metadata else self.config.eval_examples

    def eval_steps(self, num_replicas: int) -> int:
        del num_replicas  # eval_batch_size is global
        return max(1, math.ceil(self.eval_samples() / self.config.eval_batch_size))

    @property
    def max_decode_length(self) -> int:
        return self.config.data.eval_max_length + self.config.model.extra_decode_length

    # ---- model and optimizer -------------------------------------------------------------------
    def model_params(self) -> model_lib.TransformerParams:
        m = self.config.model
        return model_lib.TransformerParams(
            # The shape, dropouts and MoE: `config.model`'s fields of the same names.
            **{
                field.name: getattr(m, field.name)
                for field in dataclasses.fields(model_lib.TransformerParams)
                if hasattr(m, field.name)
            },
            # Training capacity counts the replica's token budget, not each batch's real tokens:
            # one buffer shape on every replica (expert parallelism's all-to-all needs it), and
            # the same for every --expert_parallel.
            moe_group_size=self.per_replica_batch_size if m.moe.enabled else None,
            collective_timeout_s=self.context.collective_timeout_s,
        )

    def build_model(self) -> model_lib.Transformer:
        """The Transformer with all variables created (under the runner's strategy scope).

        Raises:
          ConfigError: the prepared vocabulary's size differs from `model.vocab_size`.
        """
        if (
            self.metadata is not None
            and self.metadata["vocab_size"] != self.config.model.vocab_size
        ):
            raise ConfigError(
                f"`model.vocab_size` ({self.config.model.vocab_size}) differs from the vocabulary "
                f"in '{self.config.data_dir}' ({self.metadata['vocab_size']}); set "
                f"--config.model.vocab_size={self.metadata['vocab_size']}"
            )
        if self.mesh.expert > 1 and self.config.model.moe.num_experts % self.mesh.expert:
            raise ConfigError(
                f"--expert_parallel={self.mesh.expert} must divide `model.moe.num_experts` "
                f"({self.config.model.moe.num_experts})"
            )
        model = model_lib.Transformer(self.model_params())
        model.build()
        return model

    def learning_rate_schedule(self) -> WarmupRsqrtDecay:
        opt = self.config.optimizer
        return WarmupRsqrtDecay(
            opt.opt_base_learning_rate,
            warmup_steps=opt.opt_learning_rate_warmup_steps,
            factor=self.config.model.hidden_size**-0.5,
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """The config's optimizer (Adam: `FusedAdam`, beta_1, beta_2, epsilon from config) on the
        linear warmup + rsqrt decay schedule."""
        del train_steps  # the rsqrt decay has no end
        opt = self.config.optimizer
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, opt.opt_params)

    # ---- data ----------------------------------------------------------------------------------
    def synthetic_train_data(self, input_context, batch_size: int) -> tf.data.Dataset:
        """Synthetic token batches, different for each batch shard (`synthetic.per_batch_shard`)."""
        return synthetic.per_batch_shard(
            lambda seed: input_lib.synthetic_train_dataset(
                tokens_per_replica=batch_size,
                max_length=self.config.data.max_sequence_length,
                vocab_size=self.config.model.vocab_size,
                seed=seed,
            ),
            seed=self.seed,
            input_context=input_context,
        )

    def record_train_data(self, input_context, batch_size: int) -> tf.data.Dataset:
        d = self.config.data
        return input_lib.train_dataset(
            self._record_files("train"),
            input_context=input_context,
            tokens_per_replica=batch_size,
            max_length=d.max_sequence_length,
            method=d.max_length_method,
            bucket_lengths=d.buckets,
            batch_multiple=d.batch_multiple,
            shuffle_buffer=d.shuffle_buffer,
            seed=self.seed,
            cache=d.cache_train,
            skip_bad_records=self.skip_bad_records,
        )

    def synthetic_eval_data(self, input_context, batch_size: int, num_batches: int):
        return input_lib.synthetic_eval_dataset(
            input_context=input_context,
            num_examples=self.config.eval_examples,
            batch_size=batch_size,
            num_batches=num_batches,
            eval_max_length=self.config.data.eval_max_length,
            vocab_size=self.config.model.vocab_size,
            seed=self.seed + 1,
        )

    def record_eval_data(self, input_context, batch_size: int, num_batches: int):
        return input_lib.eval_dataset(
            self._record_files("eval"),
            input_context=input_context,
            batch_size=batch_size,
            num_batches=num_batches,
            eval_max_length=self.config.data.eval_max_length,
            skip_bad_records=self.skip_bad_records,
        )

    def _record_files(self, split: str) -> list[str]:
        """The `split` ("train" or "eval") TFRecord shards that prepare.py wrote to `data_dir`.

        Raises:
          DataError: the folder is missing or holds none.
        """
        return pipeline.list_files(
            os.path.join(self.config.data_dir, f"{split}-*"), what=f"transformer {split}"
        )

    # ---- steps (replica context) ---------------------------------------------------------------
    def compute_loss(self, model, batch, training: bool = True) -> tf.Tensor:
        """`compute_loss_and_metrics` without the metrics."""
        return self.compute_loss_and_metrics(model, batch, training)[0]

    def train_metric_shapes(self) -> dict[str, tuple[int, ...]]:
        m = self.config.model
        return moe.metric_shapes(2 * m.moe.count(m.num_layers), m.moe.num_experts)

    def compute_loss_and_metrics(self, model, batch, training: bool = True):
        """Label-smoothed cross-entropy, mean over this replica's target tokens / replicas, plus
        the MoE layers' weighted auxiliary losses / replicas (and their metrics, if any).

        As in the reference (tensorflow/models transformer: per-replica token mean, scaled by
        1/replicas), so that the gradients summed over replicas are the mean of the replicas'
        token-mean gradients. Batches are token-count batches whose pair count varies by bucket,
        so the loss is normalized by real tokens rather than `micro_batch_size`.

        Padding is skipped unless the run needs static shapes (`--xla`, TPUs): both streams run
        packed (`mlperf_tf.layers.PackedTokens`: every per-token layer on the real tokens only,
        attention on unpacked [batch, length] tensors with its masks), and only the real target
        positions reach the vocabulary projection and the loss. Padded positions weigh 0 in the loss and
        are masked out of every attention, so the loss and the gradients are the same; the
        work saved is the batch's padding (issue 14; `tools/peers/bench_transformer.py`, ablations
        `mlperf_tf_padded` and `mlperf_tf_packed_logits`).
        """
        targets = batch["targets"]
        packed = not self.static_shapes
        aux = moe.Collector()
        states = model.teacher_forced_states(
            {"inputs": batch["inputs"], "targets": targets},
            training=training,
            packed=packed,
            aux=aux,
        )
        if packed:  # the states of the real target tokens, in row-major order
            targets = tf.boolean_mask(targets, tf.not_equal(targets, model_lib.PAD_ID))
        smoothing = self.config.optimizer.label_smoothing
        if model.axis.size > 1:  # this shard's [tokens, vocab/M] logits, never gathered
            xent = vocab_parallel_cross_entropy(
                model.logits(states), targets, vocab_size=self.config.model.vocab_size,
                smoothing=smoothing, axis=model.axis,
            )  # fmt: skip
            weights = tf.cast(tf.not_equal(targets, model_lib.PAD_ID), tf.float32)
            loss_sum, tokens = tf.reduce_sum(xent * weights), tf.reduce_sum(weights)
        else:
            loss_sum, tokens = label_smoothed_cross_entropy(
                model.logits(states), targets, smoothing
            )
        loss = loss_sum / tf.maximum(tokens, 1.0)
        aux_loss, metrics = moe.summarize(aux)
        if aux.calls:
            loss += aux_loss
        # This batch shard's share (a model group's replicas share one: the runner's to count).
        return loss / float(self.batch_shards), metrics

    def eval_step(self, model, batch) -> dict[str, tf.Tensor]:
        """Beam-search translations of the batch (padding rows are marked by `valid`)."""
        m = self.config.model
        # Expert parallelism: each replica gathers every expert once for the batch; the
        # decoding loop stops at different steps on different replicas, so it cannot hold
        # all-to-alls.
        with moe.whole_experts(model):
            hypotheses = beam_search.translate(
                model,
                batch["inputs"],
                beam_size=m.beam_size,
                alpha=m.alpha,
                max_decode_length=self.max_decode_length,
                eos_id=prepare.EOS_ID,
                # A sentence leaves the decoding loop once its best translation is decided (same
                # translations; 2.4-2.9x faster mini evals, `tools/costs/bench_transformer_eval.py`);
                # static shapes (XLA, TPUs, model parallelism) keep the whole batch.
                retire_finished=not self.static_shapes,
            )
        return {
            "hypotheses": hypotheses,
            "targets": batch["targets"],
            "index": batch["index"],
            "valid": batch["valid"],
        }

    # ---- host side -----------------------------------------------------------------------------
    def eval_begin(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Eval state: example index -> (hypothesis ids, target ids)."""
        return {}

    def eval_reduce(self, state, outputs: dict[str, np.ndarray]):
        for row in np.flatnonzero(np.asarray(outputs["valid"]) > 0):
            state[int(outputs["index"][row])] = (
                np.asarray(outputs["hypotheses"][row]),
                np.asarray(outputs["targets"][row]),
            )
        return state

    @functools.cached_property
    def _vocab(self):
        return prepare.load_vocab(os.path.join(self.config.data_dir, prepare.VOCAB_MODEL))

    @functools.cached_property
    def _references(self) -> list[str]:
        return prepare.read_lines(os.path.join(self.config.data_dir, prepare.EVAL_REFERENCES))

    def translations(self, state) -> tuple[list[str], list[str]]:
        """(references, hypotheses) text of an eval state, in eval-set order.

        With real data every reference counts: a pair that was not decoded scores as an empty
        hypothesis (`eval_result` warns about it).
        """
        indices = sorted(state)
        if self.config.synthetic:
            # Synthetic ids have no text: score id strings against the target ids.
            def text(ids):
                ids = [int(i) for i in ids]
                ids = ids[: ids.index(prepare.EOS_ID)] if prepare.EOS_ID in ids else ids
                return " ".join(str(i) for i in ids if i != prepare.PAD_ID)

            return [text(state[i][1]) for i in indices], [text(state[i][0]) for i in indices]
        references = self._references
        return references, [
            prepare.decode(self._vocab, state[i][0]) if i in state else ""
            for i in range(len(references))
        ]

    def eval_result(self, state) -> float:
        """Uncased BLEU (sacrebleu, intl tokenization) of the eval set, divided by 100."""
        if len(state) != self.eval_samples():
            logging.warning(
                "transformer eval decoded %d of %d pairs", len(state), self.eval_samples()
            )
        references, hypotheses = self.translations(state)
        for reference, hypothesis in list(zip(references, hypotheses))[:3]:
            logging.info("eval sample: %r (reference %r)", hypothesis, reference)
        return bleu.uncased_bleu(references, hypotheses) / 100.0

    def mlperf_hparams(self) -> dict[str, Any]:
        opt, d = self.config.optimizer, self.config.data
        hparams = {
            C.OPT_BASE_LR: opt.opt_base_learning_rate,
            C.OPT_LR_WARMUP_STEPS: opt.opt_learning_rate_warmup_steps,
            C.MAX_SEQUENCE_LENGTH: (d.max_sequence_length, {"method": d.max_length_method}),
        }
        if opt.opt_name != "adam":  # a registry optimizer: its own keys
            return {**hparams, **registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params)}
        return {
            C.OPT_NAME: opt.opt_name,
            C.OPT_ADAM_BETA_1: opt.opt_adam_beta_1,
            C.OPT_ADAM_BETA_2: opt.opt_adam_beta_2,
            C.OPT_ADAM_EPSILON: opt.opt_adam_epsilon,
            **hparams,
        }

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the gettext English->German mini dataset (see `prepare.prepare_mini`)."""
        prepare.prepare_mini_preset(data_dir)
