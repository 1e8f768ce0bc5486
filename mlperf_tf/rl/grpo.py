"""Provides GRPO's math: group advantages, the token-level clipped policy loss with sequence-mask
truncated importance sampling, the log-probability error mask, overlong filtering and pass@k.

Each function follows NeMo-RL at the commit the MLPerf reference pins
(`NVIDIA-NeMo/RL` 3fca04c9b313d313302923a5bb6b0c8dc0340ed6): `nemo_rl/algorithms/
advantage_estimator.py` `GRPOAdvantageEstimator`, `nemo_rl/algorithms/utils.py`
`calculate_baseline_and_std_per_prompt` and `masked_mean`, `nemo_rl/algorithms/loss/
loss_functions.py` `ClippedPGLossFn`, `nemo_rl/algorithms/grpo.py`
`compute_and_apply_seq_logprob_error_masking` and its overlong filtering. The tests check each
against a NumPy transcription of those formulas.

Layouts: a step's rollouts are `[prompts, generations]` in prompt-major order (rollout
`p * G + g` is generation g of prompt p, as NeMo-RL repeats each prompt G times); token tensors
are `[rollouts, length]` and already aligned to the token they score (NeMo-RL's `[:, 1:]`).
All functions run in replica context or eagerly; none issues a collective.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mlperf_tf.config import ConfigError
from mlperf_tf.layers.tensor_parallel import vocab_parallel_cross_entropy

# NeMo-RL's constants: `GRPOAdvantageEstimator` divides by std + 1e-6; `masked_mean` adds 1e-8 to
# its denominator.
ADVANTAGE_EPSILON = 1e-6
MASKED_MEAN_EPSILON = 1e-8
TIS_TYPES = ("tis", "icepop", "seq-mask-tis")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLossConfig:
    """The clipped policy-gradient loss's settings, named as NeMo-RL's `loss_fn` block.

    Defaults are the MLPerf reference's (`qwen_35/configs/grpo_qwen35_397b_swe_openhands_async.yaml`):
    asymmetric clipping 0.2 / 0.28 with the on-policy ratio forced (`force_on_policy_ratio`),
    token-level loss, no KL term, `seq-mask-tis` importance sampling with bounds 0.999 / 1.002.
    """

    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.28
    force_on_policy_ratio: bool = True
    token_level_loss: bool = True
    reference_policy_kl_penalty: float = 0.0
    use_importance_sampling_correction: bool = True
    truncated_importance_sampling_type: str = "seq-mask-tis"
    truncated_importance_sampling_ratio_min: float = 0.999
    truncated_importance_sampling_ratio: float = 1.002

    def __post_init__(self):
        for name in ("ratio_clip_min", "ratio_clip_max"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"`{name}` ({getattr(self, name)}) must be in [0, 1).")
        if self.reference_policy_kl_penalty != 0.0:
            raise ConfigError(
                f"`reference_policy_kl_penalty` ({self.reference_policy_kl_penalty}): the "
                "reference policy pass is not implemented (the MLPerf recipe sets 0)."
            )
        if not self.token_level_loss:
            raise ConfigError("`token_level_loss` (False): only the token-level loss is built.")
        tis = self.truncated_importance_sampling_type
        if tis not in TIS_TYPES + ("",):
            raise ConfigError(
                f"`truncated_importance_sampling_type` ({tis!r}) must be one of {TIS_TYPES} or ''."
            )
        if tis and not self.use_importance_sampling_correction:
            raise ConfigError(
                f"`truncated_importance_sampling_type` ({tis!r}) needs "
                "`use_importance_sampling_correction`."
            )
        lo, hi = (
            self.truncated_importance_sampling_ratio_min,
            self.truncated_importance_sampling_ratio,
        )
        if tis and not 0.0 <= lo <= hi:
            raise ConfigError(
                f"`truncated_importance_sampling_ratio_min` ({lo}) must be in "
                f"[0, truncated_importance_sampling_ratio ({hi})]."
            )


def _float(x) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(x), tf.float32)


def group_advantages(rewards, *, leave_one_out: bool = True, normalize: bool = True) -> tf.Tensor:
    """GRPO advantages of one step's rewards: reward minus its group's baseline, over the std.

    The baseline of generation g is the mean reward of its prompt's other generations
    (leave-one-out, RLOO) or of all of them; the std is the matching sample std (NeMo-RL's
    `(E[r^2] - E[r]^2) * n / (n - 1)` over the same members, n = G - 1 when leaving one out). A
    group whose std is 0 (all rewards equal) keeps its unnormalized advantage, which is 0
    without leave-one-out and 0 with it too (every member's baseline is its own reward).

    Args:
      rewards: `[prompts, generations]` float rewards.
      leave_one_out: NeMo-RL's `use_leave_one_out_baseline`.
      normalize: NeMo-RL's `normalize_rewards` (divide by std + 1e-6 where std > 0).

    Returns:
      `[prompts, generations]` float32 advantages (one per rollout; every token of a rollout
      gets its rollout's advantage).

    Raises:
      ConfigError: a group of fewer than 2 generations, which has no baseline.
    """
    rewards = _float(rewards)
    if rewards.shape.rank != 2:
        raise ValueError(f"`rewards` must be [prompts, generations], got shape {rewards.shape}.")
    g = rewards.shape[1]
    if g is None or g < 2:
        raise ConfigError(
            f"`num_generations_per_prompt` ({g}): GRPO needs at least 2 generations per prompt "
            "(a group of one has no baseline and no advantage)."
        )
    n = g - int(leave_one_out)  # members of each baseline
    total = tf.reduce_sum(rewards, axis=1, keepdims=True)
    total_sq = tf.reduce_sum(tf.square(rewards), axis=1, keepdims=True)
    if leave_one_out:
        baseline = (total - rewards) / n
        mean_sq = (total_sq - tf.square(rewards)) / n
    else:
        baseline = tf.broadcast_to(total / n, tf.shape(rewards))
        mean_sq = tf.broadcast_to(total_sq / n, tf.shape(rewards))
    advantages = rewards - baseline
    if not normalize:
        return advantages
    if n > 1:
        var = (mean_sq - tf.square(baseline)) * (n / (n - 1))
        # NeMo-RL's sqrt(...).nan_to_num(0): a rounding-negative variance gives std 0.
        std = tf.sqrt(tf.maximum(var, 0.0))
    else:  # G = 2 leaving one out: one member, no spread.
        std = tf.zeros_like(rewards)
    return tf.where(std > 0, advantages / (std + ADVANTAGE_EPSILON), advantages)


def masked_mean(values, mask, axis=None, normalizer=None) -> tf.Tensor:
    """NeMo-RL's `masked_mean`: sum(values * mask) / (normalizer or sum(mask), + 1e-8)."""
    values, mask = _float(values), _float(mask)
    denominator = tf.reduce_sum(mask, axis=axis) if normalizer is None else _float(normalizer)
    return tf.reduce_sum(values * mask, axis=axis) / (denominator + MASKED_MEAN_EPSILON)


def overlong_filter(sample_mask, truncated) -> tf.Tensor:
    """Drops rollouts cut at the length limit from the update (NeMo-RL `overlong_filtering`).

    Args:
      sample_mask: `[rollouts]` 0/1 weights (NeMo-RL's `loss_multiplier`).
      truncated: `[rollouts]` bool, True where generation stopped at the length limit.

    Returns:
      `[rollouts]` float32: the mask with truncated rollouts set to 0.
    """
    return tf.where(tf.cast(truncated, tf.bool), 0.0, _float(sample_mask))


def sequence_logprob_error(generation_logprobs, prev_logprobs, token_mask, sample_mask):
    """Each rollout's mean of exp(|generation - recomputed log-prob|) over its valid tokens.

    NeMo-RL's `seq_mult_prob_error`: the mask inside the exponent as well as outside, over
    `token_mask * sample_mask`; a rollout with no valid token gets 0.

    Returns:
      `[rollouts]` float32.
    """
    mask = _float(token_mask) * _float(sample_mask)[:, None]
    error = tf.abs(_float(generation_logprobs) - _float(prev_logprobs))
    num = tf.reduce_sum(tf.exp(error * mask) * mask, axis=-1)
    denom = tf.reduce_sum(mask, axis=-1)
    return tf.where(denom > 0, num / tf.maximum(denom, 1.0), 0.0)


def logprob_error_mask(generation_logprobs, prev_logprobs, token_mask, sample_mask, threshold):
    """The sample mask with rollouts whose log-prob error exceeds `threshold` set to 0.

    NeMo-RL `compute_and_apply_seq_logprob_error_masking` (`grpo.seq_logprob_error_threshold`,
    2.0 in the MLPerf recipe): kept where `sequence_logprob_error <= threshold`.

    Returns:
      `[rollouts]` float32 sample mask.
    """
    error = sequence_logprob_error(generation_logprobs, prev_logprobs, token_mask, sample_mask)
    return tf.cast(error <= threshold, tf.float32) * _float(sample_mask)


def clipped_policy_loss(
    curr_logprobs,
    generation_logprobs,
    advantages,
    token_mask,
    sample_mask,
    *,
    config: PolicyLossConfig,
    prev_logprobs=None,
    global_valid_tokens=None,
):
    """NeMo-RL's `ClippedPGLossFn` at the token level, without KL.

    loss = sum_t w_t max(-A_t r_t, -A_t clip(r_t, 1 - eps_lo, 1 + eps_hi)) m_t / N, with r_t
    = pi_theta / pi_old (forced to exp(x - stop_gradient(x)) = 1 with gradient 1 when
    `force_on_policy_ratio`, pi_old then being the current policy), w_t the importance weight
    pi_old / pi_generator (stopped gradient) truncated as configured, m_t the token mask times
    the sample mask, N the valid tokens of the global batch (or of these rollouts).

    `seq-mask-tis` zeroes every weight of a rollout whose geometric-mean weight (over
    `token_mask`, not the sample mask, as NeMo-RL) leaves [min, max]; kept rollouts keep their
    raw token weights.

    Args:
      curr_logprobs: `[rollouts, length]` log-probs of the sampled tokens under the policy
        being trained (differentiable).
      generation_logprobs: `[rollouts, length]` the generator's log-probs of the same tokens.
      advantages: `[rollouts]` or `[rollouts, length]`.
      token_mask: `[rollouts, length]` 1 on the policy's own tokens (prompts, tool outputs and
        padding 0).
      sample_mask: `[rollouts]` 0/1 (after overlong and log-prob error filtering).
      config: the loss settings.
      prev_logprobs: `[rollouts, length]` the old policy's log-probs; ignored (taken as the
        current ones) when `config.force_on_policy_ratio`.
      global_valid_tokens: the normalizer N (the valid tokens of the global batch, so that
        micro-batches and replicas sum to the global mean); default: these rollouts' count.

    Returns:
      (loss scalar, dict of float32 metrics: `probs_ratio`, `sampling_importance_ratio`,
      `is_oob_ratio`, `token_mult_prob_error`).
    """
    curr = _float(curr_logprobs)
    gen = _float(generation_logprobs)
    token_mask = _float(token_mask)
    sample_mask = _float(sample_mask)
    advantages = _float(advantages)
    if advantages.shape.rank == 1:
        advantages = advantages[:, None]
    mask = token_mask * sample_mask[:, None]  # [rollouts, length]
    valid = tf.reduce_sum(mask) if global_valid_tokens is None else _float(global_valid_tokens)

    if config.force_on_policy_ratio:
        prev = tf.stop_gradient(curr)
        ratios = tf.exp(curr - prev)  # 1.0, gradient d curr
        ratios_clamped = ratios
    else:
        if prev_logprobs is None:
            raise ValueError("`prev_logprobs` is required unless `force_on_policy_ratio`.")
        prev = _float(prev_logprobs)
        ratios = tf.exp(curr - prev)
        ratios_clamped = tf.clip_by_value(
            ratios, 1.0 - config.ratio_clip_min, 1.0 + config.ratio_clip_max
        )
    clip_loss = tf.maximum(-advantages * ratios, -advantages * ratios_clamped)

    def finite(x):  # torch.nan_to_num(x, nan=0, posinf=0, neginf=0)
        return tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))

    weights = finite(tf.exp(prev - gen))  # [rollouts, length]
    seq_kept = tf.ones_like(sample_mask)
    oob = tf.constant(0.0)
    lo = config.truncated_importance_sampling_ratio_min
    hi = config.truncated_importance_sampling_ratio
    tis = config.truncated_importance_sampling_type
    if tis == "tis":
        oob = masked_mean(tf.cast((weights > hi) | (weights < lo), tf.float32), mask, None, valid)
        weights = tf.clip_by_value(weights, lo, hi)
    elif tis == "icepop":
        kept = (weights >= lo) & (weights <= hi)
        oob = masked_mean(1.0 - tf.cast(kept, tf.float32), mask, None, valid)
        weights = tf.where(kept, weights, 0.0)
    elif tis == "seq-mask-tis":
        log_ratio = finite(prev - gen)
        geomean = tf.exp(masked_mean(log_ratio, token_mask, axis=-1))  # [rollouts]
        seq_kept = tf.cast((geomean >= lo) & (geomean <= hi), tf.float32)
        oob = masked_mean(1.0 - seq_kept, sample_mask)
        weights = weights * seq_kept[:, None]
    weights = tf.stop_gradient(weights)
    if not config.use_importance_sampling_correction:
        weights = tf.ones_like(weights)

    loss = masked_mean(weights * clip_loss, mask, None, valid)
    metrics = {
        "probs_ratio": masked_mean(tf.stop_gradient(ratios), mask, None, valid),
        "sampling_importance_ratio": masked_mean(weights, mask, None, valid),
        "is_oob_ratio": oob,
        "token_mult_prob_error": masked_mean(
            tf.exp(tf.abs(gen - tf.stop_gradient(prev)) * mask), mask, None, valid
        ),
    }
    return loss, metrics


