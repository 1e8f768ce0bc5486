"""Provides `Llama31Benchmark`: MLPerf `llama31_8b` (Llama 3.1 8B pretraining on C4 to log
perplexity 3.3)."""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b import input as input_lib
from benchmarks.llama31_8b import model as model_lib
from mlperf_tf import flops
from mlperf_tf.benchmark import Benchmark, EvalPoint, sample_eval_schedule
from mlperf_tf.facts import Blocks, Rcp, SimulatorShape
from mlperf_tf.layers import moe
from mlperf_tf.layers.tensor_parallel import vocab_parallel_cross_entropy
from mlperf_tf.optimizers import WarmupCosineDecay, registry

# MLPerf log keys of closed_llama31_8b.yaml that `mlperf_logging.mllog.constants` spells
# differently or lacks.
MAX_STEPS = "max_steps"
DECAY_SCHEDULE = "cosine with linear warmup"


class Llama31Benchmark(Benchmark):
    """Llama 3.1 causal-LM pretraining with AdamW to the MLPerf log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (labels are the inputs
    shifted by one, see input.py) and, in eval, float32 `valid` [batch]. The quality value is
    the eval set's log perplexity: the mean next-token cross-entropy (nats) over all its tokens,
    which the run drives down to `quality_target` (`higher_is_better` is False).
    """

    name = "llama31_8b"
    mlperf_benchmark = "llama31_8b"
    config_class = config_lib.LlamaConfig
    presets = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}
    input_module = input_lib.INPUT
    higher_is_better = False
    # Samples (sequences of 8,192 tokens) to log perplexity 3.3 at global batch 16 ... 128.
    convergence = Rcp("training_5.1.0/rcps_llama31_8b.json", "llama31_8b_ref_", in_samples=True)

    config: config_lib.LlamaConfig

    def decoder_shape(self) -> flops.DecoderShape:
        """`config.model` as `mlperf_tf.flops` counts a decoder (MoE blocks: router and top-k)."""
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
        )

    def simulator_shape(self) -> SimulatorShape:
        """For `--model_parallel` and `--expert_parallel`: Megatron's two all-reduces per block
        over sequence x hidden activations; the SwiGLU feed-forward an MoE layer replaces."""
        m = self.config.model
        h, f = m.hidden_size, m.intermediate_size
        seq = self.config.data.max_sequence_length
        blocks = Blocks(m.num_hidden_layers, 2, h, seq, 3 * h * f, 2.0 * 3 * h * f)
        return SimulatorShape(blocks=blocks)

    @property
    def parallel_axes(self) -> tuple[str, ...]:
        """Data and tensor parallelism (Megatron's layers, `mlperf_tf.layers.tensor_parallel`);
        expert parallelism too when the config has MoE blocks (a dense config refuses
        --expert_parallel in one line)."""
        return ("data", "model", "expert") if self.config.model.moe.enabled else ("data", "model")

    # ---- sizes and schedule --------------------------------------------------------------------
    def parameter_count(self) -> int:
        """Parameters of `config.model` (8,030,261,248 for the `mlperf` preset), from the config
        (MoE blocks: the router and every expert)."""
        return self.config.model.parameter_count()

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
        """`opt_end_learning_rate`, or 0.1 x the base LR (NeMo's `min_lr`) when -1."""
        end = self.config.optimizer.opt_end_learning_rate
        return end if end >= 0 else config_lib.END_LR_FRACTION * self.learning_rate_and_warmup()[0]

    def decay_steps(self) -> int:
        """`opt_learning_rate_decay_steps`: max_steps - warm-up (the rules check this sum)."""
        return max(1, self.config.optimizer.max_steps - self.learning_rate_and_warmup()[1])

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `eval_every_samples` sequences (rounded up to whole steps) and at the end."""
        return sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.config.eval_every_samples,
            # The reference logs `samples_count` in the block and eval events.
            log_samples_count=True,
        )

    def tokens_per_sample(self) -> int:
        """Tokens per training sequence (`mlperf-tf bench` reports tokens/s)."""
        return self.config.data.max_sequence_length

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence from the config (`flops.decoder_training_flops_per_sample`
        of `decoder_shape()`: attention's full square, MoE blocks' active experts only)."""
        seq = self.config.data.max_sequence_length
        return flops.decoder_training_flops_per_sample(self.decoder_shape(), seq)

    def scaled_settings(self) -> dict[str, str]:
        """`max_sequence_length` when below the rules' 8,192 (the mini and smoke presets)."""
        seq = self.config.data.max_sequence_length
        if seq == config_lib.MLPERF_SEQUENCE_LENGTH:
            return {}
        return {
            C.MAX_SEQUENCE_LENGTH: f"sequence {seq} instead of "
            f"{config_lib.MLPERF_SEQUENCE_LENGTH}: a scaled-down preset"
        }

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """The Llama of `config.model` (under the strategy scope, dtype policy set).

        MoE blocks count their training capacity on the replica's static token budget (micro
        batch share x sequence length): one buffer shape on every replica, as expert
        parallelism's all-to-all needs, and the same for every --expert_parallel.
        """
        m = self.config.model
        group = None
        if m.moe.enabled:
            group = self.per_replica_batch_size * self.config.data.max_sequence_length
        return model_lib.build_model(
            m, mesh=self.mesh, moe_group_size=group,
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
        """AdamW (registry `adamw`, or `opt_name`) on the warm-up + cosine schedule.

        The schedule runs over `optimizer.max_steps`, not `train_steps`: the rules fix it.
        """
        del train_steps
        opt = self.config.optimizer
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, opt.opt_params)

    # ---- steps (replica context) ---------------------------------------------------------------
    def token_losses(
        self, model: keras.Model, batch: Any, training: bool, aux: moe.Collector | None = None
    ) -> tf.Tensor:
        """Next-token cross-entropy (nats, float32) per token [batch, seq]; the MoE layers'
        stats go to `aux`."""
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
        return moe.metric_shapes(m.moe.count(m.num_hidden_layers), m.moe.num_experts)

    def compute_loss_and_metrics(self, model: keras.Model, batch: Any, training: bool = True):
        """Mean token loss of this replica, plus the MoE layers' weighted auxiliary losses, x its
        share of the micro batch (and the MoE metrics, `moe.summarize`, if any).

        The reference's loss is the mean over its batch's tokens (every window is full); with
        gradients summed across replicas, each replica scales its mean by its share. The
        auxiliary losses are per replica (a replica's tokens are one routing group) and scaled
        alike, as the Transformer's are.
        """
        aux = moe.Collector()
        losses = self.token_losses(model, batch, training, aux=aux)
        local_batch = batch["input_ids"].shape[0]
        loss = tf.reduce_mean(losses)
        aux_loss, metrics = moe.summarize(aux)
        if aux.calls:
            loss += aux_loss
        return loss * (float(local_batch) / float(self.micro_batch_size)), metrics

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: summed token loss and token count `[batch]` (padding examples: 0).

        Expert parallelism: each replica gathers every expert once per batch
        (`MoEFeedForward.whole_experts`, one all-gather per MoE layer, as the Transformer's
        eval does) and routes its own tokens through them at the eval capacity factor, with no
        all-to-all.
        """
        with contextlib.ExitStack() as stack:
            for layer in getattr(model, "moe_layers", []):
                stack.enter_context(layer.whole_experts())
            losses = self.token_losses(model, batch, training=False)
        valid = tf.cast(batch["valid"], tf.float32)
        tokens = tf.cast(tf.shape(losses)[1], tf.float32)
        return {"loss": tf.reduce_sum(losses, axis=1) * valid, "tokens": tokens * valid}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """Log perplexity: summed token loss over the eval set's tokens (Megatron's val loss)."""
        tokens = float(state.get("tokens", 0.0))
        if tokens <= 0:
            raise ValueError("eval saw no tokens: the eval set is empty")
        return float(state["loss"]) / tokens

    def train_samples(self) -> int:
        """`train_samples`: the sequences of the whole schedule (max_steps x batch)."""
        return self.config.optimizer.max_steps * self.config.global_batch_size

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_llama31_8b.yaml (5.1.0, 6.0.0, 6.1.0); the runner adds the round's
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
        """Writes the offline mini data set (TFRecords + BPE vocabulary) into `data_dir`."""
        from benchmarks.llama31_8b import prepare  # noqa: PLC0415

        summary = prepare.prepare_mini(data_dir)
        logging.info("llama31_8b: mini dataset in %s: %s", data_dir, summary)
