"""Tests of compliance.scoring: times to train and MLPerf benchmark results."""

import json
import random
import shutil
import subprocess
import sys

import pytest

from compliance import cli, scoring
from mlperf_tf.errors import UserError
from tests.compliance import logs


def _write_runs(directory, accuracy_lists):
    directory.mkdir(parents=True, exist_ok=True)
    for i, accuracies in enumerate(accuracy_lists):
        status = "success" if accuracies[-1] >= 0.759 else "aborted"
        logs.write_log(
            directory / f"result_{i}.txt",
            logs.resnet_records(accuracies=accuracies, status=status),
        )
    return str(directory)


def test_olympic_mean_matches_result_summarizer():
    from mlperf_logging.result_summarizer import result_summarizer

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 12)
        times = [rng.uniform(1, 100) for _ in range(n)]
        dropped = rng.randint(0, 1)
        max_dropped = rng.choice([1, 4])
        ours = scoring.olympic_mean(times, non_converged=dropped, max_dropped=max_dropped)
        theirs = result_summarizer._compute_olympic_average(list(times), dropped, max_dropped)
        assert ours == pytest.approx(theirs) if theirs is not None else ours is None


def test_result_of_five_runs_drops_fastest_and_slowest(tmp_path):
    # One minute per eval block: runs of 1..5 minutes; the result is the mean of 2, 3 and 4.
    runs = [[0.5] * (n - 1) + [0.76] for n in (3, 1, 5, 2, 4)]
    # Round 0.7.0 has no RCPs: the olympic scoring alone.
    result = scoring.score_directory(_write_runs(tmp_path / "resnet", runs), ruleset="0.7.0")
    assert result.valid, result.format_text()
    assert not result.rcp.checked and "RCPs exist from round 1.0.0 on" in result.rcp.message
    assert result.normalized_minutes == result.score_minutes
    assert result.required_runs == 5
    assert [round(r.time.minutes) for r in result.runs] == [3, 1, 5, 2, 4]
    assert result.score_minutes == pytest.approx(3.0, abs=0.01)


def test_one_non_converged_run_counts_as_the_slowest(tmp_path):
    runs = [[0.76], [0.5, 0.76], [0.5, 0.5, 0.76], [0.5, 0.5, 0.5, 0.76], [0.5]]
    result = scoring.score_directory(_write_runs(tmp_path / "resnet", runs), ruleset="0.7.0")
    assert result.valid
    assert [r.converged for r in result.runs] == [True, True, True, True, False]
    # Dropped: the fastest (1 min) and the non-converged run; mean of 2, 3 and 4 minutes.
    assert result.score_minutes == pytest.approx(3.0, abs=0.01)


def test_two_non_converged_runs_make_the_result_invalid(tmp_path):
    runs = [[0.76], [0.5, 0.76], [0.5, 0.5, 0.76], [0.5], [0.4]]
    result = scoring.score_directory(_write_runs(tmp_path / "resnet", runs), ruleset="1.0.0")
    assert not result.valid and result.score_minutes is None
    assert any("2 runs did not converge" in p for p in result.problems)


def test_too_few_runs_give_no_result_but_a_mean(tmp_path):
    directory = _write_runs(tmp_path / "resnet", [[0.76], [0.5, 0.76]])
    result = scoring.score_directory(directory, ruleset="1.0.0")
    assert not result.valid
    assert "2 run(s), the rules need 5" in result.problems
    assert result.mean_minutes == pytest.approx(1.5, abs=0.01)
    assert cli.main(["score", directory]) == 1


