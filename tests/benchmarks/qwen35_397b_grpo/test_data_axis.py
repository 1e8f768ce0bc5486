"""`mlperf-tf run --preset=smoke` of the GRPO benchmark on two batch shards (data = 2) against
one device: the validation batches are cut into the shards' shares (before, the evaluator ran
out of data at the first evaluation), and the step's token-mean metric and the evaluations
equal the one-device run's (the rollouts are generated once on the host, so both runs train
on the same batches). Processes are bounded and killed by pid (`tests.processes`)."""

import json
import re

import pytest

from tests import processes

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

TIMEOUT_S = 300
SMOKE = ["-m", "mlperf_tf.cli", "run", "--benchmark=qwen35_397b_grpo", "--preset=smoke",
         "--config.eval_batch_size=2", "--config.eval_examples=2",
         "--config.rollout.eval_tasks=2"]  # fmt: skip


def _run(tmp_path, name: str, *flags: str):
    model_dir = tmp_path / name
    text = processes.run_ok([*SMOKE, f"--model_dir={model_dir}", *flags],
                            str(tmp_path / f"{name}.out"), TIMEOUT_S)  # fmt: skip
    ratios = [float(x) for x in re.findall(r"sampling_importance_ratio ([0-9.e-]+)", text)]
    evals = [
        json.loads(line.split(":::MLLOG ", 1)[1])["value"]
        for line in (model_dir / "mlperf_log.txt").read_text().splitlines()
        if '"key": "eval_accuracy"' in line
    ]
    return ratios, evals


def test_two_batch_shards_evaluate_and_report_the_one_device_run(tmp_path):
    one_ratios, one_evals = _run(tmp_path, "one", "--distribution=one_device")
    two_ratios, two_evals = _run(tmp_path, "two", "--num_cpu_devices=2")
    assert len(two_evals) == len(one_evals) == 2
    assert two_evals == pytest.approx(one_evals)
    # Before, each replica's share of the step's tokens was averaged: 0.5 where 1 is right.
    assert len(two_ratios) == len(one_ratios) == 2
    assert two_ratios == pytest.approx(one_ratios, rel=1e-3)
