"""Checkpoints of weight-update-sharded runs: the optimizer slots' shards are saved at full size
and restored exactly, so N steps, a restart and M more end where N + M unbroken steps end.

The runs go through the runner in-process (the restart rebuilds everything from the checkpoint)
on the 4 logical CPUs of the test session, with LARS (one momentum slot per variable) and
`torus2d`, whose shard of a replica is not its replica id (2x2: replica 1 holds shard 2).
"""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import runner
from mlperf_tf.optimizers import LARS
from tests.numerics import assert_close
from tests.tiny_benchmark import TinyBenchmark, smoke, weights

pytestmark = pytest.mark.numerics

FIRST_STEPS, MORE_STEPS = 3, 3


@pytest.fixture
def lars_tiny(monkeypatch):
    # Momentum 0.9 carries each step's slot into the next: a resume with wrong slots ends
    # far beyond 1e-6 of the unbroken run.
    monkeypatch.setattr(
        TinyBenchmark,
        "build_optimizer",
        lambda self, train_steps: LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01),
    )


def _run(model_dir, steps, all_reduce="torus2d"):
    run_config = runner.RunConfig(
        model_dir=str(model_dir),
        steps_per_loop=FIRST_STEPS,
        max_train_steps=steps,
        distribution="mirrored",
        num_cpu_devices=4,
        all_reduce=all_reduce,
        weight_update_sharding=True,
        collective_timeout=60,
    )
    return runner.run(TinyBenchmark(smoke()), run_config)


# Extended (CI runs it after README's default run); the default run covers its case by
# test_sharded_resume.py (a sharded Adam run resumes exactly).
@pytest.mark.extended
def test_a_resumed_sharded_run_matches_the_unbroken_run(tmp_path, lars_tiny):
    unbroken = _run(tmp_path / "unbroken", FIRST_STEPS + MORE_STEPS)
    first = _run(tmp_path / "broken", FIRST_STEPS)
    assert first.steps == FIRST_STEPS
    saved = tf.train.latest_checkpoint(str(tmp_path / "broken" / "ckpt"))
    assert saved.endswith(f"-{FIRST_STEPS}")
    resumed = _run(tmp_path / "broken", FIRST_STEPS + MORE_STEPS)
    assert resumed.steps == FIRST_STEPS + MORE_STEPS
    for a, b in zip(weights(resumed.model), weights(unbroken.model), strict=True):
        assert_close(a, b, rtol=1e-6)

    # The checkpoint holds each momentum slot once, at its variable's full shape, not non-zero
    # by accident: after 3 steps of LARS every slot has moved.
    stored = dict(tf.train.list_variables(saved))
    slot_keys = sorted(k for k in stored if k.startswith("sharded_slots/"))
    shapes = [tuple(w.shape) for w in weights(first.model)]
    assert len(slot_keys) == len(shapes)
    reader = tf.train.load_checkpoint(saved)
    for index, shape in enumerate(shapes):
        key = f"sharded_slots/.ATTRIBUTES/momentum_{index}"
        momentum = reader.get_tensor(key)
        assert momentum.shape == shape
        assert np.abs(momentum).max() > 0


@pytest.mark.slow  # 17-63 s; the default run keeps the same-algorithm resume above and
# tests/mlperf_tf/layers/test_moe_parallel.py's slots saved whole and cut again
def test_a_sharded_checkpoint_resumes_under_another_algorithm(tmp_path, lars_tiny):
    # Saved at full size, the slots are cut again for the resuming run's shard layout (ring:
    # replica i holds shard i). Different summation orders: the plain-sum tolerance, 1e-5.
    unbroken = _run(tmp_path / "unbroken", FIRST_STEPS + MORE_STEPS)
    _run(tmp_path / "broken", FIRST_STEPS)
    resumed = _run(tmp_path / "broken", FIRST_STEPS + MORE_STEPS, all_reduce="ring")
    for a, b in zip(weights(resumed.model), weights(unbroken.model), strict=True):
        assert_close(a, b, rtol=1e-5)