def test_score_cli_json_and_bad_input(tmp_path, capsys):
    runs = [[0.5] * (n - 1) + [0.76] for n in (3, 1, 5, 2, 4)]
    directory = _write_runs(tmp_path / "resnet", runs)
    assert cli.main(["score", directory, "--json", "--ruleset", "0.7.0"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert document["valid"] and document["benchmark"] == "resnet"
    assert len(document["runs"]) == 5
    assert cli.main(["score", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no result_"):
        scoring.score_directory(str(tmp_path / "empty"))


def _rcp_runs(directory, conv_epochs, *, epochs_per_eval):
    """Five converged runs at global batch 1632 (an RCP of v1.0 ResNet: mean 35.0 epochs, max
    speedup 1.035, so at least 33.8 epochs), each converging at `conv_epochs`."""
    directory.mkdir(parents=True)
    evals = conv_epochs // epochs_per_eval
    for i in range(5):
        records = logs.resnet_records(
            accuracies=[0.5] * (evals - 1) + [0.76], epochs_per_eval=epochs_per_eval, gbs=1632
        )
        logs.write_log(directory / f"result_{i}.txt", records)
    return str(directory)


def test_rcp_check_is_the_official_rcp_checker(tmp_path):
    from mlperf_logging.rcp_checker import rcp_checker

    slower = scoring.score_directory(
        _rcp_runs(tmp_path / "a", 36, epochs_per_eval=4), ruleset="1.0.0"
    )
    assert slower.valid and slower.rcp.passed and slower.rcp.message == "RCP found"
    assert slower.rcp.norm_factor == 1.0 and slower.normalized_minutes == slower.score_minutes
    # Faster than the RCP mean, within the speedup it allows: the result is scaled up, as
    # result_summarizer scales it (RCP mean / the runs' mean epochs).
    faster = scoring.score_directory(
        _rcp_runs(tmp_path / "b", 34, epochs_per_eval=2), ruleset="1.0.0"
    )
    assert faster.valid and faster.rcp.passed
    assert faster.rcp.norm_factor == pytest.approx(35.0 / 34.0, rel=1e-3)
    assert faster.normalized_minutes == faster.score_minutes * faster.rcp.norm_factor
    assert "RCP-normalised result" in faster.format_text()
    # Too fast for the RCP: not a valid result.
    too_fast = scoring.score_directory(
        _rcp_runs(tmp_path / "c", 32, epochs_per_eval=4), ruleset="1.0.0"
    )
    assert not too_fast.rcp.passed and not too_fast.valid
    assert any("RCP check failed" in p for p in too_fast.problems)
    # The same verdicts as the official function called directly.
    for folder, result in (("a", slower), ("b", faster), ("c", too_fast)):
        passed, message, factor = rcp_checker.check_directory(
            str(tmp_path / folder), "training", "1.0.0", False, False, rcp_pass="pruned_rcps"
        )
        assert (passed, message, factor) == (
            result.rcp.passed,
            result.rcp.message,
            result.rcp.norm_factor,
        )


def test_rounds_and_benchmarks_without_rcps_say_so(tmp_path):
    directory = _rcp_runs(tmp_path / "a", 36, epochs_per_eval=4)
    assert (
        "RCPs exist from round 1.0.0 on" in scoring.rcp_check(directory, "resnet", "0.7.0").message
    )
    result = scoring.rcp_check(directory, "transformer", "1.0.0")
    assert not result.checked and "round 1.0.0 has no RCPs for 'transformer'" in result.message
    assert "rounds with them: none" in result.message
    assert "rounds with them: 1.0.0" in scoring.rcp_check(directory, "resnet", "5.0.0").message


def test_a_resumed_run_without_its_first_run_start_is_not_counted(tmp_path):
    directory = _write_runs(
        tmp_path / "resnet", [[0.5] * (n - 1) + [0.76] for n in (3, 1, 5, 2, 4)]
    )
    first = tmp_path / "resnet" / "result_1.txt"
    first.write_text(
        '# mlperf-tf resumed {"step": 40, "original_run_start_ms": null}\n' + first.read_text()
    )
    result = scoring.score_directory(directory, ruleset="0.7.0")
    assert [r.converged for r in result.runs] == [True, False, True, True, True]
    # The resumed run (1 min, the fastest) counts as the slowest: mean of 3, 4 and 5 minutes.
    assert result.score_minutes == pytest.approx(4.0, abs=0.01)


def test_time_to_train_reads_seconds_and_milliseconds(tmp_path):
    json_log = logs.write_log(tmp_path / "a.txt", logs.resnet_records(accuracies=(0.5, 0.76)))
    assert scoring.time_to_train(json_log).minutes == pytest.approx(2.0, abs=0.01)
    v06 = tmp_path / "b.txt"
    v06.write_text(
        ':::MLL 1000.5 run_start: {"value": null, "metadata": {}}\n'
        ':::MLL 1090.5 run_stop: {"value": null, "metadata": {"status": "success"}}\n'
    )
    time = scoring.time_to_train(str(v06))
    assert time.seconds == 90.0 and time.status == "success"


_SUMMARIZER = """
import contextlib, io, json, sys
from mlperf_logging.result_summarizer import result_summarizer
results = []
for benchmark, folder, ruleset in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        scores, _, score, _, _ = result_summarizer._compute_strong_score_standalone(
            benchmark, "system", False, folder, "training", ruleset, return_full_scores=True)
    results.append({"scores": scores, "score": score})
print(json.dumps(results))
"""


def test_run_times_match_result_summarizer_on_the_corpus(corpus_dir, corpus_rows, tmp_path):
    """Per-run times to train and the olympic score equal result_summarizer's on real logs.

    The summarizer takes timestamps as milliseconds, which 0.6.0 logs are not (they write
    seconds): there its minutes are ours / 1000.
    """
    groups = {}
    for row in corpus_rows:
        if row["kind"] == "real":
            groups.setdefault((row["ruleset"], row["benchmark"]), []).append(row)
    jobs = []
    for (ruleset, benchmark), rows in sorted(groups.items()):
        folder = tmp_path / ruleset / benchmark
        folder.mkdir(parents=True)
        for i, row in enumerate(rows):
            shutil.copy(corpus_dir / row["path"], folder / f"result_{i}.txt")
        jobs.append((benchmark, str(folder), ruleset))
    done = subprocess.run(
        [sys.executable, "-c", _SUMMARIZER, json.dumps(jobs)],
        capture_output=True,
        text=True,
        check=True,
    )
    compared = 0
    for (benchmark, folder, ruleset), theirs in zip(jobs, json.loads(done.stdout)):
        ours = scoring.score_directory(str(folder), ruleset=ruleset)
        unit = 1000.0 if ruleset == "0.6.0" else 1.0
        counted = {run.path: run.time.minutes / unit for run in ours.runs if run.converged}
        assert counted.keys() == theirs["scores"].keys(), (ruleset, benchmark)
        for path, minutes in counted.items():
            assert minutes == theirs["scores"][path]  # same arithmetic, same float
            compared += 1
        non_converged = len(ours.runs) - len(counted)
        if non_converged <= 1:
            olympic = scoring.olympic_mean(list(counted.values()), non_converged=non_converged)
            assert olympic == pytest.approx(theirs["score"]) if olympic else theirs["score"] is None
    assert compared >= 50


def test_score_prints_each_runs_time_breakdown(tmp_path):
    directory = tmp_path / "runs"
    _write_runs(directory, [(0.5, 0.76)] * 2)
    with open(directory / "result_0.txt", "a", encoding="utf-8") as f:
        f.write(
            '# mlperf-tf time_breakdown {"train": 100.0, "compile": 0.0, "eval": 10.0, '
            '"checkpoint": 0.0, "input_wait": 5.0, "other": 5.0, "time_to_train_s": 120.0}\n'
        )
    score = scoring.score_directory(str(directory), ruleset="1.0.0")
    assert score.runs[0].breakdown["train"] == 100.0 and score.runs[1].breakdown is None
    text = score.format_text()
    assert "    time to train 120.0 s: train 100.0 s (83 %), compile 0.0 s (0 %)" in text
    assert score.to_dict()["runs"][0]["time_breakdown"]["input_wait"] == 5.0
