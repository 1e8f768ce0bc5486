"""Tests of compliance.report: the PNG and Markdown summary of a run."""

import pytest

from compliance import cli, logfile, report
from compliance.suite_checks import Target
from tests.compliance import logs


def _records(tmp_path, **kwargs):
    path = logs.write_log(tmp_path / "run.txt", logs.resnet_records(**kwargs))
    return path, logfile.parse_records(logfile.scan_log(path), "1.0.0")


def test_series_has_the_evals_and_block_throughput(tmp_path):
    # One block of 4 epochs of 1000 samples per minute, an eval after each block.
    _, records = _records(tmp_path, accuracies=(0.5, 0.7, 0.76))
    series = report.run_series(records, "resnet")
    assert [round(m, 2) for m, _, _ in series.evals] == [1.0, 2.0, 3.0]
    assert [a for _, a, _ in series.evals] == [0.5, 0.7, 0.76]
    assert [e for _, _, e in series.evals] == [4, 8, 12]
    assert series.throughput_unit == "samples/s"
    assert [round(r, 1) for _, r in series.throughput] == pytest.approx([4000 / 60] * 3, abs=0.1)
    assert series.time.minutes == pytest.approx(3.0, abs=0.01)


def test_figure_draws_the_target_line(tmp_path):
    _, records = _records(tmp_path)
    series = report.run_series(records, "resnet")
    official = Target(0.759, True, "v >= 0.759")
    figure = report.plot_figure(series, report.Targets(official, official, "MLPerf's rules"), "t")
    accuracy_axes, throughput_axes = figure.axes
    assert any(list(line.get_ydata()) == [0.759, 0.759] for line in accuracy_axes.lines)
    assert list(accuracy_axes.lines[0].get_ydata()) == [0.5, 0.7, 0.76]
    assert len(throughput_axes.lines[0].get_xdata()) == 3


def test_write_report_writes_png_and_markdown(tmp_path):
    from matplotlib.image import imread

    path, _ = _records(tmp_path, accuracies=(0.5, 0.7, 0.76))
    files = report.write_report(path, str(tmp_path / "out"), ruleset="1.0.0")
    image = imread(files.png)
    assert image.shape[0] > 300 and image.shape[1] > 300
    text = open(files.markdown).read()
    assert "Verdict: **PASS**" in text
    assert "Target (MLPerf's rules) 0.759: reached at epoch 12" in text
    assert "Time to train: 3.0" in text
    assert "| 8 | 2.000 | 0.7000 |" in text
    assert "![eval accuracy and throughput](run.png)" in text


def test_report_of_a_failed_run_names_the_findings(tmp_path):
    path, _ = _records(tmp_path, accuracies=(0.5, 0.6), status="aborted")
    files = report.write_report(path, str(tmp_path / "out"), ruleset="1.0.0")
    text = open(files.markdown).read()
    assert "Verdict: **FAIL**" in text
    assert "Target (MLPerf's rules) 0.759: not reached (best 0.6000)" in text
    assert "[official:target]" in text


def test_report_cli_writes_one_pair_per_log_and_reports_bad_ones(tmp_path, capsys):
    first, _ = _records(tmp_path)
    other = tmp_path / "sub"
    other.mkdir()
    second = logs.write_log(other / "run.txt", logs.resnet_records())  # the same file name
    out = tmp_path / "out"
    code = cli.main(["report", first, second, str(tmp_path / "missing.txt"), "--out", str(out)])
    assert code == 2
    assert sorted(p.name for p in out.iterdir()) == ["run.md", "run.png", "run_2.md", "run_2.png"]
    assert "missing.txt: no such file" in capsys.readouterr().err


