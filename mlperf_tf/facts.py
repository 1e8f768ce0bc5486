"""Provides the value types of the facts a benchmark declares about itself for the simulator.

A benchmark declares them through the `Benchmark` contract (`mlperf_tf/benchmark.py`:
`simulator_shape()`, `convergence`); `python -m mlperf_tf.flops --write` stores them, as plain
dicts, beside the FLOP counts in the simulator's cache, and `mlperf_tf.simulate` reads them back
with `from_dict` without importing TensorFlow. Pure Python: nothing here imports TF or a benchmark.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A Transformer-family model as tensor and expert parallelism see it.

    Attributes:
      blocks: transformer blocks (encoder + decoder layers).
      allreduces_per_block: forward all-reduces per block under tensor parallelism (2:
        attention and feed-forward; 3 for a decoder block with cross-attention, averaged over
        the model).
      hidden: model width (the all-reduced activations are tokens x hidden).
      tokens_per_sample: tokens of one sample of the global batch (the Transformer's batch
        counts tokens: 1).
      ffn_parameters: weights of one block's feed-forward (what an MoE layer has per expert).
      ffn_flops_per_token: forward FLOPs of one block's feed-forward per token.
      kv_width: values per token of the keys and values a context-parallel ring pass sends
        (0: 2 x hidden, an upper bound for grouped-query attention; multi-head latent attention
        sends its full heads, 128 x (192 + 128) for DeepSeek-V3).
    """

    blocks: int
    allreduces_per_block: float
    hidden: int
    tokens_per_sample: int
    ffn_parameters: int
    ffn_flops_per_token: float
    kv_width: int = 0


@dataclasses.dataclass(frozen=True)
class Conv:
    """Convolutions of one feature-map size: `count` layers of kernel `kernel` (and `stride`)
    reading `width` x `channels` activations at height `height` (for halos: rows of width x
    channels, and columns of height x channels)."""

    count: int
    kernel: int
    height: int
    width: int
    channels: int
    stride: int = 1


