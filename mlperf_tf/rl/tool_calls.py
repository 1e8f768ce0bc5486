"""Provides Qwen's XML tool-call format: `parse_tool_calls` reads the calls in a generated turn,
`format_tool_call` writes one (the expert trajectories of the `mini` data), `ToolCallError` is a
malformed call, which the environment answers as an observation (the agent's mistake, never a
crash).

The format (Qwen3-Coder / Qwen3.5 chat template; vLLM's `qwen3_xml` tool parser, which the
reference serves with):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

A value keeps its inner text with the one newline after the opening tag and the one before the
closing tag removed (as the parser strips them); values are strings.
"""

from __future__ import annotations

import dataclasses
import re

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class ToolCallError(ValueError):
    """A tool call the environment cannot read; its message is shown to the agent."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, str]


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls of one generated turn, in order (none: a plain answer).

    Raises:
      ToolCallError: an unclosed `<tool_call>`, a call without one `<function=...>` block, a
        repeated parameter, or text between parameters.
    """
    if text.count(CALL_OPEN) != text.count(CALL_CLOSE):
        raise ToolCallError("a <tool_call> is not closed by </tool_call>")
    calls = []
    for body in _CALL.findall(text):
        match = _FUNCTION.match(body)
        if match is None:
            raise ToolCallError("a <tool_call> must hold one <function=NAME>...</function> block")
        name, inner = match.group(1).strip(), match.group(2)
        arguments: dict[str, str] = {}
        for key, value in _PARAMETER.findall(inner):
            key = key.strip()
            if key in arguments:
                raise ToolCallError(f"parameter {key!r} is given twice in a call to {name!r}")
            arguments[key] = _strip_one_newline(value)
        if _PARAMETER.sub("", inner).strip():
            raise ToolCallError(
                f"the call to {name!r} has text outside <parameter=KEY>...</parameter> blocks"
            )
        calls.append(ToolCall(name, arguments))
    return calls


def format_tool_call(name: str, arguments: dict[str, str]) -> str:
    """One call in the format `parse_tool_calls` reads (the inverse on well-formed calls)."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"{CALL_OPEN}\n<function={name}>\n{params}</function>\n{CALL_CLOSE}"
