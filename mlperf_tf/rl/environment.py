"""Provides `Environment`, the one interface a rollout acts through: reset a task (the first
observation), a tool call (the next observation), finish (the reward from the task's tests);
and `Environment.act`, which turns a generated turn into tool calls and observations so that a
malformed call, an unknown tool or a tool that fails is the agent's mistake, answered in text.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

from mlperf_tf.rl.tool_calls import ToolCall, ToolCallError, parse_tool_calls

FINISH = "finish"


@dataclasses.dataclass(frozen=True)
class Turn:
    """What the environment answers to one generated turn: the observation (the tool outputs,
    or the error), whether the rollout ended (`finish` called, or no tool call), and how many
    tool calls were malformed or failed (a per-rollout statistic)."""

    observation: str
    done: bool
    errors: int = 0


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

    def act(self, text: str) -> Turn:
        """Runs the tool calls of a generated turn; never raises for the agent's mistakes."""
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
