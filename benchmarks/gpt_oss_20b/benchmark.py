"""Provides `GptOssBenchmark`: MLPerf `gpt_oss_20b` (GPT-OSS 20B mixture-of-experts pretraining on
C4 to log perplexity 3.34)."""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b import input as input_lib
from benchmarks.gpt_oss_20b import model as model_lib
from mlperf_tf.benchmark import Benchmark, EvalPoint, sample_eval_schedule
from mlperf_tf.data import c4
from mlperf_tf.errors import UserError
from mlperf_tf.layers import moe
from mlperf_tf.layers.tensor_parallel import vocab_parallel_cross_entropy
from mlperf_tf.optimizers import WarmupCosineDecay, registry

# MLPerf log keys of closed_gpt_oss_20b.yaml that `mlperf_logging.mllog.constants` spells
# differently or lacks.
MAX_STEPS = "max_steps"
DECAY_SCHEDULE = "cosine with linear warmup"
# Disclosure keys of the 6.1.0 common rules (`rounds` drops them for 6.0.0).
PRECISION_KEYS = (
    "lowest_numerical_precision_in_linear",
    "lowest_numerical_precision_in_attn",
    "lowest_numerical_precision_in_comm",
)
_PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}


class GptOssBenchmark(Benchmark):
    """GPT-OSS causal-LM pretraining with AdamW to the MLPerf log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (`mlperf_tf.data.
    token_windows`) and, in eval, float32 `valid` [batch]. Positions whose input token is the
    end-of-document token are left out of the loss and the eval (Megatron's `eod_mask_loss`:
    `loss_mask[tokens == eod] = 0` on the input tokens). The quality value is the eval set's log
    perplexity: the summed next-token cross-entropy (nats) over its unmasked tokens divided by
    their count, driven down to `quality_target` (`higher_is_better` is False).
    """

    name = "gpt_oss_20b"
    mlperf_benchmark = "gpt_oss_20b"
    config_class = config_lib.GptOssConfig
    presets = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}
    input_module = input_lib.INPUT
    higher_is_better = False
    parallel_axes = ("data", "model", "expert")

    config: config_lib.GptOssConfig

    # ---- sizes and schedule --------------------------------------------------------------------
    def parameter_count(self) -> int:
        """All parameters of `config.model` (20,488,418,112 for `mlperf`), from the config."""
        return self.config.model.parameter_count()

    def active_parameter_count(self) -> int:
        """Parameters one token uses (3,766,907,712 for `mlperf`): the router and its top-k
        experts of each MoE layer, everything else whole."""
        return self.config.model.active_parameter_count()

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

    def tokens_per_sample(self) -> int:
        """Tokens per training sequence (`mlperf-tf bench` reports tokens/s)."""
        return self.config.data.max_sequence_length

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence: active parameters plus attention, sliding-window
        layers at their window (`ModelConfig.training_flops`)."""
        return self.config.model.training_flops(self.config.data.max_sequence_length)

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
    def build_model(self) -> keras.Model:
        """The GPT-OSS decoder of `config.model` (under the strategy scope, dtype policy set).

        The MoE layers are dropless. Without static shapes and with all experts on this replica
        (`model.moe_dispatch` "sorted"), each expert runs on its routed rows only; otherwise
        (XLA, expert parallelism, "buffer") on a capacity buffer of the replica's static token
        count (micro batch share x sequence), one shape on every replica.
        """
        self.check_layout()
        m = self.config.model
        sorted_dispatch = (
            m.moe_dispatch == "sorted" and not self.static_shapes and self.mesh.expert == 1
        )
        return model_lib.build_model(
            m,
            group_size=self.per_replica_batch_size * self.config.data.max_sequence_length,
            sorted_dispatch=sorted_dispatch,
            seq_length=self.config.data.max_sequence_length,
        )

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

    # ---- steps (replica context) ---------------------------------------------------------------
    def loss_mask(self, batch: Any) -> tf.Tensor:
        """float32 [batch, seq]: 0 where the input token is the end-of-document token."""
        eod = self.config.data.eod_token_id
        ids = batch["input_ids"]
        if eod < 0:
            return tf.ones(tf.shape(ids), tf.float32)
        return tf.cast(tf.not_equal(ids, eod), tf.float32)

    def token_losses(
        self, model: keras.Model, batch: Any, training: bool, aux: moe.Collector | None = None
    ) -> tf.Tensor:
        """Next-token cross-entropy (nats, float32) per token [batch, seq], unmasked."""
        logits = tf.cast(model(batch["input_ids"], training=training, aux=aux), tf.float32)
        if self.mesh.model > 1:  # this shard's [batch, seq, vocab/M], never gathered
            return vocab_parallel_cross_entropy(
                logits, batch["labels"], vocab_size=self.config.model.vocab_size, smoothing=0.0,
                axis=model.axis,
            )  # fmt: skip
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=batch["labels"], logits=logits)

    def compute_loss(self, model: keras.Model, batch: Any, training: bool = True) -> tf.Tensor:
        """`compute_loss_and_metrics` without the metrics."""
        return self.compute_loss_and_metrics(model, batch, training)[0]

    def train_metric_shapes(self) -> dict[str, tuple[int, ...]]:
        m = self.config.model
        return moe.metric_shapes(m.num_hidden_layers, m.moe.num_experts)

    def compute_loss_and_metrics(self, model: keras.Model, batch: Any, training: bool = True):
        """This replica's masked mean token loss x its share of the micro batch, and the MoE
        metrics (`moe.summarize`; the auxiliary losses' coefficients are 0 in the reference).

        Megatron divides each micro batch's masked loss sum by its unmasked tokens and averages
        over data-parallel ranks; each replica here is such a rank.
        """
        aux = moe.Collector()
        losses = self.token_losses(model, batch, training, aux=aux)
        mask = self.loss_mask(batch)
        loss = tf.reduce_sum(losses * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)
        aux_loss, metrics = moe.summarize(aux)
        if aux.calls:
            loss += aux_loss
        local_batch = batch["input_ids"].shape[0]
        return loss * (float(local_batch) / float(self.micro_batch_size)), metrics

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: the summed unmasked token loss and the unmasked token count `[batch]`
        (padding examples: 0). Expert parallelism gathers each layer's experts once per batch
        (`MoEFeedForward.whole_experts`)."""
        with contextlib.ExitStack() as stack:
            for layer in getattr(model, "moe_layers", []):
                stack.enter_context(layer.whole_experts())
            losses = self.token_losses(model, batch, training=False)
        mask = self.loss_mask(batch) * tf.cast(batch["valid"], tf.float32)[:, None]
        return {"loss": tf.reduce_sum(losses * mask, axis=1), "tokens": tf.reduce_sum(mask, axis=1)}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """Log perplexity: summed loss over the eval set's unmasked tokens (Megatron's val loss)."""
        tokens = float(state.get("tokens", 0.0))
        if tokens <= 0:
            raise ValueError("eval saw no tokens: the eval set is empty")
        return float(state["loss"]) / tokens

    def train_samples(self) -> int:
        """`train_samples`: the sequences of the whole schedule (max_steps x batch)."""
        return self.config.optimizer.max_steps * self.config.global_batch_size

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_gpt_oss_20b.yaml (6.0.0, 6.1.0) and 6.1.0's disclosure keys."""
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
        precision = _PRECISION_NAMES.get(
            keras.mixed_precision.global_policy().compute_dtype, "fp32"
        )
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
            # 6.1.0 disclosure keys (precision of the run's dtype policy; the mesh's axes).
            **{key: precision for key in PRECISION_KEYS},
            "tensor_parallelism": self.mesh.model,
            "pipeline_parallelism": 1,
            "context_parallelism": 1,
            "expert_parallelism": self.mesh.expert,
            "micro_batch_size": self.per_replica_batch_size,
            "config_filename": "benchmarks/gpt_oss_20b/config.py",
        }

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the shared C4-format mini corpus (`mlperf_tf.data.c4`) into `data_dir`."""
        summary = c4.prepare_mini(data_dir)
        logging.info("gpt_oss_20b: mini dataset in %s: %s", data_dir, summary)