@dataclasses.dataclass(frozen=True)
class Experts:
    """The mixture-of-experts layers of a model built with them (GPT-OSS), as the simulator
    splits them over `--expert_parallel`: each MoE layer holds `num_experts` feed-forwards of
    `Blocks.ffn_parameters` weights each and sends every token to `top_k` of them.

    Attributes:
      num_experts: experts per MoE layer.
      top_k: experts per token.
      every: an MoE layer every N-th block (1: every block).
      capacity_factor: slots per expert over the even share (0: dropless).
      first_dense: the first blocks that keep a dense feed-forward (DeepSeek-V3's 3): no
        experts there, so no all-to-all (`is_moe_layer`).
    """

    num_experts: int
    top_k: int
    every: int = 1
    capacity_factor: float = 0.0
    first_dense: int = 0

    def layers(self, blocks: int) -> int:
        """The MoE layers among `blocks` blocks (`is_moe_layer`'s rule)."""
        return sum(
            is_moe_layer(i, num_experts=self.num_experts, every=self.every,
                         first_dense=self.first_dense)
            for i in range(blocks)
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """Embedding tables a sample looks rows up in, sharded over every chip (TorchRec's row- and
    table-wise plans; `--expert_parallel` in this suite's runs), as the simulator charges them.

    Per sample, forward: the ids go to the rows' owners and the rows come back (two all-to-alls
    of `lookups_per_sample` ids and rows); backward: the rows' gradients go to the owners (a
    third), which update the touched rows in place (row-wise Adagrad: one accumulator per row).
    Every step the owners stream the touched rows through memory: the gather reads a row, the
    update reads the row, its gradient and its accumulator and writes both back.

    Attributes:
      parameters: the tables' weights (rows x width of every table): neither all-reduced nor
        updated densely (the simulator leaves them out of the gradient all-reduce and the dense
        optimizer's pass).
      lookups_per_sample: rows one sample gathers, over every table (a history of L events
        looks up L item, album and artist rows).
      row_bytes: bytes of one row as stored (width x bytes per value).
      id_bytes: bytes of one id sent to its owner (int64: 8).
      state_bytes_per_row: the sparse optimizer's state per row (row-wise Adagrad: one fp32).
      sent_row_bytes: bytes of one row (or its gradient) as the all-to-alls send it, where a
        run compresses them (TorchRec's quantized comms, e.g. fp16 rows of fp32 tables); 0:
        `row_bytes`.
    """

    parameters: int
    lookups_per_sample: float
    row_bytes: int
    id_bytes: int = 8
    state_bytes_per_row: int = 4
    sent_row_bytes: int = 0

    def memory_bytes_per_sample(self) -> float:
        """Bytes a sample moves through the owners' memory in one step: the gather's row read,
        and the update's row, gradient and state reads and row and state writes."""
        row, state = self.row_bytes, self.state_bytes_per_row
        return self.lookups_per_sample * (row + 3 * row + 2 * state)

    def all_to_all_bytes_per_sample(self) -> tuple[float, float, float]:
        """(ids out, rows back, gradients out): the bytes one sample sends in each of the three
        all-to-alls of a step."""
        n, sent = self.lookups_per_sample, self.sent_row_bytes or self.row_bytes
        return n * self.id_bytes, n * sent, n * sent


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """A reinforcement-learning step whose samples are generated by the policy itself
    (GRPO on agentic rollouts), as the simulator times it: generation on one pool of chips,
    training on the rest, the new weights sent from one to the other after every step.

    A rollout alternates turns: the generator prefills what is new in the context (the prompt,
    then each tool's observation) and decodes the policy's next message; the environment then
    runs the tool (`environment_s_per_turn`). Decoding is bound by memory bandwidth: each
    decoding step of one generator instance reads its share of the weights once for all its
    sequences and, per sequence, the attention layers' key/value cache over the context so far
    and the recurrent layers' state. Prefill is bound by compute (2 FLOPs per active weight per
    token).

    Attributes:
      generation_chips: chips of the generation pool over the run's chips (the reference: 48 of
        its 64 trays); the rest train.
      instance_chips: chips of one generator instance (its tensor x expert split).
      prompt_tokens: mean tokens of a rollout's first prompt.
      generated_tokens: mean tokens the policy generates in one rollout (all its turns).
      context_tokens: mean tokens of a finished rollout (prompt, messages, observations): what
        training runs on.
      turns: mean turns of a rollout.
      environment_s_per_turn: mean seconds the environment spends on one turn's tool call.
      environment_source: where that constant comes from.
      weight_bytes: bytes of the generator's weights outside the routed experts (every
        decoding step reads them).
      expert_bytes: bytes of the routed experts' weights; a decoding step reads those its
        sequences' tokens route to: of E experts per layer with top-k each, 1 - (1 - k/E)^c
        of them for c sequences (`touched_experts`).
      num_experts, top_k: the routing of the experts (0: dense).
      kv_bytes_per_token: cache bytes per context token read by one decoding step of one
        sequence (the attention layers' keys and values).
      state_bytes: recurrent state bytes per sequence read and written per decoding step (the
        linear-attention layers').
      active_parameters: weights one token multiplies (prefill's 2 FLOPs per weight).
      max_age: generation runs at most this many steps ahead of training (0: synchronous, the
        step is the sum; 1: generation of step k+1 beside training of step k, the step the
        larger of the two plus the refit; the first step's rollouts are generated with no
        training beside them).
      eval_generations: rollouts an evaluation generates per eval sample (pass@k's k), all at
        once on the generation pool like a step's; 0: the evaluation is forward passes.
      length_cv: the spread of one rollout's generated tokens over the rollouts of a step, as
        a coefficient of variation of a lognormal distribution (0: every rollout the mean). A
        step waits for its slowest rollout (`slowest`).
      length_source: where `length_cv` comes from.
      max_context_tokens: the longest context a rollout may reach (the run's
        `max_sequence_length`; 0: no limit).
      max_turns: the agent's turn limit (0: none).
      concurrency: rollouts in flight at once (the agent server's limit); a step or an
        evaluation of more rollouts runs them as a stream through that many slots: each
        instance decodes concurrency / instances at a time, and the last slot frees after
        (rollouts / concurrency - 1) mean rollouts plus the slowest (`stream_rollouts`).
        0: every rollout of a step at once.
      recompute_forward: the trainer recomputes each forward pass in its backward (full
        activation checkpointing): 4 rather than 3 forward passes' FLOPs (8 rather than 6 x
        active weights a token).
      logprob_pass: before training, the trainer runs a forward pass over the batch for the
        current policy's log-probabilities (one forward pass); generation overlaps
        it as it does the training.
      drain_before_eval: the rollouts in flight when an evaluation is due (a step's, at most
        `concurrency`, all at once) finish first, nothing overlapping them, before the
        evaluation's begin.
      refit_whole: the refit broadcasts every weight to every generator chip, each loading
        its own share of what it receives (NeMo-RL's collective refit: one broadcast from the
        first trainer to all generator workers), so each chip receives all the weights; False:
        each receives its 1/instance share.
      attention_width: the softmax-attention layers' query width summed over them (layers x
        query heads x head dim); a token attends to its own rollout's tokens before it (one
        rollout a sequence, causal), so a forward pass over a rollout of L tokens spends
        2 x 2 x width x L^2 / 2 FLOPs on its scores and weighted values, beyond the weights'
        products (`trainer_flops_per_sample`, `logprob_flops_per_sample`). 0: none counted.
      decode_step_latency_s: seconds one decoding step of a generator instance takes beyond
        its bytes at the memory bandwidth (`decode_read_bytes`): the chain of a layer's
        kernels and its tensor- or expert-parallel collectives, paid once a step whatever
        the batch (a large MoE at batch 1 decodes at 11-20 ms a token on 8 B200 where its
        bytes take under 1 ms; docs/scaling.md, "Issue 48, session 13"). 0: the bandwidth
        bound alone.
      decode_source: where `decode_step_latency_s` comes from.
      group_size: rollouts generated from one prompt (GRPO's group, whose rewards are
        normalized against each other): a step's batch is whole groups (1: any batch).
    """

    generation_chips: float
    instance_chips: int
    prompt_tokens: float
    generated_tokens: float
    context_tokens: float
    turns: float
    environment_s_per_turn: float
    environment_source: str
    weight_bytes: float
    expert_bytes: float
    num_experts: int
    top_k: int
    kv_bytes_per_token: float
    state_bytes: float
    active_parameters: float
    max_age: int = 1
    length_cv: float = 0.0
    length_source: str = ""
    max_context_tokens: float = 0.0
    max_turns: float = 0.0
    eval_generations: int = 0
    concurrency: int = 0
    recompute_forward: bool = False
    logprob_pass: bool = False
    drain_before_eval: bool = False
    refit_whole: bool = False
    attention_width: float = 0.0
    decode_step_latency_s: float = 0.0
    decode_source: str = ""
    group_size: int = 1

    def in_flight(self, rollouts: float) -> float:
        """Rollouts in flight at once when `rollouts` are due (`concurrency`)."""
        return min(rollouts, self.concurrency) if self.concurrency else rollouts

    def stream_rollouts(self, rollouts: float) -> float:
        """Mean rollouts that run one after another in a slot before the slowest's start:
        rollouts / in flight - 1 (0 when they all run at once)."""
        return rollouts / self.in_flight(rollouts) - 1.0

    def slowest_factor(self, rollouts: float) -> float:
        """The slowest of `rollouts` rollouts' generated tokens over the mean: the expected
        maximum of n lognormal draws of mean 1 and coefficient of variation `length_cv`,
        exp(sigma z_n - sigma^2 / 2) with sigma^2 = ln(1 + cv^2) and z_n Blom's normal score
        of the largest of n, the normal quantile of (n - 0.375) / (n + 0.25) (Blom 1958, the
        standard approximation of the expected largest order statistic)."""
        if self.length_cv <= 0 or rollouts <= 1:
            return 1.0
        sigma = math.sqrt(math.log1p(self.length_cv**2))
        z = statistics.NormalDist().inv_cdf((rollouts - 0.375) / (rollouts + 0.25))
        return math.exp(sigma * z - sigma**2 / 2)

    def slowest(self, rollouts: float) -> tuple[float, float, float]:
        """(generated tokens, turns, context tokens) of the slowest of `rollouts` rollouts: the
        mean rollout's scaled by `slowest_factor`, its turns (each with its observation) in
        proportion, within the turn limit and the context limit."""
        factor = self.slowest_factor(rollouts)
        generated = self.generated_tokens * factor
        turns = self.turns * factor
        if self.max_turns:
            turns = min(turns, self.max_turns)
        observations = self.context_tokens - self.prompt_tokens - self.generated_tokens
        context = self.prompt_tokens + generated + observations * turns / max(self.turns, 1e-9)
        if self.max_context_tokens and context > self.max_context_tokens:
            generated -= (
                (context - self.max_context_tokens) * generated / (context - self.prompt_tokens)
            )
            context = self.max_context_tokens
        return generated, turns, context

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one rollout: 6 x active weights x its tokens (the products of the
        forward and backward passes; attention's and the recurrent state's left out)."""
        return 6.0 * self.active_parameters * self.context_tokens

    def forward_flops_per_sample(self) -> float:
        """FLOPs of one forward pass over a rollout at the mean length L: 2 x active weights x
        L for the weights' products and 2 x `attention_width` x L^2 for the causal attention's
        (scores and weighted values, each 2 x width FLOPs a pair of tokens, over the L^2 / 2
        pairs; the recurrent layers' state updates left out)."""
        tokens = self.context_tokens
        return 2.0 * self.active_parameters * tokens + 2.0 * self.attention_width * tokens**2

    def trainer_flops_per_sample(self) -> float:
        """FLOPs the trainer's update spends on one rollout: forward and backward (3 forward
        passes' worth) and, with `recompute_forward`, the forward again in the backward (4),
        attention included (`forward_flops_per_sample`). `training_flops_per_sample` stays
        the model's FLOPs (MFU's)."""
        return (3.0 + self.recompute_forward) * self.forward_flops_per_sample()

    def logprob_flops_per_sample(self) -> float:
        """FLOPs of the trainer's log-probability pass over one rollout before its update
        (`logprob_pass`: one forward pass, `forward_flops_per_sample`; 0 without)."""
        return self.logprob_pass * self.forward_flops_per_sample()

    def decode_read_bytes(self, sequences: float, context: float) -> float:
        """Bytes one decoding step of `sequences` sequences at `context` tokens each reads
        from memory: the weights outside the routed experts once, the experts their tokens
        route to (`touched_experts`), and per sequence its key/value cache over the context
        and its recurrent state (read and written)."""
        read = self.weight_bytes + self.expert_bytes * self.touched_experts(sequences)
        return read + sequences * (self.kv_bytes_per_token * context + 2 * self.state_bytes)

    def decode_step_s(self, sequences: float, context: float, bandwidth: float) -> float:
        """Seconds of one decoding step of a generator instance whose chips read
        `bandwidth` bytes/s together: its bytes at that rate plus `decode_step_latency_s`."""
        return self.decode_read_bytes(sequences, context) / bandwidth + self.decode_step_latency_s

    def touched_experts(self, sequences: float) -> float:
        """The share of the routed experts one decoding step of `sequences` sequences reads:
        1 - (1 - k/E)^c, each sequence's token choosing k of E (uniform routing)."""
        if not self.num_experts:
            return 0.0
        return 1.0 - (1.0 - self.top_k / self.num_experts) ** max(1.0, sequences)


# Number formats a system can list a dense peak for (`--precision`); the aliases name the same
# products (AMD's MXFP4 and NVIDIA's NVFP4 are both 4-bit floats with block scales).
FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
FORMAT_ALIASES = {
    "mxfp4": "fp4",
    "nvfp4": "fp4",
    "mxfp8": "fp8",
    "bfloat16": "bf16",
    "float16": "fp16",
}


def is_moe_layer(index: int, *, num_experts: int, every: int, first_dense: int) -> bool:
    """Whether block `index` (0-based) of a decoder is a mixture-of-experts layer: every
    `every`-th block after the first `first_dense` when the model has experts (`MoEConfig`'s
    rule, here without TensorFlow for the simulator's memory count)."""
    return num_experts > 0 and index >= first_dense and (index + 1) % every == 0


def normalize_format(name: str) -> str:
    """The canonical name of a number format (`mxfp4` -> `fp4`); unknown names come back
    lower-cased, for the caller to refuse with the formats it has."""
    name = str(name).strip().lower()
    return FORMAT_ALIASES.get(name, name)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The simulator's constants of one benchmark on one family of systems, and the published
    result they come from (docs/scaling.md: at most one MLPerf result per benchmark calibrates;
    the rest are tests).

    Attributes:
      families: the system families it holds for (`System.family`: "blackwell", "hopper",
        "tpu-v3", ...); the first entry naming a system's family wins.
      compute_efficiency: the fraction of the dense peak of `precision` that the model's
        products sustain (a physically plausible value is at most 0.75); None: the system's
        default.
      precision: the number format whose dense peak `compute_efficiency` is a fraction of: the
        calibrating run's linear layers' format (its log's `lowest_numerical_precision`, or the
        submitter's config), or, for a run in several (`run_formats`), the one it is stated in.
        A run in another of FP8 and FP4 takes it at the profiled layer's rate ratio on its chip
        (`mlperf_tf.simulate.model.linear_rate`), any other format as the same fraction of
        its own peak.
      run_formats: the calibrating run's linear-layer formats and the steps it ran in each,
        from its log, where it ran in more than one (e.g. NVFP4 until a healing step, FP8
        after): the efficiency is fitted over the mixed steps. (): all in `precision`.
      source: the published result (round and path) it was fitted to, or "assumed: why".
      overlap_fraction: the part of the gradient all-reduce hidden under the backward pass, where
        this benchmark's runs differ from the system's (None: the system's).
      per_chip_batch: the default per-chip batch when no global batch is given (None: the
        system's).
      input_samples_per_s_per_host: the input pipeline's rate per host (None: unbounded).
    """

    families: tuple[str, ...]
    compute_efficiency: float | None = None
    precision: str = "bf16"
    source: str = ""
    overlap_fraction: float | None = None
    per_chip_batch: int | None = None
    input_samples_per_s_per_host: float | None = None
    run_formats: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["families"] = list(self.families)
        data["run_formats"] = [list(entry) for entry in self.run_formats]
        return {k: v for k, v in data.items() if v is not None and v != []}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        data = dict(data)
        data["families"] = tuple(data["families"])
        data["run_formats"] = tuple((str(f), int(n)) for f, n in data.get("run_formats", ()))
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class SimulatorShape:
    """What each kind of parallelism splits and sends, for `mlperf-tf simulate`, and the
    simulator's constants of the benchmark.

    Attributes:
      blocks: the transformer blocks that tensor parallelism (`--model_parallel`) splits and
        whose feed-forwards MoE layers replace (`--expert_parallel`); None: the model has none
        (the simulator refuses those flags for it, as `run` does).
      convs: the convolutions whose halos spatial partitioning (`--spatial_partition`)
        exchanges, by feature-map size, the input layer first; (): none (refused).
      batch_norms: batch-norm layers whose statistics a spatial group sums.
      experts: the model's own mixture-of-experts layers (None: dense; the simulator's
        `--config.model.moe.*` then adds experts to `blocks`, as `run` does to a dense
        Transformer or Llama).
      precision: the number format the benchmark's reference trains in (`simulate
        --precision`'s default).
      calibration: the simulator's constants per system family (`Calibration`); (): the
        systems' defaults, uncalibrated.
      attention_flops: of the training FLOPs per sample, those of attention's score and
        context products (Q·Kᵀ, P·V and their gradients) as the count makes them (the full
        S x S square). They run in `attention_precision` whatever `--precision` the linear
        layers use: Transformer Engine's FP8 and NVFP4 recipes quantize the GEMMs of its Linear
        modules, and FP8 attention is a separate switch, off by default (`DelayedScaling(
        fp8_dpa=False)`). 0: none declared (every FLOP in the run's format).
      attention_precision: the number format the reference's attention products run in
        (`simulate --attention_precision`'s default): "bf16" unless the reference turns on
        FP8 dot-product attention (NeMo's `FP8_DPA`, Megatron's `fp8_dot_product_attention`).
      output_flops: of the training FLOPs per sample, those of the output projections onto
        the vocabulary (the LM head, and each multi-token-prediction depth's), which a run may
        keep out of its low-precision recipe (`simulate --output_precision`; Megatron keeps the
        output layer in BF16 unless NeMo's `FP8_OUTPUT_PROJ` puts it in MXFP8). 0: none
        declared (counted in the run's format).
      causal: the attention is causal, so flash attention computes half of the counted
        square (FlashAttention-2, Dao 2023, sec. 3.1: blocks above the diagonal are skipped).
      pipeline_stages: uneven stage maps the reference declares over `blocks.blocks`
        ("+"-joined block counts, one map per stage count, e.g. "16+16+16+14"): a pipeline of
        that many stages is legal though it does not divide the blocks, and its longest stage
        sets the tick; (): equal stages only.
      weight_update_sharding: the reference shards its optimizer state over the data-parallel
        replicas (Megatron's distributed optimizer): `simulate` always does for it.
      reference_batch: the global batch the reference runs (`simulate`'s default; 0: the
        per-chip batch times the chips).
      recompute: the memory check counts full activation recomputation, the least any plan
        keeps (True), or none (False: a benchmark whose reference keeps its activations, e.g.
        DeepSeek-V3's v6.0 runs, `RECOMPUTE_MODULES=""`; the layouts a search finds are then
        the ones its reference's plan fits).
      embeddings: sharded embedding tables and their sparse optimizer (`Embeddings`).
      rollouts: the step is generated rollouts and training on them (`Rollouts`).
      dense_mlp_flops: forward FLOPs per sample of the feed-forwards that are not mixtures of
        experts (DeepSeek-V3's first 3 blocks): what Megatron's `recompute_modules: ['mlp']`
        runs again (`simulate --recompute_mlp`; it skips MoE layers). 0: none declared (a
        dense model's are its blocks' feed-forwards, `recomputed_mlp_flops`).
    """

    blocks: Blocks | None = None
    convs: tuple[Conv, ...] = ()
    batch_norms: int = 0
    experts: Experts | None = None
    precision: str = "bf16"
    calibration: tuple[Calibration, ...] = ()
    attention_flops: float = 0.0
    causal: bool = False
    attention_precision: str = "bf16"
    output_flops: float = 0.0
    pipeline_stages: tuple[str, ...] = ()
    weight_update_sharding: bool = False
    reference_batch: int = 0
    recompute: bool = True
    embeddings: Embeddings | None = None
    rollouts: Rollouts | None = None
    dense_mlp_flops: float = 0.0

    @property
    def recomputed_mlp_flops(self) -> float:
        """Forward FLOPs per sample that `recompute_modules: ['mlp']` runs again: the declared
        dense feed-forwards, or every block's where the model has no experts."""
        if self.dense_mlp_flops or self.experts is not None or self.blocks is None:
            return self.dense_mlp_flops
        b = self.blocks
        return b.blocks * b.ffn_flops_per_token * b.tokens_per_sample

    def as_dict(self) -> dict[str, Any]:
        """Plain dicts; `experts`, `precision`, `calibration` and the later fields only where
        declared (the entries of the cache that declare none keep their form)."""
        data = dataclasses.asdict(self)
        for name in ("pipeline_stages", "weight_update_sharding", "reference_batch",
                     "embeddings", "rollouts", "dense_mlp_flops"):  # fmt: skip
            if not data[name]:
                del data[name]
        if self.recompute:
            del data["recompute"]
        if "pipeline_stages" in data:
            data["pipeline_stages"] = list(self.pipeline_stages)
        if self.blocks is not None and not self.blocks.kv_width:
            del data["blocks"]["kv_width"]
        if self.experts is None:
            del data["experts"]
        elif not self.experts.first_dense:
            del data["experts"]["first_dense"]
        if self.precision == "bf16":
            del data["precision"]
        if self.calibration:
            data["calibration"] = [c.as_dict() for c in self.calibration]
        else:
            del data["calibration"]
        if not self.attention_flops:
            del data["attention_flops"], data["causal"]
        if self.attention_precision == "bf16":
            del data["attention_precision"]
        if not self.output_flops:
            del data["output_flops"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SimulatorShape:
        """The shape of `as_dict`'s output (None or {}: a data-parallel-only model)."""
        data = data or {}
        blocks = data.get("blocks")
        return cls(
            blocks=Blocks(**blocks) if blocks else None,
            convs=tuple(Conv(**c) for c in data.get("convs", ())),
            batch_norms=int(data.get("batch_norms", 0)),
            experts=Experts(**data["experts"]) if data.get("experts") else None,
            precision=str(data.get("precision", "bf16")),
            calibration=tuple(Calibration.from_dict(c) for c in data.get("calibration", ())),
            attention_flops=float(data.get("attention_flops", 0.0)),
            causal=bool(data.get("causal", False)),
            attention_precision=str(data.get("attention_precision", "bf16")),
            output_flops=float(data.get("output_flops", 0.0)),
            pipeline_stages=tuple(data.get("pipeline_stages", ())),
            weight_update_sharding=bool(data.get("weight_update_sharding", False)),
            reference_batch=int(data.get("reference_batch", 0)),
            recompute=bool(data.get("recompute", True)),
            embeddings=Embeddings(**data["embeddings"]) if data.get("embeddings") else None,
            rollouts=Rollouts(**data["rollouts"]) if data.get("rollouts") else None,
            dense_mlp_flops=float(data.get("dense_mlp_flops", 0.0)),
        )

    def stage_blocks(self, stages: int) -> tuple[int, ...] | None:
        """The blocks of each of `stages` pipeline stages: the declared map for that count, or
        equal runs where `stages` divides the blocks (None: neither, or no blocks)."""
        if self.blocks is None:
            return None
        for entry in self.pipeline_stages:
            counts = tuple(int(c) for c in entry.split("+"))
            if len(counts) == stages and sum(counts) == self.blocks.blocks:
                return counts
        if self.blocks.blocks % stages == 0:
            return (self.blocks.blocks // stages,) * stages
        return None

    def calibration_for(self, family: str) -> Calibration | None:
        """The first declared calibration that holds for `family` (None: none does)."""
        for entry in self.calibration:
            if family in entry.families:
                return entry
        return None


# A rule's steps rounded as the runner rounds its integer arithmetic: a + b / B computed in floats
# lands a hair off a whole step (DLRMv4's 7,000.000000001 at 8,192), which must not round away.
_EPSILON = 1e-9
_ROUNDINGS = {
    "ceil": lambda x: math.ceil(x - _EPSILON),
    "floor": lambda x: math.floor(x + _EPSILON),
    "round": round,
}


@dataclasses.dataclass(frozen=True)
class EvalCadence:
    """When a benchmark's runner evaluates, as `simulate` counts it without the benchmark's code:
    the steps of its `eval_schedule()` at any global batch B (the tests hold the two equal at
    the published runs' batches).

    A run evaluates at `first`, `first + every`, ... steps and stops at the first evaluation at
    or after the step its target falls in; an evaluation is never skipped once they begin.

    Attributes:
      every_samples: samples between evaluations, rounded up to whole steps (the runners'
        `ceil(every / B)`); 0 where the schedule is in epochs.
      every_epochs: epochs between evaluations of an epoch schedule (`epoch_eval_schedule`:
        the step of epoch e is round(e x floor(train_examples / B))); 0 for a sample schedule.
      offset_epochs: an epoch schedule's first evaluation (0: after `every_epochs`).
      first: (a, b): a sample schedule's first evaluation at a + b / B steps, rounded by
        `first_rounding` ("ceil", "floor" or "round"); (0, 0): after one interval.
      first_on_grid: the first is rounded up to a multiple of the interval (a grid from 0).
      skipped: (a, b): the first int(a x B + b) evaluations of the grid are not run (a delay
        counted in evaluations).
    """

    every_samples: float = 0.0
    every_epochs: float = 0.0
    offset_epochs: float = 0.0
    first: tuple[float, float] = (0.0, 0.0)
    first_rounding: str = "ceil"
    first_on_grid: bool = False
    skipped: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self):
        if (self.every_samples > 0) == (self.every_epochs > 0):
            raise ValueError("EvalCadence: give one of `every_samples` and `every_epochs` (> 0)")
        if self.first_rounding not in _ROUNDINGS:
            raise ValueError(f"EvalCadence: `first_rounding` {self.first_rounding!r} unknown")

    def first_and_every(self, global_batch: int, train_examples: int) -> tuple[int, int]:
        """(the first evaluation's step, steps between evaluations) at a global batch; an
        epoch schedule's interval is its first two evaluations' distance."""
        if self.every_epochs:
            per_epoch = max(1, int(train_examples) // int(global_batch))
            first = self.offset_epochs or self.every_epochs
            step = max(1, round(first * per_epoch))
            return step, max(1, round((first + self.every_epochs) * per_epoch) - step)
        every = max(1, math.ceil(self.every_samples / global_batch))
        a, b = self.first
        first = _ROUNDINGS[self.first_rounding](a + b / global_batch) if (a or b) else every
        if self.first_on_grid:
            first = max(1, math.ceil(first / every)) * every
        skipped = int(self.skipped[0] * global_batch + self.skipped[1])
        return max(1, first + skipped * every), every

    def evaluations(self, global_batch: int, train_examples: int, target_step: int) -> int:
        """Evaluations of a run whose target falls in `target_step`: those before it and the one
        at or after it that finds the target (at least one; the steps trained stay the
        convergence's, even where the first evaluation comes later)."""
        if self.every_epochs:  # each epoch rounded to a step as the runner rounds it
            per_epoch = max(1, int(train_examples) // int(global_batch))
            epoch, count = self.offset_epochs or self.every_epochs, 1
            while max(1, round(epoch * per_epoch)) < target_step:
                epoch, count = epoch + self.every_epochs, count + 1
            return count
        first, every = self.first_and_every(global_batch, train_examples)
        return 1 + max(0, math.ceil((target_step - first) / every))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalCadence:
        data = dict(data)
        for key in ("first", "skipped"):
            if key in data:
                data[key] = tuple(float(x) for x in data[key])
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Rcp:
    """MLPerf's reference convergence points of a benchmark, in the installed mlperf-logging.

    Attributes:
      file: the RCP file under `mlperf_logging/rcp_checker/`, e.g.
        "training_4.0.0/rcps_resnet.json" (the newest round whose references match the model).
      prefix: the key prefix of the entries that are this model's ("resnet_ref_").
      in_samples: the entries count samples (BERT, LLMs), not epochs.
    """

    file: str
    prefix: str
    in_samples: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"rcp": dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class StatedConvergence:
    """Epochs to target at some global batches where no RCP exists, and where they come from.

    Attributes:
      points: (global batch, epochs) pairs, smallest batch first; interpolated like RCPs.
      source: where the points come from (a stated model, not a measurement: say so).
    """

    points: tuple[tuple[int, float], ...]
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"stated": {"points": [list(p) for p in self.points], "source": self.source}}


def convergence_from_dict(data: dict[str, Any] | None) -> Rcp | StatedConvergence | None:
    """The declaration of `Rcp.as_dict` or `StatedConvergence.as_dict` (None: none declared)."""
    if not data:
        return None
    if "rcp" in data:
        return Rcp(**data["rcp"])
    stated = data["stated"]
    return StatedConvergence(
        tuple((int(b), float(e)) for b, e in stated["points"]), stated["source"]
    )


class RenamedKey(NamedTuple):
    """A log key that MLPerf renamed from one round on (BERT's `opt_epsilon`, `opt_lamb_epsilon`
    from 2.1.0): the runner logs the name of the run's round."""

    old: str
    new: str
    since: str
