"""Tests of the MLPerf logger: line format, chief-only writing, no logging from inside tf.function."""

import json

import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from mlperf_tf.mllog import MLPerfLogger


def _records(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert all(line.startswith(":::MLLOG {") for line in lines), lines
    return [json.loads(line[len(":::MLLOG ") :]) for line in lines]


def test_lines_are_mllog_json_with_the_caller_and_metadata(tmp_path):
    path = tmp_path / "log.txt"
    with MLPerfLogger(str(path)) as log:
        log.start(C.RUN_START)
        log.event(C.EVAL_ACCURACY, 0.5, metadata={C.EPOCH_NUM: 4})
        log.log_hparams({C.OPT_BASE_LR: 0.1, C.MAX_SEQUENCE_LENGTH: (256, {"method": "discard"})})
        log.end(C.RUN_STOP, metadata={C.STATUS: C.SUCCESS})
    records = _records(path)
    assert [r["key"] for r in records] == [C.RUN_START, C.EVAL_ACCURACY, C.OPT_BASE_LR,
                                           C.MAX_SEQUENCE_LENGTH, C.RUN_STOP]  # fmt: skip
    assert [r["event_type"] for r in records] == [C.INTERVAL_START, C.POINT_IN_TIME,
        C.POINT_IN_TIME, C.POINT_IN_TIME, C.INTERVAL_END]  # fmt: skip
    assert records[1]["metadata"]["epoch_num"] == 4
    assert records[3]["value"] == 256 and records[3]["metadata"]["method"] == "discard"
    assert records[4]["metadata"]["status"] == "success"
    # The caller's file, relative to the repo, not this logger's own module.
    assert records[0]["metadata"]["file"] == "tests/mlperf_tf/test_mllog.py"
    assert records[2]["metadata"]["file"] == "tests/mlperf_tf/test_mllog.py"
    assert all(isinstance(r["time_ms"], int) for r in records)


def test_non_chief_writes_nothing(tmp_path):
    path = tmp_path / "worker1.txt"
    log = MLPerfLogger(str(path), enabled=False)
    log.event(C.SEED, 1)
    log.close()
    assert not path.exists()


def test_logging_while_tracing_a_tf_function_is_an_error(tmp_path):
    log = MLPerfLogger(str(tmp_path / "log.txt"))

    @tf.function
    def step():
        log.event(C.EVAL_ACCURACY, 1.0)
        return 1

    with pytest.raises(RuntimeError, match="inside a tf.function"):
        step()
    log.close()
