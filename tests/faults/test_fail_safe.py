"""No user file moved, no finished run overwritten, honest stops in set-up (issue 31, items 1-3)."""

import os
import signal
import time

import pytest
from mlperf_logging.mllog import constants as C

from mlperf_tf import distribute, preemption, runlog, runner
from mlperf_tf.errors import UserError
from tests.mlperf_tf.test_runner import _log_lines
from tests.tiny_benchmark import TinyBenchmark, smoke


def _config(model_dir, **kwargs):
    kwargs.setdefault("distribution", "one_device")
    kwargs.setdefault("steps_per_loop", 3)
    return runner.RunConfig(model_dir=str(model_dir), **kwargs)


def _run(model_dir, cfg=None, **kwargs):
    return runner.run(TinyBenchmark(cfg or smoke()), _config(model_dir, **kwargs))


def _tree(root):
    """{relative path: (size, mtime_ns)} of every file under `root`."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_mlperf_log_naming_a_folder_writes_the_log_inside_and_moves_nothing(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    result = _run(tmp_path / "m", max_train_steps=2, mlperf_log=str(folder))
    assert result.mlperf_log == str(folder / "mlperf_log.txt")
    assert (folder / "notes.txt").read_text() == "my notes\n"
    assert not (tmp_path / "results.1").exists()
    assert any(e["key"] == C.RUN_STOP for e in _log_lines(result.mlperf_log))


@pytest.mark.parametrize(
    "content", [b"my thesis, not a log\n", b"\x00\x01\x02binary", b"\n\n# a comment\nplain text"]
)
def test_a_file_that_is_not_a_suite_log_is_never_moved(tmp_path, content):
    path = tmp_path / "paper.txt"
    path.write_bytes(content)
    with pytest.raises(UserError, match="not an MLPerf log this suite wrote"):
        _run(tmp_path / "m", max_train_steps=2, mlperf_log=str(path))
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["paper.txt"]  # not even the model_dir was made


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: (p / "f").write_text("x") and str(p / "f" / "log.txt"), "is a file"),
        (lambda p: (p / "f").write_text("x") and str(p / "f" / "a" / "log.txt"), "is a file"),
    ],
)
def test_a_log_path_under_a_file_is_an_error_before_any_work(tmp_path, make, needle):
    with pytest.raises(UserError, match=needle):
        _config(tmp_path / "m", mlperf_log=make(tmp_path))


def test_a_finished_run_is_not_resumed_and_its_log_is_kept(tmp_path):
    first = _run(tmp_path / "m", max_train_steps=4)
    assert first.cause is runner.StopCause.BUDGET_ENDED
    text = _read(first.mlperf_log)
    before = _tree(tmp_path)
    with pytest.raises(runlog.RunFinished, match="finished .budget_ended at step 4"):
        _run(tmp_path / "m", max_train_steps=4)
    assert _tree(tmp_path) == before, "a finished run's folder was changed"
    # --restart: a new run in a new log; the old log and checkpoints are kept.
    again = _run(tmp_path / "m", max_train_steps=4, restart=True)
    assert again.cause is runner.StopCause.BUDGET_ENDED and again.steps == 4
    assert _read(first.mlperf_log + ".1") == text
    assert os.path.isdir(tmp_path / "m" / "ckpt.1")
    new = _log_lines(again.mlperf_log)
    assert [e["key"] for e in new].count(C.EVAL_ACCURACY) >= 1
    assert "mlperf-tf resumed" not in _read(again.mlperf_log)
    # A longer step budget goes on from the last checkpoint (and keeps the finished log).
    longer = _run(tmp_path / "m", max_train_steps=6)
    assert longer.steps == 6 and "mlperf-tf resumed" in _read(longer.mlperf_log)
    assert _read(again.mlperf_log + ".2") != _read(longer.mlperf_log)


def test_a_run_that_reached_its_target_is_not_resumed(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(smoke(), quality_target=0.0, max_epochs=5)
    first = _run(tmp_path / "m", cfg=cfg)
    assert first.cause is runner.StopCause.TARGET_REACHED
    text = _read(first.mlperf_log)
    with pytest.raises(runlog.RunFinished, match="target_reached"):
        _run(tmp_path / "m", cfg=cfg)
    assert _read(first.mlperf_log) == text
    assert not os.path.exists(first.mlperf_log + ".1")


def test_an_interrupted_run_resumes_and_its_log_is_kept(tmp_path):
    """A run_stop aborted by a stop request is not a finished run: the same command resumes."""
    stop = preemption.StopRequest()
    stop.request("test")
    benchmark = TinyBenchmark(smoke())
    first = runner.run(benchmark, _config(tmp_path / "m", max_train_steps=4), stop_request=stop)
    assert first.cause is runner.StopCause.INTERRUPTED
    text = _read(first.mlperf_log)
    resumed = _run(tmp_path / "m", max_train_steps=4)
    assert resumed.cause is runner.StopCause.BUDGET_ENDED
    assert _read(first.mlperf_log + ".1") == text
    keys = [e["key"] for e in _log_lines(resumed.mlperf_log)]
    assert C.EVAL_ACCURACY in keys and keys[-1] == C.RUN_STOP


def test_finished_reads_the_note_and_legacy_success_logs(tmp_path):
    start = ':::MLLOG {"key": "init_start", "value": null}\n'
    stop_aborted = ':::MLLOG {"key": "run_stop", "metadata": {"status": "aborted"}}\n'
    stop_success = ':::MLLOG {"key": "run_stop", "metadata": {"status": "success"}}\n'
    note = "# " + runlog.finished_note("budget_ended", 7, "aborted") + "\n"
    cases = {
        "noted": (start + note + stop_aborted, runlog.Finished("budget_ended", 7, "aborted")),
        "interrupted": (start + stop_aborted, None),
        "note_without_stop": (start + note, None),
        "legacy_success": (start + stop_success, runlog.Finished("target_reached", 0, "success")),
        "restarted_after_finish": (start + note + stop_aborted + start, None),
        "foreign": ("hello\n" + note + stop_aborted, None),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        assert runlog.finished(str(tmp_path / name)) == expected, name


def test_a_log_that_never_reached_run_start_is_replaced_not_kept(tmp_path):
    log = tmp_path / "mlperf_log.txt"
    log.write_text(':::MLLOG {"key": "init_start", "value": null}\n')
    assert runlog.keep_previous(str(log), model_dir=str(tmp_path), restart=False) is None
    assert not log.exists() and not (tmp_path / "mlperf_log.txt.1").exists()


def test_a_huge_cpu_device_count_is_one_line_before_any_set_up(tmp_path):
    begin = time.monotonic()
    with pytest.raises(UserError, match=r"--num_cpu_devices=100000 is more than this host"):
        _config(tmp_path / "m", num_cpu_devices=100000, distribution="mirrored")
    assert time.monotonic() - begin < 10  # making 100,000 devices would take minutes
    assert distribute.max_cpu_devices() >= 8  # the tests' splits fit on any CI host
    assert not (tmp_path / "m").exists()


def _wait_for(items, seconds=10):
    deadline = time.monotonic() + seconds
    while not items and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_signal_before_the_first_loop_ends_set_up_at_once():
    stop = preemption.StopRequest()
    early, second = [], []
    with preemption.handle_stop_signals(stop, on_second=second.append, before_start=early.append):
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(early)
    assert early == ["SIGTERM"] and not stop.requested and not second


def test_a_signal_after_the_loop_is_built_stops_at_the_next_step():
    stop = preemption.StopRequest()
    stop.should_stop()  # what tracing the first loop does
    assert stop.armed
    early = []
    with preemption.handle_stop_signals(stop, before_start=early.append):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stop.requested and not early


def test_stop_messages_name_only_checkpoints_that_exist(tmp_path):
    assert "no checkpoint exists" in preemption.last_checkpoint_words(str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    for name in ("ckpt-3.index", "ckpt-12.index", "ckpt-12.data-00000-of-00001", "checkpoint"):
        (tmp_path / "ckpt" / name).write_text("")
    words = preemption.last_checkpoint_words(str(tmp_path))
    assert "step 12" in words and os.path.join(str(tmp_path), "ckpt", "ckpt-12") in words


@pytest.mark.parametrize("opt_name", ["kfac", "nlcg", "neumann"])
def test_a_resnet_run_with_an_optimizer_closed_rules_forbid_is_open_or_refused(tmp_path, opt_name):
    from mlperf_tf import config as config_lib
    from mlperf_tf import registry
    from mlperf_tf.runner import controller

    resnet = registry.get("resnet50")
    cfg = config_lib.override(resnet.preset("smoke"), {"optimizer.opt_name": opt_name})
    benchmark = resnet(cfg)
    auto = controller._resolve_division(benchmark, _config(tmp_path), "4.0.0")
    assert auto.submission_division == "open"
    with pytest.raises(UserError, match=f"--submission_division=closed: .*not '{opt_name}'"):
        controller._resolve_division(
            benchmark, _config(tmp_path, submission_division="closed"), "4.0.0"
        )
    lars = resnet(resnet.preset("smoke"))
    assert controller._resolve_division(lars, _config(tmp_path), "4.0.0").submission_division == (
        "closed"
    )


def test_progress_to_a_file_is_a_few_plain_lines_not_a_redraw_per_shard():
    import io

    from mlperf_tf.data import tfrecord

    stream = io.StringIO()  # not a terminal, like a redirected log
    bar = tfrecord.Progress(10_000, prefix="train", stream=stream)
    for _ in range(10_000):
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    assert text.count("\n") <= 3 and "10000/10000" in text.splitlines()[-1]


def test_a_failed_conversion_leaves_no_shards(tmp_path):
    from mlperf_tf.data import tfrecord

    def examples():
        yield b"record"
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        tfrecord.write_sharded(examples(), str(tmp_path / "out"), prefix="train", num_shards=4)
    assert os.listdir(tmp_path / "out") == []


def test_bench_and_cli_do_not_import_each_other():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "mlperf_tf"
    assert "mlperf_tf.cli" not in (root / "bench.py").read_text()
    assert "split_config_overrides" in (root / "config.py").read_text()
