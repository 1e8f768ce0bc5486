"""Tests of Qwen's XML tool-call parsing: well-formed calls (several per turn, multi-line values
kept), the writer as the parser's inverse, and malformed calls as `ToolCallError`."""

import pytest

from mlperf_tf.rl.tool_calls import ToolCall, ToolCallError, format_tool_call, parse_tool_calls

TURN = """I will look first.
<tool_call>
<function=view>
<parameter=path>
solution.py
</parameter>
</function>
</tool_call>
<tool_call>
<function=str_replace>
<parameter=path>
solution.py
</parameter>
<parameter=old_str>
    y = x + 1
    return y
</parameter>
<parameter=new_str>
    return x
</parameter>
</function>
</tool_call>"""


def test_parses_calls_in_order():
    calls = parse_tool_calls(TURN)
    assert calls == [
        ToolCall("view", {"path": "solution.py"}),
        ToolCall("str_replace", {"path": "solution.py", "old_str": "    y = x + 1\n    return y",
                                 "new_str": "    return x"}),
    ]  # fmt: skip
    assert parse_tool_calls("just an answer") == []


def test_format_is_the_inverse():
    args = {"path": "a.py", "old_str": "  a\n  b", "new_str": ""}
    assert parse_tool_calls(format_tool_call("str_replace", args)) == [
        ToolCall("str_replace", args)
    ]
    assert parse_tool_calls(format_tool_call("run_tests", {})) == [ToolCall("run_tests", {})]


@pytest.mark.parametrize(
    "text,message",
    [
        ("<tool_call>\n<function=view>\n", "not closed"),
        ("<tool_call>\n<parameter=path>\nx\n</parameter>\n</tool_call>", "one <function"),
        ("<tool_call>\n<function=view>\nhello\n</function>\n</tool_call>", "outside"),
        ("<tool_call>\n<function=v>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n"
         "</parameter>\n</function>\n</tool_call>", "twice"),
    ],
)  # fmt: skip
def test_malformed_calls(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_calls(text)
