"""Provides `BertBenchmark`: MLPerf language (BERT-large pretraining, masked-LM accuracy)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.bert import checkpoint as checkpoint_lib
from benchmarks.bert import config as config_lib
from benchmarks.bert import input as input_lib
from benchmarks.bert import model as model_lib
from mlperf_tf import rounds, rules
from mlperf_tf.benchmark import Benchmark, EvalPoint, eval_ratio, sample_eval_schedule
from mlperf_tf.config import ConfigError
from mlperf_tf.facts import Blocks, Calibration, EvalCadence, Rcp, RenamedKey, SimulatorShape
from mlperf_tf.optimizers import WarmupPolynomialDecay, registry
from mlperf_tf.optimizers.lamb import DEFAULT_LAMB_EXCLUDE
from mlperf_tf.spmd import vocab_parallel_cross_entropy

# MLPerf log keys of closed_bert.yaml (0.7.0, 1.0.0) that `mlperf_logging.mllog.constants` lacks.
OPT_EPSILON = "opt_epsilon"
MAX_PREDICTIONS_PER_SEQ = "max_predictions_per_seq"

# Patterns (re.search on Keras variable paths) that get neither weight decay nor layer
# adaptation: the reference's ["LayerNorm", "layer_norm", "bias"]. model.py names every layer
# norm "...LayerNorm" so the pattern finds its gamma and beta.
LAMB_EXCLUDE = DEFAULT_LAMB_EXCLUDE
# The reference's denominator guard for the masked-LM mean (`+ 1e-5`).
_MLM_WEIGHT_EPSILON = 1e-5


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    Calibration(("tpu-v3",), 0.5546, "bf16", "MLPerf v0.7 Google/results/tpu-v3-32-TF2.0/bert",
                per_chip_batch=8),
    Calibration(("tpu-v4",), 0.6908, "bf16", "MLPerf v0.7 Google/results/tpu-v4-16-TF/bert",
                per_chip_batch=24),
    # NVIDIA's v0.7 BERT all-reduced after the backward pass: no overlap.
    Calibration(("ampere",), 0.4684, "fp16", "MLPerf v0.7 NVIDIA/results/dgxa100_ngc20.06_pytorch/bert",
                overlap_fraction=0.0, per_chip_batch=32),
)  # fmt: skip


class BertBenchmark(Benchmark):
    """BERT pretraining with LAMB to MLPerf's masked-LM accuracy target.

    Batches are dicts of the seven MLPerf features (see input.py): int32 `input_ids`,
    `input_mask`, `segment_ids` [batch, seq], `masked_lm_positions`, `masked_lm_ids` [batch,
    predictions], float32 `masked_lm_weights` [batch, predictions], int32
    `next_sentence_labels` [batch]; and, in eval, float32 `valid` [batch].
    """

    name = "bert"
    mlperf_benchmark = C.BERT
    sample_unit = "sequence"
    parallel_axes = ("data", "model")
    # Samples to 72.0 % masked-LM accuracy by global batch (the last round with BERT's RCPs).
    convergence = Rcp("training_4.0.0/rcps_bert.json", "bert_ref_", in_samples=True)
    renamed_keys = (RenamedKey(rounds.OPT_EPSILON, rounds.OPT_LAMB_EPSILON, "2.1.0"),)
    config_class = config_lib.BertConfig
    input_module = input_lib.INPUT  # synthetic or record batches (the Benchmark's input hooks)

    config: config_lib.BertConfig

    def simulator_shape(self) -> SimulatorShape:
        """For `--model_parallel`: each encoder block all-reduces after attention and after the
        feed-forward (Megatron's two), over activations of `max_seq_length` tokens x hidden."""
        m = self.model_config
        h, f = m.hidden_size, m.intermediate_size
        blocks = Blocks(
            m.num_hidden_layers, 2, h, self.config.data.max_seq_length, 2 * h * f, 2.0 * 2 * h * f
        )
        return SimulatorShape(blocks=blocks, precision="bf16", calibration=SIMULATOR_CALIBRATION)

    # ---- sizes ---------------------------------------------------------------------------------
    @property
    def model_config(self) -> config_lib.ModelConfig:
        """`config.model`, or the model of `config.bert_config_file` when one is given.

        Raises:
          ConfigError: the file is unreadable, or the sequence length does not fit its model.
        """
        if not self.config.bert_config_file:
            return self.config.model
        model = config_lib.model_config_from_json(self.config.bert_config_file)
        if self.config.data.max_seq_length > model.max_position_embeddings:
            raise ConfigError(
                f"`data.max_seq_length` ({self.config.data.max_seq_length}) exceeds "
                f"max_position_embeddings ({model.max_position_embeddings}) of "
                f"'{self.config.bert_config_file}'."
            )
        return model

    def decay_steps(self, train_steps: int) -> int:
        """`opt_learning_rate_training_steps`: the config's, or the run's step budget when 0."""
        return self.config.optimizer.opt_learning_rate_training_steps or max(1, train_steps)

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """The BERT pretrainer of `model_config` (under the strategy scope, dtype policy set)."""
        return model_lib.build_pretrainer(self.model_config)

    def learning_rate_schedule(self, train_steps: int) -> WarmupPolynomialDecay:
        """The reference's schedule: polynomial decay from step 0 over
        `opt_learning_rate_training_steps`, overridden by the linear warmup that starts at
        `start_warmup_step` and lasts `num_warmup_steps`."""
        opt = self.config.optimizer
        return WarmupPolynomialDecay(
            opt.opt_base_learning_rate,
            warmup_steps=opt.num_warmup_steps,
            decay_steps=self.decay_steps(train_steps),
            end_learning_rate=0.0,
            power=opt.opt_lamb_learning_rate_decay_poly_power,
            start_warmup_step=opt.start_warmup_step,
            decay_start_step=0,
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """LAMB (the MLPerf reference's, bias-corrected) on `learning_rate_schedule`."""
        opt = self.config.optimizer
        # LAMB is the registry's plug-in too, built from this config's `opt_lamb_*` and
        # `opt_epsilon` fields with `LAMB_EXCLUDE`; `opt_params` are for the other optimizers.
        params = () if opt.opt_name == "lamb" else opt.opt_params
        return registry.build(opt.opt_name, self.learning_rate_schedule(train_steps), opt, params)

    def restore_initial_weights(self, model: keras.Model) -> None:
        """Loads `config.init_checkpoint` (a TF1 BERT checkpoint) by google-research names."""
        if not self.config.init_checkpoint:
            return
        report = checkpoint_lib.load_tf1_checkpoint(model, self.config.init_checkpoint)
        logging.info(
            "bert: loaded %d variables from %s (skipped %d non-model variables)",
            len(report.loaded),
            report.path,
            len(report.skipped),
        )

    # ---- steps (replica context) ---------------------------------------------------------------
    def losses(self, model: keras.Model, batch: Any, training: bool) -> dict[str, tf.Tensor]:
        """This replica's masked-LM loss (weighted mean over its masked tokens, as the
        reference's `get_masked_lm_output`) and next-sentence loss (mean over its examples).

        The encoder skips the padding (`packed`: its blocks run on the real tokens only) unless
        the run needs static shapes (`--xla`, TPUs); the losses and gradients are the same
        (issue 14; `tools/peers/bench_bert.py`, ablation `mlperf_tf_padded`).
        """
        outputs = model(batch, training=training, packed=not self.static_shapes)
        mlm_logits = tf.cast(outputs["mlm_logits"], tf.float32)  # [batch, predictions, vocab]
        weights = tf.cast(batch["masked_lm_weights"], tf.float32)  # [batch, predictions]
        if (
            model.mlm_head.axis.size > 1
        ):  # this shard's [batch, predictions, vocab/M], never gathered
            token_loss = vocab_parallel_cross_entropy(
                mlm_logits, batch["masked_lm_ids"], vocab_size=self.model_config.vocab_size,
                smoothing=0.0, axis=model.mlm_head.axis,
            )  # fmt: skip
        else:
            token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=batch["masked_lm_ids"], logits=mlm_logits
            )
        mlm = tf.reduce_sum(token_loss * weights) / (tf.reduce_sum(weights) + _MLM_WEIGHT_EPSILON)
        nsp_logits = tf.cast(outputs["nsp_logits"], tf.float32)  # [batch, 2]
        nsp = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=batch["next_sentence_labels"], logits=nsp_logits
            )
        )
        return {"mlm": mlm, "nsp": nsp}

    def compute_loss(self, model: keras.Model, batch: Any, training: bool = True) -> tf.Tensor:
        """(masked-LM + next-sentence loss of this replica) x replica batch / `micro_batch_size`.

        The reference's loss is a mean over one replica's batch, and its gradients are averaged
        across replicas. Here gradients are summed across replicas (and averaged over
        accumulation steps by the runner), so each replica scales its mean by its share of the
        micro batch: with equal shares that is the reference's average of replica means.
        """
        parts = self.losses(model, batch, training)
        local_batch = batch["input_ids"].shape[0]  # static: batches use drop_remainder
        return (parts["mlm"] + parts["nsp"]) * (float(local_batch) / float(self.micro_batch_size))

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: weighted correct masked-LM predictions and weight sums `[batch]`.

        The metric is the reference's `tf.metrics.accuracy(masked_lm_ids, argmax,
        weights=masked_lm_weights)`; padding examples (`valid` 0) weigh 0.
        """
        outputs = model(batch, training=False)
        # Under model parallelism the shards' logits are gathered for the argmax (eval only).
        logits = model.mlm_head.axis.gather_last(outputs["mlm_logits"])
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        valid = tf.cast(batch["valid"], tf.float32)[:, None]
        weights = tf.cast(batch["masked_lm_weights"], tf.float32) * valid  # [batch, predictions]
        correct = tf.cast(tf.equal(predictions, batch["masked_lm_ids"]), tf.float32) * weights
        return {"correct": tf.reduce_sum(correct, axis=1), "weight": tf.reduce_sum(weights, axis=1)}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """Masked-LM accuracy: correct predictions over the weight of all masked tokens."""
        return eval_ratio(state, "correct", "weight", what="masked tokens")

    def eval_every_samples(self) -> int:
        """Samples between evals: `config.eval_every_samples`, or MLPerf's `eval_rule`."""
        return self.config.eval_every_samples or rules.bert_eval_interval_samples(
            self.config.eval_rule, self.config.global_batch_size
        )

    def eval_cadence(self) -> EvalCadence:
        """Every `eval_every_samples()` samples (the round's rule at this batch)."""
        return EvalCadence(every_samples=float(self.eval_every_samples()))

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `eval_every_samples()` samples (rounded up to whole steps) and at the end."""
        return sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.eval_every_samples(),
        )

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_bert.yaml (rulesets 0.7.0 and 1.0.0) and the reference's extras."""
        opt = self.config.optimizer
        if opt.opt_name == "lamb":
            optimizer_keys = {
                C.OPT_NAME: C.LAMB,
                OPT_EPSILON: opt.opt_epsilon,
                C.OPT_LAMB_EPSILON: opt.opt_epsilon,  # the key's name from ruleset 2.1 on
                C.OPT_LAMB_BETA_1: opt.opt_lamb_beta_1,
                C.OPT_LAMB_BETA_2: opt.opt_lamb_beta_2,
                C.OPT_LAMB_WEIGHT_DECAY: opt.opt_lamb_weight_decay_rate,
                C.OPT_LAMB_LR_DECAY_POLY_POWER: opt.opt_lamb_learning_rate_decay_poly_power,
            }
        else:  # a registry optimizer on the same schedule: its own keys
            optimizer_keys = registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params)
        return {
            **optimizer_keys,
            C.OPT_BASE_LR: opt.opt_base_learning_rate,
            C.OPT_LR_TRAINING_STEPS: self.decay_steps(self.train_steps),
            C.OPT_LR_WARMUP_STEPS: opt.num_warmup_steps,
            C.NUM_WARMUP_STEPS: opt.num_warmup_steps,
            C.START_WARMUP_STEP: opt.start_warmup_step,
            C.MAX_SEQUENCE_LENGTH: self.config.data.max_seq_length,
            MAX_PREDICTIONS_PER_SEQ: self.config.data.max_predictions_per_seq,
        }
