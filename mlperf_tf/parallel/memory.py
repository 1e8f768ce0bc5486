"""Provides `decoder_memory`: the bytes one chip holds to train a decoder under a mesh layout
(weights, gradients, optimizer moments, activations with the pipeline's in-flight
micro-batches), and `pick_layouts`, the smallest layouts that fit a chip.

An estimate from the config, for planning (no weights are allocated). What it counts:

* weights of the chip's pipeline stage (the layers of its worst stage: the first holds the
  embedding, the last the head), tensor-split ones divided by `tensor` (attention, dense
  feed-forward, the vocabulary), experts divided by `expert` (`EXPERT_SPLIT`: not by `tensor`),
  norms replicated; `weight_bytes` each (4: Keras' mixed precision keeps float32 variables);
  a frozen base (LoRA) at `frozen_bytes`;
* gradients of the trainable weights (`grad_bytes`) and Adam's two moments (`moment_bytes` for
  both) of the stage: the moments divided by P through the stage map, and by `data` under
  weight-update sharding (`shard_moments`). The suite's runs hold exactly that at every P > 1
  (the update sharded by the stage map over `pipeline`, `mlperf_tf/collectives/stages.py`;
  each stage's replicas hold its moments whole, or with `--weight_update_sharding` divided
  evenly over `data`), except under the flag for a model with a variable two stages read (a
  tied embedding, or one an MTP head reads): its moments are then divided over P x data. The
  weights and gradients counted are the stage's, what a framework with
  stage-local variables holds; the suite's mirrored variables keep the whole model's weights
  and gradient buffers on every replica (`mlperf_tf/parallel/README.md`);
* activations kept for the backward pass, per token of a layer, in `activation_bytes` (2:
  bfloat16), with a fused attention kernel (no [seq, seq] scores kept: this suite's CPU
  attention does keep them, a GPU or TPU kernel does not) and no recomputation: the norms'
  float32 inputs (2 h x 4 bytes) and outputs (2 h), q, k, v and the attention output
  ((2 q + 2 kv) / tensor), the feed-forward's gate, up and product (3 I / tensor; an MoE layer:
  its top-k experts' 3 f per token and the dispatch and combine buffers, 2 top-k h); the
  first stage's embedding output, the last stage's float32 logits and softmax (2 x 4 V /
  tensor) for one micro-batch; times the micro-batches the schedule holds in flight on the
  stage (`pipeline.in_flight`, the schedule table's count: 1F1B at most P - s, GPipe all M).
  Tokens per chip: the micro batch x sequence / `context`. With a declared uneven stage map
  (`DecoderConfig.pipeline_layers`) the stages are the map's; the chip counted is the worst.

Options for planning a GPU framework's run (`mlperf-tf simulate`): `shard_weights` divides the
weights and gradients by `data` too (FSDP, ZeRO-3; Megatron's `data_parallel_sharding_strategy=
'optim_grads_params'`), and `precision_bytes` gives the bytes per weight of the run's number
format with Megatron's mixed-precision state (fp32 gradients, fp32 master weights and moments).
`DecoderSizes` carries what the count reads of a `DecoderConfig` as plain numbers, so that the
simulator can count without importing TensorFlow (the config's module imports Keras).

Not counted: the framework's workspace, the all-to-all and all-reduce buffers, fragmentation,
the input pipeline (a few percent to 20 % in practice).
"""

from __future__ import annotations

import dataclasses

from mlperf_tf.facts import is_moe_layer
from mlperf_tf.parallel.pipeline import in_flight as in_flight_of
from mlperf_tf.parallel.pipeline import stage_bounds

GB = 1e9


