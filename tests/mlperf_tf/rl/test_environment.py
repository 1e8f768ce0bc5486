"""Tests of `Environment`'s agent timeout: no limit until started; a turn after the deadline,
or one whose tools run past it, ends the rollout as invalid; `time_left` caps a tool's own
timeout by the time the rollout has left."""

import time

from mlperf_tf.rl.environment import Environment
from mlperf_tf.rl.tool_calls import format_tool_call


class Sleepy(Environment):
    def reset(self, task):
        return "task"

    def tools(self):
        return {"nap": lambda seconds: time.sleep(float(seconds)) or "rested"}

    def reward(self):
        return 1.0


def test_the_agent_timeout_makes_the_turn_invalid():
    env = Sleepy()
    nap = format_tool_call("nap", {"seconds": "0.3"})
    assert env.act(nap) == env.act(nap)  # no clock: no limit
    assert env.time_left(5.0) == 5.0 and not env.timed_out
    env.start_agent_clock(10.0)
    assert 9.0 < env.time_left(60.0) <= 10.0 and env.time_left(2.0) == 2.0
    turn = env.act(nap)
    assert turn.observation == "rested" and not turn.done and not turn.invalid
    env.start_agent_clock(0.2)
    turn = env.act(nap)  # runs past the deadline: its answer ends the rollout, invalid
    assert turn.observation == "rested" and turn.done and turn.invalid and env.timed_out
    turn = env.act(nap)
    assert turn.invalid and "agent timeout" in turn.observation
    assert env.time_left(5.0) == 1e-3
    env.start_agent_clock(None)
    assert not env.timed_out and not env.act(nap).invalid
