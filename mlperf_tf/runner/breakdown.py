"""Provides `TimeBreakdown`: the action that accounts for the time from `run_start` to `run_stop`.

It adds up each host loop's time and input wait (`LoopOutput.seconds`, `.input_wait_s`), each
evaluation's time, and the checkpointer's save time, and at `run_stop` writes
`<model_dir>/time_breakdown.json` plus the same object as a comment line of the MLPerf log (see
`mlperf_tf.time_breakdown` for the parts and how they add up).
"""

from __future__ import annotations

import json
import time

from mlperf_tf import time_breakdown
from mlperf_tf.runner.actions import Action


class TimeBreakdown(Action):
    """Accounts for the run's time; `result` holds the breakdown after `at_end` (else None).

    Put it right after the action that logs `run_stop`, so its `at_end` reads the clock there.
    """

    def __init__(self):
        self.controller = None
        self.loops: list[tuple[int, float, float]] = []
        self.eval_s = 0.0
        self._eval_begin = None
        self.result = None

    def attach(self, controller) -> None:
        self.controller = controller

    def after_loop(self, output):
        self.loops.append((output.steps, output.seconds, output.input_wait_s))

    def eval_begin(self, point):
        self._eval_begin = time.monotonic()

    def after_eval(self, output):
        if self._eval_begin is not None:
            self.eval_s += time.monotonic() - self._eval_begin
            self._eval_begin = None

    def at_end(self, end):
        controller = self.controller
        result = time_breakdown.compute(
            total_s=end.seconds,
            loops=self.loops,
            eval_s=self.eval_s,
            checkpoint_s=controller.checkpointer.save_seconds,
        )
        result.update(
            status=end.stop.cause.status,
            steps=sum(steps for steps, _, _ in self.loops),
            run_start_ms=int(controller.run_state.run_start_ms.numpy()),
            resumed_from_step=controller.start_step,
            warm_up_s=controller.warm_up_s,  # init time, before run_start: not in the total
        )
        self.result = result
        if controller.chief:
            controller.mllog.comment(f"mlperf-tf {time_breakdown.COMMENT_TAG} {json.dumps(result)}")
            time_breakdown.write(controller.run_config.model_dir, result)