@dataclasses.dataclass(frozen=True)
class ChipLayout:
    """How a run splits the model over chips: the mesh axes' sizes that change a chip's bytes."""

    tensor: int = 1
    pipeline: int = 1
    expert: int = 1
    context: int = 1
    data: int = 1
    shard_moments: bool = False  # `--weight_update_sharding`: moments split over `data`

    def __str__(self) -> str:
        parts = [f"{k[0].upper()}{v}" for k, v in (("model", self.tensor),
                 ("pipeline", self.pipeline), ("expert", self.expert),
                 ("context", self.context)) if v > 1]  # fmt: skip
        return " x ".join(parts) or "1 chip"

    @property
    def chips(self) -> int:
        """Chips per copy of the model (the data axis aside)."""
        return self.tensor * self.pipeline * self.expert * self.context


@dataclasses.dataclass(frozen=True)
class ChipMemory:
    """Bytes one chip holds (its worst pipeline stage)."""

    weights: float
    gradients: float
    moments: float
    activations: float
    stage: int
    in_flight: int

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.moments + self.activations


def _stage_parameters(config, first: int, end: int, *, tensor: int, expert: int,
                      first_stage: bool, last_stage: bool) -> float:  # fmt: skip
    """Parameters one chip of the stage holding layers [first, end) keeps."""
    c, h = config, config.hidden_size
    experts_per_layer = c.moe_layer_parameters() - h * c.moe.num_experts if c.moe.enabled else 0
    count = 0.0
    for i in range(first, end):
        count += c.attention_parameters() / tensor + 2 * h  # norms replicated
        if c.moe.is_moe(i):
            count += h * c.moe.num_experts + experts_per_layer / expert  # router replicated
        else:
            count += c.dense_feed_forward_parameters() / tensor
    table = c.vocab_size * h / tensor
    if first_stage:
        count += table
    if last_stage:
        count += h  # the final norm
        if not c.tie_word_embeddings or not first_stage:
            count += table  # the head (a tied one is the embedding's copy on the last stage)
    return count


def _activation_bytes_per_token(config, index: int, *, tensor: int, activation_bytes: int):
    """Bytes one token keeps for the backward pass in layer `index` (see the module doc)."""
    c, a = config, activation_bytes
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    count = 2 * h * 4 + 2 * h * a + (2 * q + 2 * kv) / tensor * a
    if c.moe.is_moe(index):
        f = c.moe.filter_size or c.intermediate_size
        count += c.moe.top_k * (3 * f + 2 * h) * a + c.moe.num_experts * 4
    else:
        count += 3 * c.intermediate_size / tensor * a
    return count


def _megatron_activation_bytes_per_token(config, index: int, *, tensor: int, linear_input: float):
    """Bytes one token keeps for the backward pass in layer `index` under Megatron-Core with
    Transformer Engine (`decoder_memory(..., activation_model="megatron")`), no recomputation:

    * the two norms' bf16 inputs (2 x 2h) and each Linear's input in the run's format
      (`linear_input`: TE keeps the quantized copy its weight gradient reads): the norms'
      outputs into QKV and the first feed-forward product (2h), the attention output into
      the projection (q), the gated product into the second feed-forward product;
    * flash attention's bf16 q, k, v and output (2q + 2kv, x 2 bytes; its softmax statistics,
      a few bytes a head, aside);
    * the first feed-forward product's bf16 output (2I x 2), which SwiGLU's backward reads; an
      MoE layer: per routed copy of the token (top-k) the dispatched input (h, in the format),
      that product (2f x 2), the gated product (f, in the format) and the expert output for the
      combine (h x 2), and the router's fp32 probabilities (E x 4).

    Megatron runs tensor parallelism with sequence parallelism: all of it is divided by
    `tensor`. The logits are not kept: the v6.0 runs fuse the head with the cross entropy
    (`LinearCrossEntropyModule`, `cross_entropy_loss_fusion` in their logs).
    """
    c, b = config, linear_input
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    count = 2 * h * 2 + 2 * h * b + q * b + (2 * q + 2 * kv) * 2
    if c.moe.is_moe(index):
        f = c.moe.filter_size or c.intermediate_size
        count += c.moe.top_k * (h * b + 2 * f * 2 + f * b + h * 2) + c.moe.num_experts * 4
    else:
        count += 2 * c.intermediate_size * 2 + c.intermediate_size * b
    return count / tensor


