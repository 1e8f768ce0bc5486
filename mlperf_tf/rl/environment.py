"""Provides `Environment`, the one interface a rollout acts through: reset a task (the first
observation), a tool call (the next observation), finish (the reward from the task's tests);
and `Environment.act`, which turns a generated turn into tool calls and observations so that a
malformed call, an unknown tool or a tool that fails is the agent's mistake, answered in text;
and the agent timeout (`Environment.start_agent_clock`): a rollout still running when its
wall-clock budget is spent ends as invalid, never as a zero reward (the reference README,
section 3: a rollout cut by the agent timeout "must not be included as a valid benchmark
sample").
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable

from mlperf_tf.rl.tool_calls import ToolCall, ToolCallError, parse_tool_calls

FINISH = "finish"


@dataclasses.dataclass(frozen=True)
class Turn:
    """What the environment answers to one generated turn: the observation (the tool outputs,
    or the error), whether the rollout ended (`finish` called, or no tool call), how many
    tool calls were malformed or failed (a per-rollout statistic), and whether the rollout was
    cut by the agent timeout (`invalid`: the rollout loop marks it as it marks a rollout cut by
    the length limit, so that it never counts as a sample)."""

    observation: str
    done: bool
    errors: int = 0
    invalid: bool = False


class Environment(abc.ABC):
    """A task an agent works on through tools.

    Subclasses define `reset`, `tools` (name -> callable taking the call's string arguments and
    returning an observation) and `reward`. `act` is the loop's one entry per turn.
    """

    @abc.abstractmethod
    def reset(self, task) -> str:
        """Starts `task` in a fresh state; returns the first observation (the task prompt)."""

    @abc.abstractmethod
    def tools(self) -> dict[str, Callable[..., str]]:
        """The tools the agent may call (`finish` ends the rollout and needs no entry)."""

    @abc.abstractmethod
    def reward(self) -> float:
        """The task's tests on the current state: 1.0 passed, 0.0 not."""

    def close(self) -> None:
        """Releases the task's resources (a sandbox, a container)."""

    # The agent timeout: unset (no limit) until a subclass starts the clock in `reset`.
    _deadline: float | None = None
    timed_out: bool = False

    def start_agent_clock(self, timeout_s: float | None) -> None:
        """Starts the rollout's wall-clock budget (generation and tools alike); None: no limit."""
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.timed_out = False

    def time_left(self, limit_s: float) -> float:
        """`limit_s` (a tool's own timeout), or less when the agent timeout comes sooner (at
        least a millisecond, so that a command cut by it is answered like any timeout)."""
        if self._deadline is None:
            return limit_s
        return max(min(limit_s, self._deadline - time.monotonic()), 1e-3)

    def _out_of_time(self) -> bool:
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.timed_out = True
        return self.timed_out

    def act(self, text: str) -> Turn:
        """Runs the tool calls of a generated turn; never raises for the agent's mistakes.

        A turn that arrives after the agent timeout, or whose tools run past it, ends the
        rollout as invalid (`Turn.invalid`)."""
        if self._out_of_time():
            return Turn("error: the agent timeout has passed", done=True, invalid=True)
        turn = self._act(text)
        if self._out_of_time():
            return dataclasses.replace(turn, done=True, invalid=True)
        return turn

    def _act(self, text: str) -> Turn:
        try:
            calls = parse_tool_calls(text)
        except ToolCallError as e:
            return Turn(f"error: malformed tool call: {e}", done=False, errors=1)
        if not calls:
            return Turn("", done=True)
        observations, errors = [], 0
        for call in calls:
            if call.name == FINISH:
                return Turn("\n".join(observations), done=True, errors=errors)
            text, failed = self._call(call)
            observations.append(text)
            errors += failed
        return Turn("\n".join(observations), done=False, errors=errors)

    def _call(self, call: ToolCall) -> tuple[str, bool]:
        tools = self.tools()
        tool = tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted([*tools, FINISH]))
            return f"error: unknown tool {call.name!r} (tools: {names})", True
        try:
            return tool(**call.arguments), False
        except TypeError as e:
            return f"error: bad arguments for {call.name!r}: {e}", True
        except Exception as e:  # noqa: BLE001 - any tool failure is an observation, never a crash
            return f"error: {call.name!r} failed: {type(e).__name__}: {e}", True
