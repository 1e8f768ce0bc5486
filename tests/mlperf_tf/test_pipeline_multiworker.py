"""`mlperf-tf run --pipeline_parallel=2` with the two stages on two MultiWorkerMirroredStrategy
processes (127.0.0.1, one CPU replica each: P = 2, data = 1): the smoke Llama trains 2 steps and
the chief's checkpoint (weights and the stage-local Adam moments, saved whole under the
optimizer's own keys) equals the one-process P = 2 run's on 2 logical CPUs, and holds the keys of
the unsplit one-device run, whose weights it ends at within the summation order's rounding.

Four workers (P = 2 across process pairs, data = 2, each data group its own smoke batches) end
at the one-process D2 x P2 run on 4 logical CPUs, and at the unsplit D2 run.

Each worker traces the stage map for the stage it does not hold too (`stage_owners`): before,
a worker saw its own stage only, found no stage map, and every replica kept every moment.
Every wait is bounded (collectives 60 s, each process 300 s); processes are killed by pid (group).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tests import processes

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

TIMEOUT_S = 300
STEPS = 2
LLAMA = ["-m", "mlperf_tf.cli", "run", "--benchmark=llama31_8b", "--preset=smoke",
         "--collective_timeout=60", f"--max_train_steps={STEPS}"]  # fmt: skip
PARTS = ("model_variables/", "optimizer_variables/")


def _checkpoint(model_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(model_dir / "ckpt" / f"ckpt-{STEPS}"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith(PARTS)}  # fmt: skip


def _assert_close(got: dict, want: dict, rtol: float) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        if np.issubdtype(value.dtype, np.floating):
            scale = float(np.max(np.abs(value))) if value.size else 0.0
            np.testing.assert_allclose(got[key], value, rtol=rtol, atol=rtol * scale, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=key)


def _three_runs(tmp_path, workers: int, unsplit_devices: str):
    """The P = 2 run across `workers` processes, the one-process P = 2 run on as many logical
    CPUs, and the unsplit run on `unsplit_devices`: their checkpoints and the first's summation."""
    across = tmp_path / "across"
    logs = tmp_path / "logs"
    logs.mkdir()
    processes.run_workers(
        lambda _: [*LLAMA, "--distribution=multi_worker", "--startup_timeout_s=120",
                   "--pipeline_parallel=2", f"--model_dir={across}"],
        logs,
        TIMEOUT_S * workers // 2,
        count=workers,
    )  # fmt: skip
    runs = {}
    for name, flags in (("one", [f"--num_cpu_devices={workers}", "--pipeline_parallel=2"]),
                        ("unsplit", [unsplit_devices])):  # fmt: skip
        processes.run_ok([*LLAMA, *flags, f"--model_dir={tmp_path / name}"],
                         str(tmp_path / f"{name}.out"), TIMEOUT_S)  # fmt: skip
        runs[name] = _checkpoint(tmp_path / name)
    summation = json.loads((across / "gradient_summation.json").read_text())
    assert summation["update_stages"] == 2
    got = _checkpoint(across)
    assert any("_momentum" in k for k in got) and not any("sharded_slots" in k for k in got)
    return got, runs, summation


def test_two_workers_one_stage_each_end_at_the_one_process_run(tmp_path):
    got, runs, summation = _three_runs(tmp_path, 2, "--distribution=one_device")
    assert summation["optimizer_state"] == "its pipeline stage's, whole"
    # Measured bit for bit (2026-12-06): the same collectives' sums in the same order.
    _assert_close(got, runs["one"], rtol=1e-6)
    # The unsplit run sums the whole gradient in another order: its scale-aware 1e-5.
    _assert_close(got, runs["unsplit"], rtol=1e-5)


def test_four_workers_pipeline_across_pairs_data_axis_of_two_equal_one_process(tmp_path):
    # P = 2 over process pairs, data = 2: the stage map's sum groups and the stage sends cross
    # processes while the two data groups read different smoke batches
    # (`synthetic.per_batch_shard`); the one-process references read the same batch shards.
    got, runs, _ = _three_runs(tmp_path, 4, "--num_cpu_devices=2")
    _assert_close(got, runs["one"], rtol=1e-6)
    _assert_close(got, runs["unsplit"], rtol=1e-5)
