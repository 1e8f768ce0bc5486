"""Provides `assert_resumes`: a benchmark's run saved under one layout resumes under another.

A checkpoint is one format whatever the layout (`mlperf_tf.checkpoints.run_checkpoint`): the
first run trains a few steps under its layout and saves; the second, under another layout (fewer
chips after a failure, or more), restores it and trains on. Checked: the file holds the first
run's whole weights by path (split ones gathered); right after the restore the second run's
whole weights and optimizer state (gathered from its own shards) are the file's; it then trains
to its step budget and its weights move. Both runs go through the runner in-process, on the
test session's 4 logical CPUs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from mlperf_tf import checkpoints, runner
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.mesh import build_mesh

# Restoring copies the saved values: any difference beyond float32 rounding of the largest
# value is a wrong slice or a wrong key.
RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Layout:
    """A run's devices and mesh flags."""

    devices: int
    model_parallel: int = 1
    expert_parallel: int = 1
    spatial_partition: str = "1"

    def config(self, model_dir, steps: int) -> runner.RunConfig:
        return runner.RunConfig(
            model_dir=str(model_dir), num_cpu_devices=self.devices,
            model_parallel=self.model_parallel, expert_parallel=self.expert_parallel,
            spatial_partition=self.spatial_partition, max_train_steps=steps,
            collective_timeout=60, warm_up=False,
        )  # fmt: skip


def whole_state(model, optimizer, mesh) -> dict[str, np.ndarray]:
    """The model's and optimizer's whole values, keyed as the checkpoint keys them."""
    parts = {
        checkpoints.MODEL_PART: checkpoints.model_paths(model),
        checkpoints.OPTIMIZER_PART: checkpoints.optimizer_paths(optimizer),
    }
    return {
        f"{part}:{name}": np.asarray(layout_lib.whole_value(variable, mesh))
        for part, variables in parts.items()
        for name, variable in variables.items()
    }


class _AfterRestore(runner.Action):
    """Keeps the run's whole state as restored (`attach` runs after the restore, before step 1)."""

    state: dict[str, np.ndarray] | None = None

    def attach(self, controller):
        self.state = whole_state(controller.model, controller.optimizer, controller.benchmark.mesh)


def _assert_same(got: dict, expected: dict, what: str) -> None:
    assert sorted(got) == sorted(expected), what
    for key, value in expected.items():
        assert got[key].shape == value.shape, f"{what}: {key}"
        if np.issubdtype(value.dtype, np.floating):
            scale = max(float(np.max(np.abs(value), initial=0.0)), 1e-3)
            np.testing.assert_allclose(
                got[key], value, rtol=RTOL, atol=RTOL * scale, err_msg=f"{what}: {key}"
            )
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=f"{what}: {key}")


def _file_state(path: str) -> dict[str, np.ndarray]:
    return {
        f"{part}:{name}": value
        for part in (checkpoints.MODEL_PART, checkpoints.OPTIMIZER_PART)
        for name, value in checkpoints.read_part(path, part).items()
    }


def assert_resumes(make_benchmark, *, saved: Layout, resumed: Layout, model_dir, first=2, more=1):
    """Trains `first` steps under `saved`, resumes under `resumed` for `more`; checks as above.

    Args:
      make_benchmark: () -> a fresh benchmark (its smoke preset, small).
      saved, resumed: the two runs' layouts.
      model_dir: the runs' folder (a pytest tmp_path).
    """
    # TF starts with the test session's 4 logical CPUs (conftest) before a run of fewer could
    # reconfigure it (`--num_cpu_devices` splits the CPU when TF has not started yet).
    assert len(tf.config.list_logical_devices("CPU")) >= 4
    result = runner.run(make_benchmark(), saved.config(model_dir, first))
    assert result.steps == first
    path = tf.train.latest_checkpoint(str(model_dir / "ckpt"))
    assert path and path.endswith(f"-{first}")
    stored = _file_state(path)
    # The file holds whole tensors by path: the first run's final weights, gathered.
    model_part = _whole_model(result.model, saved)
    _assert_same({k: stored[k] for k in stored if k in model_part}, model_part, "saved file")

    after_restore = _AfterRestore()
    second = runner.run(
        make_benchmark(), resumed.config(model_dir, first + more), actions=[after_restore]
    )
    assert after_restore.state is not None
    # Every variable of the resumed run came from the file (the step count among them).
    _assert_same(
        {k: after_restore.state[k] for k in stored if k in after_restore.state}, stored, "restored"
    )
    missing = sorted(set(after_restore.state) - set(stored))
    assert not missing, f"not in the checkpoint: {missing[:5]}"
    # Training continued from there: the step budget was reached and the weights moved.
    assert second.steps == first + more
    final = _whole_model(second.model, resumed)
    moved = [
        k
        for k, v in final.items()
        if np.issubdtype(v.dtype, np.floating) and not np.array_equal(v, after_restore.state[k])
    ]
    assert moved, "no weight moved after the resume"
    assert all(np.isfinite(v).all() for v in final.values() if np.issubdtype(v.dtype, np.floating))


def _whole_model(model, layout: Layout) -> dict[str, np.ndarray]:
    mesh = build_mesh(
        layout.devices,
        model_parallel=layout.model_parallel,
        expert_parallel=layout.expert_parallel,
        spatial_partition=layout.spatial_partition,
    )
    return {
        f"{checkpoints.MODEL_PART}:{name}": np.asarray(layout_lib.whole_value(v, mesh))
        for name, v in checkpoints.model_paths(model).items()
    }
