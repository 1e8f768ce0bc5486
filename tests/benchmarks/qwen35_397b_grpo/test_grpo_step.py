"""Tests of one GRPO step on the tiny Qwen3.5: rollouts from the model itself in the sandbox
become a training batch (advantages by group, masks aligned to the policy's tokens, overlong
filtering), the loss at the sampled weights has importance weights of 1 (generator and trainer
agree) and masks nothing, and Adam steps on it raise the log-probability of the rewarded
rollouts' tokens relative to the unrewarded ones."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import config
from mlperf_tf.lm.hybrid import build_hybrid_decoder
from mlperf_tf.rl import batch as batch_lib
from mlperf_tf.rl import grpo
from mlperf_tf.rl.chat import ByteChat
from mlperf_tf.rl.rollout import Rollout

CHAT = ByteChat()


def _rollouts(model, prompts, generations, rng):
    from mlperf_tf.rl.generation import generate

    out = []
    for p in prompts:
        tokens = CHAT.message("user", p) + CHAT.assistant_header()
        gens = generate(model, [tokens] * generations, max_new_tokens=4, eos_id=CHAT.IM_END,
                        pad_id=CHAT.PAD, temperature=1.0, top_p=1.0,
                        seeds=list(rng.integers(1 << 20, size=generations)))  # fmt: skip
        for g in gens:
            r = Rollout([], [], [])
            r.extend(tokens, policy=False)
            r.extend(g.tokens, policy=True, logprobs=g.logprobs)
            r.reward = float(rng.integers(0, 2))
            r.truncated = g.stop == "length" and len(g.tokens) < 3
            out.append(r)
    return out


@pytest.mark.slow  # ~10 s idle, 35 s under load: eager gradients through the DeltaNet scan
@pytest.mark.numerics
def test_grpo_step_on_the_tiny_model():
    tf.keras.utils.set_random_seed(0)
    model = build_hybrid_decoder(config.tiny(vocab_size=CHAT.vocab_size))
    rng = np.random.default_rng(0)
    rollouts = _rollouts(model, ["fix a", "fix b"], 3, rng)
    rollouts[0].reward, rollouts[1].reward = 1.0, 0.0  # each group has a spread
    rollouts[3].reward, rollouts[4].reward = 0.0, 1.0
    arrays = batch_lib.training_batch(rollouts, num_generations=3, length=30, pad_id=CHAT.PAD)
    want = grpo.group_advantages([[r.reward for r in rollouts[:3]],
                                  [r.reward for r in rollouts[3:]]]).numpy().reshape(-1)  # fmt: skip
    np.testing.assert_allclose(arrays["advantages"], want)
    assert arrays["token_mask"].sum() == sum(sum(r.policy_mask[1:]) for r in rollouts)
    batch = {k: tf.constant(v) for k, v in arrays.items()}
    loss_config = grpo.PolicyLossConfig()
    _, metrics = batch_lib.policy_loss(model, batch, loss=loss_config, logprob_error_threshold=2.0)
    np.testing.assert_allclose(metrics["sampling_importance_ratio"].numpy(), 1.0, atol=1e-3)
    assert metrics["is_oob_ratio"].numpy() == 0.0 and metrics["masked_sequences"].numpy() == 0

    def score():  # mean log-prob of policy tokens, rewarded minus unrewarded rollouts
        logp = grpo.token_logprobs(model(batch["input_ids"]), batch["targets"]).numpy()
        per = (logp * arrays["token_mask"]).sum(1) / np.maximum(arrays["token_mask"].sum(1), 1)
        adv = arrays["advantages"]
        return per[adv > 0].mean() - per[adv < 0].mean()

    before = score()
    optimizer = tf.keras.optimizers.Adam(3e-3)
    variables = model.trainable_variables
    for _ in range(2):
        with tf.GradientTape() as tape:
            value, _ = batch_lib.policy_loss(
                model, batch, loss=grpo.PolicyLossConfig(truncated_importance_sampling_type="",
                                                         use_importance_sampling_correction=False),
                logprob_error_threshold=2.0,
            )  # fmt: skip
        optimizer.apply_gradients(zip(tape.gradient(value, variables), variables))
    assert score() > before + 0.05, (before, score())


@pytest.mark.numerics
def test_micro_batches_sum_to_the_step_token_mean():
    """The benchmark's loss on micro-batches of unequal policy-token counts, averaged as the
    runner averages them, is the token mean over the whole step (NeMo-RL's
    `global_valid_toks`), checked against a NumPy transcription; so are its gradients. A
    per-micro-batch mean would weigh the short micro-batch's tokens more."""
    from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark

    rng = np.random.default_rng(3)
    rows, length, parts = 4, 9, 2
    token_mask = np.zeros([rows, length], np.float32)
    for i, n in enumerate([2, 3, 8, 6]):  # micro-batch 0: 5 tokens, micro-batch 1: 14
        token_mask[i, length - n :] = 1.0
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.layers.Embedding(CHAT.vocab_size, 8), tf.keras.layers.Dense(CHAT.vocab_size)]
    )
    tokens = rng.integers(0, 256, size=[rows, length + 1])
    rollouts = []
    for i in range(rows):
        r = Rollout([], [], [])
        r.extend(tokens[i].tolist(), policy=False)
        r.policy_mask[1:] = token_mask[i].astype(int).tolist()
        r.reward = float(i % 2)
        rollouts.append(r)
    arrays = batch_lib.training_batch(rollouts, num_generations=2, length=length, pad_id=0)
    np.testing.assert_array_equal(arrays["token_mask"], token_mask)
    assert np.all(arrays["valid_tokens"] == token_mask.sum())
    # The generator is the policy: its log-probs are the model's own.
    own = grpo.token_logprobs(model(arrays["input_ids"]), arrays["targets"]).numpy()
    arrays["generation_logprobs"] = own * token_mask
    arrays["trajectory_age"] = np.zeros(rows, np.float32)  # the pipeline's (`input.py`)
    smoke = config.smoke()
    bench = Qwen35GrpoBenchmark(dataclasses.replace(smoke, gradient_accumulation_steps=parts))
    variables = model.trainable_variables

    def loss_and_grads(part):
        with tf.GradientTape() as tape:
            value = bench.compute_loss(model, {k: tf.constant(v[part]) for k, v in arrays.items()})
        return value.numpy(), [
            tf.convert_to_tensor(g).numpy() for g in tape.gradient(value, variables)
        ]

    halves = [loss_and_grads(slice(0, 2)), loss_and_grads(slice(2, 4))]
    mean_loss = np.mean([h[0] for h in halves])
    # NumPy: ratios are 1 and importance weights 1 (the generator's log-probs are the policy's),
    # so the loss is -sum_t A_t m_t / N over the step's tokens.
    want = -np.sum(arrays["advantages"][:, None] * token_mask) / token_mask.sum()
    np.testing.assert_allclose(mean_loss, want, rtol=1e-5)
    whole_loss, whole_grads = loss_and_grads(slice(0, 4))
    np.testing.assert_allclose(whole_loss / parts, want, rtol=1e-5)
    for a, b, w in zip(halves[0][1], halves[1][1], whole_grads, strict=True):
        np.testing.assert_allclose((a + b) / parts, w / parts, rtol=1e-4, atol=1e-7)
