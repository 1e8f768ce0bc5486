"""Provides `MLPerfLogger`: writes MLPerf `:::MLLOG {json}` lines through `mlperf_logging.mllog`.

The emitter side of MLPerf logging lives in the library (the runner calls it); `compliance/` is the
checker side only and imports neither this module nor TensorFlow.

Only the chief worker writes; every other worker gets a logger whose calls do nothing, so callers
never branch on the task. Log calls are host-side: calling one while a `tf.function` is being traced
is an error, because the line would be written once at trace time instead of at every step.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import sys
from typing import Any

import tensorflow as tf
from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog import mllog

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_logger_ids = itertools.count()


class MLPerfLogger:
    """Writes one MLPerf log file (and optionally echoes it to stdout).

    Args:
      path: the log file; its folder is created. Ignored when `enabled` is False.
      enabled: False on non-chief workers: every call is then a no-op.
      echo: also print each line to stdout, as MLPerf reference implementations do.
    """

    def __init__(self, path: str | None, *, enabled: bool = True, echo: bool = False):
        self.path = path if enabled else None
        self.enabled = enabled and path is not None
        self._handlers: list[logging.Handler] = []
        self._mllogger = None
        if not self.enabled:
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # A private logging.Logger per file: mllog's module-level default logger would share
        # handlers between runs in one process (tests, notebooks).
        py_logger = logging.getLogger(f"mlperf_tf.mllog.{next(_logger_ids)}")
        py_logger.propagate = False
        py_logger.setLevel(logging.INFO)
        file_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        file_handler.setFormatter(logging.Formatter("%(message)s"))
        self._handlers.append(file_handler)
        if echo:
            stream_handler = logging.StreamHandler(sys.stdout)
            stream_handler.setFormatter(logging.Formatter("%(message)s"))
            self._handlers.append(stream_handler)
        for handler in self._handlers:
            py_logger.addHandler(handler)
        self._py_logger = py_logger
        # stack offset 2: report the caller of event()/start()/end(), not this module
        # (`_record` passes its own, one deeper).
        self._mllogger = mllog.MLLogger(
            logger=py_logger, default_stack_offset=2, root_dir=re.escape(_REPO_ROOT)
        )

    def _check_host(self, key: str) -> None:
        if tf.inside_function():
            raise RuntimeError(
                f"MLPerf log key '{key}' logged inside a tf.function: log from the host loop."
            )

    def event(
        self, key: str, value: Any = None, metadata: dict | None = None, *, _depth: int = 0
    ) -> None:
        """Logs a point-in-time event (`event_type: POINT_IN_TIME`)."""
        self._record("event", key, _depth, value=value, metadata=metadata)

    def start(
        self,
        key: str,
        value: Any = None,
        metadata: dict | None = None,
        *,
        time_ms: int | None = None,
        _depth: int = 0,
    ) -> None:
        """Logs the start of an interval (`INTERVAL_START`), e.g. `run_start`.

        `time_ms` overrides the line's time (a resumed run re-logs its first `run_start`).
        """
        self._record("start", key, _depth, value=value, metadata=metadata, time_ms=time_ms)

    def comment(self, text: str) -> None:
        """Writes `# text` as its own line: not an MLPerf record (the official parser skips it)."""
        if self.enabled:
            self._py_logger.info("# %s", text)
            self._flush()

    def end(
        self, key: str, value: Any = None, metadata: dict | None = None, *, _depth: int = 0
    ) -> None:
        """Logs the end of an interval (`INTERVAL_END`), e.g. `run_stop`."""
        self._record("end", key, _depth, value=value, metadata=metadata)

    def _record(self, kind: str, key: str, depth: int, **fields) -> None:
        """Writes one line by `MLLogger`'s method `kind` ("event", "start" or "end"), from the
        host only. Its `file`/`lineno` name the caller of the public method, `depth` frames
        further up for the helpers of this class (stack offset 3: past this method and it)."""
        self._check_host(key)
        if self.enabled:
            getattr(self._mllogger, kind)(key=key, stack_offset=3 + depth, **fields)
            self._flush()

    def _flush(self) -> None:
        # Every line reaches the disk at once: a run killed later keeps its log up to that point.
        for handler in self._handlers:
            handler.flush()

    def log_hparams(self, hparams: dict[str, Any]) -> None:
        """Logs `{key: value}` or `{key: (value, metadata)}` entries as events, in order."""
        for key, value in hparams.items():
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
                self.event(key, value[0], metadata=value[1], _depth=1)
            else:
                self.event(key, value, _depth=1)

    def log_submission(
        self, *, benchmark: str, org: str, platform: str, division: str, status: str
    ) -> None:
        """Logs the five `submission_*` keys the rules require once per run."""
        self.event(C.SUBMISSION_BENCHMARK, benchmark, _depth=1)
        self.event(C.SUBMISSION_ORG, org, _depth=1)
        self.event(C.SUBMISSION_DIVISION, division, _depth=1)
        self.event(C.SUBMISSION_STATUS, status, _depth=1)
        self.event(C.SUBMISSION_PLATFORM, platform, _depth=1)

    def close(self) -> None:
        """Closes the file; later calls would raise."""
        for handler in self._handlers:
            handler.close()
            self._py_logger.removeHandler(handler)
        self._handlers = []
        self.enabled = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
