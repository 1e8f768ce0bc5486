"""Provides `GptOssBenchmark`: MLPerf `gpt_oss_20b` (GPT-OSS 20B mixture-of-experts pretraining on
C4 to log perplexity 3.34)."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b import input as input_lib
from benchmarks.gpt_oss_20b import model as model_lib
from mlperf_tf import flops
from mlperf_tf.benchmark import EvalPoint, sample_eval_schedule
from mlperf_tf.data import c4
from mlperf_tf.errors import UserError
from mlperf_tf.facts import Blocks, Rcp, SimulatorShape
from mlperf_tf.lm.benchmark import LanguageModelBenchmark
from mlperf_tf.lm.decoder import DecoderModel
from mlperf_tf.optimizers import WarmupCosineDecay, registry
from mlperf_tf.parallel.context import use_mesh

# MLPerf log keys of closed_gpt_oss_20b.yaml that `mlperf_logging.mllog.constants` spells
# differently or lacks.
MAX_STEPS = "max_steps"
DECAY_SCHEDULE = "cosine with linear warmup"


class GptOssBenchmark(LanguageModelBenchmark):
    """GPT-OSS causal-LM pretraining with AdamW to the MLPerf log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (`mlperf_tf.data.
    token_windows`) and, in eval, float32 `valid` [batch]. Positions whose input token is the
    end-of-document token (`config.data.eod_token_id`) are left out of the loss and the eval
    (Megatron's `eod_mask_loss`: `loss_mask[tokens == eod] = 0` on the input tokens). The
    quality value is the eval set's log perplexity: the summed next-token cross-entropy (nats)
    over its unmasked tokens over their count, driven down to `quality_target`. Model, loss,
    MoE metrics and eval: `mlperf_tf.lm.LanguageModelBenchmark`.
    """

    name = "gpt_oss_20b"
    mlperf_benchmark = "gpt_oss_20b"
    config_class = config_lib.GptOssConfig
    presets = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}
    input_module = input_lib.INPUT
    model_name = model_lib.MODEL_NAME
    # Samples (sequences of 8,192 tokens) to log perplexity 3.34 at global batch 16, 32, 64.
    convergence = Rcp(config_lib.RCP_FILE.removeprefix("rcp_checker/"), "gpt_oss_20b_ref_", True)

    config: config_lib.GptOssConfig

    @property
    def eod_token(self) -> int | None:
        """The end-of-document id whose input positions the loss skips (the preset's data)."""
        eod = self.config.data.eod_token_id
        return None if eod < 0 else eod

    def decoder_shape(self) -> flops.DecoderShape:
        """`config.model` as `mlperf_tf.flops` counts it: active experts only, windowed layers
        at their window."""
        m = self.config.model
        return flops.DecoderShape(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            num_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            head_dim=m.head_dim,
            intermediate_size=m.intermediate_size,
            moe_layers=m.moe.count(m.num_hidden_layers),
            num_experts=m.moe.num_experts,
            experts_per_token=m.moe.top_k,
            expert_intermediate_size=m.moe.filter_size,
            sliding_window=m.sliding_window,
            sliding_layers=m.sliding_layers(),
        )

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence: active parameters plus attention, sliding-window
        layers at their window (`flops.decoder_training_flops_per_sample`)."""
        seq = self.config.data.max_sequence_length
        return flops.decoder_training_flops_per_sample(self.decoder_shape(), seq)

    def simulator_shape(self) -> SimulatorShape:
        """Megatron's two all-reduces per block under tensor parallelism; each MoE layer holds
        one SwiGLU expert's weights per expert and runs top-k of them per token."""
        m = self.config.model
        h, f = m.hidden_size, m.moe.filter_size or m.intermediate_size
        seq = self.config.data.max_sequence_length
        blocks = Blocks(m.num_hidden_layers, 2, h, seq, 3 * h * f, 2.0 * 3 * h * f)
        return SimulatorShape(blocks=blocks)

    # ---- sizes and schedule --------------------------------------------------------------------
    def learning_rate_and_warmup(self) -> tuple[float, int]:
        """(base LR, warm-up steps): the config's, or the RCP's for the global batch size.

        Raises:
          ConfigError: taken from the RCPs, and the batch size has none.
        """
        opt = self.config.optimizer
        lr, warmup = opt.opt_base_learning_rate, opt.opt_learning_rate_warmup_steps
        if not lr or warmup < 0:
            rcp_lr, rcp_warmup = config_lib.rcp_hparams(self.config.global_batch_size)
            lr = lr or rcp_lr
            warmup = rcp_warmup if warmup < 0 else warmup
        return lr, warmup

    def end_learning_rate(self) -> float:
        """`opt_end_learning_rate`, or 0.1 x the base LR (the reference's `min_lr`) when -1."""
        end = self.config.optimizer.opt_end_learning_rate
        return end if end >= 0 else config_lib.END_LR_FRACTION * self.learning_rate_and_warmup()[0]

    def decay_steps(self) -> int:
        """`opt_learning_rate_decay_steps`: max_steps - warm-up (the rules check this sum)."""
        return max(1, self.config.optimizer.max_steps - self.learning_rate_and_warmup()[1])

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `ceil(eval_every_samples / GBS)` steps (`ceil(12288 / GBS) x GBS` sequences:
        the reference's `PRIMUS_EVAL_INTERVAL`) and at the end, with `samples_count`."""
        return sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.config.eval_every_samples,
            log_samples_count=True,
        )

    def scaled_settings(self) -> dict[str, str]:
        """`max_sequence_length` when below the rules' 8,192 (the mini and smoke presets)."""
        seq = self.config.data.max_sequence_length
        if seq == config_lib.MLPERF_SEQUENCE_LENGTH:
            return {}
        return {
            C.MAX_SEQUENCE_LENGTH: f"sequence {seq} instead of "
            f"{config_lib.MLPERF_SEQUENCE_LENGTH}: a scaled-down preset"
        }

    def check_layout(self) -> None:
        """Raises UserError when the mesh's expert axis does not divide the experts."""
        experts, axis = self.config.model.moe.num_experts, self.mesh.expert
        if experts % axis:
            raise UserError(
                f"--expert_parallel={axis} must divide `model.moe.num_experts` ({experts})"
            )

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> DecoderModel:
        """The GPT-OSS decoder of `config.model` (under the strategy scope, dtype policy set).

        The MoE layers are dropless. With `moe.dispatch` "sorted" each expert runs on its routed
        rows only; where shapes must be static (XLA) the layers use the capacity buffers (every
        expert over the replica's T tokens), as they do under expert parallelism.
        """
        self.check_layout()
        m = self.config.model
        if self.static_shapes and m.moe.dispatch == "sorted":
            m = dataclasses.replace(m, moe=dataclasses.replace(m.moe, dispatch="buffer"))
        with use_mesh(self.mesh):
            return model_lib.build_model(
                m, moe_group_size=self.moe_group_size(),
                collective_timeout_s=self.context.collective_timeout_s,
            )  # fmt: skip

    def learning_rate_schedule(self) -> WarmupCosineDecay:
        lr, warmup = self.learning_rate_and_warmup()
        return WarmupCosineDecay(
            lr,
            warmup_steps=warmup,
            decay_steps=self.decay_steps(),
            end_learning_rate=self.end_learning_rate(),
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """AdamW (registry `adamw`, or `opt_name`) on the warm-up + cosine schedule over
        `optimizer.max_steps` (the rules fix it), not `train_steps`."""
        del train_steps
        opt = self.config.optimizer
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, opt.opt_params)

    # ---- host side -----------------------------------------------------------------------------
    def train_samples(self) -> int:
        """`train_samples`: the sequences of the whole schedule (max_steps x batch)."""
        return self.config.optimizer.max_steps * self.config.global_batch_size

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_gpt_oss_20b.yaml (6.0.0, 6.1.0); the runner adds 6.1.0's
        disclosure keys (`Benchmark.round_hparams`)."""
        opt = self.config.optimizer
        lr, warmup = self.learning_rate_and_warmup()
        if opt.opt_name == "adamw":
            optimizer_keys = {
                C.OPT_NAME: "adamw",
                C.OPT_ADAMW_BETA_1: opt.opt_adamw_beta_1,
                C.OPT_ADAMW_BETA_2: opt.opt_adamw_beta_2,
                C.OPT_ADAMW_EPSILON: opt.opt_adamw_epsilon,
                C.OPT_ADAMW_WEIGHT_DECAY: opt.opt_adamw_weight_decay,
            }
        else:
            optimizer_keys = registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params)
        return {
            **optimizer_keys,
            C.OPT_BASE_LR: lr,
            C.OPT_END_LR: self.end_learning_rate(),
            C.OPT_LR_WARMUP_STEPS: warmup,
            C.OPT_LR_DECAY_STEPS: self.decay_steps(),
            C.OPT_LR_DECAY_SCHEDULE: DECAY_SCHEDULE,
            C.OPT_GRADIENT_CLIP_NORM: float(self.config.gradient_clip_norm),
            C.MAX_SEQUENCE_LENGTH: self.config.data.max_sequence_length,
            MAX_STEPS: opt.max_steps,
        }

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the shared C4-format mini corpus (`mlperf_tf.data.c4`) into `data_dir`."""
        summary = c4.prepare_mini(data_dir)
        logging.info("gpt_oss_20b: mini dataset in %s: %s", data_dir, summary)
