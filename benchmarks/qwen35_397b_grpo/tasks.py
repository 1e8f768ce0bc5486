"""Provides the `mini` and `smoke` presets' generated repair tasks: a small Python function with
one injected bug and tests that expose it, and the expert trajectory that repairs it with the
same tools the agent has (look, edit, run the tests, finish).

A task is made from a template (a correct function and the lines a bug may replace), a bug (one
replacement that changes the function's results on the tests' inputs: checked when the task is
made) and constants drawn from a seeded generator, so `make_tasks(n, seed)` is the same list on
every machine. Training and held-out tasks come from disjoint seeds.
"""

from __future__ import annotations

import dataclasses
import random

from mlperf_tf.rl.tool_calls import format_tool_call

SOLUTION = "solution.py"
TESTS = "test_solution.py"

# (name, source with {c} constants, bugs: (correct line, buggy line), inputs maker)
_TEMPLATES = (
    ("scale_add", "def scale_add(x):\n    y = x * {a}\n    return y + {b}\n",
     [("    y = x * {a}", "    y = x + {a}"), ("    return y + {b}", "    return y - {b}")],
     lambda r: [(r.randint(-9, 9),) for _ in range(5)]),
    ("clamp", "def clamp(x):\n    if x < {a}:\n        return {a}\n    if x > {hi}:\n"
     "        return {hi}\n    return x\n",
     [("    if x < {a}:", "    if x > {a}:"), ("    if x > {hi}:", "    if x < {hi}:")],
     lambda r: [(r.randint(-20, 40),) for _ in range(6)]),
    ("count_above", "def count_above(xs):\n    n = 0\n    for x in xs:\n        if x > {a}:\n"
     "            n += 1\n    return n\n",
     [("        if x > {a}:", "        if x < {a}:"), ("            n += 1", "            n += 2")],
     lambda r: [([r.randint(-5, 15) for _ in range(6)],) for _ in range(4)]),
    ("poly", "def poly(x):\n    return {a} * x * x + {b} * x\n",
     [("    return {a} * x * x + {b} * x", "    return {a} * x + {b} * x"),
      ("    return {a} * x * x + {b} * x", "    return {a} * x * x - {b} * x")],
     lambda r: [(r.randint(-6, 6),) for _ in range(5)]),
    ("total", "def total(xs):\n    s = {b}\n    for x in xs:\n        s += x * {a}\n    return s\n",
     [("        s += x * {a}", "        s = x * {a}"), ("    s = {b}", "    s = {b} + 1")],
     lambda r: [([r.randint(0, 9) for _ in range(r.randint(2, 5))],) for _ in range(4)]),
    ("pick", "def pick(xs):\n    best = xs[0]\n    for x in xs:\n        if x > best:\n"
     "            best = x\n    return best + {b}\n",
     [("        if x > best:", "        if x < best:"), ("    return best + {b}", "    return best - {b}")],
     lambda r: [([r.randint(-9, 9) for _ in range(5)],) for _ in range(4)]),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RepairTask:
    """One generated task: its id, the files the agent starts with (the buggy solution and the
    tests), the issue text, and the fix (the buggy line and the correct one)."""

    task_id: str
    files: dict[str, str]
    issue: str
    buggy_line: str
    fixed_line: str

    def prompt(self) -> str:
        """The task as the agent reads it: the issue and the files' names, short (a rollout's
        prompt is prefilled again every turn)."""
        return f"Fix {SOLUTION}, not {TESTS}: {self.issue}"

    def edit(self) -> tuple[str, str]:
        """The expert's `str_replace` (old_str, new_str): `shortest_unique_edit` of the buggy
        and the correct `solution.py`."""
        bad = self.files[SOLUTION]
        return shortest_unique_edit(bad, bad.replace(self.buggy_line, self.fixed_line, 1))


def shortest_unique_edit(before: str, after: str) -> tuple[str, str]:
    """The shortest (old, new) that turns `before` into `after` by one `str_replace`: `old` is
    the shortest substring of `before` that holds every changed character and occurs once in it
    (within one line when it can be; of equal lengths, the one reaching furthest left: code
    before constants); `new` is the same span of `after`. An agent copies a few bytes around
    the change, not a whole line.

    Raises:
      ValueError: the texts are equal.
    """
    if before == after:
        raise ValueError("nothing changed")
    start = 0
    while before[start] == after[start]:
        start += 1
    tail = 0  # common suffix, not overlapping the common prefix
    while (tail < min(len(before), len(after)) - start
           and before[-1 - tail] == after[-1 - tail]):  # fmt: skip
        tail += 1
    end = len(before) - tail  # before[start:end] becomes after[start:len(after) - tail]
    for newline_ok in (False, True):
        for length in range(max(end - start, 1), len(before) + 1):
            for i in range(max(0, end - length), min(start, len(before) - length) + 1):
                old = before[i : i + length]
                if (newline_ok or "\n" not in old) and before.count(old) == 1:
                    j = len(before) - (i + length)  # the span's right edge, from the end
                    return old, after[i : len(after) - j]
    raise AssertionError("unreachable: the whole text occurs once")


def _run(source: str, name: str, args):
    scope: dict = {}
    exec(compile(source, SOLUTION, "exec"), scope)  # noqa: S102 - the suite's generated code
    return scope[name](*args)


def make_task(seed: int) -> RepairTask:
    """The task of `seed` (deterministic)."""
    rng = random.Random(seed)
    while True:
        name, source, bugs, inputs = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
        consts = {"a": rng.randint(2, 9), "b": rng.randint(1, 9)}
        consts["hi"] = consts["a"] + rng.randint(3, 20)
        good = source.format(**consts)
        right, wrong = (line.format(**consts) for line in bugs[rng.randrange(len(bugs))])
        bad = good.replace(right, wrong, 1)
        cases = inputs(rng)
        expected = [_run(good, name, args) for args in cases]
        if bad != good and any(_run(bad, name, a) != e for a, e in zip(cases, expected)):
            break
    tests = f"from solution import {name}\n\n\ndef test_{name}():\n" + "".join(
        f"    assert {name}(*{args!r}) == {want!r}\n" for args, want in zip(cases, expected)
    )
    first = next(a for a, e in zip(cases, expected) if _run(bad, name, a) != e)
    issue = (
        f"{name}(*{first!r}) returns {_run(bad, name, first)!r}, not {_run(good, name, first)!r}."
    )
    return RepairTask(f"repair-{seed}", {SOLUTION: bad, TESTS: tests}, issue, wrong, right)


def make_tasks(count: int, seed: int) -> list[RepairTask]:
    """`count` tasks from seeds `seed * 100_003 + i` (disjoint between small seeds)."""
    return [make_task(seed * 100_003 + i) for i in range(count)]


def expert_turns(task: RepairTask) -> list[str]:
    """The assistant turns of the expert trajectory (each one tool call): look, edit (the
    shortest unique substring around the bug, `RepairTask.edit`), test, finish. The `mini` base
    model is trained on these, with the environment's observations."""
    old, new = task.edit()
    return [
        format_tool_call("view", {"path": SOLUTION}),
        format_tool_call("str_replace", {"path": SOLUTION, "old_str": old, "new_str": new}),
        format_tool_call("run_tests", {}),
        format_tool_call("finish", {}),
    ]
