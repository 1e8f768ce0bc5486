"""Provides `LoraBenchmark`: MLPerf `llama2_70b_lora` (LoRA fine-tuning of Llama 2 70B on SCROLLS
GovReport to an eval loss of 0.925 on the summary tokens)."""

from __future__ import annotations

import json
import os
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora import input as input_lib
from benchmarks.llama2_70b_lora import model as model_lib
from mlperf_tf.benchmark import EvalPoint, sample_eval_schedule
from mlperf_tf.facts import Blocks, Calibration, Rcp, SimulatorShape
from mlperf_tf.layers import lora as lora_lib
from mlperf_tf.layers.context_parallel import check_sequence
from mlperf_tf.lm.benchmark import LanguageModelBenchmark
from mlperf_tf.optimizers import WarmupCosineDecay, registry
from mlperf_tf.spmd import use_mesh

# MLPerf log keys of closed_llama2_70b_lora.yaml that `mlperf_logging.mllog.constants` lacks.
LORA_RANK = "lora_rank"


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    # Fitted with the calibrating run as it ran: its logs print NVFP4 linear layers (`fp4: true`,
    # `fp4_recipe: nvfp4`, config DGXB200_1x8x1xtp1pp1cp1_fp4) healed to FP8 from step 350
    # (`healing_iter: 350`, `healing_precision: FP8_DS`), and it stops at step 432 (9 of its 10
    # results): 350 steps in NVFP4, 82 in FP8, the efficiency stated as a fraction of the FP8
    # peak and carried to the NVFP4 steps at the profiled layer's FP4 / FP8 rate on a B200
    # (1.04 x, not the peaks' 2 x: Transformer Engine's GEMM profile, docs/scaling.md
    # "Efficiency per number format"); its attention FP8 (`fp8_dot_product_attention: 1`;
    # config_common.sh: FP8_DPA=1, NVTE_FP8_DPA_BWD=1), at `FP8_ATTENTION_SPEEDUP` x the BF16
    # rate. Hopper takes the Blackwell fraction of its FP8 peak (no Hopper result calibrates).
    Calibration(("blackwell", "hopper"), 0.4572, "fp8",
                "MLPerf v5.1 Nebius/results/nebius_b200_n1/llama2_70b_lora",
                run_formats=(("fp4", 350), ("fp8", 82))),
)  # fmt: skip


