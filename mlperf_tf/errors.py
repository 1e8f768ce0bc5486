"""Provides the suite's error types and the documented exit codes of `mlperf-tf run`.

Exit codes (`docs/reliability.md`):
  0  the run ended: success, or its step budget ran out (`run_stop` says which).
  1  the run aborted on a non-finite loss (`run_stop` aborted; no checkpoint of the bad weights).
  2  bad input (`UserError`: a flag, a path, a file's content); one `error:` line.
  3  stopped by SIGTERM/SIGINT at a step boundary: checkpoint saved, `run_stop` aborted; rerun the
     same command to resume.
  4  a peer worker died or froze (`PeerError`): `run_stop` aborted, a checkpoint where possible.
  5  the tf.data service sent no batch for `--data_service_timeout_s` (all its workers dead or
     frozen): `run_stop` aborted, a checkpoint of the last completed step where possible.
  130  a second SIGTERM/SIGINT: stopped at once, nothing saved beyond the last checkpoint.
"""

EXIT_OK = 0
EXIT_NON_FINITE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 3
EXIT_PEER_FAILED = 4
EXIT_DATA_SERVICE_FAILED = 5
EXIT_KILLED_AT_ONCE = 130


class UserError(Exception):
    """A problem with what the user gave (a flag, a path, a file's content), not a bug.

    The message must name the bad input and say what was expected; the CLI prints it as
    `error: <message>` and exits with code 2, without a traceback.
    """


class DataError(UserError, ValueError):
    """Input data is missing, empty or corrupt; the message names the file or path."""


class PeerError(Exception):
    """A peer worker of a multi-worker run failed (died, froze, or became unreachable).

    The message names the task and its address and says how it failed; the CLI prints it as
    `error: <message>` and exits with `EXIT_PEER_FAILED`.
    """
