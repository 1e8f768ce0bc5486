"""Tests of `mlperf-tf sweep`: the grid, learning-rate rules, reading runs back, restart."""

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.resnet50 import config as resnet_config
from mlperf_tf import sweep
from mlperf_tf.errors import UserError
from tests import processes

TINY = "tests.tiny_benchmark:TinyBenchmark"


def _spec(**kwargs):
    return sweep.SweepSpec(**{"benchmark": "resnet50", "preset": "mini", **kwargs})


def test_split_top_level_keeps_tuples_whole():
    assert sweep.split_top_level("1,2, 4") == ["1", "2", "4"]
    assert sweep.split_top_level("(0.5,1.0),(0.1,1.0)") == ["(0.5,1.0)", "(0.1,1.0)"]
    assert sweep.split_top_level("") == []


def test_parse_args_builds_the_grid():
    spec, out, plots = sweep.parse_args([
        "--benchmark=resnet50", "--out=/tmp/x", "--optimizers=sgd,lars", "--batch_sizes=32,256",
        "--grid.model.bn_group_size=1,2", "--config.model.base_width=16", "--seeds=0,1",
        "--lr_rule=sgd:linear,lars:sqrt", "--run.num_cpu_devices=2", "--plots=false",
    ])  # fmt: skip
    assert out == "/tmp/x" and not plots
    assert spec.grid == {"model.bn_group_size": ("1", "2")}
    assert spec.lr_rule("sgd") == "linear" and spec.lr_rule("lars") == "sqrt"
    grid = sweep.cells(spec)
    assert len(grid) == 2 * 2 * 2 * 2
    assert len({cell.name for cell in grid}) == len(grid)
    assert grid[0] == sweep.Cell("sgd", 32, (("model.bn_group_size", "1"),), 0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--benchmark=resnet50"], "--out is required"),
        (["--benchmark=resnet50", "--out=x", "--bogus=1"], "unknown sweep argument --bogus"),
        (["--benchmark=resnet50", "--out=x", "--lr_rule=cubic"], "names no rule"),
        (["--benchmark=resnet50", "--out=x", "--batch_sizes=a,b"], "--batch_sizes"),
        (["--benchmark=resnet50", "--out=x", "--run.seed=3"], "--run.seed is set by the sweep"),
        (["--benchmark=resnet50", "--out=x", "--budget=forever"], "--budget='forever'"),
        (["--benchmark=resnet50", "--out=x", "optimizers=sgd"], "must look like --key=value"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("+", r"\+")):
        sweep.parse_args(argv)


@pytest.mark.parametrize(
    "optimizer, rule, factor",
    [("sgd", "linear", 64.0), ("sgd", "sqrt", 8.0), ("lars", "own", 1.0), ("lars", "sqrt", 8.0)],
)
def test_learning_rate_rules_scale_from_the_preset_batch(optimizer, rule, factor):
    preset = resnet_config.mini()  # global batch 32
    spec = _spec(optimizers=(optimizer,), batch_sizes=(2048,), lr_rules={optimizer: rule})
    overrides, lr = sweep.cell_overrides(spec, sweep.cells(spec)[0], preset)
    field = f"{optimizer}_opt_base_learning_rate"
    expected = getattr(preset.optimizer, field) * factor
    assert lr["lr_field"] == f"optimizer.{field}" and lr["lr_rule"] == rule
    assert math.isclose(lr["learning_rate"], expected)
    assert math.isclose(float(overrides[f"optimizer.{field}"]), expected)
    assert overrides["optimizer.opt_name"] == optimizer
    assert overrides["global_batch_size"] == "2048"
    # A fixed epoch budget: no cell stops at the target.
    assert float(overrides["quality_target"]) == sweep.UNREACHABLE_TARGET


def test_per_optimizer_overrides_and_lr_field():
    spec, _, _ = sweep.parse_args([
        "--benchmark=resnet50", "--out=x", "--optimizers=lars,sgd", "--batch_sizes=128",
        "--lr_rule=own", "--lr_field=sgd:optimizer.lars_opt_base_learning_rate",
        "--opt.sgd.optimizer.lars_opt_base_learning_rate=0.5",
        "--opt.sgd.optimizer.label_smoothing=0.2",
    ])  # fmt: skip
    preset = resnet_config.mini()
    lars, sgd = sweep.cells(spec)
    overrides, lr = sweep.cell_overrides(spec, lars, preset)
    assert "optimizer.label_smoothing" not in overrides
    assert lr["learning_rate"] == preset.optimizer.lars_opt_base_learning_rate
    overrides, lr = sweep.cell_overrides(spec, sgd, preset)
    assert overrides["optimizer.label_smoothing"] == "0.2"
    assert lr["lr_field"] == "optimizer.lars_opt_base_learning_rate"
    assert lr["learning_rate"] == 0.5
    with pytest.raises(UserError, match="not in --optimizers"):
        sweep.parse_args(["--benchmark=resnet50", "--out=x", "--opt.nlcg.a=1"])


def test_target_budget_keeps_the_target_and_grid_values_override():
    preset = resnet_config.mini()
    spec = _spec(budget="target", target=0.5, epochs=3, grid={"model.bn_group_size": ("2",)})
    overrides, _ = sweep.cell_overrides(spec, sweep.cells(spec)[0], preset)
    assert overrides["quality_target"] == "0.5"
    assert overrides["max_epochs"] == "3.0"
    assert overrides["model.bn_group_size"] == "2"


def test_missing_learning_rate_field_names_the_optimizer():
    spec = _spec(lr_fields={"*": "optimizer.no_such_rate"})
    with pytest.raises(UserError, match="no base learning-rate field"):
        sweep.cell_overrides(spec, sweep.cells(spec)[0], resnet_config.mini())


def _log_line(key, value, **metadata):
    event = {"key": key, "value": value, "time_ms": metadata.pop("time_ms", 0),
             "metadata": metadata}  # fmt: skip
    return ":::MLLOG " + json.dumps(event) + "\n"


def test_summarize_reads_quality_and_time_to_target(tmp_path):
    log = tmp_path / "mlperf_log.txt"
    log.write_text(
        "some other output\n"
        + _log_line("run_start", None, time_ms=1000)
        + _log_line("eval_accuracy", 0.4, epoch_num=1)
        + _log_line("eval_accuracy", 0.8, epoch_num=2)
        + _log_line("eval_accuracy", 0.7, epoch_num=3)
        + _log_line("run_stop", None, time_ms=31000, status="aborted")
    )
    run = {"cause": "budget_ended", "steps": 30, "steps_per_epoch": 10, "train_examples": 105,
           "global_batch_size": 10}  # fmt: skip
    row = sweep.summarize(run, sweep.read_mlperf_log(str(log)), target=0.75)
    assert row["final_quality"] == 0.7 and row["best_quality"] == 0.8
    assert row["steps_to_target"] == 20
    # Epochs count the examples trained on: 20 steps x 10 / 105.
    assert math.isclose(row["epochs_to_target"], 200 / 105)
    assert math.isclose(row["epochs"], 300 / 105)
    assert row["run_seconds"] == 30.0
    assert [p["step"] for p in row["curve"]] == [10, 20, 30]
    never = sweep.summarize(run, sweep.read_mlperf_log(str(log)), target=0.9)
    assert never["steps_to_target"] is None and never["epochs_to_target"] is None


def test_summarize_of_a_lower_is_better_quality_counted_in_samples(tmp_path):
    """Llama: log perplexity falls to its target, and epoch_num counts samples."""
    log = tmp_path / "mlperf_log.txt"
    log.write_text(
        _log_line("run_start", None, time_ms=0)
        + _log_line("eval_accuracy", 4.0, epoch_num=384)
        + _log_line("eval_accuracy", 3.2, epoch_num=768)
        + _log_line("eval_accuracy", 3.25, epoch_num=800)
        + _log_line("run_stop", None, time_ms=5000, status="success")
    )
    run = {"cause": "target_reached", "steps": 100, "steps_per_epoch": 125,
           "train_examples": 1000, "global_batch_size": 8, "higher_is_better": False,
           "eval_steps": [[384, 48], [768, 96], [800, 100]]}  # fmt: skip
    row = sweep.summarize(run, sweep.read_mlperf_log(str(log)), target=3.3)
    assert [p["step"] for p in row["curve"]] == [48, 96, 100]
    assert row["steps_to_target"] == 96 and row["best_quality"] == 3.2
    # Without the direction, 4.0 would count as reaching 3.3 at the first eval.
    assert sweep.summarize({**run, "higher_is_better": True}, sweep.read_mlperf_log(str(log)),
                           target=3.3)["steps_to_target"] == 48  # fmt: skip


def test_an_epoch_budget_of_a_lower_is_better_benchmark_never_stops_at_its_target():
    from benchmarks.llama31_8b import config as llama_config

    spec = _spec(benchmark="llama31_8b", preset="smoke")
    overrides, _ = sweep.cell_overrides(spec, sweep.cells(spec)[0], llama_config.smoke())
    assert float(overrides["quality_target"]) == -sweep.UNREACHABLE_TARGET


def test_malformed_log_is_a_user_error(tmp_path):
    log = tmp_path / "bad.txt"
    log.write_text(':::MLLOG {"key": "run_start"\n')
    with pytest.raises(UserError, match="bad.txt:1: malformed MLPerf log line"):
        sweep.read_mlperf_log(str(log))
    with pytest.raises(UserError, match="does not exist"):
        sweep.read_mlperf_log(str(tmp_path / "missing.txt"))


def _sweep_args(out):
    return [
        "-m", "mlperf_tf.cli", "sweep", f"--benchmark={TINY}", "--preset=smoke", f"--out={out}",
        "--batch_sizes=16,32", "--epochs=2", "--config.eval_every_epochs=1",
        "--run.steps_per_loop=5",
    ]  # fmt: skip


# Extended (CI runs it after README's default run); the default run covers its case by
# test_failed_cells_do_not_stop_the_others (the sweep's cells as processes).
@pytest.mark.extended
def test_two_cells_killed_and_restarted(tmp_path):
    """A sweep killed during its second cell keeps the first cell's result and finishes on rerun."""
    out = tmp_path / "sweep"
    first_log = str(tmp_path / "first.txt")
    first = processes.start(_sweep_args(out), first_log)
    try:
        done = out / "cells" / "preset_opt-b16-s0" / "result.json"
        second_started = out / "cells" / "preset_opt-b32-s0" / "job.json"
        processes.wait_until(lambda: second_started.exists(), 300, "the second cell to start")
    finally:
        processes.kill(first)
    assert done.exists()
    first_row = json.loads(done.read_text())
    assert not (out / "results.csv").exists()  # the killed sweep never got to its table

    second_log = str(tmp_path / "second.txt")
    second = processes.start(_sweep_args(out), second_log)
    assert processes.wait(second, 300, second_log) == 0, open(second_log).read()[-3000:]
    output = open(second_log).read()
    assert "preset_opt-b16-s0: done before, skipped" in output
    assert json.loads(done.read_text()) == first_row  # not run again

    rows = json.loads((out / "results.json").read_text())
    assert [row["global_batch_size"] for row in rows] == [16, 32]
    for row in rows:
        # smoke: 160 examples, 2 epochs -> 20 steps at batch 16, 10 at batch 32.
        assert row["steps"] == 2 * 160 // row["global_batch_size"]
        assert row["epochs"] == 2.0
        assert [p["epoch"] for p in row["curve"]] == [1.0, 2.0]
        assert 0.0 <= row["final_quality"] <= row["best_quality"] <= 1.0
        assert row["final_quality"] == row["curve"][-1]["quality"]
        log = os.path.join(out, "cells", row["cell"], "run", "mlperf_log.txt")
        logged = [e["value"] for e in sweep.read_mlperf_log(log) if e["key"] == "eval_accuracy"]
        assert logged == [p["quality"] for p in row["curve"]]
    assert rows[0]["learning_rate"] == 0.05 and rows[1]["learning_rate"] == 0.1  # linear
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == list(sweep.TABLE_COLUMNS) and len(csv_lines) == 3
    assert len((out / "results.md").read_text().splitlines()) == 2 + 2
    for png in ("quality_vs_batch.png", "quality_vs_epochs.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    # The same folder with another grid is refused, before any cell runs.
    other = [
        a if not a.startswith("--batch_sizes") else "--batch_sizes=8" for a in _sweep_args(out)
    ]
    refused = subprocess.run(
        [sys.executable, *other], cwd=processes.REPO_ROOT, env=processes.python_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "holds a different sweep (differs in batch_sizes)" in refused.stderr


def test_bad_run_flag_fails_before_any_cell(tmp_path):
    spec = sweep.SweepSpec(benchmark=TINY, preset="smoke", run_flags={"no_such_flag": "1"})
    with pytest.raises(UserError, match="--run.no_such_flag: `mlperf-tf run` has no flag"):
        sweep.run_sweep(spec, str(tmp_path / "sweep"), plots=False)
    assert not (tmp_path / "sweep" / "cells").exists()


def test_failed_cells_do_not_stop_the_others(tmp_path, monkeypatch):
    """Cells whose process cannot import the benchmark fail; every cell is still tried."""
    monkeypatch.chdir(tmp_path)  # the cells' `python -m` sees no `tests` package
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    spec = sweep.SweepSpec(benchmark=TINY, preset="smoke", batch_sizes=(16, 32))
    out = tmp_path / "sweep"
    with pytest.raises(sweep.CellFailedError, match="2 of 2 cells failed"):
        sweep.run_sweep(spec, str(out), plots=False, env=env)
    for cell in sweep.cells(spec):
        assert "cannot be imported" in (out / "cells" / cell.name / "output.txt").read_text()
        assert not (out / "cells" / cell.name / "result.json").exists()
    assert (out / "results.csv").read_text().splitlines() == [",".join(sweep.TABLE_COLUMNS)]
