"""ResNet-50's smoke preset through the CLI with torus2d, weight-update sharding and 4 devices."""

import json

import pytest

from tests import e2e, processes
from tests.refusals import the_error_line

TIMEOUT_S = 900


# 35-39 s (four replicas' sharded step to trace, even at 4 steps without the warm-up): the same
# flags through two worker processes run by default (`test_multiworker.py`, torus2d + sharding),
# and the summer's algorithms at four devices (`test_summer.py`).
@pytest.mark.slow
def test_resnet50_smoke_torus2d_sharded_on_four_devices(tmp_path):
    model_dir = tmp_path / "run"
    log = str(tmp_path / "cli.out")
    processes.run_ok(
        ["-m", "mlperf_tf.cli", "run", "--benchmark=resnet50", "--preset=smoke",
         f"--model_dir={model_dir}", "--all_reduce=torus2d", "--weight_update_sharding",
         "--num_cpu_devices=4"],
        log,
        TIMEOUT_S,
    )  # fmt: skip
    with open(model_dir / "gradient_summation.json", encoding="utf-8") as f:
        assert json.load(f) == {"all_reduce": "torus2d", "mesh": "2x2", "pack_mb": 0.0,
                                "weight_update_sharding": True}  # fmt: skip
    records = e2e.log_records(model_dir / "mlperf_log.txt")
    stops = [r for r in records if r["key"] == "run_stop"]
    assert len(stops) == 1
    assert any(r["key"] == "eval_accuracy" for r in records)


def test_wrong_mesh_is_a_one_line_error(tmp_path):
    log = str(tmp_path / "cli.out")
    code, text = processes.run(
        ["-m", "mlperf_tf.cli", "run", "--benchmark=resnet50", "--preset=smoke",
         f"--model_dir={tmp_path / 'run'}", "--all_reduce=torus2d", "--mesh=3x1",
         "--num_cpu_devices=4"],
        log,
        300,
    )  # fmt: skip
    line = the_error_line(text, code, 2)
    assert line == "error: --mesh=3x1 has 3 replicas but the strategy has 4", text[-3000:]
