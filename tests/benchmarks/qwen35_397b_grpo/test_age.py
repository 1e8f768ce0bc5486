"""The async schedule's age (`grpo.max_trajectory_age_steps`, `mlperf_tf.rl.age.AgeGate`): at 0
the rollouts of step 2 are sampled by the weights after update 1; at 1 they may be sampled
before it (the prefetch runs ahead), but never more than one update old; the age each batch was
generated at is its `trajectory_age` and the step's `avg_trajectory_age`; a closed gate stops
holding the pipeline; an age above the setting stops the run in one line."""

import dataclasses
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo.benchmark import AgeGuard, Qwen35GrpoBenchmark
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.rl import grpo
from mlperf_tf.rl.age import AgeGate
from mlperf_tf.runner.actions import LoopOutput


class Counter:
    """A policy version that a test advances by hand."""

    def __init__(self, start: int = 0):
        self.value = start

    def __call__(self) -> int:
        return self.value


def _later(seconds: float, fn) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    thread.start()
    return thread


def test_the_gate_waits_for_the_update_the_age_allows():
    version = Counter(start=7)  # a resumed run: the count starts at its checkpoint's
    sync = AgeGate(0, version, poll_s=0.001)
    assert sync.wait(0) == 0  # the first batch: the weights it trains
    begin = time.monotonic()
    thread = _later(0.2, lambda: setattr(version, "value", 8))  # update 1 done
    assert sync.wait(1) == 0 and time.monotonic() - begin >= 0.15
    thread.join()
    one = AgeGate(1, Counter(start=3), poll_s=0.001)
    assert [one.wait(0), one.wait(1)] == [0, 1]  # batch 1 during update 1: one update old
    assert one.max_seen == 1 and one.ages == [0, 1]


def test_a_closed_gate_ends_the_wait_and_no_version_is_age_zero():
    """Closed (the consumer is gone), the gate waits no more and records no age: the generator
    runs on, untrained, until its iterator is released."""
    gate = AgeGate(0, Counter(), poll_s=0.001)
    gate.wait(0)
    thread = _later(0.1, gate.close)
    assert gate.wait(1) == 1  # would have waited forever for update 1
    thread.join()
    assert gate.wait(5) == 5 and gate.ages == [0] and gate.max_seen == 0
    free = AgeGate(1, None)  # nothing updates the weights
    assert [free.wait(b) for b in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="max_age"):
        AgeGate(-1, None)


def test_a_negative_age_setting_is_one_line():
    config = Qwen35GrpoBenchmark.preset("smoke")
    with pytest.raises(ConfigError, match=r"grpo\.max_trajectory_age_steps"):
        dataclasses.replace(config.grpo, max_trajectory_age_steps=-1)


def test_an_age_above_the_setting_stops_the_run_in_one_line():
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("smoke"))
    gate = AgeGate(1, Counter())
    gate.ages = [0, 2]  # what a broken gate would have let through
    bench._gates.append(gate)
    output = LoopOutput(step=3, steps=1, loss=0.0, seconds=1.0, samples_per_second=1.0,
                        last_step=3, epoch=1.0, next_eval_step=4, first=False)  # fmt: skip
    with pytest.raises(UserError, match=r"^step 3: rollouts generated 2 updates before") as e:
        AgeGuard(bench).after_loop(output)
    assert "\n" not in str(e.value) and "max_trajectory_age_steps` (1)" in str(e.value)
    gate.ages = [0, 1]
    AgeGuard(bench).after_loop(output)


def _policy_logprobs(model, batch) -> np.ndarray:
    """The model's log-probs of the batch's policy tokens (0 elsewhere), as generated."""
    logp = grpo.token_logprobs(model(tf.constant(batch["input_ids"])), batch["targets"])
    return logp.numpy() * batch["token_mask"]


def _run(max_age: int, *, slow_first_update: bool):
    """3 updates of the smoke benchmark (eager rollouts of 4 x 8 tokens, Adam at 1e-2 so that
    one update moves the log-probs far beyond the tolerance), its training pipeline behind a
    prefetch of 2 (as the runner's); with `slow_first_update`, update 1 starts only once the
    prefetch has generated (or, held by the gate, not) batch 2. Returns the batches, each
    with the model's log-probs of its tokens just before its update, and the model with its
    initial weights restored."""
    config = Qwen35GrpoBenchmark.preset("smoke")
    config = dataclasses.replace(
        config, grpo=dataclasses.replace(config.grpo, max_trajectory_age_steps=max_age),
        optimizer=dataclasses.replace(config.optimizer, opt_base_learning_rate=1e-2),
        rollout=dataclasses.replace(config.rollout, compiled_generation=False, max_length=64),
    )  # fmt: skip
    keras.utils.set_random_seed(3)
    bench = Qwen35GrpoBenchmark(config)
    model = bench.build_model()
    initial = model.get_weights()
    optimizer = bench.build_optimizer(3)
    bench.bind_model(model)
    iterator = iter(bench.train_dataset(None).prefetch(2))
    out = []
    try:
        for _ in range(3):
            batch = {k: v.numpy() for k, v in next(iterator).items()}
            if slow_first_update and not out:
                deadline = time.monotonic() + (2.0 if max_age == 0 else 60.0)
                while bench.rollout_clock.snapshot()["rollouts"] < 8:
                    if time.monotonic() > deadline:
                        break  # held by the gate (age 0): it must not come
                    time.sleep(0.05)
            out.append((batch, _policy_logprobs(model, batch)))
            with tf.GradientTape() as tape:
                loss = bench.compute_loss(model, {k: tf.constant(v) for k, v in batch.items()})
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
    finally:
        bench.release_input()
        del iterator
    model.set_weights(initial)
    return out, model


@pytest.mark.numerics
def test_at_age_0_step_2_is_sampled_by_the_weights_after_update_1():
    """The consumer dawdles before update 1 (2 s): the gate holds batch 2 anyway, and every
    batch's generation log-probs are the model's just before its own update."""
    batches, initial = _run(0, slow_first_update=True)
    for batch, current in batches:
        np.testing.assert_allclose(batch["generation_logprobs"], current, rtol=0, atol=1e-4)
        assert np.all(batch["trajectory_age"] == 0)
    second = batches[1][0]  # not the initial weights' tokens: update 1 moved them
    assert np.max(np.abs(_policy_logprobs(initial, second) - second["generation_logprobs"])) > 1e-2


@pytest.mark.slow  # 15-34 s; the default run keeps the stricter age-0 case and the gate's unit tests
@pytest.mark.numerics
def test_at_age_1_step_2_may_be_sampled_before_update_1_but_no_older():
    """With update 1 held until the prefetch has generated batch 2, batch 2 is the initial
    weights' (one update old) and says so; batch 3 waited for update 1."""
    batches, initial = _run(1, slow_first_update=True)
    (first, _), (second, after_1), (third, _) = batches
    assert first["trajectory_age"][0] == 0 and np.all(second["trajectory_age"] == 1)
    assert np.all(third["trajectory_age"] <= 1)
    np.testing.assert_allclose(second["generation_logprobs"], _policy_logprobs(initial, second),
                               rtol=0, atol=1e-4)  # fmt: skip
    assert np.max(np.abs(second["generation_logprobs"] - after_1)) > 1e-2
