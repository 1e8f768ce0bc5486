"""Provides the step from rollouts to the policy update: `training_batch` turns one step's
rollouts into padded tensors with GRPO's advantages and filters, and `policy_loss` is the loss
of such a batch under a causal language model (the token-level clipped loss of
`mlperf_tf.rl.grpo` with the log-prob error mask applied first, as NeMo-RL orders them).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mlperf_tf.rl import grpo


def training_batch(rollouts, *, num_generations: int, length: int, pad_id: int,
                   leave_one_out: bool = True, normalize: bool = True,
                   overlong_filtering: bool = True) -> dict[str, np.ndarray]:  # fmt: skip
    """One step's rollouts (prompt-major: generation g of prompt p at p * G + g) as arrays.

    Returns:
      `input_ids` int32 [R, length] (the tokens but the last), `targets` int32 [R, length]
      (the next tokens), `token_mask` float32 [R, length] (1 where the target is the policy's),
      `generation_logprobs` float32 [R, length] (of the targets), `advantages` float32 [R],
      `sample_mask` float32 [R] (0 for truncated rollouts with overlong filtering), `rewards`,
      `valid_tokens` float32 [R]: every row holds the step's count of the policy's tokens in
      kept rollouts (token mask x sample mask, over all R), the loss's normalizer (NeMo-RL's
      `global_valid_toks`), so a micro-batch's or a replica's loss is its share of the step's
      token mean (`policy_loss(global_valid_tokens=...)`). Counted before the log-prob error
      mask, which needs the current policy's log-probs of every micro-batch.

    Raises:
      ValueError: the rollouts are not a whole number of groups.
    """
    count = len(rollouts)
    if count % num_generations:
        raise ValueError(f"{count} rollouts are not groups of {num_generations} generations")
    rewards = np.array([r.reward for r in rollouts], np.float32)
    advantages = grpo.group_advantages(
        rewards.reshape(-1, num_generations), leave_one_out=leave_one_out, normalize=normalize
    )
    arrays = token_arrays(rollouts, length=length, pad_id=pad_id)
    truncated = np.array([r.truncated for r in rollouts])
    sample_mask = np.ones(count, np.float32)
    if overlong_filtering:
        sample_mask = grpo.overlong_filter(sample_mask, truncated).numpy()
    valid_tokens = float(np.sum(arrays["token_mask"] * sample_mask[:, None]))
    arrays.update(
        advantages=advantages.numpy().reshape(-1), sample_mask=sample_mask, rewards=rewards,
        valid_tokens=np.full(count, valid_tokens, np.float32),
    )  # fmt: skip
    return arrays


def token_arrays(rollouts, *, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """The rollouts' tokens as next-token arrays [R, length], cut or padded: `input_ids`,
    `targets`, `token_mask` (1 where the target is the policy's), `generation_logprobs` (the
    targets'). `training_batch`'s token part, and a supervised batch on its own (the `mini`
    base's expert trajectories)."""
    count = len(rollouts)
    arrays = {
        "input_ids": np.full([count, length], pad_id, np.int32),
        "targets": np.full([count, length], pad_id, np.int32),
        "token_mask": np.zeros([count, length], np.float32),
        "generation_logprobs": np.zeros([count, length], np.float32),
    }
    for i, r in enumerate(rollouts):
        n = min(len(r.tokens), length + 1) - 1  # predictions of tokens 1..n
        arrays["input_ids"][i, :n] = r.tokens[:n]
        arrays["targets"][i, :n] = r.tokens[1 : n + 1]
        arrays["token_mask"][i, :n] = r.policy_mask[1 : n + 1]
        arrays["generation_logprobs"][i, :n] = r.logprobs[1 : n + 1]
    return arrays


def vocab_split(model) -> dict:
    """`grpo.token_logprobs`' tensor-parallel arguments for `model`'s logits: its `ModelAxis`
    and whole vocabulary (a `DecoderModel` under a `model` axis gives [..., vocab/M])."""
    config = getattr(model, "config", None)
    if config is None:
        return {}
    return {"axis": model.axis, "vocab_size": config.vocab_size}


def supervised_loss(model, batch) -> tf.Tensor:
    """Mean negative log-likelihood of the policy's tokens (`token_mask`) of `batch`
    (`token_arrays`' arrays) under `model`: supervised fine-tuning on expert trajectories."""
    logp = grpo.token_logprobs(model(batch["input_ids"]), batch["targets"])
    mask = tf.cast(batch["token_mask"], tf.float32)
    return -tf.reduce_sum(logp * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)


def policy_loss(model, batch, *, loss: grpo.PolicyLossConfig, logprob_error_threshold: float,
                temperature: float = 1.0, global_valid_tokens=None):  # fmt: skip
    """The GRPO loss of `batch` (`training_batch`'s arrays, as tensors) under `model`
    (token ids [R, T] -> logits [R, T, vocab]); returns (loss, metrics).

    The current log-probs are both the policy's (differentiated) and, stopped, the old
    policy's (`force_on_policy_ratio`): the log-prob error mask compares them with the
    generator's before the loss, as NeMo-RL's `seq_logprob_error_threshold` does.
    """
    logits = model(batch["input_ids"])
    curr = grpo.token_logprobs(logits, batch["targets"], temperature,
                               **vocab_split(model))  # [R, T] # fmt: skip
    sample_mask = grpo.logprob_error_mask(
        batch["generation_logprobs"], tf.stop_gradient(curr), batch["token_mask"],
        batch["sample_mask"], logprob_error_threshold,
    )  # fmt: skip
    value, metrics = grpo.clipped_policy_loss(
        curr, batch["generation_logprobs"], batch["advantages"], batch["token_mask"],
        sample_mask, config=loss, global_valid_tokens=global_valid_tokens,
    )  # fmt: skip
    metrics["masked_sequences"] = tf.reduce_sum(batch["sample_mask"] - sample_mask)
    return value, metrics
