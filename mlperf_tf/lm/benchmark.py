"""Provides `LanguageModelBenchmark`: what every causal-LM benchmark shares (the model from its
`DecoderConfig`, the masked token loss, MoE auxiliary losses, metrics and eval scope, the mesh
axes, the token-weighted eval loss, the 6.1 disclosure keys); a benchmark subclasses it and adds
its data, optimizer, schedule and MLPerf keys."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import keras
import tensorflow as tf

from mlperf_tf.benchmark import Benchmark
from mlperf_tf.errors import UserError
from mlperf_tf.layers import moe
from mlperf_tf.lm import loss as loss_lib
from mlperf_tf.lm.decoder import DecoderModel, build_decoder
from mlperf_tf.lm.mtp import shift_left
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.runner.actions import Action, LoopOutput


def update_router_biases(model, load, rate: float) -> None:
    """Moves every MoE layer's selection bias of `model` (its `moe_layers`) by `rate` towards
    balance (`moe.aux_free_bias_update`); `load` [layers, experts]: each layer's fraction of
    choices per expert (the `moe/load` metric). Host or graph context."""
    for layer, layer_load in zip(model.moe_layers, tf.unstack(load), strict=True):
        layer.router_bias.assign(moe.aux_free_bias_update(layer.router_bias, layer_load, rate))


class RouterBiasUpdate(Action):
    """DeepSeek-V3's auxiliary-loss-free balancing between steps: after each host loop, every
    sigmoid MoE layer's selection bias moves by `moe.bias_update_rate` x the loop's steps
    towards balance (`mlperf_tf.layers.moe.aux_free_bias_update` of the loop's mean expert
    load, the `moe/load` metric, summed over replicas and micro batches), outside the gradient
    (Megatron's `moe_router_bias_update_rate`, applied once per optimizer step on the step's
    token counts; equal to it with `--steps_per_loop=1`)."""

    def __init__(self, rate: float):
        self.rate = float(rate)
        self.model = None

    def attach(self, controller) -> None:
        self.model = controller.model

    def after_loop(self, output: LoopOutput):
        load = output.metrics.get("moe/load")
        if load is None or self.model is None:
            return None
        update_router_biases(self.model, tf.constant(load, tf.float32), self.rate * output.steps)
        return None


# The training metric of the multi-token prediction loss (weighted, as added to the loss).
MTP_LOSS = "mtp/loss"


class LanguageModelBenchmark(Benchmark):
    """A causal language model trained on next-token cross-entropy; quality = log perplexity.

    The config must have `model` (a `mlperf_tf.lm.DecoderConfig`) and `data.max_sequence_length`.
    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (labels: the inputs shifted
    by one; `IGNORE_INDEX` where a position takes no part in the loss), optionally a float
    `loss_mask` [batch, seq], and in eval a float32 `valid` [batch] (0: a padding example).

    Class attributes to set (besides `Benchmark`'s):
      model_name: the Keras name of the model (the prefix of its variables' paths).
      eod_token: the end-of-document id whose positions the loss skips (Megatron's
        `eod_mask_loss`), or None.

    Hooks: `loss_weights(batch)` (the per-position weights), `sequence_length()`.
    """

    model_name: ClassVar[str] = "decoder"
    eod_token: ClassVar[int | None] = None
    higher_is_better = False
    sample_unit = "sequence"

    @property
    def parallel_axes(self) -> tuple[str, ...]:
        """Data and tensor parallelism; expert parallelism too when the config has MoE blocks
        (a dense config refuses --expert_parallel in one line)."""
        return ("data", "model", "expert") if self.config.model.moe.enabled else ("data", "model")

    # ---- sizes -------------------------------------------------------------------------------
    def sequence_length(self) -> int:
        """Tokens per training sequence."""
        return self.config.data.max_sequence_length

    def parameter_count(self) -> int:
        """Parameters of `config.model`, from the config (MoE: the router and every expert)."""
        return self.config.model.parameter_count()

    def active_parameter_count(self) -> int:
        """Parameters one token uses (MoE: the router and the top-k experts)."""
        return self.config.model.active_parameter_count()

    def tokens_per_sample(self) -> int:
        """Tokens per training sequence (`mlperf-tf bench` reports tokens/s)."""
        return self.sequence_length()

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence, analytic (`DecoderConfig.training_flops`)."""
        return self.config.model.training_flops(self.sequence_length())

    # ---- building ----------------------------------------------------------------------------
    def moe_group_size(self) -> int | None:
        """Static tokens per replica for the MoE training capacity (micro batch share x
        sequence length: one buffer shape on every replica, as expert parallelism's all-to-all
        needs, the same for every --expert_parallel); None for a dense model."""
        if not self.config.model.moe.enabled:
            return None
        return self.per_replica_batch_size * self.sequence_length()

    def check_layout(self) -> None:
        """Raises UserError when the mesh's expert axis does not divide the experts."""
        experts, axis = self.config.model.moe.num_experts, self.mesh.expert
        if experts and experts % axis:
            raise UserError(
                f"--expert_parallel={axis} must divide `model.moe.num_experts` ({experts})"
            )

    def build_model(self) -> DecoderModel:
        """The decoder of `config.model` (under the strategy scope, dtype policy set), built
        under this benchmark's mesh: the runner has made it ambient already; tests and tools
        that build a benchmark directly get it here.

        Dropless MoE layers with `moe.dispatch` "sorted" run each expert on its routed rows
        only; where shapes must be static (XLA) they use the capacity buffers (every expert
        over the replica's T tokens), as they do under expert parallelism.
        """
        self.check_layout()
        m = self.config.model
        if self.static_shapes and m.moe.dispatch == "sorted":
            m = dataclasses.replace(m, moe=dataclasses.replace(m.moe, dispatch="buffer"))
        with use_mesh(self.mesh):
            return build_decoder(
                m, moe_group_size=self.moe_group_size(),
                collective_timeout_s=self.context.collective_timeout_s, name=self.model_name,
            )  # fmt: skip

    # ---- steps (replica context) -------------------------------------------------------------
    def loss_weights(self, batch: Any) -> tf.Tensor:
        """float32 [batch, seq] weights of each position's loss (`mlperf_tf.lm.loss.loss_weights`:
        ignored labels, `eod_token` inputs, the batch's `loss_mask`)."""
        return loss_lib.loss_weights(
            batch["labels"], input_ids=batch["input_ids"], eod_token=self.eod_token,
            mask=batch.get("loss_mask") if isinstance(batch, dict) else None,
        )  # fmt: skip

    def token_losses(
        self, model: keras.Model, batch: Any, training: bool, aux: moe.Collector | None = None
    ) -> tf.Tensor:
        """Next-token cross-entropy (nats, float32) per position [batch, seq] (0 at ignored
        labels); the MoE layers' stats go to `aux`."""
        logits = model(batch["input_ids"], training=training, aux=aux)
        return loss_lib.token_cross_entropy(
            logits, batch["labels"], vocab_size=self.config.model.vocab_size, axis=model.axis
        )

    def compute_loss(self, model: keras.Model, batch: Any, training: bool = True) -> tf.Tensor:
        """`compute_loss_and_metrics` without the metrics."""
        return self.compute_loss_and_metrics(model, batch, training)[0]

    def train_metric_shapes(self) -> dict[str, tuple[int, ...]]:
        m = self.config.model
        shapes = moe.metric_shapes(
            m.moe.count(m.num_hidden_layers + m.mtp_layers), m.moe.num_experts
        )
        if m.mtp_layers:
            shapes[MTP_LOSS] = ()
        return shapes

    def mtp_loss(self, mtp_logits: list, batch: Any, weights: tf.Tensor, axis=None) -> tf.Tensor:
        """The MTP depths' weighted mean token losses, summed, x `mtp_loss_weight / D`
        (`mlperf_tf.lm.mtp`): depth k's targets are the labels k positions on, its weights
        the main weights k positions on (0 at the last k positions). `axis`: the model's
        `ModelAxis` (vocabulary-split logits)."""
        m = self.config.model
        total = tf.constant(0.0)
        for k, logits in enumerate(mtp_logits, start=1):
            labels = shift_left(batch["labels"], k, fill=loss_lib.IGNORE_INDEX)
            losses = loss_lib.token_cross_entropy(
                logits, labels, vocab_size=m.vocab_size, axis=axis
            )
            total += loss_lib.weighted_mean(losses, shift_left(weights, k))
        return total * (m.mtp_loss_weight / len(mtp_logits))

    def compute_loss_and_metrics(self, model: keras.Model, batch: Any, training: bool = True):
        """This replica's weighted mean token loss, plus the MoE layers' weighted auxiliary
        losses, x its share of the micro batch (and the MoE metrics, `moe.summarize`, if any).

        With gradients summed across replicas, each replica scales its mean by its share of the
        micro batch (with every weight 1, the mean over the micro batch's tokens: Megatron's
        and NeMo's loss when every window is full). The auxiliary losses are per replica (a
        replica's tokens are one routing group) and scaled alike.
        """
        aux = moe.Collector()
        weights = self.loss_weights(batch)
        mtp = None
        if self.config.model.mtp_layers and training:
            logits, mtp_logits = model.with_mtp(batch["input_ids"], training=training, aux=aux)
            mtp = self.mtp_loss(mtp_logits, batch, weights, axis=model.axis)
            losses = loss_lib.token_cross_entropy(
                logits, batch["labels"], vocab_size=self.config.model.vocab_size, axis=model.axis
            )
        else:
            losses = self.token_losses(model, batch, training, aux=aux)
        local_batch = batch["input_ids"].shape[0]
        loss = loss_lib.weighted_mean(losses, weights)
        aux_loss, metrics = moe.summarize(aux)
        if aux.calls:
            loss += aux_loss
        if mtp is not None:
            loss += mtp
            metrics[MTP_LOSS] = mtp
        return loss * (float(local_batch) / float(self.micro_batch_size)), metrics

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: summed weighted token loss and weight (token count) `[batch]`
        (padding examples: 0).

        Expert parallelism: each replica gathers every expert once per batch
        (`moe.whole_experts`, one all-gather per MoE layer) and routes its own
        tokens through them at the eval capacity factor, with no all-to-all.
        """
        with moe.whole_experts(model):
            losses = self.token_losses(model, batch, training=False)
        weights = self.loss_weights(batch)
        valid = tf.cast(batch["valid"], tf.float32)
        return {
            "loss": tf.reduce_sum(losses * weights, axis=1) * valid,
            "tokens": tf.reduce_sum(weights, axis=1) * valid,
        }

    # ---- host side ---------------------------------------------------------------------------
    def run_actions(self) -> list[Any]:
        """`RouterBiasUpdate` when the MoE layers move a selection bias (`moe.bias_update_rate`)."""
        rate = self.config.model.moe.bias_update_rate
        return [RouterBiasUpdate(rate)] if self.config.model.moe.enabled and rate else []

    def eval_result(self, state: dict[str, float]) -> float:
        """Log perplexity: summed token loss over the eval set's counted tokens (Megatron's
        validation loss, token-weighted)."""
        tokens = float(state.get("tokens", 0.0))
        if tokens <= 0:
            raise ValueError("eval saw no tokens: the eval set is empty or all masked")
        return float(state["loss"]) / tokens