def decoder_memory(
    config, *, seq: int, micro_batch: int, micro_batches: int, layout: ChipLayout,
    schedule: str = "1f1b", trainable_parameters: float | None = None, weight_bytes: int = 4,
    frozen_bytes: int = 2, grad_bytes: int = 4, moment_bytes: int = 8, activation_bytes: int = 2,
    shard_weights: bool = False, activation_model: str = "keras", linear_input_bytes: float = 2,
    recompute: bool = False,
) -> ChipMemory:  # fmt: skip
    """The bytes of the worst chip of `layout` training `config` (a `DecoderConfig`).

    Args:
      seq: tokens per sequence.
      micro_batch: sequences per data group in one micro-batch.
      micro_batches: M, micro-batches per step on a data group (the schedule's in-flight count).
      layout: the mesh axes' sizes.
      schedule: "1f1b" or "gpipe".
      trainable_parameters: the model's trainable parameter count when not every weight
        trains (LoRA's adapters, spread as the frozen weights are); None: all.
      weight_bytes, frozen_bytes, grad_bytes, moment_bytes, activation_bytes: bytes per
        trainable weight, frozen weight, gradient, both Adam moments, activation element.
      shard_weights: weights and gradients divided by `layout.data` too (FSDP).
      activation_model: "keras" (this suite's layers: the module doc) or "megatron" (Megatron-Core
        with Transformer Engine: `_megatron_activation_bytes_per_token`, no logits kept).
      linear_input_bytes: under "megatron", bytes of each Linear's kept input (the run's
        format: 1 for FP8).
      recompute: full activation recomputation (Megatron's `recompute_granularity=full`):
        a micro-batch keeps each layer's bf16 input (2h bytes a token, divided by `tensor`
        under sequence parallelism) and, during its backward, one layer's activations.

    Raises:
      UserError: `layout.pipeline` does not divide the layers and the config declares no map
        for it (`DecoderConfig.pipeline_layers`).
    """
    # The declared map's stages when the config has one for P (`DecoderConfig.pipeline_layers`).
    stages = stage_bounds(config.num_hidden_layers, layout.pipeline, config.pipeline_layers)
    tokens = micro_batch * seq / layout.context
    whole = config.parameter_count()
    best = None
    for s, (first, end) in enumerate(stages):
        params = _stage_parameters(
            config, first, end, tensor=layout.tensor, expert=layout.expert,
            first_stage=s == 0, last_stage=s == len(stages) - 1,
        )  # fmt: skip
        if trainable_parameters is None:
            trainable, weights = params, params * weight_bytes
        else:  # adapters spread as the base is
            trainable = trainable_parameters * params / whole
            weights = (params - trainable) * frozen_bytes + trainable * weight_bytes
        moments = trainable * moment_bytes / (layout.data if layout.shard_moments else 1)
        per_layer = _megatron_activation_bytes_per_token if activation_model == "megatron" else None
        if recompute:
            largest = max(
                per_layer(config, i, tensor=layout.tensor, linear_input=linear_input_bytes)
                if per_layer
                else _activation_bytes_per_token(
                    config, i, tensor=layout.tensor, activation_bytes=activation_bytes
                )
                for i in range(first, end)
            )  # fmt: skip
            inputs = (end - first) * 2 * config.hidden_size * activation_bytes / layout.tensor
            per_micro = tokens * (inputs + largest)
        elif per_layer:
            per_micro = tokens * sum(
                per_layer(config, i, tensor=layout.tensor, linear_input=linear_input_bytes)
                for i in range(first, end)
            )  # fmt: skip
        else:
            per_micro = tokens * sum(
                _activation_bytes_per_token(
                    config, i, tensor=layout.tensor, activation_bytes=activation_bytes
                )
                for i in range(first, end)
            )  # fmt: skip
        if s == 0:
            per_micro += tokens * config.hidden_size * activation_bytes
        in_flight = in_flight_of(
            schedule, stages=layout.pipeline, micro_batches=micro_batches, stage=s
        )
        activations = per_micro * in_flight
        if s == len(stages) - 1 and per_layer is None:  # logits and softmax, float32
            activations += tokens * 2 * 4 * config.vocab_size / layout.tensor
        gradients = trainable * grad_bytes
        if shard_weights:  # FSDP: each data replica keeps 1/data of them between uses
            weights, gradients = weights / layout.data, gradients / layout.data
        memory = ChipMemory(weights, gradients, moments, activations, s, in_flight)
        if best is None or memory.total > best.total:
            best = memory
    return best


