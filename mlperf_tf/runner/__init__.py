"""Provides `run`: the MLPerf training loop of any `Benchmark` on any tf.distribute strategy.

The package is shaped like Orbit: `controller` (the outer loop, `run`), `trainer` (one compiled
host loop; `Trainer.sum_and_apply` is where gradients are summed and applied), `evaluator`,
`actions` (side work called with each loop's and eval's output) and `config` (`RunConfig`, the one
declaration of the run settings; `StopCause`; `RunResult`).
"""

from mlperf_tf.runner.actions import Action, EvalOutput, LoopOutput, RunEnd, Stop
from mlperf_tf.runner.config import RunConfig, RunResult, StopCause
from mlperf_tf.runner.controller import Controller, StopRequest, preflight, run, schedule
from mlperf_tf.runner.evaluator import Evaluator, evaluate_only
from mlperf_tf.runner.trainer import Trainer, replica_function

__all__ = [
    "Action",
    "Controller",
    "EvalOutput",
    "Evaluator",
    "LoopOutput",
    "RunConfig",
    "RunEnd",
    "RunResult",
    "Stop",
    "StopCause",
    "StopRequest",
    "Trainer",
    "evaluate_only",
    "preflight",
    "replica_function",
    "run",
    "schedule",
]
