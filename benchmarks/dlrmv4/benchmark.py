"""Provides `DlrmV4Benchmark`: MLPerf `dlrmv4` (an HSTU ranking model on Yambda-5b, streamed in
time order, to AUC 0.75 on the held-out future window)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4 import input as input_lib
from benchmarks.dlrmv4 import model as model_lib
from mlperf_tf import distribute
from mlperf_tf.benchmark import Benchmark, EvalPoint
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.facts import Embeddings, EvalCadence, Rcp, SimulatorShape
from mlperf_tf.optimizers import WarmupPolynomialDecay
from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad

# BinnedCumulativeAUC's resolution (gin `CUMULATIVE_AUC_BINS`).
AUC_BINS = 100_000


def binned_auc(positives: np.ndarray, negatives: np.ndarray) -> float:
    """The reference's `BinnedCumulativeAUC._compute` on score histograms (index = score bin):
    sum_b pos_b (neg below b + neg_b / 2) / (P N); 0.5 when a class is empty."""
    positives = positives.astype(np.float64)
    negatives = negatives.astype(np.float64)
    below = np.cumsum(negatives) - negatives
    denominator = positives.sum() * negatives.sum()
    if denominator <= 0:
        return 0.5
    return float((positives * (below + 0.5 * negatives)).sum() / denominator)


# The simulator's shape of the reference (`simulator_shape`): its mean history (gin
# `HISTORY_LENGTH` = `MIN_HISTORY` = 4,086 events: every kept anchor has that many) and its
# tables' values, fp32 (assumed: TorchRec's `EmbeddingBagConfig` default `data_type`), sent
# by the lookups' all-to-alls in fp16 both ways (gin `sparse_a2a_forward_precision` and
# `sparse_a2a_backward_precision` = "fp16": TorchRec's quantized comms).
REFERENCE_MEAN_HISTORY = 4086
TABLE_VALUE_BYTES = 4
SENT_VALUE_BYTES = 2


class DlrmV4Benchmark(Benchmark):
    """DlrmHSTU trained by dense Adam and row-wise Adagrad tables, on time windows in order.

    Batches are dicts of the model's inputs (`model.DlrmHstu`) and float32 `label` [batch]
    (the candidate's `listen_plus` bit); eval batches add float32 `valid`. The loss is the
    binary cross-entropy of the `listen_plus` logit; the quality value is the AUC over the
    whole eval window from 100,000-bin score histograms whose integer counts are summed over
    replicas (the reference's `BinnedCumulativeAUC`, per eval pass).
    """

    name = config_lib.NAME
    config_class = config_lib.DlrmConfig
    input_module = input_lib
    # The tables split over `expert` (`--expert_parallel`): its replicas read different
    # batches and exchange rows by all-to-all, as the MoE layers' experts (README).
    parallel_axes = ("data", "expert")
    # Samples to AUC 0.75 at global batch 8192, 16384, 32768 (the reference's sweep).
    convergence = Rcp(config_lib.RCP_FILE.removeprefix("rcp_checker/"), "dlrmv4_ref_", True)

    config: config_lib.DlrmConfig

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        if config.optimizer.opt_learning_rate_warmup_start_lr:
            raise ConfigError(
                "`optimizer.opt_learning_rate_warmup_start_lr` must be 0.0: the rules fix a "
                "ramp from zero"
            )

    # ---- facts ---------------------------------------------------------------------------------
    def parameter_count(self) -> int:
        """Embedding rows x width plus the dense weights, from the config alone."""
        return sum(self.parameter_groups().values())

    def parameter_groups(self) -> dict[str, int]:
        """{"embedding": table parameters, "dense": the rest}, from the config alone."""
        embedding, dense = model_lib.parameter_counts(self.config.model)
        return {"embedding": embedding, "dense": dense}

    def training_flops_per_sample(self) -> float:
        """The reference's MFU yardstick (`DlrmHSTU.get_num_flops_per_sample`) at the jagged
        sequence's mean length S (`jagged_length`), not the padded `max_seq_len`: per STU layer
        6 x (UVQK S D H (2 d_v + 2 d_qk) + output S 3 H d_v D) + 7 x causal attention S^2/2 H
        (d_qk + d_v), and the head's 6 D; lookups and element-wise work left out, as there
        (the simulator charges the lookups apart: `simulator_shape`)."""
        m = self.config.model
        s, d, h = float(self.jagged_length()), m.transducer_dim, m.num_heads
        dv, dq = m.attn_linear_dim, m.attn_qk_dim
        layer = 6 * s * d * (2 * dv + 2 * dq) * h + 7 * (s * s / 2) * h * (dq + dv)
        layer += 6 * s * (3 * h * dv) * d
        return m.num_layers * layer + 6 * d

    def jagged_length(self) -> int:
        """A sample's mean sequence length: the contextual tokens, the mean history and the
        candidate. The reference keeps only anchors with `MIN_HISTORY` earlier events and
        gives each `HISTORY_LENGTH` of them (gin: both 4,086), so its mean history is 4,086
        (`REFERENCE_MEAN_HISTORY`); a preset with shorter histories counts its longest."""
        m = self.config.model
        return m.num_contextual + min(REFERENCE_MEAN_HISTORY, m.history_length) + 1

    def simulator_shape(self) -> SimulatorShape:
        """The tables as the simulator charges them (`facts.Embeddings`): per sample the
        history's and the candidate's item, artist and album rows (3 x (L + 1)) and the 8
        contextual rows, 512 fp32 values each (sent as fp16), sharded over every chip
        (TorchRec's plan), updated by row-wise Adagrad (one fp32 accumulator per row); the dense
        weights all-reduced; the preset's batch as the default (the reference's 8,192). No
        blocks: tensor, pipeline and context parallelism do not apply."""
        m = self.config.model
        history = self.jagged_length() - m.num_contextual - 1
        embeddings = Embeddings(
            parameters=model_lib.parameter_counts(m)[0],
            lookups_per_sample=3 * (history + 1) + m.num_contextual,
            row_bytes=m.embedding_dim * TABLE_VALUE_BYTES,
            sent_row_bytes=m.embedding_dim * SENT_VALUE_BYTES,
        )
        # The reference's batch (gin BATCH_SIZE 8,192: 1,024 a rank x 8), the preset's.
        return SimulatorShape(embeddings=embeddings, reference_batch=self.config.global_batch_size)

    def scaled_settings(self) -> dict[str, str]:
        """The mini and smoke presets' departures from the closed rules, each with why."""
        c = self.config
        if c.optimizer.lr_band_check and c.train_examples == config_lib.TRAIN_SAMPLES:
            return {}
        why = "a scaled-down preset"
        out = {
            C.TRAIN_SAMPLES: f"{c.train_examples} generated samples: {why}",
            C.EVAL_SAMPLES: f"{c.eval_examples} eval samples: {why}",
            # The rules' grid (and first eval) are computed from the 2.29 B stream's size, so
            # every eval of a shorter stream's own 0.1 % grid is off theirs.
            C.EVAL_ACCURACY: (
                f"evals every {c.eval_interval_steps * c.global_batch_size} samples from "
                f"{c.first_eval_samples}, {c.data.eval_every_data_pct:g} of the "
                f"{c.train_examples}-sample stream: {why}"
            ),
        }
        if c.model.max_seq_len != config_lib.MAX_SEQUENCE_LENGTH:
            out[C.MAX_SEQUENCE_LENGTH] = f"sequence {c.model.max_seq_len}: {why}"
        if not c.optimizer.lr_band_check:
            out[C.OPT_BASE_LR] = f"LR {c.learning_rate:g} for a small model: {why}"
            out[C.OPT_SPARSE_BASE_LR] = out[C.OPT_BASE_LR]
        if c.optimizer.opt_learning_rate_warmup_steps != config_lib.WARMUP_STEPS:
            out[C.OPT_LR_WARMUP_STEPS] = f"warm-up scaled to the run's steps: {why}"
        if c.data.eval_every_data_pct != config_lib.EVAL_EVERY_DATA_PCT:
            out[C.EVAL_EVERY_DATA_PCT] = f"fewer evals of a short stream: {why}"
        return out

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> model_lib.DlrmHstu:
        """The DlrmHSTU of `config.model`, built (under the strategy scope). Under TPUStrategy
        its tables are the TPU embedding engine's (`TpuEmbeddingTables`: TPUEmbeddingV2, row-wise
        Adagrad as a `CustomOptimizer` slot program; README "Tables on TPU")."""
        on_tpu = distribute.is_tpu(tf.distribute.get_strategy())
        eps = self.config.optimizer.opt_sparse_epsilon if on_tpu else None
        batch = self.per_replica_batch_size if on_tpu else 0
        if on_tpu and self.replica_batch_size(self.config.eval_batch_size) != batch:
            # The engine's shapes and buffers are one batch's (`output_shape`).
            raise UserError(
                f"`eval_batch_size` ({self.config.eval_batch_size}) must equal the training "
                f"batch ({self.micro_batch_size}) with the tables on the TPU embedding engine"
            )
        model = model_lib.build(self.config.model, seed=self.seed, tpu_epsilon=eps,
                                tpu_batch=batch)  # fmt: skip
        self.tpu_tables = model.tables if on_tpu else None
        return model

    def build_optimizer(self, train_steps: int) -> AdamWRowWiseAdagrad:
        """Adam (PyTorch's, no weight decay) on dense weights and row-wise Adagrad on the
        tables, both at the base rate ramped linearly from 0 over the warm-up steps."""
        del train_steps
        o = self.config.optimizer
        lr = self.config.learning_rate
        schedule = WarmupPolynomialDecay(
            lr,
            warmup_steps=o.opt_learning_rate_warmup_steps,
            decay_steps=1,
            end_learning_rate=lr,  # flat after the warm-up
        )
        optimizer = AdamWRowWiseAdagrad(
            schedule,
            beta_1=o.opt_adam_beta_1,
            beta_2=o.opt_adam_beta_2,
            epsilon=o.opt_adam_epsilon,
            weight_decay=o.opt_weight_decay,
            sparse_variables=(model_lib.SPARSE_PREFIX,),
            sparse_epsilon=o.opt_sparse_epsilon,
            dense_clipnorm=o.opt_gradient_clip_norm or None,
        )
        if getattr(self, "tpu_tables", None) is not None:
            # The TPU tables' learning rate is this optimizer's (its schedule at its step).
            self.tpu_tables.bind_optimizer(optimizer)
        return optimizer

    def gradient_clip_norm(self) -> float | None:
        """None: the optimizer clips the summed dense gradients to the rules' norm itself
        (`dense_clipnorm`), leaving the tables out as the reference does."""
        return None

    def timed_step_parts(self, model) -> dict:
        """The embedding lookup, for `bench`'s share of the step: every table's gather of one
        replica's batch (`DlrmHstu.embed`: with the tables split, the ids and rows all-to-alls
        too) and its backward pass down to the tables' gradient (with the tables split, the
        rows' all-to-all back to their owners), as the step runs them. Not the row-wise
        Adagrad update of the touched rows, which is the optimizer's. On TPU none: the
        engine's backward pass is its update (timing it alone would train the tables)."""
        if model.on_tpu:
            return {}

        def lookup(batch):
            with tf.GradientTape() as tape:
                embedded = model.embed(batch)  # [B, H+1, E] x 3, [B, C, E]
                total = tf.add_n([tf.reduce_sum(v) for v in embedded.values()])
            grad = tape.gradient(total, model.tables.embeddings)  # of the local shard
            values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
            return total + tf.reduce_sum(values[:1])

        return {"embedding lookup": lookup}

    # ---- steps ---------------------------------------------------------------------------------
    def compute_loss(self, model, batch, training: bool = True) -> tf.Tensor:
        """Binary cross-entropy of the `listen_plus` logit, summed over the batch / micro batch."""
        logits = model(batch, training=training)
        loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits)
        return tf.reduce_sum(loss) / float(self.micro_batch_size)

    def eval_step(self, model, batch) -> dict[str, tf.Tensor]:
        """Each example's score bin (of `AUC_BINS` over [0, 1]), label and `valid`."""
        scores = tf.sigmoid(model(batch, training=False))
        bins = tf.clip_by_value(tf.cast(scores * AUC_BINS, tf.int32), 0, AUC_BINS - 1)
        return {"bin": bins, "label": batch["label"], "valid": batch["valid"]}

    def eval_begin(self):
        """Histograms of positive and negative counts per score bin (int64: exact sums)."""
        return {"pos": np.zeros(AUC_BINS, np.int64), "neg": np.zeros(AUC_BINS, np.int64)}

    def eval_reduce(self, state, outputs):
        """Adds one gathered batch's real examples to the histograms."""
        valid = np.asarray(outputs["valid"]) > 0
        bins = np.asarray(outputs["bin"])[valid]
        labels = np.asarray(outputs["label"])[valid] > 0.5
        state["pos"] += np.bincount(bins[labels], minlength=AUC_BINS)
        state["neg"] += np.bincount(bins[~labels], minlength=AUC_BINS)
        return state

    def eval_result(self, state) -> float:
        """The AUC of the eval window (`binned_auc`)."""
        if state["pos"].sum() + state["neg"].sum() == 0:
            raise ValueError("eval saw no samples: the eval window is empty")
        return binned_auc(state["pos"], state["neg"])

    # ---- schedule and log ----------------------------------------------------------------------
    def eval_cadence(self) -> EvalCadence:
        """Every `eval_every_data_pct` of the stream rounded up to whole steps, the first at
        `data.first_eval_samples` or the rules' floor((4480 x GBS + 135,331,840) / 3), rounded
        up to that grid (`config.first_eval_samples`)."""
        c = self.config
        first = c.data.first_eval_samples
        rule = (4480 / 3, 135_331_840 / 3) if first < 0 else (0.0, float(first))
        return EvalCadence(
            every_samples=c.data.eval_every_data_pct * c.train_examples,
            first=rule, first_on_grid=True,
        )  # fmt: skip

    def eval_schedule(self) -> list[EvalPoint]:
        """Evals on the rules' grid (every ceil(pct x train_samples / batch) steps) from the
        first eval on, up to the end of the stream; `samples_count` on each."""
        c = self.config
        every = c.eval_interval_steps
        first = c.first_eval_samples // c.global_batch_size
        last = max(first, (self.steps_per_epoch // every) * every)
        points, previous = [], 0
        for step in range(first, last + 1, every):
            samples = step * c.global_batch_size
            points.append(
                EvalPoint(
                    step=step,
                    epoch_num=samples,
                    first_epoch_num=previous * c.global_batch_size,
                    epoch_count=(step - previous) * c.global_batch_size,
                    samples_count=samples,
                )
            )
            previous = step
        return points

    def mlperf_hparams(self) -> dict:
        """The keys closed_dlrmv4.yaml requires (the runner adds batch and sample counts)."""
        c, o = self.config, self.config.optimizer
        return {
            C.OPT_NAME: o.opt_name,
            C.OPT_BASE_LR: c.learning_rate,
            C.OPT_ADAM_BETA_1: o.opt_adam_beta_1,
            C.OPT_ADAM_BETA_2: o.opt_adam_beta_2,
            C.OPT_ADAM_EPSILON: o.opt_adam_epsilon,
            C.OPT_WEIGHT_DECAY: o.opt_weight_decay,
            C.OPT_GRADIENT_CLIP_NORM: o.opt_gradient_clip_norm,
            C.OPT_SPARSE_NAME: o.opt_sparse_name,
            C.OPT_SPARSE_BASE_LR: c.learning_rate,
            C.OPT_LR_WARMUP_STEPS: o.opt_learning_rate_warmup_steps,
            C.OPT_LR_WARMUP_START_LR: o.opt_learning_rate_warmup_start_lr,
            C.EVAL_EVERY_DATA_PCT: c.data.eval_every_data_pct,
            C.MAX_SEQUENCE_LENGTH: c.model.max_seq_len,
        }