# Bytes per weight of each number format: FP8 E4M3 one byte (MXFP8's one 8-bit scale per 32
# values adds 1/32, ignored); NVFP4 E2M1 half a byte plus one E4M3 scale per 16 values (4.5
# bits: NVIDIA, "Introducing NVFP4", 2025). A run keeps its weights in the format of its products
# (Transformer Engine's `fp8_param`, as NVIDIA's and Dell's v6.0 gpt_oss_20b logs print it).
FORMAT_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
# Megatron's mixed-precision state per trainable weight, as the v6.0 logs configure it: a bf16
# gradient buffer (`grad_reduce_in_fp32=False`) and, in the optimizer, the fp32 main gradient,
# master copy and two Adam moments (`main_grads_dtype`, `main_params_dtype`, `exp_avg_dtype`,
# `exp_avg_sq_dtype` all float32), 16 bytes, which the distributed optimizer divides by the
# data-parallel size (Megatron Core's "Distributed Optimizer" guide, docs.nvidia.com/megatron-
# core/developer-guide/latest/distrib_optimizer.html: 4 + 16/d bytes per parameter for 16-bit
# weights and gradients).
GRADIENT_BYTES = 2
OPTIMIZER_BYTES = 16


def precision_bytes(precision: str) -> dict[str, float | str]:
    """`decoder_memory`'s byte arguments for a Megatron-Core run whose products use `precision`
    (a format of `FORMAT_BYTES`): its weights, trainable and frozen, and its Linear inputs kept
    for the backward pass in that format (at most bf16); Megatron's bf16 gradient buffer and
    fp32 optimizer state; Megatron's activations (`_megatron_activation_bytes_per_token`).

    Raises:
      KeyError: an unknown format.
    """
    weight = FORMAT_BYTES[precision]
    return {
        "weight_bytes": weight, "frozen_bytes": weight, "grad_bytes": GRADIENT_BYTES,
        "moment_bytes": OPTIMIZER_BYTES, "activation_bytes": 2, "activation_model": "megatron",
        "linear_input_bytes": min(weight, 2.0),
    }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MoESizes:
    """What the count reads of a `MoEConfig` (`mlperf_tf.layers.moe`)."""

    num_experts: int = 0
    every: int = 1
    first_dense: int = 0
    top_k: int = 1
    filter_size: int = 0

    @property
    def enabled(self) -> bool:
        return self.num_experts > 0

    def is_moe(self, layer_index: int) -> bool:
        """As `MoEConfig.is_moe` (`mlperf_tf.facts.is_moe_layer`)."""
        return is_moe_layer(
            layer_index, num_experts=self.num_experts, every=self.every,
            first_dense=self.first_dense,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DecoderSizes:
    """What `decoder_memory` reads of a `DecoderConfig`, as plain numbers: the benchmark facts
    cache stores it (`mlperf_tf.flops`) and `simulate` counts from it without TensorFlow.

    Attributes:
      attention, dense_feed_forward, moe_layer, parameters: `DecoderConfig`'s
        `attention_parameters()`, `dense_feed_forward_parameters()`, `moe_layer_parameters()`
        and `parameter_count()`.
      the others: the config's fields of the same names (`moe`: its `MoEConfig`'s;
        `pipeline_layers`: its declared stage maps).
    """

    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    head_dim: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool
    attention: int
    dense_feed_forward: int
    moe_layer: int
    parameters: int
    moe: MoESizes = MoESizes()
    pipeline_layers: tuple[str, ...] = ()

    @classmethod
    def of(cls, config) -> DecoderSizes:
        """The sizes of a `DecoderConfig` (read by attribute: this module imports no model)."""
        m = config.moe
        return cls(
            num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
            vocab_size=config.vocab_size, head_dim=config.head_dim,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            intermediate_size=config.intermediate_size,
            tie_word_embeddings=bool(config.tie_word_embeddings),
            attention=int(config.attention_parameters()),
            dense_feed_forward=int(config.dense_feed_forward_parameters()),
            moe_layer=int(config.moe_layer_parameters()) if m.enabled else 0,
            parameters=int(config.parameter_count()),
            moe=MoESizes(m.num_experts, m.every, m.first_dense, m.top_k, m.filter_size),
            pipeline_layers=tuple(config.pipeline_layers),
        )  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> DecoderSizes:
        data = dict(data)
        data["moe"] = MoESizes(**data.get("moe", {}))
        data["pipeline_layers"] = tuple(data.get("pipeline_layers", ()))  # JSON: a list
        return cls(**data)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def attention_parameters(self) -> int:
        return self.attention

    def dense_feed_forward_parameters(self) -> int:
        return self.dense_feed_forward

    def moe_layer_parameters(self) -> int:
        return self.moe_layer

    def parameter_count(self) -> int:
        return self.parameters


# Layouts in the order a user tries them: the fewest chips per model copy first; tensor
# parallelism inside a node (up to 8) before pipeline stages across nodes, and experts split
# before either for an MoE model (their all-to-all is the cheapest split of the most bytes).
def candidate_layouts(*, moe: bool, num_experts: int = 1) -> list[ChipLayout]:
    out = []
    for pipeline in (1, 2, 4, 8, 16):
        for tensor in (1, 2, 4, 8):
            for expert in (1, 2, 4, 8, 16, 32) if moe else (1,):
                if moe and (expert > num_experts or num_experts % expert):
                    continue
                out.append(ChipLayout(tensor=tensor, pipeline=pipeline, expert=expert))
    return sorted(out, key=lambda lay: (lay.chips, lay.pipeline, lay.tensor))


def pick_layout(fits, layouts: list[ChipLayout]) -> ChipLayout | None:
    """The first of `layouts` for which `fits(layout)` is true (None: none fits)."""
    for layout in layouts:
        if fits(layout):
            return layout
    return None


CHIP_GB = (80, 192, 288)  # H100 / B200 / B300-class HBM
HEADROOM = 0.9  # the share of a chip's memory a plan may fill (workspace, buffers)


def memory_table(estimate, layouts: list[ChipLayout], chip_gb=CHIP_GB) -> str:
    """A markdown table: per chip size, the first of `layouts` whose `estimate(layout)` (a
    `ChipMemory`) fits `HEADROOM` of the chip, with its parts in GB."""
    lines = [
        "| chip | layout (chips per model copy) | weights | gradients | Adam moments "
        "| activations (micro-batches in flight) | total |",
        "|---|---|---|---|---|---|---|",
    ]
    for gb in chip_gb:
        layout = pick_layout(lambda lay, gb=gb: estimate(lay).total <= HEADROOM * gb * GB, layouts)
        if layout is None:
            lines.append(f"| {gb} GB | none of the layouts fits | | | | | |")
            continue
        m = estimate(layout)
        lines.append(
            f"| {gb} GB | {layout} ({layout.chips}) | {m.weights / GB:.1f} | "
            f"{m.gradients / GB:.1f} | {m.moments / GB:.1f} | "
            f"{m.activations / GB:.1f} ({m.in_flight}) | {m.total / GB:.1f} |"
        )
    return "\n".join(lines)
