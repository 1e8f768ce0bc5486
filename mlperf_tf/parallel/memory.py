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
  weight-update sharding (`shard_moments`). The suite's runs hold exactly that with
  `--weight_update_sharding` (its update sharded by the stage map over `pipeline`, then evenly
  over `data`: `mlperf_tf/collectives/stages.py`); without it every replica holds the whole
  model's moments. The weights and gradients counted are the stage's, what a framework with
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
  stage (`Schedule.in_flight`: 1F1B at most P - s, GPipe all M). Tokens per chip: the micro
  batch x sequence / `context`.

Not counted: the framework's workspace, the all-to-all and all-reduce buffers, fragmentation,
the input pipeline (a few percent to 20 % in practice).
"""

from __future__ import annotations

import dataclasses

from mlperf_tf.parallel.pipeline import Schedule, stage_bounds

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


def decoder_memory(
    config, *, seq: int, micro_batch: int, micro_batches: int, layout: ChipLayout,
    schedule: str = "1f1b", trainable_parameters: float | None = None, weight_bytes: int = 4,
    frozen_bytes: int = 2, grad_bytes: int = 4, moment_bytes: int = 8, activation_bytes: int = 2,
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

    Raises:
      UserError: `layout.pipeline` does not divide the layers.
    """
    stages = stage_bounds(config.num_hidden_layers, layout.pipeline)
    table = Schedule.build(schedule, stages=layout.pipeline, micro_batches=micro_batches)
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
        per_micro = tokens * sum(
            _activation_bytes_per_token(
                config, i, tensor=layout.tensor, activation_bytes=activation_bytes
            )
            for i in range(first, end)
        )  # fmt: skip
        if s == 0:
            per_micro += tokens * config.hidden_size * activation_bytes
        in_flight = table.in_flight(s)
        activations = per_micro * in_flight
        if s == len(stages) - 1:  # logits and softmax, float32, one micro-batch at a time
            activations += tokens * 2 * 4 * config.vocab_size / layout.tensor
        memory = ChipMemory(weights, trainable * grad_bytes, moments, activations, s, in_flight)
        if best is None or memory.total > best.total:
            best = memory
    return best


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
