"""Provides `LanguageModelBenchmark`: what every causal-LM benchmark shares (the model from its
`DecoderConfig`, the masked token loss, MoE auxiliary losses, metrics and eval scope, the mesh
axes, the token-weighted eval loss, the 6.1 disclosure keys); a benchmark subclasses it and adds
its data, optimizer, schedule and MLPerf keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import keras
import tensorflow as tf

from mlperf_tf.benchmark import Benchmark
from mlperf_tf.errors import UserError
from mlperf_tf.layers import moe
from mlperf_tf.layers.context_parallel import ContextAxis, check_sequence
from mlperf_tf.lm import loss as loss_lib
from mlperf_tf.lm.decoder import DecoderModel, build_decoder
from mlperf_tf.lm.mtp import shift_left
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.memory import (
    ChipLayout,
    ChipMemory,
    candidate_layouts,
    decoder_memory,
    memory_table,
)


def update_router_biases(model, load, rate: float) -> None:
    """Moves every MoE layer's selection bias of `model` (its `moe_layers`) by `rate` towards
    balance (`moe.aux_free_bias_update`); `load` [layers, experts]: each layer's choices per
    expert (`moe.TOKENS_PER_EXPERT`, or the `moe/load` fractions). Host or graph context."""
    for layer, layer_load in zip(model.moe_layers, tf.unstack(load), strict=True):
        layer.router_bias.assign(moe.aux_free_bias_update(layer.router_bias, layer_load, rate))


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

    Context parallelism (`--context_parallel=C`): every member of a context group receives the
    group's batch and keeps its 2 of each sequence's 2C chunks (`split_sequences`, in the step:
    token ids are 4 bytes a token, nothing beside the activations); the model attends over the
    gathered keys at true positions; each member's loss is its tokens' share of the whole
    sequences' weighted mean, and its eval sums are summed over the axis.
    """

    # The [batch, seq] tensors of a batch that context parallelism splits along the sequence.
    sequence_keys: ClassVar[tuple[str, ...]] = ("input_ids", "labels", "loss_mask")

    model_name: ClassVar[str] = "decoder"
    eod_token: ClassVar[int | None] = None
    higher_is_better = False
    sample_unit = "sequence"

    @property
    def parallel_axes(self) -> tuple[str, ...]:
        """Data, tensor, pipeline and context parallelism; expert parallelism when the config
        has MoE blocks. The model's split is exact on each (multi-token prediction included:
        its targets are shifted before the context split, `mtp_targets`, and it runs on the
        last pipeline stage, `DecoderStage`); a layout the model cannot take is a one-line
        error where it is built."""
        axes = ("data", "model", "pipeline", "context")
        return axes + ("expert",) if self.config.model.moe.enabled else axes

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

    # ---- memory ------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, float]:
        """`mlperf_tf.parallel.memory.decoder_memory`'s byte sizes where this benchmark differs
        from its defaults (a LoRA run's frozen base and trainable count)."""
        return {}

    def memory_per_chip(self, layout: ChipLayout, *, schedule: str = "1f1b",
                        micro_batch: int = 1) -> ChipMemory:  # fmt: skip
        """Bytes a chip holds to train this config under `layout` (`decoder_memory`): one
        sequence per micro-batch (Megatron's LLM default), the global batch's micro-batches
        on each data group of `layout`."""
        per_group = self.config.global_batch_size // (micro_batch * layout.data)
        return decoder_memory(
            self.config.model, seq=self.sequence_length(), micro_batch=micro_batch,
            micro_batches=max(1, per_group), layout=layout, schedule=schedule,
            **self.memory_bytes(),
        )  # fmt: skip

    def memory_layouts(self) -> list[ChipLayout]:
        """The layouts a user would try, fewest chips first, on the axes this benchmark
        supports and the sizes its model divides by."""
        m = self.config.model
        axes = self.parallel_axes
        out = []
        for layout in candidate_layouts(moe=m.moe.enabled, num_experts=m.moe.num_experts):
            if layout.pipeline > 1 and (
                "pipeline" not in axes or not m.takes_pipeline(layout.pipeline)
            ):
                continue
            if layout.expert > 1 and "expert" not in axes:
                continue
            if layout.tensor > 1 and ("model" not in axes or m.num_key_value_heads % layout.tensor):
                continue
            out.append(layout)
        return out

    def memory_table(self) -> str:
        """The README's table: per chip size (`memory.CHIP_GB`), the first layout that fits."""
        return memory_table(self.memory_per_chip, self.memory_layouts())

    # ---- building ----------------------------------------------------------------------------
    def moe_group_size(self) -> int | None:
        """Static tokens per replica for the MoE training capacity (micro batch share x
        sequence length, or with a pipeline its micro-batch's: one buffer shape on every
        replica, as expert parallelism's all-to-all needs, the same for every
        --expert_parallel); None for a dense model."""
        if not self.config.model.moe.enabled:
            return None
        tokens = self.sequence_length() // self.mesh.context  # a context member's share
        if self.mesh.pipeline > 1:  # the pipeline's micro-batches go through the layers
            return self.pipeline_micro_batch * tokens
        return self.per_replica_batch_size * tokens

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

        Raises:
          UserError: `--context_parallel` does not cut the sequence into 2C equal chunks, or
            `--expert_parallel` does not divide the experts.
        """
        check_sequence(self.sequence_length(), self.mesh.context)
        self.check_layout()
        m = self.config.model
        if self.static_shapes and m.moe.dispatch == "sorted":
            m = dataclasses.replace(m, moe=dataclasses.replace(m.moe, dispatch="buffer"))
        with use_mesh(self.mesh):
            return build_decoder(
                m, moe_group_size=self.moe_group_size(),
                collective_timeout_s=self.context.collective_timeout_s, name=self.model_name,
                model_class=self.decoder_class(),
            )  # fmt: skip

    def decoder_class(self) -> Callable[..., DecoderModel]:
        """The model class `build_model` builds (`build_decoder`'s `model_class`): `DecoderModel`;
        a benchmark with a declared parametrization returns its subclass or factory."""
        return DecoderModel

    def pipeline_stage(self, model: DecoderModel, stage: int, stages: int) -> DecoderStage:
        """Stage `stage` of `stages` of `model` for the pipeline schedule
        (`mlperf_tf.runner.pipeline`): a run of consecutive decoder layers (the config's
        declared map for `stages`, `DecoderConfig.pipeline_layers`, else equal runs), the
        embedding on the first stage, the final norm, head and loss on the last.

        Raises:
          UserError: no map for `stages` and it does not divide the layers (one line).
        """
        first, end = self.config.model.stage_bounds(stages)[stage]
        return DecoderStage(self, model, first, end)

    # ---- steps (replica context) -------------------------------------------------------------
    def context_axis(self) -> ContextAxis:
        """The mesh's `context` axis as the step's loss and batch split see it."""
        return ContextAxis("lm_batch", mesh=self.mesh, timeout_s=self.context.collective_timeout_s)

    def split_sequences(self, batch: Any) -> Any:
        """This replica's tokens of `batch` under context parallelism (its zig-zag chunks of
        every `sequence_keys` tensor); `batch` itself otherwise."""
        axis = self.context_axis()
        if axis.size == 1 or not isinstance(batch, dict):
            return batch
        return {k: axis.split(v) if k in self.sequence_keys else v for k, v in batch.items()}

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

    def update_metrics(self) -> tuple[str, ...]:
        """The MoE layers' choices per expert when they move a selection bias
        (`moe.bias_update_rate`), for `after_update`."""
        m = self.config.model.moe
        return (moe.TOKENS_PER_EXPERT,) if m.enabled and m.bias_update_rate else ()

    def after_update(self, model: keras.Model, metrics: dict[str, tf.Tensor]) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing, once per optimizer step inside the
        compiled step: every MoE layer's selection bias moves by `moe.bias_update_rate` x
        sign(mean load - load) on the step's choices per expert, summed over its micro-batches
        and replicas (`update_router_biases`). Megatron-LM does the same once per global batch
        (`megatron/core/distributed/finalize_model_grads.py`, `_update_router_expert_bias`:
        `local_tokens_per_expert` accumulated over the micro-batches, all-reduced over the
        tensor x data x context group by `moe_utils.get_updated_expert_bias`). Replicas that
        route the same tokens (a model group) or hold the whole model's counts (each pipeline
        stage, `moe.stage_metrics` combined over the stages) count them several times: every
        expert alike, so the sign is the same. Each layer's counts are its own stage's."""
        update_router_biases(
            model, metrics[moe.TOKENS_PER_EXPERT], self.config.model.moe.bias_update_rate
        )

    def mtp_targets(self, batch: Any) -> list[dict[str, tf.Tensor]]:
        """Per MTP depth k = 1..D, this replica's `input_ids` (the tokens t_{i+k} whose
        embedding the depth reads), `labels` (t_{i+k+1}) and loss `weights` (the main weights k
        positions on, 0 at the last k positions of the sequence), each shifted along the whole
        sequence of `batch` and then split like the batch (`split_sequences`): under context
        parallelism a zig-zag chunk's next tokens are the next chunk's first, held by another
        member, so the shift cannot come after the split."""
        weights = self.loss_weights(batch)  # [batch, seq]: per position, split like the batch
        axis = self.context_axis()
        return [
            {
                "input_ids": axis.split(shift_left(batch["input_ids"], k)),
                "labels": axis.split(shift_left(batch["labels"], k, fill=loss_lib.IGNORE_INDEX)),
                "weights": axis.split(shift_left(weights, k)),
            }
            for k in range(1, self.config.model.mtp_layers + 1)
        ]

    def mtp_loss(self, mtp_logits: list, targets: list[dict], axis=None, context=None):
        """The MTP depths' weighted mean token losses, summed, x `mtp_loss_weight / D`
        (`mlperf_tf.lm.mtp`) against `mtp_targets`. `axis`: the model's `ModelAxis`
        (vocabulary-split logits); `context`: the `ContextAxis` of C > 1 (the means over whole
        sequences' tokens), or None."""
        m = self.config.model
        total = tf.constant(0.0)
        for logits, target in zip(mtp_logits, targets, strict=True):
            losses = loss_lib.token_cross_entropy(
                logits, target["labels"], vocab_size=m.vocab_size, axis=axis
            )
            total += loss_lib.weighted_mean(losses, target["weights"], context)
        return total * (m.mtp_loss_weight / len(mtp_logits))

    def compute_loss_and_metrics(self, model: keras.Model, batch: Any, training: bool = True):
        """This replica's weighted mean token loss, plus the MoE layers' weighted auxiliary
        losses, x its share of the micro batch (and the MoE metrics, `moe.summarize`, if any).

        With gradients summed across replicas, each replica scales its mean by its share of the
        micro batch (with every weight 1, the mean over the micro batch's tokens: Megatron's
        and NeMo's loss when every window is full). The auxiliary losses are per replica (a
        replica's tokens are one routing group) and scaled alike.
        """
        context = self.context_axis()
        whole_sequences = context if context.size > 1 else None
        targets = None
        if self.config.model.mtp_layers and training:
            targets = self.mtp_targets(batch)  # from the whole sequences, before the split
        batch = self.split_sequences(batch)
        aux = moe.Collector()
        weights = self.loss_weights(batch)
        mtp = None
        if targets is not None:
            logits, mtp_logits = model.with_mtp(
                batch["input_ids"], training=training, aux=aux,
                next_ids=[t["input_ids"] for t in targets],
            )  # fmt: skip
            mtp = self.mtp_loss(mtp_logits, targets, axis=model.axis, context=whole_sequences)
            losses = loss_lib.token_cross_entropy(
                logits, batch["labels"], vocab_size=self.config.model.vocab_size, axis=model.axis
            )
        else:
            losses = self.token_losses(model, batch, training, aux=aux)
        local_batch = batch["input_ids"].shape[0]
        loss = loss_lib.weighted_mean(losses, weights, whole_sequences)
        aux_loss, metrics = moe.summarize(aux)
        if aux.calls:
            # Per routing group (a replica's tokens): under context parallelism the members'
            # mean, so the group's auxiliary loss counts once (the sequence-wise balance loss
            # is the whole sequences' on every member, `moe.sequence_balance_loss`).
            loss += aux_loss / context.size
        if mtp is not None:
            loss += mtp
            metrics[MTP_LOSS] = mtp
        if context.size > 1:
            # The runner averages metrics over replicas: a member's MTP loss is its tokens'
            # share (summed over the axis: the whole sequences'), its max logit its tokens' own.
            if MTP_LOSS in metrics:
                metrics[MTP_LOSS] = context.total(metrics[MTP_LOSS])
            if "moe/max_router_logit" in metrics:
                metrics["moe/max_router_logit"] = context.max(metrics["moe/max_router_logit"])
        return loss * (float(local_batch) / float(self.micro_batch_size)), metrics

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per example: summed weighted token loss and weight (token count) `[batch]`
        (padding examples: 0).

        Expert parallelism: each replica gathers every expert once per batch
        (`moe.whole_experts`, one all-gather per MoE layer) and routes its own
        tokens through them at the eval capacity factor, with no all-to-all.
        """
        context = self.context_axis()
        batch = self.split_sequences(batch)
        with moe.whole_experts(model):
            losses = self.token_losses(model, batch, training=False)
        weights = self.loss_weights(batch)
        valid = tf.cast(batch["valid"], tf.float32)
        # Context parallelism: each member's sums over its chunks, summed over the axis (the
        # evaluator counts the first replica of each group).
        return {
            "loss": context.total(tf.reduce_sum(losses * weights, axis=1) * valid),
            "tokens": context.total(tf.reduce_sum(weights, axis=1) * valid),
        }

    # ---- host side ---------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """Log perplexity: summed token loss over the eval set's counted tokens (Megatron's
        validation loss, token-weighted)."""
        tokens = float(state.get("tokens", 0.0))
        if tokens <= 0:
            raise ValueError("eval saw no tokens: the eval set is empty or all masked")
        return float(state["loss"]) / tokens


class DecoderStage:
    """One pipeline stage of a decoder: layers [first, end) (replica context).

    `forward(batch, x)` -> (hidden states [micro batch, seq, hidden], the stage's MoE auxiliary
    loss or None, its metrics) of a stage before the last (`x` None on the first: it embeds
    `input_ids`); `loss(batch, x)` -> (loss, metrics) of the last stage: the whole model's loss
    code run from layer `first` on `x` (`DecoderModel.from_stage`), multi-token prediction
    included: its depths read the embedding of the next tokens through the last stage's own
    (mirrored) copy of the table, a second lookup of the shifted ids from the micro-batch,
    whose gradient is summed with the first stage's over the `pipeline` axis like every
    weight's (no activations sent for it). Metrics are the stage's
    additive part of the model's (`moe.stage_metrics`); `metric_max` names those combined
    over the stages by a max.
    """

    metric_max = moe.STAGE_MAX_METRICS

    def __init__(self, benchmark: LanguageModelBenchmark, model: DecoderModel, first: int,
                 end: int):  # fmt: skip
        self.benchmark, self.model, self.first, self.end = benchmark, model, first, end
        self.activation_dtype = model.compute_dtype
        m = model.config
        self._moe_first = m.moe.count(first)  # MoE layers before this stage's first
        # The MTP depths' blocks (after the last layer, on the last stage) count too.
        self._moe_total = m.moe.count(m.num_hidden_layers + m.mtp_layers)
        # Every stage returns every training metric (zeros where not its own: the pipeline
        # combines them over the stages name by name), e.g. the last stage's MTP loss.
        self._metric_shapes = benchmark.train_metric_shapes()

    def activation_shape(self, batch) -> list[int]:
        """[micro batch, seq / C, hidden]: what a stage sends to the next (static; under context
        parallelism a member's tokens, to the member of the same context index)."""
        ids = batch["input_ids"]
        seq = int(ids.shape[1]) // self.benchmark.mesh.context
        return [int(ids.shape[0]), seq, self.model.config.hidden_size]

    def _metrics(self, metrics):
        out = dict(metrics)
        if self._moe_total:
            moe_metrics = {k: v for k, v in metrics.items() if k in moe.MOE_METRICS}
            out.update(moe.stage_metrics(
                moe_metrics, first=self._moe_first, total=self._moe_total,
                num_experts=self.model.config.moe.num_experts,
            ))  # fmt: skip
        for name, shape in self._metric_shapes.items():
            out.setdefault(name, tf.zeros(shape, tf.float32))
        return out

    def forward(self, batch, x):
        aux = moe.Collector()
        if x is None:  # the first stage: this context member's tokens (all of them at C = 1)
            x = self.benchmark.split_sequences(batch)["input_ids"]
        out = self.model.stage_states(x, self.first, self.end, training=True, aux=aux)
        if not aux.calls:
            return out, None, self._metrics({})
        # The micro-batch's share of the batch; under context parallelism the members' mean
        # (as `compute_loss_and_metrics` adds the auxiliary losses).
        share = float(batch["input_ids"].shape[0]) / float(self.benchmark.micro_batch_size)
        share /= self.benchmark.mesh.context
        aux_loss, metrics = moe.summarize(aux)
        return out, aux_loss * share, self._metrics(metrics)

    def loss(self, batch, x):
        with self.model.from_stage(x, self.first):
            loss, metrics = self.benchmark.compute_loss_and_metrics(
                self.model, batch, training=True
            )
        return loss, self._metrics(metrics)
