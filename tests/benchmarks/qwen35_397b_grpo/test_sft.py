"""Tests of the `mini` base model's supervision: the expert's scripted rollouts earn reward 1
with the policy's tokens exactly the expert's turns, the supervised loss against a NumPy
transcription (prompt and tool output masked), and the one-line errors of a missing base and
of `prepare --mini --base_steps=0`."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import config, prepare, sft, tasks
from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf.errors import UserError
from mlperf_tf.lm.hybrid import build_hybrid_decoder
from mlperf_tf.rl import batch as batch_lib


def test_expert_rollouts_earn_the_reward_and_hold_the_expert_turns():
    chosen = tasks.make_tasks(2, seed=31)
    rollouts = sft.expert_rollouts(config.mini(), chosen, chunk=2)
    assert len(rollouts) == 2
    for r, task in zip(rollouts, chosen):
        assert r.reward == 1.0 and r.turns == 4 and not r.truncated
        policy = sft.CHAT.decode([t for t, m in zip(r.tokens, r.policy_mask) if m])
        assert policy == "".join(tasks.expert_turns(task))
        assert "[exit code 0]" in sft.CHAT.decode(r.tokens)


class _Oracle:
    """Logits that put each rollout's next token first, except at the positions in `wrong`
    (row, position of the token): a model whose teacher-forced accuracy is known."""

    def __init__(self, rollouts, wrong=()):
        self.next = {tuple(r.tokens[:-1]): r.tokens[1:] for r in rollouts}
        self.wrong = set(wrong)

    def __call__(self, ids):
        ids = ids.numpy()
        logits = np.zeros([*ids.shape, sft.CHAT.vocab_size], np.float32)
        for row, seq in enumerate(ids):
            key = next(k for k in self.next if tuple(seq[: len(k)]) == k)
            for pos, token in enumerate(self.next[key]):
                logits[row, pos, (token + ((row, pos + 1) in self.wrong)) % 256] = 1.0
        return tf.constant(logits)


def test_edit_accuracy_counts_the_edit_bytes_teacher_forced():
    chosen = tasks.make_tasks(3, seed=33)
    rollouts = sft.expert_rollouts(config.mini(), chosen, chunk=3)
    for r, task in zip(rollouts, chosen):
        old, new = task.edit()
        assert sft.CHAT.decode([r.tokens[i] for i in sft.edit_positions(r)]) == f"{old}\n{new}\n"
    assert sft.edit_accuracy(_Oracle(rollouts), rollouts, batch=2) == {"bytes": 1.0, "edits": 1.0}
    first = sft.edit_positions(rollouts[1])[0]
    total = sum(len(sft.edit_positions(r)) for r in rollouts)
    # Row 1 of the first batch of 2 is rollouts[1]; one wrong byte spoils its whole edit.
    got = sft.edit_accuracy(_Oracle(rollouts, wrong=[(1, first)]), rollouts, batch=2)
    assert got == {"bytes": (total - 1) / total, "edits": 2 / 3}
    # A wrong token outside the edit does not count.
    got = sft.edit_accuracy(_Oracle(rollouts, wrong=[(0, 5)]), rollouts, batch=2)
    assert got == {"bytes": 1.0, "edits": 1.0}


@pytest.mark.numerics
def test_supervised_loss_is_the_masked_mean_nll():
    tf.keras.utils.set_random_seed(0)
    model = build_hybrid_decoder(config.tiny(vocab_size=sft.CHAT.vocab_size))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, 256, size=[2, 9]).astype(np.int32),
        "targets": rng.integers(0, 256, size=[2, 9]).astype(np.int32),
        "token_mask": (rng.random([2, 9]) < 0.5).astype(np.float32),
    }
    logits = model(tf.constant(batch["input_ids"])).numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    want = -(picked * batch["token_mask"]).sum() / batch["token_mask"].sum()
    got = batch_lib.supervised_loss(model, {k: tf.constant(v) for k, v in batch.items()})
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_a_missing_base_is_one_line(tmp_path):
    cfg = dataclasses.replace(config.smoke(), init_checkpoint=str(tmp_path / "none"))
    with pytest.raises(UserError, match="init_checkpoint") as info:
        Qwen35GrpoBenchmark(cfg).restore_initial_weights(None)
    assert "\n" not in str(info.value)


def test_prepare_mini_refuses_zero_steps(tmp_path):
    with pytest.raises(UserError, match="--base_steps"):
        prepare.main(["--mini", "--base_steps=0", f"--out_dir={tmp_path}"])


@pytest.mark.numerics
@pytest.mark.parametrize("clip", [1e6, 0.01])
def test_accumulated_step_is_the_whole_batch_step(clip):
    """Micro-batches of equal token counts: their averaged gradients are the whole batch's, so
    the step (clip binding or not) moves the weights as one step on the whole batch does."""
    rng = np.random.default_rng(4)
    batch = {
        "input_ids": rng.integers(0, 256, size=[4, 7]).astype(np.int32),
        "targets": rng.integers(0, 256, size=[4, 7]).astype(np.int32),
        "token_mask": np.ones([4, 7], np.float32),
    }
    weights, norms = [], []
    for micro in (2, 4):
        tf.keras.utils.set_random_seed(0)  # a small causal LM: ids -> logits (cheap to trace)
        model = tf.keras.Sequential(
            [tf.keras.layers.Embedding(sft.CHAT.vocab_size, 8), tf.keras.layers.Dense(259)]
        )
        model.build((None, None))
        before = [v.numpy() for v in model.trainable_variables]
        step = sft.accumulated_step(
            model, tf.keras.optimizers.SGD(0.5), clip, batch_lib.supervised_loss, micro
        )
        norms.append(step(batch)[1])
        weights.append([v.numpy() for v in model.trainable_variables])
        moved = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(weights[-1], before)))
        np.testing.assert_allclose(moved, 0.5 * min(norms[-1], clip), rtol=1e-4)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > 0.01
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.numerics
def test_base_recipe_schedule_is_warmup_then_cosine():
    recipe = sft.BaseRecipe(steps=10, lr=2.0, warmup=2, final_lr_fraction=0.1)
    schedule = recipe.schedule(scale=3.0)
    peak = 6.0
    for step in range(11):
        if step < 2:
            want = peak * step / 2
        else:
            want = peak * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (step - 2) / 8)))
        np.testing.assert_allclose(float(schedule(step)), want, rtol=1e-5, err_msg=str(step))
    assert sft.BaseRecipe(lr=0.5).schedule(2.0) == 1.0  # constant: a plain rate


class _TinyLM(tf.keras.Model):
    """ids -> logits through a `token_embedding` (what `sft.recipe_step` finds) and a dense
    layer: cheap to trace."""

    def __init__(self):
        super().__init__(name="tiny_lm")
        self.token_embedding = tf.keras.layers.Embedding(sft.CHAT.vocab_size, 8)
        self.head = tf.keras.layers.Dense(sft.CHAT.vocab_size)

    def call(self, ids):
        return self.head(self.token_embedding(ids))


@pytest.mark.numerics
def test_base_recipe_moves_the_embedding_at_its_own_rate():
    """Adam's first step moves a weight by about the rate (g / |g|): the embedding's rows by
    `embedding_lr_scale` x the rate, every other weight by the rate."""
    tf.keras.utils.set_random_seed(0)
    model = _TinyLM()
    model(tf.zeros([1, 1], tf.int32))  # builds its layers
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, 256, size=[2, 9]).astype(np.int32),
        "targets": rng.integers(0, 256, size=[2, 9]).astype(np.int32),
        "token_mask": np.ones([2, 9], np.float32),
    }
    before = [v.numpy() for v in model.trainable_variables]
    step = sft.recipe_step(model, sft.BaseRecipe(lr=1e-3, embedding_lr_scale=4.0, clip=0.0))
    step({k: tf.constant(v) for k, v in batch.items()})
    embedding = model.token_embedding.embeddings
    moved = {v.path: np.abs(v.numpy() - b).max() for v, b in zip(model.trainable_variables, before)}
    np.testing.assert_allclose(moved.pop(embedding.path), 4e-3, rtol=1e-3)  # no KeyError
    assert max(moved.values()) <= 1e-3 * (1 + 1e-5)  # |g| / (|g| + epsilon) <= 1
    np.testing.assert_allclose(max(moved.values()), 1e-3, rtol=1e-3)
