"""Resuming a weight-update-sharded Adam run (`--weight_update_sharding`, FusedAdam) of the smoke
Llama through the runner's `Trainer` and checkpoint format (`checkpoints.run_checkpoint`): saved
after step k and restored into a fresh model, the weights are the saving run's at k bit for bit,
and step k + 1 ends at the unbroken run's, at P = 1, at D2 x P2 and across P; and through
`runner.run` itself (the benchmark's AdamW, the `Checkpointer`; slow).

The bug these guard: the checkpoint `tests/pipeline_runs.py` wrote was `tf.train.Checkpoint(
model=...)`, whose object graph does not reach layers Keras 3 holds in a list (the decoder
blocks); an unsharded run saved them anyway through the optimizer's references to its
variables, a sharded run (optimizer built without variables) did not, so its resume started
from the initial decoder weights (one Adam step, 1e-3, from the saved ones; step k + 1 2.4e-3
from the unbroken run's).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf import checkpoints, runner
from tests import pipeline_runs
from tests.numerics import assert_close
from tests.tiny_benchmark import weights

pytestmark = pytest.mark.numerics

SAVED_AFTER = 1  # k: the steps before the save; the unbroken run takes k + 1


# The default test's model: one decoder block (still in the list Keras does not track), one
# micro-batch, no clip: ~10 s of CPU for its two runs; the slow ones take the pipeline tests'
# 2 blocks, 2 micro-batches and clip 1.
SMALL = dict(gradient_accumulation_steps=1, model__num_hidden_layers=1)
PIPELINE = dict(gradient_accumulation_steps=2, clip_norm=1.0)


def _sharded(pipeline: int, steps: int, *, clip_norm=None, **kwargs) -> pipeline_runs.Run:
    """Data 2 x `pipeline` on 2 x `pipeline` devices, the sharded update; `kwargs`: the
    harness' and the config's (`benchmark_of`'s "__" overrides)."""
    config = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith(("model__", "gradient_"))}
    bench = pipeline_runs.benchmark_of(Llama31Benchmark, **config)
    return pipeline_runs.train(bench, num_devices=2 * pipeline, pipeline=pipeline, steps=steps,
                               summer=True, clip_norm=clip_norm, weight_update_sharding=True,
                               **kwargs)  # fmt: skip


def _unbroken(pipeline: int, path: str, **kwargs) -> pipeline_runs.Run:
    """k + 1 steps, saved to `path` after k of them."""
    return _sharded(pipeline, SAVED_AFTER + 1, save_to=path, save_after=SAVED_AFTER, **kwargs)


def _assert_resumed(resumed: pipeline_runs.Run, saving: pipeline_runs.Run,
                    unbroken: pipeline_runs.Run, rtol: float):  # fmt: skip
    """(a) The restored weights are the `saving` run's when it saved, bit for bit; (b) the next
    step ends at the `unbroken` run's, to `rtol` of the weights' scale."""
    assert resumed.restored.keys() == saving.saved.keys()
    for name, saved in saving.saved.items():
        np.testing.assert_array_equal(resumed.restored[name], saved, err_msg=name)
    scale = max(float(np.max(np.abs(w))) for w in unbroken.weights.values())
    for name, expected in unbroken.weights.items():
        assert_close(resumed.weights[name], expected, rtol=rtol, scale=scale, err_msg=name)


def test_a_sharded_adam_run_resumes_exactly_at_p1(tmp_path):
    """Data 2 on 2 devices (the replicas read different batches): the resumed step is the
    unbroken one to float32 rounding (measured: bit for bit)."""
    path = str(tmp_path / "ckpt")
    unbroken = _unbroken(1, path, **SMALL)
    resumed = _sharded(1, 1, restore_from=path, **SMALL)
    _assert_resumed(resumed, unbroken, unbroken, rtol=1e-6)
    stored = checkpoints.read_part(path)  # every weight by its path, the decoder block's included
    for name, saved in unbroken.saved.items():
        np.testing.assert_array_equal(stored[name], saved, err_msg=name)
    # Not equal by standing still: the step after the save moved every decoder weight.
    moved = [n for n in unbroken.saved if "decoder" in n
             and not np.array_equal(unbroken.saved[n], unbroken.weights[n])]  # fmt: skip
    assert moved and len(moved) == sum("decoder" in n for n in unbroken.saved)


@pytest.fixture(scope="module")
def unbroken_runs(tmp_path_factory):
    """The sharded unbroken runs at P = 1 and P = 2 (data 2), each saved after k steps."""
    folder = tmp_path_factory.mktemp("sharded_resume")
    return {p: (_unbroken(p, str(folder / f"p{p}"), **PIPELINE), str(folder / f"p{p}"))
            for p in (1, 2)}  # fmt: skip


@pytest.mark.slow  # with the fixture, 3 runs of ~35 s (load 8)
def test_a_sharded_adam_run_resumes_exactly_at_d2_x_p2(unbroken_runs):
    """D2 x P2 (the stage-sharded update: each stage's slots saved whole, cut again)."""
    unbroken, path = unbroken_runs[2]
    _assert_resumed(_sharded(2, 1, restore_from=path, **PIPELINE), unbroken, unbroken, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("saved_at", "resumed_at"), [(2, 1), (1, 2)], ids=["p2_at_p1", "p1_at_p2"])
def test_a_sharded_adam_run_resumes_across_p(unbroken_runs, saved_at, resumed_at):
    """Saved at one P, resumed at the other: the restored weights are the saved ones bit for
    bit (whole tensors, mirrored) and the next step ends at the unbroken run of the resuming P
    (the two P's runs differ by float32 summation order: 1e-5)."""
    saving, path = unbroken_runs[saved_at]
    unbroken, _ = unbroken_runs[resumed_at]
    resumed = _sharded(resumed_at, 1, restore_from=path, **PIPELINE)
    _assert_resumed(resumed, saving, unbroken, rtol=1e-5)


@pytest.mark.slow  # three runner runs, 157 s (load 5-6)
def test_the_runner_resumes_a_sharded_llama_exactly(tmp_path):
    """Through `runner.run` and its own checkpoint (`Checkpointer`, by path): 1 step, a restart,
    1 more = 2 unbroken steps (measured: bit for bit)."""

    def run(folder: str, steps: int):
        config = runner.RunConfig(
            model_dir=str(tmp_path / folder), steps_per_loop=1, max_train_steps=steps,
            distribution="mirrored", num_cpu_devices=2, weight_update_sharding=True,
            collective_timeout=120,
        )  # fmt: skip
        return runner.run(Llama31Benchmark(Llama31Benchmark.preset("smoke")), config)

    unbroken = run("unbroken", 2)
    assert run("broken", 1).steps == 1
    resumed = run("broken", 2)
    assert resumed.steps == 2
    for got, want in zip(weights(resumed.model), weights(unbroken.model), strict=True):
        assert_close(got, want, rtol=1e-6)
