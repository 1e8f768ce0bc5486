"""`mlperf-tf run --model_parallel=2` with the model axis across two MultiWorkerMirroredStrategy
processes (127.0.0.1, one CPU replica each: M = 2, data = 1): BERT smoke trains, and every
checkpoint the chief writes holds whole tensors (the split weights and their LAMB slots joined
by a collective all-gather at each save, `parallel.layout.gathered_value`). A run stopped at
step 2 and resumed across the two workers, or at M = 1 in one process, ends at the checkpoint
of the unbroken one-process M = 1 run (same initial weights, dropout off), weights and slots.
A worker whose save fails stops with one `error:` line, and its peer does not hang. Four
workers (M = 2 across process pairs, data = 2) end at the one-process M = 1 run on 2 devices.

The M = 2 run takes BERT's unpacked path (static shapes under model parallelism), M = 1 the
padding-skipping one: the same math rounded differently, hence the scale-aware 1e-5. Every wait
is bounded (collectives 60 s, each process 300 s); processes are killed by pid (group).
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import checkpoints
from tests import processes
from tests.numerics import assert_close

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

FIRST, STEPS = 2, 4
RTOL = 1e-5
TIMEOUT_S = 300
BERT = [
    "-m", "mlperf_tf.cli", "run", "--benchmark=bert", "--preset=smoke",
    "--config.model.hidden_dropout_prob=0.0", "--config.model.attention_probs_dropout_prob=0.0",
]  # fmt: skip
ACROSS = ["--distribution=multi_worker", "--model_parallel=2", "--collective_timeout=60",
          "--startup_timeout_s=90"]  # fmt: skip


def _workers(model_dir, logs, steps: int, *extra: str) -> list[str]:
    logs.mkdir()
    return processes.run_workers(
        lambda _: [*BERT, *ACROSS, f"--model_dir={model_dir}", f"--max_train_steps={steps}",
                   *extra],
        logs,
        TIMEOUT_S,
    )  # fmt: skip


def _one_process(model_dir, log: str, steps: int) -> None:
    _one_process_on(model_dir, log, steps, "--distribution=one_device")


def _one_process_on(model_dir, log: str, steps: int, *devices: str) -> None:
    processes.run_ok(
        [*BERT, *devices, f"--model_dir={model_dir}", f"--max_train_steps={steps}"],
        log,
        TIMEOUT_S,
    )


# Entries that differ between runs by design: the number of saves, the first run_start time.
# The model's variables by path (`checkpoints.run_checkpoint`).
MODEL_KEYS = f"{checkpoints.MODEL_PART}/"
RUN_BOOKKEEPING = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/", "run_state/")


def _checkpoint(model_dir, step: int) -> dict[str, np.ndarray]:
    """The checkpoint's model and optimizer tensors by key (weights, slots, the step count)."""
    reader = tf.train.load_checkpoint(str(model_dir / "ckpt" / f"ckpt-{step}"))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if not key.startswith(RUN_BOOKKEEPING)
    }


def _assert_same(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape, key  # whole tensors, not shards
        if np.issubdtype(value.dtype, np.floating):
            assert_close(got[key], value, rtol=RTOL, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The checkpoint of BERT smoke at M = 1 in one process after STEPS steps."""
    root = tmp_path_factory.mktemp("unbroken")
    _one_process(root / "model", str(root / "run.out"), STEPS)
    return _checkpoint(root / "model", STEPS)


def test_a_model_axis_across_workers_checkpoints_whole_and_resumes(tmp_path, unbroken):
    model_dir = tmp_path / "model"
    _workers(model_dir, tmp_path / "first", FIRST)
    halfway = _checkpoint(model_dir, FIRST)
    # Whole tensors, mesh-independent: the keys and shapes of the one-process M = 1 checkpoint.
    assert {k: v.shape for k, v in halfway.items()} == {k: v.shape for k, v in unbroken.items()}
    kernels = [k for k in halfway if k.startswith(MODEL_KEYS) and halfway[k].ndim == 2]
    assert len(kernels) >= 8
    shutil.copytree(model_dir, tmp_path / "copy")

    # Resumed across the two workers: the chief's checkpoint of step STEPS.
    _workers(model_dir, tmp_path / "resumed", STEPS)
    _assert_same(_checkpoint(model_dir, STEPS), unbroken)
    # Not trivially equal: the resumed steps moved the state beyond the tolerance (the weights
    # by 3.6e-5 at most, early in BERT's warm-up; the LAMB moments by 2e-2).
    floats = [k for k in halfway if np.issubdtype(halfway[k].dtype, np.floating)]
    moved = max(float(np.max(np.abs(unbroken[k] - halfway[k]))) for k in floats)
    assert moved > 100 * RTOL
    assert max(float(np.max(np.abs(unbroken[k] - halfway[k]))) for k in kernels) > RTOL

    # Resumed at M = 1 in one process from the workers' checkpoint of step FIRST.
    _one_process(tmp_path / "copy", str(tmp_path / "m1.out"), STEPS)
    _assert_same(_checkpoint(tmp_path / "copy", STEPS), unbroken)


def test_a_failed_save_on_one_worker_is_one_line_and_its_peer_does_not_hang(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "ckpt_worker1").write_text("a file where worker 1 writes its throw-away saves")
    results = processes.run_worker_processes(
        lambda _: [*BERT, *ACROSS, f"--model_dir={model_dir}", "--max_train_steps=40",
                   "--steps_per_loop=1", "--checkpoint_every_loops=1"],
        tmp_path,
        TIMEOUT_S,
    )  # fmt: skip
    codes, texts = zip(*results, strict=True)
    assert codes[1] != 0 and codes[0] != 0, codes
    errors = [line for line in texts[1].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ckpt_worker1" in errors[0], texts[1][-3000:]
    assert "Traceback" not in texts[1]
    # Worker 1 failed before its gathers (TF makes the folder first): the chief's gather loses
    # its peer, and says so.
    errors = [line for line in texts[0].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "another worker did not take part" in errors[0], texts[0][-3000:]


def test_four_workers_model_axis_across_pairs_data_axis_of_two_equal_one_process(tmp_path):
    # M = 2 over workers (0, 1) and (2, 3): the model axis crosses processes and the two data
    # groups read different smoke batches (`synthetic.per_batch_shard`; the one-process M = 1
    # reference on 2 devices reads the same two batch shards). Measured: 160 s at load ~4-9.
    model_dir = tmp_path / "model"
    (tmp_path / "logs").mkdir()
    processes.run_workers(
        lambda _: [*BERT, *ACROSS, f"--model_dir={model_dir}", f"--max_train_steps={STEPS}"],
        tmp_path / "logs",
        TIMEOUT_S * 2,
        count=4,
    )
    _one_process_on(tmp_path / "ref", str(tmp_path / "ref.out"), STEPS, "--num_cpu_devices=2")
    _assert_same(_checkpoint(model_dir, STEPS), _checkpoint(tmp_path / "ref", STEPS))