def test_a_run_with_its_own_target_is_drawn_against_it_and_mlperfs_is_marked(tmp_path):
    # A mini run aiming at 0.90 (say), which reached 0.76 at epoch 8: MLPerf's 0.759 is met too.
    records = logs.resnet_records(accuracies=(0.5, 0.76, 0.91), status="success")
    path = logs.write_log(
        tmp_path / "mini.txt", ['# mlperf-tf target {"quality_target": 0.9}', *records]
    )
    files = report.write_report(path, str(tmp_path / "out"), ruleset="1.0.0", quality="skip")
    text = open(files.markdown).read()
    assert "Target (the run's log) 0.9: reached at epoch 12" in text
    assert "MLPerf's target (not this run's) 0.759: reached at epoch 8" in text
    scan = logfile.scan_log(path)
    checked = report.checker.check_log(path, ruleset="1.0.0", quality="skip")
    targets = report.targets_of(checked, scan)
    assert (targets.run.value, targets.official.value, targets.differ) == (0.9, 0.759, True)
    figure = report.plot_figure(report.run_series(logfile.parse_records(scan, "1.0.0"), "resnet"),
                                targets, "t")  # fmt: skip
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert "run's target 0.9" in labels and "MLPerf target 0.759" in labels


def test_skip_judges_the_status_by_the_runs_own_target_when_logged(tmp_path):
    # A mini run that reached its own 0.6 and says success: honest under --quality=skip...
    records = logs.resnet_records(accuracies=(0.5, 0.61), status="success")
    path = logs.write_log(
        tmp_path / "a.txt", ['# mlperf-tf target {"quality_target": 0.6}', *records]
    )
    assert report.checker.check_log(path, ruleset="1.0.0", quality="skip").passed
    # ...but not without the logged target, nor with the MLPerf target enforced.
    bare = logs.write_log(tmp_path / "b.txt", records)
    assert not report.checker.check_log(bare, ruleset="1.0.0", quality="skip").passed
    assert not report.checker.check_log(path, ruleset="1.0.0").passed


_BREAKDOWN = (
    '# mlperf-tf time_breakdown {"train": 150.0, "compile": 0.5, "eval": 20.0, "checkpoint": 2.0,'
    ' "input_wait": 4.5, "other": 3.0, "time_to_train_s": 180.0, "warm_up_s": 9.0}'
)


def test_a_runs_time_breakdown_is_drawn_and_tabled_and_the_log_still_passes(tmp_path):
    records = logs.resnet_records(accuracies=(0.5, 0.7, 0.76))
    path = logs.write_log(tmp_path / "run.txt", [*records, _BREAKDOWN])
    plain = logs.write_log(tmp_path / "plain.txt", records)
    files = report.write_report(path, str(tmp_path / "out"), ruleset="1.0.0")
    text = open(files.markdown).read()
    assert "Verdict: **PASS**" in text  # the comment line is no MLPerf record
    assert "| train | 150.0 | 83.3 % |" in text and "| input wait | 4.5 | 2.5 % |" in text
    assert "Warm-up before run_start (init time, not counted): 9.0 s." in text
    out = tmp_path / "both"
    assert cli.main(["report", path, plain, "--out", str(out), "--ruleset", "1.0.0"]) == 0
    table = (out / "time_breakdown.md").read_text()
    row = f"| {tmp_path.name}/run.txt | 150.0 | 0.5 | 20.0 | 2.0 | 4.5 | 3.0 | 180.0 | 83.3 % |"
    assert row in table
    assert "plain.txt" not in table  # no breakdown in that log: no row
    assert (out / "time_breakdown.png").stat().st_size > 1000
    figure = report.plot_figure(
        report.run_series(logfile.parse_records(logfile.scan_log(path), "1.0.0"), "resnet"),
        report.Targets(None, None, "none"),
        "t",
        {"train": 150.0, "compile": 0.5, "eval": 20.0, "checkpoint": 2.0, "input_wait": 4.5,
         "other": 3.0, "time_to_train_s": 180.0},
    )  # fmt: skip
    bars = figure.axes[2].patches
    assert [round(b.get_width(), 1) for b in bars] == [150.0, 0.5, 20.0, 2.0, 4.5, 3.0]