def token_logprobs(logits, tokens, temperature: float = 1.0, *, axis=None,
                   vocab_size: int = 0) -> tf.Tensor:  # fmt: skip
    """Log-probabilities of `tokens` under `logits / temperature` (float32 softmax).

    Args:
      logits: `[..., vocab]`, or under tensor parallelism (`axis.size` M > 1) this shard's
        `[..., vocab/M]` (the negated vocabulary-parallel cross-entropy: the logits are never
        gathered).
      tokens: `[...]` int token ids.
      axis: the model's `ModelAxis` (None or size 1: whole logits).
      vocab_size: the whole vocabulary (with `axis`).

    Returns:
      `[...]` float32.
    """
    logits = tf.cast(logits, tf.float32) / temperature
    if axis is not None and axis.size > 1:
        return -vocab_parallel_cross_entropy(
            logits, tf.cast(tokens, tf.int32), vocab_size=vocab_size, smoothing=0.0, axis=axis
        )
    logp = tf.nn.log_softmax(logits, axis=-1)
    return tf.gather(logp, tf.cast(tokens, tf.int32), axis=-1, batch_dims=len(tokens.shape))


def pass_at_k(rewards) -> tf.Tensor:
    """Grouped pass@k: the share of tasks with at least one positive reward among their k.

    Args:
      rewards: `[tasks, k]`.

    Returns:
      float32 scalar in [0, 1].
    """
    solved = tf.reduce_any(_float(rewards) > 0, axis=1)
    return tf.reduce_mean(tf.cast(solved, tf.float32))