class LoraBenchmark(LanguageModelBenchmark):
    """LoRA fine-tuning of a frozen Llama 2 with AdamW to the MLPerf eval-loss target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (labels shifted by one,
    -100 on the prompt and the padding: input.py) and, in eval, float32 `valid` [batch]. The
    loss of a sequence is the mean cross-entropy over its summary tokens, and a batch's loss the
    mean over its sequences: what the reference's Hugging Face Trainer computes with one
    sequence per device (`per_device_train_batch_size 1`, the model's mean over the sequence's
    unmasked labels, gradients averaged over devices). The quality value is the same over the
    173 eval sequences (the Trainer's `eval_loss`: the mean of per-batch losses at batch 1).
    """

    name = "llama2_70b_lora"
    config_class = config_lib.LoraBenchmarkConfig
    input_module = input_lib.INPUT
    model_name = model_lib.MODEL_NAME
    parallel_axes = ("data", "model", "context")
    # Samples to the eval loss target at global batch 8 ... 128 (6.1.0's RCPs).
    convergence = Rcp(
        "training_6.1.0/rcps_llama2_70b_lora.json", "llama2_70b_lora_ref_", in_samples=True
    )

    # For the simulator: the reference skips int(0.125 x global batch + 2) of its evals
    # (`config.reference_skipped_evals`), whatever batch is simulated.
    skipped_evals_rule = config_lib.EVAL_DELAY

    config: config_lib.LoraBenchmarkConfig

    def simulator_shape(self) -> SimulatorShape:
        """For `--model_parallel`: Megatron's two all-reduces per block over sequence x hidden
        activations, the frozen base split as in pretraining (the adapters follow their
        projections' split)."""
        m, seq = self.config.model, self.sequence_length()
        h, f = m.hidden_size, m.intermediate_size
        blocks = Blocks(m.num_hidden_layers, 2, h, seq, 3 * h * f, 6.0 * h * f)
        # Attention's products stay in BF16 in an FP8 or FP4 run.
        return SimulatorShape(
            blocks=blocks, precision="bf16", calibration=SIMULATOR_CALIBRATION,
            attention_flops=self._attention_flops(), causal=True,
        )  # fmt: skip

    def _attention_flops(self) -> float:
        """Attention's scores and context products of one sequence in training (3 x forward:
        the activations' gradients are all needed), the full square as `training_flops` counts."""
        m, seq = self.config.model, self.sequence_length()
        return 3.0 * 4.0 * seq * seq * m.num_attention_heads * m.head_dim * m.num_hidden_layers

    # ---- sizes and schedule --------------------------------------------------------------------
    def trainable_parameter_count(self) -> int:
        """The adapters' parameters, from the config (44,564,480 for the `mlperf` preset)."""
        return lora_lib.trainable_parameters(self.config.lora, self.config.model.projections())

    def memory_bytes(self) -> dict[str, float]:
        """The frozen base in `model.base_dtype`; only the adapters have gradients and moments."""
        frozen = 2 if self.config.model.base_dtype == "bfloat16" else 4
        return {"trainable_parameters": self.trainable_parameter_count(), "frozen_bytes": frozen}

    def training_flops_per_sample(self) -> float:
        """FLOPs of one fine-tuning sequence (a multiply-add is 2). A frozen projection costs its
        forward product and the input gradient's (2 x forward; no weight gradient), the
        adapters and attention's two activation products 3 x forward:
        `DecoderConfig.training_flops` (3 x forward of everything) less one third of the
        frozen projections', plus the adapters' 3 x 2 r (in + out) per token."""
        m, seq = self.config.model, self.sequence_length()
        whole = m.training_flops(seq)
        attention = self._attention_flops()
        frozen = whole - attention  # 3 x 2 seq x projections
        return frozen * 2.0 / 3.0 + attention + 3.0 * 2.0 * seq * self.trainable_parameter_count()

    def learning_rate(self) -> float:
        """`opt_base_learning_rate`, or the RCP's for the global batch size when 0.

        Raises:
          ConfigError: taken from the RCPs, and the batch size has none.
        """
        lr = self.config.optimizer.opt_base_learning_rate
        return lr or config_lib.rcp_learning_rate(self.config.global_batch_size)

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `eval_every_samples` samples (rounded up to whole steps) and at the end, less
        the first `config.skipped` (the reference's eval delay); the first block runs from 0."""
        points = sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.config.eval_every_samples,
            log_samples_count=True,
        )
        kept = points[min(self.config.skipped, len(points) - 1) :]
        first = kept[0]
        kept[0] = EvalPoint(
            step=first.step, epoch_num=first.epoch_num, first_epoch_num=0,
            epoch_count=first.epoch_num, samples_count=first.samples_count,
        )  # fmt: skip
        return kept

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """Llama 2 with adapters on `config.lora.targets`, base frozen (under the strategy scope
        and this benchmark's mesh).

        Raises:
          UserError: `--context_parallel` does not cut the sequence into 2C equal chunks.
        """
        check_sequence(self.sequence_length(), self.mesh.context)
        with use_mesh(self.mesh):
            model = model_lib.build_model(self.config.model, self.config.lora, seed=self.seed)
        trainable = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
        logging.info(
            "llama2_70b_lora: %s trainable parameters (this replica's), %s in the base "
            "(whole: %s trainable of %s)", f"{trainable:,}",
            f"{model.count_params() - trainable:,}", f"{self.trainable_parameter_count():,}",
            f"{self.parameter_count():,}",
        )  # fmt: skip
        return model

    def restore_initial_weights(self, model: keras.Model) -> None:
        """Loads the base from `config.base_checkpoint` (before `run_start`, as MLPerf allows)."""
        if not self.config.base_checkpoint:
            return
        with use_mesh(self.mesh):
            count = model_lib.load_base(model, self.config.base_checkpoint, self.config.model)
        logging.info("llama2_70b_lora: loaded %d base tensors from %s", count,
                     self.config.base_checkpoint)  # fmt: skip

    def learning_rate_schedule(self) -> WarmupCosineDecay:
        """Hugging Face's "cosine" to 0 over `opt_learning_rate_training_steps`; the reference's
        warm-up ratio is 0 (with one, the warm-up ramps as `WarmupCosineDecay` does)."""
        opt = self.config.optimizer
        warmup = opt.warmup_steps
        return WarmupCosineDecay(
            self.learning_rate(), warmup_steps=warmup,
            decay_steps=max(1, opt.opt_learning_rate_training_steps - warmup),
            end_learning_rate=0.0,
        )  # fmt: skip

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """AdamW (registry `adamw`) on the cosine schedule, for the adapters only (the base is
        not trainable, so it has no slots)."""
        del train_steps
        opt = self.config.optimizer
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, opt.opt_params)

    # ---- steps (replica context) ---------------------------------------------------------------
    def sequence_losses(self, model, batch, training: bool) -> tuple[tf.Tensor, tf.Tensor]:
        """(mean loss over each sequence's counted tokens [batch], counted tokens [batch]).

        Under context parallelism (`--context_parallel=C`) this member's tokens' share of each
        sequence's mean: its summed token losses over the whole sequence's count (summed over
        the axis, no gradient), so the members' shares, and their gradients, sum to the
        unsplit per-sequence means."""
        batch = self.split_sequences(batch)
        losses = self.token_losses(model, batch, training)
        weights = self.loss_weights(batch)
        tokens = self.context_axis().total(tf.reduce_sum(weights, axis=1))  # whole sequences'
        return tf.reduce_sum(losses * weights, axis=1) / tf.maximum(tokens, 1.0), tokens

    def compute_loss_and_metrics(self, model: keras.Model, batch: Any, training: bool = True):
        """The mean over this replica's sequences of their mean summary-token loss, x its share
        of the micro batch (summed over replicas: the mean over the global batch)."""
        per_sequence, _ = self.sequence_losses(model, batch, training)
        local_batch = batch["input_ids"].shape[0]
        loss = tf.reduce_mean(per_sequence)
        return loss * (float(local_batch) / float(self.micro_batch_size)), {}

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: its mean summary-token loss, 1 (a sequence) and its token count
        (padding examples: 0)."""
        per_sequence, tokens = self.sequence_losses(model, batch, training=False)
        per_sequence = self.context_axis().total(per_sequence)  # the members' shares summed
        valid = tf.cast(batch["valid"], tf.float32)
        return {"loss": per_sequence * valid, "sequences": valid, "tokens": tokens * valid}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """The eval loss: the mean over eval sequences of their mean summary-token loss."""
        if float(state.get("tokens", 0.0)) <= 0:
            raise ValueError("eval saw no summary tokens: the eval set is empty or all masked")
        return float(state["loss"]) / float(state["sequences"])

    def train_samples(self) -> int:
        """`train_samples`: the training split's sequences (3,901 for GovReport; the mini's
        from its `summary.json`)."""
        if self.config.dataset_train_samples:
            return self.config.dataset_train_samples
        with open(os.path.join(self.config.data_dir, "summary.json"), encoding="utf-8") as f:
            return int(json.load(f)["train_examples"])

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_llama2_70b_lora.yaml (5.1.0, 6.0.0, 6.1.0), the reference's
        other hyperparameters (6.1.0's disclosure keys are the runner's: `round_hparams`)."""
        opt = self.config.optimizer
        return {
            C.OPT_NAME: opt.opt_name,
            C.OPT_ADAMW_BETA_1: opt.opt_adamw_beta_1,
            C.OPT_ADAMW_BETA_2: opt.opt_adamw_beta_2,
            C.OPT_ADAMW_EPSILON: opt.opt_adamw_epsilon,
            C.OPT_ADAMW_WEIGHT_DECAY: opt.opt_adamw_weight_decay,
            C.OPT_BASE_LR: self.learning_rate(),
            C.OPT_LR_TRAINING_STEPS: opt.opt_learning_rate_training_steps,
            C.OPT_LR_WARMUP_FACTOR: opt.opt_learning_rate_warmup_factor,
            C.OPT_GRADIENT_CLIP_NORM: float(self.config.gradient_clip_norm),
            C.LORA_ALPHA: self.config.lora.alpha,
            LORA_RANK: self.config.lora.rank,
        }
