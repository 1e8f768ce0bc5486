"""Provides `MoEFeedForward`: a token-choice mixture-of-experts feed-forward layer (ST-MoE), with
expert parallelism over the mesh's `expert` axis.

The routing follows Flaxformer's `TokensChooseMaskedRouter` (google/flaxformer,
`flaxformer/architectures/moe/routing.py`, `_compute_routing_instructions`) and its two auxiliary
losses (`_load_balancing_loss`: Switch Transformer eqs. 4-6, the GShard form; `_router_z_loss`:
ST-MoE eq. 5), with these choices:

* **Top-k priority.** Every token's first choice is placed before any token's second choice
  (Flaxformer and Mesh TensorFlow's `_top_2_gating` in `mesh_tensorflow/transformer/moe.py` both
  do this); within one rank tokens go in order. A choice whose place in its expert's buffer is
  `>= capacity` is dropped: its token gets nothing from that expert, and where all its choices are
  dropped the token passes through the residual unchanged (the layer's output for it is 0).
* **Second-expert policy.** Mesh TensorFlow's `second_policy` "all" (every selected expert is
  used); its "random"/"threshold" policies that drop low-weight second choices are not offered.
* **Gates.** `router_softmax="before"`: softmax over all experts, then top-k; the gates are
  those probabilities (Flaxformer's combine array; Switch, GShard, ST-MoE). `"after"`: softmax
  over the k selected logits (Mixtral, GPT-OSS), which equals Mesh TensorFlow's top-2
  renormalization `gate_i / (gate_1 + gate_2)`. `"sigmoid"` (DeepSeek-V3, Hugging Face's
  `DeepseekV3TopkRouter`): scores `sigmoid(logits)`; the top-k is chosen on `scores + bias`
  (the layer's non-trainable `router_bias` [E], the auxiliary-loss-free balancing bias, moved
  after each optimizer step by `aux_free_bias_update`), and the gates are the chosen experts' scores
  without the bias, normalized to sum 1 (`norm_topk_prob`). DeepSeek-V3's group-limited choice
  (`num_groups`, `topk_groups`: the experts in `num_groups` equal groups, a group ranked by the
  sum of its two best biased scores, the top-k taken among the `topk_groups` best groups only;
  `inference/model.py` `Gate.forward`) and its `routed_scaling` (the gates times 2.5) are
  options of `route`.
* **Shared experts.** `shared_filter_size` > 0 adds DeepSeekMoE's always-on shared expert(s)
  (one SwiGLU of that width, the sum of the shared experts' widths), on every token, unsplit
  and replicated (not over `expert`): the layer's output is routed + shared.
* **Balance loss per sequence.** `balance_loss="sequence"` is DeepSeek-V3's sequence-wise
  auxiliary loss (arXiv 2412.19437 eqs. 17-20; Megatron's `seq_aux_loss`): the Switch form
  computed over each sequence's tokens and averaged over the sequences, scaled to the paper's
  `(E / k) sum_e f_e P_e` (1 for a balanced router).
* **Capacity.** Per expert and per group (a replica's tokens): `ceil(k * capacity_factor * T /
  experts)`, at most T (Flaxformer's `MoeLayer` writes `capacity_factor * T / experts`, k
  folded into the factor; here the factor 1.0 means exactly the slots of a balanced router,
  as in DeepSpeed and Megatron). `capacity_factor=0` is dropless: capacity T, which no expert
  can exceed (a token picks an expert at most once). T is the static `group_size` when one is
  given (so every replica's buffers have one shape), else the batch's token count.
* **Router precision.** Logits, softmax, top-k and both losses in float32 whatever the compute
  dtype (ST-MoE section 3.2, "selective precision"); optional jitter multiplies the router input
  by U(1 - eps, 1 + eps) in training (Flaxformer `_compute_router_probabilities`).

Dispatch is by index, not by the one-hot [T, E, C] masks (`dispatch_and_combine` builds those
for tests): each kept choice writes its token into row `expert * C + position` of an [E * C, d]
buffer (a scatter whose gradient is a gather), the experts run as one batched matmul over
[E, C, d], and each token gathers its choices' rows back, weighted by the gates.

Expert parallelism (`expert_parallel=P > 1`, in replica context on `mesh`): each replica holds
experts `[i * E/P, (i+1) * E/P)` of each layer (i: its index on the `expert` axis), as variables
of 1/P the size. Forward: one all-to-all over the replica's expert group sends each peer the
[E/P, C, d] buffer rows of its experts, the local experts run on [E/P, P * C, d], and a second
all-to-all returns the outputs. Backward: the same two all-to-alls in reverse order (an
all-to-all's gradient is an all-to-all). The expert weights have the layout
`mlperf_tf.parallel.layout.EXPERT_SPLIT` (split over `expert`; their gradients summed by the
runner's `GradientSummer` over `data` and `spatial`, not `expert`), the router's is replicated
(summed over every batch axis); checkpoints hold the whole [E, ...] tensors. On a mesh with a
`model` axis too, the replicas of a model group hold the same experts and exchange tokens with
the same-model-index replicas of their expert group. Routing is per
replica (a replica's tokens are one group), so a token's experts, its place in their buffers and
its output are those of the unsplit layer: P changes where the work runs, not what is computed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Literal

import keras
import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.config import ConfigError
from mlperf_tf.facts import is_moe_layer
from mlperf_tf.layers.activations import clamped_swiglu, swiglu
from mlperf_tf.layers.context_parallel import ContextAxis
from mlperf_tf.parallel import layout as mesh_layout
from mlperf_tf.parallel.context import resolve
from mlperf_tf.parallel.layout import EXPERT_SPLIT
from mlperf_tf.parallel.mesh import DeviceMesh

ROUTER_SOFTMAX = ("before", "after", "sigmoid")
BALANCE_LOSSES = ("batch", "sequence")
# Flaxformer's router initializer (`routing.default_kernel_init`): normal, stddev 2e-2.
ROUTER_STDDEV = 2e-2


@dataclasses.dataclass(frozen=True)
class Routing:
    """One group's routing decisions (float32 and int32 tensors).

    Attributes:
      logits: [T, E] router logits.
      probs: [T, E] softmax over all experts.
      expert: [T, k] the chosen experts, best first.
      position: [T, k] each choice's place in its expert's buffer (in priority order).
      kept: [T, k] bool, position < capacity.
      gates: [T, k] combine weights of the choices, 0 where dropped.
      capacity: scalar int, the buffer length per expert.
    """

    logits: tf.Tensor
    probs: tf.Tensor
    expert: tf.Tensor
    position: tf.Tensor
    kept: tf.Tensor
    gates: tf.Tensor
    capacity: tf.Tensor


@dataclasses.dataclass(frozen=True)
class MoEStats:
    """What one MoE layer reports per call (float32 scalars unless said).

    Attributes:
      balance_loss: the load-balancing loss (k for a balanced top-k router: a token counts for
        each of its k experts, Flaxformer's form; E when every token picks one expert, k = 1).
      z_loss: mean over tokens of logsumexp(logits)^2.
      load: [E] fraction of the k * T choices that picked each expert (before capacity).
      tokens: [E] the same choices counted (Megatron's `local_tokens_per_expert`): the
        selection-bias update sums them over micro-batches and replicas, exact integers.
      dropped: fraction of the k * T choices dropped past capacity.
      max_logit: max |router logit| over the group.
    """

    balance_loss: tf.Tensor
    z_loss: tf.Tensor
    load: tf.Tensor
    dropped: tf.Tensor
    max_logit: tf.Tensor
    tokens: tf.Tensor


def expert_capacity(tokens, *, num_experts: int, top_k: int, capacity_factor: float):
    """Buffer length per expert for a group of `tokens` (int or scalar tensor); 0 factor: T."""
    if capacity_factor == 0:
        return tokens
    if isinstance(tokens, int):
        return min(tokens, math.ceil(top_k * capacity_factor * tokens / num_experts))
    t = tf.cast(tokens, tf.float32)
    slots = tf.cast(tf.math.ceil(top_k * capacity_factor * t / num_experts), tf.int32)
    return tf.minimum(tf.cast(tokens, tf.int32), slots)


def route(logits, *, top_k: int, capacity, router_softmax: str = "before", bias=None,
          num_groups: int = 1, topk_groups: int = 1, routed_scaling: float = 1.0) -> Routing:  # fmt: skip
    """Token-choice top-k routing of one group (Flaxformer `TokensChooseMaskedRouter`).

    Args:
      logits: float32 [T, E] router logits.
      top_k: experts per token.
      capacity: buffer length per expert (int or scalar int tensor).
      router_softmax: "before" (gates: softmax over all experts), "after" (softmax over the
        k selected logits) or "sigmoid" (DeepSeek-V3: see the module docstring).
      bias: float32 [E], added to the sigmoid scores for the choice only ("sigmoid"; None: 0).
      num_groups, topk_groups: group-limited choice (DeepSeek-V3: 8, 4): the top-k only among
        the `topk_groups` groups whose two best (biased) scores sum highest ("sigmoid"; 1, 1:
        no limit).
      routed_scaling: a factor of the gates after their normalization (DeepSeek-V3: 2.5).

    Returns:
      The `Routing` (for "sigmoid", `probs` are the scores normalized over the experts, what the
      balance loss reads).
    """
    num_experts = logits.shape[-1]
    if router_softmax == "sigmoid":
        scores = tf.sigmoid(logits)  # [T, E]
        choice = scores if bias is None else scores + tf.cast(bias, scores.dtype)[None, :]
        if num_groups > 1:
            choice = group_limited(choice, num_groups=num_groups, topk_groups=topk_groups)
        _, expert = tf.math.top_k(choice, k=top_k)  # [T, k], best first
        picked = tf.gather(scores, expert, batch_dims=1)
        gates = picked / tf.reduce_sum(picked, axis=-1, keepdims=True)
        probs = scores / tf.reduce_sum(scores, axis=-1, keepdims=True)
    else:
        if bias is not None:
            raise ValueError("a router bias needs router_softmax='sigmoid'")
        probs = tf.nn.softmax(logits, axis=-1)  # [T, E]
        top_probs, expert = tf.math.top_k(probs, k=top_k)  # [T, k], best first
        if router_softmax == "after":
            gates = tf.nn.softmax(tf.gather(logits, expert, batch_dims=1), axis=-1)
        else:
            gates = top_probs
    # Choice-major order: all first choices, then all second choices, ...; a choice's place in
    # its expert's buffer is the number of earlier choices of that expert.
    flat = tf.reshape(tf.transpose(expert), [-1])  # [k * T]
    one_hot = tf.one_hot(flat, num_experts, dtype=tf.int32)  # [k * T, E]
    before = tf.cumsum(one_hot, axis=0, exclusive=True)
    position = tf.reduce_sum(before * one_hot, axis=-1)  # [k * T]
    position = tf.transpose(tf.reshape(position, [top_k, -1]))  # [T, k]
    kept = position < tf.cast(capacity, tf.int32)
    gates = gates * tf.cast(kept, gates.dtype)
    if routed_scaling != 1.0:
        gates = gates * routed_scaling
    return Routing(logits, probs, expert, position, kept, gates, tf.cast(capacity, tf.int32))


def group_limited(choice, *, num_groups: int, topk_groups: int):
    """`choice` [T, E] with the experts outside each token's `topk_groups` best groups set to
    -inf (DeepSeek-V3's node-limited routing, `inference/model.py` `Gate.forward` with a bias):
    the E experts are `num_groups` consecutive groups, a group's score is the sum of its two
    best choice scores (its one best when a group holds a single expert)."""
    tokens, experts = _dims2(choice)
    per_group = experts // num_groups
    grouped = tf.reshape(choice, [tokens, num_groups, per_group])  # [T, G, E/G]
    best, _ = tf.math.top_k(grouped, k=min(2, per_group))
    group_score = tf.reduce_sum(best, axis=-1)  # [T, G]
    _, groups = tf.math.top_k(group_score, k=topk_groups)  # [T, topk_groups]
    keep = tf.reduce_max(tf.one_hot(groups, num_groups, dtype=tf.float32), axis=1) > 0  # [T, G]
    masked = tf.where(keep[:, :, None], grouped, tf.constant(-math.inf, choice.dtype))
    return tf.reshape(masked, [tokens, experts])


def _dims2(t):
    """[T, E] of a 2-D tensor: T static where known, E static."""
    return (t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]), t.shape[-1]


def sequence_balance_loss(probs, expert, sequence_length: int, context=None):
    """DeepSeek-V3's sequence-wise balance loss (arXiv 2412.19437 eqs. 17-20) without its
    coefficient: per sequence of `sequence_length` consecutive tokens, `(E / k) sum_e f_e P_e`
    with f_e the fraction of the sequence's tokens that chose e and P_e the mean normalized
    score of e over the sequence; the mean over sequences (1 for a balanced router).

    Under context parallelism (`context` a `ContextAxis` of C > 1 members, each holding
    `sequence_length` of every sequence's C x `sequence_length` tokens) f and P are the whole
    sequences': the members' per-sequence sums, summed over the axis (two [B, E] all-reduces,
    forward only). The value is the unsplit one on every member; its gradient is C x this
    member's tokens' part of the unsplit gradient, so that the members' mean (the loss adds the
    auxiliary losses / C) has the unsplit gradient.

    Args:
      probs: float32 [T, E] scores normalized over the experts (`Routing.probs`).
      expert: int32 [T, k] the choices.
      sequence_length: tokens per sequence (T a multiple of it), this member's.
      context: the layer's `ContextAxis`, or None.
    """
    num_experts, top_k = probs.shape[-1], expert.shape[-1]
    chosen = tf.reduce_max(tf.one_hot(expert, num_experts, dtype=tf.float32), axis=-2)  # [T, E]
    chosen = tf.reshape(chosen, [-1, sequence_length, num_experts])  # [B, S, E]
    probs = tf.reshape(probs, [-1, sequence_length, num_experts])
    scale = float(num_experts) / float(top_k)
    if context is None or context.size == 1:
        per_sequence = tf.reduce_sum(
            tf.reduce_mean(chosen, axis=1) * tf.reduce_mean(probs, axis=1), axis=-1
        )  # [B]
        return tf.reduce_mean(per_sequence) * scale
    whole = float(sequence_length * context.size)
    fraction = context.total(tf.reduce_sum(chosen, axis=1)) / whole  # [B, E], constant
    local = tf.reduce_sum(probs, axis=1) / whole  # [B, E]: this member's part of P
    mean = context.total(local)  # [B, E], forward only
    mean += context.size * (local - tf.stop_gradient(local))  # value: the whole P
    return tf.reduce_mean(tf.reduce_sum(fraction * mean, axis=-1)) * scale


def balance_loss(probs, expert):
    """Switch/GShard load-balancing loss: E^2 * mean_e(fraction routed to e * mean prob of e).

    `fraction routed` counts a token for each expert among its top k, before capacity
    (Flaxformer `_load_balancing_loss`). k for a balanced top-k router (1.0 for Switch's top-1).
    """
    num_experts = probs.shape[-1]
    chosen = tf.reduce_max(tf.one_hot(expert, num_experts, dtype=tf.float32), axis=-2)  # [T, E]
    density = tf.reduce_mean(chosen, axis=0)
    mean_probs = tf.reduce_mean(probs, axis=0)
    return tf.reduce_mean(density * mean_probs) * float(num_experts**2)


def aux_free_bias_update(bias, load, rate: float):
    """DeepSeek-V3's auxiliary-loss-free balancing step (arXiv 2412.19437, section 2.1.2): each
    expert's selection bias moves by `rate` towards balance, `bias + rate * sign(mean(load) -
    load)` (an overloaded expert's bias falls). `load` [E]: the step's choices per expert,
    counted (`MoEStats.tokens` summed over the step's micro-batches and replicas, as Megatron's
    `get_updated_expert_bias` all-reduces `local_tokens_per_expert`) or as fractions (the
    sign is the same but where rounding breaks a tie)."""
    load = tf.cast(load, tf.float32)
    return bias + rate * tf.sign(tf.reduce_mean(load) - load)


def z_loss(logits):
    """ST-MoE eq. 5: mean over tokens of logsumexp(logits)^2."""
    return tf.reduce_mean(tf.square(tf.reduce_logsumexp(logits, axis=-1)))


def dispatch_and_combine(routing: Routing, num_experts: int, capacity: int):
    """The one-hot dispatch mask and combine array of `routing` ([T, E, C] float32 each), as
    Flaxformer's masked router returns them (for tests: the layer dispatches by index)."""
    slot = tf.one_hot(routing.position, capacity, dtype=tf.float32)  # [T, k, C] (0 past C)
    slot *= tf.cast(routing.kept, tf.float32)[..., None]
    expert = tf.one_hot(routing.expert, num_experts, dtype=tf.float32)  # [T, k, E]
    dispatch = tf.einsum("tke,tkc->tec", expert, slot)
    combine = tf.einsum("tke,tkc,tk->tec", expert, slot, routing.gates)
    return dispatch, combine


def _check(
    *, num_experts, top_k, capacity_factor, eval_capacity_factor, router_softmax,
    expert_parallel, jitter, num_groups=1, topk_groups=1, routed_scaling=1.0,
    balance_loss="batch",
):  # fmt: skip
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ConfigError(f"moe `num_experts` ({num_experts!r}) must be a positive integer")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ConfigError(
            f"moe `top_k` ({top_k!r}) must be an integer from 1 to the experts ({num_experts})"
        )
    for name, value in (
        ("capacity_factor", capacity_factor),
        ("eval_capacity_factor", eval_capacity_factor),
    ):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"moe `{name}` ({value!r}) must be >= 0 (0: dropless)")
    if router_softmax not in ROUTER_SOFTMAX:
        raise ConfigError(
            f"moe `router_softmax` ({router_softmax!r}) must be 'before', 'after' or 'sigmoid'"
        )
    if not 0 <= jitter < 1:
        raise ConfigError(f"moe `jitter` ({jitter!r}) must be in [0, 1)")
    if num_experts % expert_parallel:
        raise ConfigError(
            f"--expert_parallel={expert_parallel} must divide moe `num_experts` ({num_experts})"
        )
    for name, value in (("num_groups", num_groups), ("topk_groups", topk_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"moe `{name}` ({value!r}) must be a positive integer")
    if num_experts % num_groups:
        raise ConfigError(
            f"moe `num_groups` ({num_groups}) must divide moe `num_experts` ({num_experts})"
        )
    if topk_groups > num_groups:
        raise ConfigError(
            f"moe `topk_groups` ({topk_groups}) must be at most moe `num_groups` ({num_groups})"
        )
    if num_groups > 1 and router_softmax != "sigmoid":
        raise ConfigError(
            f"moe `num_groups` ({num_groups}) > 1 needs moe `router_softmax` 'sigmoid'"
        )
    if top_k > topk_groups * (num_experts // num_groups):
        raise ConfigError(
            f"moe `top_k` ({top_k}) exceeds the experts of moe `topk_groups` ({topk_groups}) "
            f"groups of {num_experts // num_groups}"
        )
    if not isinstance(routed_scaling, (int, float)) or not routed_scaling > 0:
        raise ConfigError(f"moe `routed_scaling` ({routed_scaling!r}) must be > 0")
    if balance_loss not in BALANCE_LOSSES:
        raise ConfigError(
            f"moe `balance_loss` ({balance_loss!r}) must be one of {', '.join(BALANCE_LOSSES)}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """A model's mixture-of-experts settings (`--config.model.moe.*`); ST-MoE's defaults.

    Attributes:
      num_experts: experts per MoE layer (0: a dense model, no MoE layer).
      every: every `every`-th feed-forward block is an MoE layer (layers every-1, 2*every-1, ...;
        1: all of them; ST-MoE uses 4, Switch 2).
      top_k: experts per token (1 Switch, 2 GShard/ST-MoE, 4 gpt-oss).
      capacity_factor: training capacity factor (0: dropless); `MoEFeedForward`.
      eval_capacity_factor: the same for evaluation (0: dropless).
      router_softmax: "before" or "after" the top-k, or "sigmoid" (DeepSeek-V3: sigmoid scores,
        a selection bias; see the module docstring).
      z_loss_coef: router z-loss coefficient (ST-MoE: 1e-3).
      balance_loss_coef: load-balancing loss coefficient (ST-MoE: 1e-2).
      jitter: router input jitter in training (0: off).
      filter_size: each expert's inner width (0: the model's feed-forward width). Top-k experts
        of width F/k cost the active FLOPs of one dense block of width F.
      first_dense: the first `first_dense` blocks stay dense (DeepSeek-V3's
        `first_k_dense_replace`, 3).
      num_groups, topk_groups: group-limited routing ("sigmoid"; see `route`).
      routed_scaling: the gates' factor (DeepSeek-V3's `routed_scaling_factor`, 2.5).
      balance_loss: "batch" (Switch's, over a replica's tokens) or "sequence" (DeepSeek-V3's
        sequence-wise form, `sequence_balance_loss`).
      shared_filter_size: width of the always-on shared expert(s) (0: none; DeepSeek-V3's
        `n_shared_experts x moe_intermediate_size`, 2,048).
      bias_update_rate: the selection bias's step per training step ("sigmoid";
        `aux_free_bias_update`, applied after each optimizer step inside the compiled step,
        `mlperf_tf.lm.benchmark.LanguageModelBenchmark.after_update`; 0: frozen).
    """

    num_experts: int = 0
    every: int = 2
    top_k: int = 2
    capacity_factor: float = 1.25
    eval_capacity_factor: float = 2.0
    router_softmax: Literal["before", "after", "sigmoid"] = "before"
    z_loss_coef: float = 1e-3
    balance_loss_coef: float = 1e-2
    jitter: float = 0.0
    filter_size: int = 0
    # "sorted": a dropless layer runs each expert on its routed rows only (`SortedMoEFeedForward`;
    # not for static shapes); "buffer": the capacity buffers.
    dispatch: Literal["buffer", "sorted"] = "buffer"
    first_dense: int = 0
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling: float = 1.0
    balance_loss: Literal["batch", "sequence"] = "batch"
    shared_filter_size: int = 0
    bias_update_rate: float = 0.0

    def __post_init__(self):
        if self.dispatch not in ("buffer", "sorted"):
            raise ConfigError(f"moe `dispatch` ({self.dispatch!r}) must be 'buffer' or 'sorted'")
        if self.dispatch == "sorted" and (self.capacity_factor or self.eval_capacity_factor):
            raise ConfigError(
                "moe `dispatch` 'sorted' is dropless: `capacity_factor` and "
                f"`eval_capacity_factor` must be 0 (got {self.capacity_factor}, "
                f"{self.eval_capacity_factor})"
            )
        if isinstance(self.filter_size, bool) or not isinstance(self.filter_size, int):
            raise ConfigError(f"moe `filter_size` ({self.filter_size!r}) must be an integer")
        if self.filter_size < 0:
            raise ConfigError(f"moe `filter_size` ({self.filter_size}) must be >= 0 (0: model's)")
        if isinstance(self.num_experts, bool) or not isinstance(self.num_experts, int):
            raise ConfigError(f"moe `num_experts` ({self.num_experts!r}) must be an integer")
        if self.num_experts < 0:
            raise ConfigError(f"moe `num_experts` ({self.num_experts}) must be >= 0 (0: dense)")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"moe `every` ({self.every!r}) must be a positive integer")
        for name in ("z_loss_coef", "balance_loss_coef"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"moe `{name}` ({value!r}) must be >= 0")
        if self.num_experts:
            _check(
                num_experts=self.num_experts, top_k=self.top_k,
                capacity_factor=self.capacity_factor,
                eval_capacity_factor=self.eval_capacity_factor,
                router_softmax=self.router_softmax, expert_parallel=1, jitter=self.jitter,
                num_groups=self.num_groups, topk_groups=self.topk_groups,
                routed_scaling=self.routed_scaling, balance_loss=self.balance_loss,
            )  # fmt: skip
        for name in ("first_dense", "shared_filter_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"moe `{name}` ({value!r}) must be an integer >= 0")
        rate = self.bias_update_rate
        if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
            raise ConfigError(f"moe `bias_update_rate` ({rate!r}) must be >= 0")
        if rate and self.router_softmax != "sigmoid":
            raise ConfigError(
                f"moe `bias_update_rate` ({rate}) needs moe `router_softmax` 'sigmoid' (the "
                "selection bias)"
            )

    @property
    def enabled(self) -> bool:
        return self.num_experts > 0

    def is_moe(self, layer_index: int) -> bool:
        """Whether feed-forward block `layer_index` (0-based) is an MoE layer."""
        return is_moe_layer(
            layer_index, num_experts=self.num_experts, every=self.every,
            first_dense=self.first_dense,
        )  # fmt: skip

    def count(self, num_layers: int) -> int:
        """MoE layers among `num_layers` blocks."""
        return sum(self.is_moe(i) for i in range(num_layers))

    def layer_parameters(
        self, *, hidden_size: int, filter_size: int, expert_mlp: str = "relu",
        expert_bias: bool = False,
    ) -> int:  # fmt: skip
        """Parameters of one MoE layer of these settings (all E experts and the router), as
        `MoEFeedForward` builds it; `filter_size`: the model's width (used when this config's
        `filter_size` is 0); `expert_bias`: the gated experts' biases."""
        d, f, e = hidden_size, self.filter_size or filter_size, self.num_experts
        if expert_mlp == "relu":
            expert = 2 * d * f + f + d
        else:
            expert = 3 * d * f + ((2 * f + d) if expert_bias else 0)
        bias = e if self.router_softmax == "sigmoid" else 0  # the non-trainable selection bias
        return d * e + bias + e * expert + 3 * d * self.shared_filter_size

    def layer(self, *, hidden_size: int, filter_size: int, **kwargs) -> MoEFeedForward:
        """The `MoEFeedForward` of these settings (`kwargs`: dropout, group_size, mesh, ...)."""
        layer_class = SortedMoEFeedForward if self.dispatch == "sorted" else MoEFeedForward
        return layer_class(
            hidden_size=hidden_size, filter_size=self.filter_size or filter_size,
            num_experts=self.num_experts,
            top_k=self.top_k, capacity_factor=self.capacity_factor,
            eval_capacity_factor=self.eval_capacity_factor, router_softmax=self.router_softmax,
            z_loss_coef=self.z_loss_coef, balance_loss_coef=self.balance_loss_coef,
            jitter=self.jitter, num_groups=self.num_groups, topk_groups=self.topk_groups,
            routed_scaling=self.routed_scaling, balance_loss=self.balance_loss,
            shared_filter_size=self.shared_filter_size, **kwargs,
        )  # fmt: skip


class Collector:
    """Collects (layer, `MoEStats`) of each MoE layer call of one forward pass.

    Passed down a model's call as an argument (Flax's `sow`, made explicit). Not a list: Keras
    copies list arguments of a layer call, so appends would be lost.
    """

    def __init__(self):
        self.calls: list[tuple[MoEFeedForward, MoEStats]] = []

    def add(self, layer: MoEFeedForward, stats: MoEStats) -> None:
        self.calls.append((layer, stats))


# The metric of each MoE layer's choices per expert [layers, E] (`MoEStats.tokens`): what the
# selection bias moves on (`aux_free_bias_update`), summed over a step's micro-batches and replicas.
TOKENS_PER_EXPERT = "moe/tokens_per_expert"


def metric_shapes(num_moe_layers: int, num_experts: int) -> dict[str, tuple[int, ...]]:
    """The training metrics `summarize` returns (`Benchmark.train_metric_shapes`)."""
    if not num_moe_layers:
        return {}
    return {
        "moe/aux_loss": (),
        "moe/balance_loss": (),
        "moe/z_loss": (),
        "moe/dropped": (),
        "moe/max_router_logit": (),
        "moe/dropped_per_layer": (num_moe_layers,),
        "moe/load": (num_moe_layers, num_experts),
        TOKENS_PER_EXPERT: (num_moe_layers, num_experts),
    }


# The names of `summarize`'s metrics.
MOE_METRICS = tuple(metric_shapes(1, 1))


def summarize(collector: Collector) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The weighted auxiliary loss of a forward pass and its metrics.

    Args:
      collector: the (layer, `MoEStats`) of each MoE layer call, in model order.

    Returns:
      (sum over layers of `layer.aux_loss(stats)`, metrics as in `metric_shapes`: the two losses
      and the dropped fraction are means over layers, the max logit a max).
    """
    calls = collector.calls
    if not calls:
        return tf.constant(0.0), {}
    stats = [s for _, s in calls]
    aux = tf.add_n([layer.aux_loss(s) for layer, s in calls])
    dropped = tf.stack([s.dropped for s in stats])
    return aux, {
        "moe/aux_loss": aux,
        "moe/balance_loss": tf.reduce_mean(tf.stack([s.balance_loss for s in stats])),
        "moe/z_loss": tf.reduce_mean(tf.stack([s.z_loss for s in stats])),
        "moe/dropped": tf.reduce_mean(dropped),
        "moe/max_router_logit": tf.reduce_max(tf.stack([s.max_logit for s in stats])),
        "moe/dropped_per_layer": dropped,
        "moe/load": tf.stack([s.load for s in stats]),
        TOKENS_PER_EXPERT: tf.stack([s.tokens for s in stats]),
    }


EXPERT_MLPS = ("relu", "swiglu", "swiglu_clamped")


class MoEFeedForward(keras.layers.Layer):
    """Mixture-of-experts feed-forward block: router, E experts, weighted combine.

    The experts are the model's own feed-forward form (`expert_mlp`): "relu", two layers with
    biases, `relu(x w_in + b_in) w_out + b_out` (Switch, ST-MoE; the Transformer's block),
    "swiglu", `(silu(x w_gate) * (x w_up)) w_down` (Mixtral's expert, Hugging Face's
    `MixtralBlockSparseTop2MLP`; Llama's block), or "swiglu_clamped", GPT-OSS's expert
    (`mlperf_tf.layers.activations.clamped_swiglu` of gate and up, limit `swiglu_limit`, alpha
    `swiglu_alpha`; Hugging Face's and keras-hub's `GptOssExperts`). The gated forms are
    bias-free unless `expert_bias` (GPT-OSS's experts have biases, the MLPerf reference's not):
    `b_gate`, `b_up` [E, f] and `b_down` [E, d], zeros at the start.

    Call on x [..., d] (e.g. [tokens, d] or [batch, length, d]) with `training`; returns
    (y [..., d] in the compute dtype, `MoEStats`). Add `aux_loss(stats)` to the training loss.

    Args:
      hidden_size: d.
      filter_size: each expert's inner width.
      num_experts: E (all experts of the layer, over every replica).
      top_k: experts per token.
      capacity_factor: training capacity factor (0: dropless); see the module docstring.
      eval_capacity_factor: the same for `training=False`.
      router_softmax: "before" or "after" the top-k, or "sigmoid" (with a non-trainable
        selection bias `router_bias` [E], zeros at the start).
      z_loss_coef, balance_loss_coef: coefficients of the two auxiliary losses (`aux_loss`).
      jitter: router input jitter amplitude in training (0: off).
      dropout: dropout on the experts' hidden activations in training.
      group_size: static tokens per group for the training capacity (None: the batch's count);
        needed for expert parallelism, whose buffers must have one shape on every replica. Eval
        uses the batch's count (see `whole_experts`).
      expert_parallel: P, replicas the experts are split over (the mesh's `expert` axis; None:
        that axis's size, 1 without a mesh).
      mesh: the run's `DeviceMesh` (None: the ambient one, `mlperf_tf.parallel.current_mesh()`;
        required when P > 1).
      collective_timeout_s: the all-to-alls' timeout (0: none).
      seed: seed of the jitter and dropout.
      expert_mlp: "relu", "swiglu" or "swiglu_clamped" (see above).
      expert_bias: biases on the gated experts' three projections ("relu" has its own always).
      swiglu_limit, swiglu_alpha: the clamped form's limit and alpha (GPT-OSS: 7, 1.702).
      kernel_initializer: the experts' input kernels' initializer (w_in; w_gate and w_up);
        None: Glorot-uniform of one expert's [d, f] (as Keras' Dense starts it).
      output_initializer: the output kernels' (w_out; w_down); None: Glorot-uniform.
      num_groups, topk_groups, routed_scaling: DeepSeek-V3's group-limited choice and gate
        factor (`route`).
      balance_loss: "batch" or "sequence" (per sequence of the input's second-to-last axis;
        `sequence_balance_loss`).
      shared_filter_size: the shared expert's width (0: none): `shared_gate`, `shared_up`
        [d, f_s] and `shared_down` [f_s, d], a SwiGLU on every token, started as the experts.
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        filter_size: int,
        num_experts: int,
        top_k: int = 2,
        capacity_factor: float = 1.25,
        eval_capacity_factor: float = 2.0,
        router_softmax: Literal["before", "after", "sigmoid"] = "before",
        z_loss_coef: float = 1e-3,
        balance_loss_coef: float = 1e-2,
        jitter: float = 0.0,
        dropout: float = 0.0,
        group_size: int | None = None,
        expert_parallel: int | None = None,
        mesh: DeviceMesh | None = None,
        collective_timeout_s: float = 0.0,
        seed: int | None = None,
        expert_mlp: Literal["relu", "swiglu", "swiglu_clamped"] = "relu",
        expert_bias: bool = False,
        swiglu_limit: float = 7.0,
        swiglu_alpha: float = 1.702,
        kernel_initializer=None,
        output_initializer=None,
        num_groups: int = 1,
        topk_groups: int = 1,
        routed_scaling: float = 1.0,
        balance_loss: str = "batch",
        shared_filter_size: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        mesh = resolve(mesh)
        if expert_parallel is None:
            expert_parallel = mesh.expert if mesh is not None else 1
        if expert_mlp not in EXPERT_MLPS:
            raise ValueError(f"expert_mlp {expert_mlp!r} must be one of {EXPERT_MLPS}")
        if expert_bias and expert_mlp == "relu":
            raise ValueError("expert_bias is for the gated experts ('relu' has its own biases)")
        _check(
            num_experts=num_experts, top_k=top_k, capacity_factor=capacity_factor,
            eval_capacity_factor=eval_capacity_factor, router_softmax=router_softmax,
            expert_parallel=expert_parallel, jitter=jitter, num_groups=num_groups,
            topk_groups=topk_groups, routed_scaling=routed_scaling, balance_loss=balance_loss,
        )  # fmt: skip
        self.num_groups, self.topk_groups = num_groups, topk_groups
        self.routed_scaling = float(routed_scaling)
        self.balance_loss_kind = balance_loss
        self.shared_filter_size = int(shared_filter_size)
        if expert_parallel > 1 and (mesh is None or mesh.expert != expert_parallel):
            raise ValueError(
                f"expert_parallel={expert_parallel} needs a mesh with that expert axis"
            )
        if expert_parallel > 1 and group_size is None:
            raise ValueError("expert parallelism needs a static `group_size`")
        self.hidden_size = hidden_size
        self.filter_size = filter_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.capacity_factor = float(capacity_factor)
        self.eval_capacity_factor = float(eval_capacity_factor)
        self.router_softmax = router_softmax
        self.z_loss_coef = float(z_loss_coef)
        self.balance_loss_coef = float(balance_loss_coef)
        self.jitter = float(jitter)
        self.dropout_rate = float(dropout)
        self.group_size = group_size
        self.expert_parallel = expert_parallel
        self.mesh = mesh
        self.collective_timeout_s = collective_timeout_s
        # The expert group: the replicas of this one's expert axis (same data, spatial and model
        # index), which hold the other experts of each layer.
        self.expert_group = AxisGroup(
            "expert", owner=self, mesh=mesh if expert_parallel > 1 else None,
            timeout_s=collective_timeout_s,
        )  # fmt: skip
        self.local_experts = num_experts // expert_parallel
        # The sequence-wise balance loss's whole-sequence statistics under context parallelism.
        self.context = ContextAxis(self, mesh=mesh, timeout_s=collective_timeout_s)
        self.expert_mlp = expert_mlp
        self.expert_bias = bool(expert_bias)
        self.swiglu_limit = float(swiglu_limit)
        self.swiglu_alpha = float(swiglu_alpha)
        self.kernel_initializer = kernel_initializer
        self.output_initializer = output_initializer
        self.seed_generator = keras.random.SeedGenerator(seed)
        self._gathered = None  # eval: the whole experts, see `whole_experts`

    def build(self, input_shape=None):
        d, f = self.hidden_size, self.filter_size
        # Router in float32 (ST-MoE "selective precision").
        self.router_kernel = self.add_weight(
            name="router_kernel",
            shape=(d, self.num_experts),
            initializer=keras.initializers.RandomNormal(stddev=ROUTER_STDDEV),
            dtype="float32",
            autocast=False,  # stays float32 inside a mixed-precision call
        )
        if self.router_softmax == "sigmoid":
            # DeepSeek-V3's `e_score_correction_bias`: moved by a rule, not by gradients.
            self.router_bias = self.add_weight(
                name="router_bias", shape=(self.num_experts,), initializer="zeros",
                dtype="float32", trainable=False, autocast=False,
            )  # fmt: skip
        # Each expert as Keras' Dense would start it unless told otherwise: Glorot-uniform
        # kernels, zero biases. The whole [E, ...] tensor is drawn once with the (seeded)
        # initializer and each replica of the expert axis gets its slice, so every E starts from
        # the same experts.
        limit = math.sqrt(6.0 / (d + f))
        kernel = self.kernel_initializer or keras.initializers.RandomUniform(-limit, limit)
        output = self.output_initializer or keras.initializers.RandomUniform(-limit, limit)
        n, mesh = self.num_experts, self.mesh if self.expert_parallel > 1 else None
        if self.expert_mlp != "relu":
            shapes = {"w_gate": (n, d, f), "w_up": (n, d, f), "w_down": (n, f, d)}
            inits = {"w_gate": kernel, "w_up": kernel, "w_down": output}
            if self.expert_bias:  # after the kernels: the kernels' seeded draws are unchanged
                shapes.update(b_gate=(n, f), b_up=(n, f), b_down=(n, d))
                inits.update(b_gate="zeros", b_up="zeros", b_down="zeros")
        else:
            shapes = {"w_in": (n, d, f), "b_in": (n, f), "w_out": (n, f, d), "b_out": (n, d)}
            inits = {"w_in": kernel, "b_in": "zeros", "w_out": output, "b_out": "zeros"}
        self._expert_names = tuple(shapes)
        for name, shape in shapes.items():
            weight = mesh_layout.add_split_weight(
                self, name=name, shape=shape, initializer=inits[name], layout=EXPERT_SPLIT,
                mesh=mesh,
            )  # fmt: skip
            setattr(self, name, weight)
        if self.shared_filter_size:
            fs = self.shared_filter_size
            for name, shape, init in (
                ("shared_gate", (d, fs), kernel), ("shared_up", (d, fs), kernel),
                ("shared_down", (fs, d), output),
            ):  # fmt: skip
                setattr(self, name, self.add_weight(name=name, shape=shape, initializer=init))
        super().build(input_shape)

    @property
    def expert_weights(self) -> list:
        """The per-expert variables (leading dimension: this replica's experts): w_in, b_in,
        w_out, b_out ("relu") or w_gate, w_up, w_down (the gated forms), then b_gate, b_up,
        b_down with `expert_bias`."""
        return [getattr(self, name) for name in self._expert_names]

    def aux_loss(self, stats: MoEStats):
        """`balance_loss_coef * balance_loss + z_loss_coef * z_loss` (float32 scalar)."""
        return self.balance_loss_coef * stats.balance_loss + self.z_loss_coef * stats.z_loss

    # ---- forward -------------------------------------------------------------------------------
    def router_logits(self, tokens, training):
        """float32 [T, E] logits of `tokens` [T, d] (jittered in training)."""
        x = tf.cast(tokens, tf.float32)
        if training and self.jitter > 0:
            noise = keras.random.uniform(
                tf.shape(x), 1.0 - self.jitter, 1.0 + self.jitter, seed=self.seed_generator
            )
            x = x * noise
        return tf.matmul(x, self.router_kernel)

    def capacity(self, tokens, training):
        factor = self.capacity_factor if training else self.eval_capacity_factor
        if training and self.group_size is not None:
            tokens = self.group_size
        return expert_capacity(
            tokens, num_experts=self.num_experts, top_k=self.top_k, capacity_factor=factor
        )

    def call(self, x, training=False):
        shape = tf.shape(x)
        tokens = tf.reshape(x, [-1, self.hidden_size])  # [T, d]
        num_tokens = tf.shape(tokens)[0]
        capacity = self.capacity(num_tokens, training)
        routing = route(
            self.router_logits(tokens, training),
            top_k=self.top_k,
            capacity=capacity,
            router_softmax=self.router_softmax,
            bias=self.router_bias if self.router_softmax == "sigmoid" else None,
            num_groups=self.num_groups, topk_groups=self.topk_groups,
            routed_scaling=self.routed_scaling,
        )  # fmt: skip
        # Row of each choice in the [E * C + 1, d] buffer; dropped choices write the spare row.
        rows = self.num_experts * capacity
        index = routing.expert * capacity + routing.position  # [T, k]
        index = tf.where(routing.kept, index, rows)
        token_of = tf.repeat(tf.range(num_tokens)[:, None], self.top_k, axis=1)  # [T, k]
        buffer = tf.scatter_nd(
            tf.reshape(index, [-1, 1]),
            tf.gather(tokens, tf.reshape(token_of, [-1])),
            tf.stack([rows + 1, self.hidden_size]),
        )[:rows]
        buffer = tf.reshape(buffer, [self.num_experts, capacity, self.hidden_size])
        out = self._experts_everywhere(buffer, training)  # [E, C, d]
        out = tf.concat(
            [tf.reshape(out, [rows, self.hidden_size]), tf.zeros([1, self.hidden_size], out.dtype)],
            axis=0,
        )
        picked = tf.gather(out, index)  # [T, k, d]
        y = tf.einsum("tkd,tk->td", picked, tf.cast(routing.gates, picked.dtype))
        y = self._add_shared(tokens, y)
        stats = self._stats(routing, x)
        return tf.reshape(y, shape), stats

    def _add_shared(self, tokens, y):
        """`y` [T, d] plus the shared expert's output on `tokens` [T, d] (when there is one)."""
        if not self.shared_filter_size:
            return y
        x = tf.cast(tokens, self.compute_dtype)
        gate = tf.matmul(x, tf.cast(self.shared_gate, self.compute_dtype))
        up = tf.matmul(x, tf.cast(self.shared_up, self.compute_dtype))
        shared = tf.matmul(swiglu(gate, up), tf.cast(self.shared_down, self.compute_dtype))
        return y + tf.cast(shared, y.dtype)

    def _stats(self, routing: Routing, x=None) -> MoEStats:
        choices = tf.cast(tf.size(routing.expert), tf.float32)
        tokens = tf.reduce_sum(
            tf.one_hot(routing.expert, self.num_experts, dtype=tf.float32), axis=[0, 1]
        )  # [E]
        load = tokens / tf.maximum(choices, 1.0)
        dropped = 1.0 - tf.reduce_sum(tf.cast(routing.kept, tf.float32)) / tf.maximum(choices, 1.0)
        if self.balance_loss_kind == "sequence":
            balance = sequence_balance_loss(
                routing.probs, routing.expert, x.shape[-2], context=self.context
            )
        else:
            balance = balance_loss(routing.probs, routing.expert)
        return MoEStats(
            balance_loss=balance,
            z_loss=z_loss(routing.logits),
            load=load,
            dropped=dropped,
            max_logit=tf.reduce_max(tf.abs(routing.logits)),
            tokens=tokens,
        )

    def _expert_ffn(self, x, weights, training):
        """Experts on their buffers: x [e, n, d] with weights of e experts -> [e, n, d]."""
        weights = [tf.cast(w, self.compute_dtype) for w in weights]
        if self.expert_mlp == "relu":
            w_in, b_in, w_out, b_out = weights
            h = tf.nn.relu(tf.einsum("end,edf->enf", x, w_in) + b_in[:, None, :])
        else:
            w_gate, w_up, w_out = weights[:3]
            b_gate, b_up, b_out = weights[3:] if self.expert_bias else (None, None, None)
            gate = tf.einsum("end,edf->enf", x, w_gate)
            up = tf.einsum("end,edf->enf", x, w_up)
            if self.expert_bias:
                gate, up = gate + b_gate[:, None, :], up + b_up[:, None, :]
            if self.expert_mlp == "swiglu_clamped":
                h = clamped_swiglu(gate, up, limit=self.swiglu_limit, alpha=self.swiglu_alpha)
            else:
                h = swiglu(gate, up)
        if training and self.dropout_rate > 0:
            h = keras.random.dropout(h, self.dropout_rate, seed=self.seed_generator)
        y = tf.einsum("enf,efd->end", h, w_out)
        return y if b_out is None else y + b_out[:, None, :]

    def _experts_everywhere(self, buffer, training):
        """[E, C, d] buffers -> the experts' outputs [E, C, d], wherever the experts live."""
        buffer = tf.cast(buffer, self.compute_dtype)
        if self._gathered is not None:  # eval with the whole experts gathered on this replica
            return self._expert_ffn(buffer, self._gathered, training)
        if self.expert_parallel == 1:
            return self._expert_ffn(buffer, self.expert_weights, training)
        p, e = self.expert_parallel, self.local_experts
        capacity = tf.shape(buffer)[1]
        send = tf.reshape(buffer, [p, e, -1, self.hidden_size])  # row j: peer j's experts
        received = self.expert_group.all_to_all(send, "dispatch")
        # [p (source), e, C, d] -> [e, p * C, d]: each local expert's buffer from every source.
        local = tf.reshape(tf.transpose(received, [1, 0, 2, 3]), [e, -1, self.hidden_size])
        out = self._expert_ffn(local, self.expert_weights, training)
        out = tf.transpose(tf.reshape(out, [e, p, -1, self.hidden_size]), [1, 0, 2, 3])
        back = self.expert_group.all_to_all(out, "combine")  # [p, e, C, d]
        return tf.reshape(back, [self.num_experts, capacity, self.hidden_size])

    @contextlib.contextmanager
    def whole_experts(self):
        """Within it (replica context, one trace), calls use every expert of the layer,
        all-gathered once over the expert group: for eval, whose decoding loop may run a
        different number of steps on each replica and so cannot hold collectives."""
        if self.expert_parallel == 1:
            yield
            return
        gathered = [
            self.expert_group.all_gather(tf.convert_to_tensor(w), f"gather{i}")
            for i, w in enumerate(self.expert_weights)
        ]  # each [E, ...]
        self._gathered = gathered
        try:
            yield
        finally:
            self._gathered = None


@contextlib.contextmanager
def whole_experts(model):
    """Within it, every MoE layer of `model` (its `moe_layers`; a model without them has none)
    runs on its whole experts (`MoEFeedForward.whole_experts`): the eval scope of every MoE
    benchmark, written once. Eval steps may differ in length across replicas (a decoding loop
    stops when its batch is done), so they cannot hold expert parallelism's all-to-alls: each
    replica gathers every expert once per batch and routes its own tokens through them."""
    with contextlib.ExitStack() as stack:
        for layer in getattr(model, "moe_layers", ()):
            stack.enter_context(layer.whole_experts())
        yield


# ---- dropless dispatch by sorting (single-replica experts) ----------------------------------------


def sorted_expert_outputs(tokens, expert, gates, num_experts: int, expert_fn):
    """Dropless mixture output computing only the chosen (token, expert) pairs.

    The k * T choices are grouped by expert (`tf.dynamic_partition`, a stable sort by expert
    id), each expert runs once on exactly the rows routed to it, and the rows go back to their
    choices (`tf.dynamic_stitch`) to be summed with the gates. Work is k * T rows, where the
    dropless capacity buffer runs every expert over T rows (E * T); the values are the buffer
    path's (the same rows through the same weights). The shapes depend on the routing, so this
    is not for XLA or TPUs: use the buffer path where shapes must be static.

    Args:
      tokens: [T, d] the layer's input rows.
      expert: int32 [T, k] chosen experts.
      gates: float [T, k] their combine weights.
      num_experts: E.
      expert_fn: (e, rows [n, d]) -> expert e's output [n, d], any n >= 0.

    Returns:
      [T, d]: sum over a token's choices of gate x its expert's output on it.
    """
    num_tokens, top_k = tf.shape(expert)[0], expert.shape[1]
    flat = tf.reshape(expert, [-1])  # [k * T], token-major
    choice = tf.range(tf.size(flat))
    rows = tf.gather(tokens, choice // top_k)  # [k * T, d]
    parts = tf.dynamic_partition(rows, flat, num_experts)
    where = tf.dynamic_partition(choice, flat, num_experts)
    outs = [expert_fn(e, part) for e, part in enumerate(parts)]
    picked = tf.reshape(tf.dynamic_stitch(where, outs), [num_tokens, top_k, -1])  # [T, k, d]
    return tf.einsum("tkd,tk->td", picked, tf.cast(gates, picked.dtype))


class SortedMoEFeedForward(MoEFeedForward):
    """`MoEFeedForward`, dropless, that runs each expert on its routed rows only
    (`sorted_expert_outputs`) when its experts are all on this replica; with expert parallelism
    or gathered eval experts it is the buffer path. Its capacity factors must be 0 (dropless).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.capacity_factor or self.eval_capacity_factor:
            raise ValueError(
                "SortedMoEFeedForward is dropless: capacity_factor and eval_capacity_factor "
                f"must be 0 (got {self.capacity_factor}, {self.eval_capacity_factor})"
            )

    def call(self, x, training=False):
        if self.expert_parallel > 1 or self._gathered is not None:
            return super().call(x, training=training)
        shape = tf.shape(x)
        tokens = tf.reshape(x, [-1, self.hidden_size])  # [T, d]
        routing = route(
            self.router_logits(tokens, training),
            top_k=self.top_k,
            capacity=tf.shape(tokens)[0],
            router_softmax=self.router_softmax,
            bias=self.router_bias if self.router_softmax == "sigmoid" else None,
            num_groups=self.num_groups, topk_groups=self.topk_groups,
            routed_scaling=self.routed_scaling,
        )  # fmt: skip
        weights = self.expert_weights
        compute = tf.cast(tokens, self.compute_dtype)

        def expert_fn(e, rows):
            return self._expert_ffn(rows[None], [w[e : e + 1] for w in weights], training)[0]

        y = sorted_expert_outputs(
            compute, routing.expert, routing.gates, self.num_experts, expert_fn
        )
        y = self._add_shared(tokens, y)
        return tf.reshape(y, shape), self._stats(routing, x)


def stage_metrics(
    metrics: dict[str, tf.Tensor], *, first: int, total: int, num_experts: int
) -> dict[str, tf.Tensor]:
    """`summarize`'s metrics of one pipeline stage's MoE layers (`first`.. in model order, of
    `total`; experts per layer `num_experts`) as the stage's additive part of the whole model's: per-layer rows placed at the
    stage's layers (zeros elsewhere), means over the stage's layers weighted by its share of the
    layers; `moe/max_router_logit` stays the stage's max. Summed over the stages (the max one
    maxed: `STAGE_MAX_METRICS`), they are `summarize` of the whole model. With no MoE layer on
    the stage: zeros of `metric_shapes`.
    """
    if not metrics:
        return {
            name: tf.zeros(s, tf.float32) for name, s in metric_shapes(total, num_experts).items()
        }
    count = int(metrics["moe/dropped_per_layer"].shape[0])
    share = count / total
    out = {}
    for name, value in metrics.items():
        value = tf.cast(value, tf.float32)
        if name in ("moe/dropped_per_layer", "moe/load", TOKENS_PER_EXPERT):
            pad = [[first, total - first - count]] + [[0, 0]] * (value.shape.rank - 1)
            out[name] = tf.pad(value, pad)
        elif name in ("moe/balance_loss", "moe/z_loss", "moe/dropped"):
            out[name] = value * share
        else:  # the aux loss (a sum over layers) and the max
            out[name] = value
    return out


# The metrics of `stage_metrics` that combine over stages by a max (the others by a sum).
STAGE_MAX_METRICS = ("moe/max_router_logit",)
