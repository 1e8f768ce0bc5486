"""Provides the check every refused or failed command must pass: its exit code, exactly one
`error:` line and no traceback."""


def the_error_line(text: str, code: int, expected_code: int, context: str = "") -> str:
    """Asserts a command's output `text` and exit `code`: `expected_code`, one `error:` line, no
    traceback; returns that line.

    A user's mistake or a failed peer is told in one line a person can act on, never a dump: the
    promise the CLI's refusals and the fault tests' failures share. `context` (e.g. the argv) leads
    the message of a failed assertion; the output shown is its last 3,000 characters.
    """
    shown = f"{context}exit {code}: {text[-3000:]}"
    assert "Traceback" not in text, shown
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == expected_code, shown
    assert len(lines) == 1, shown
    return lines[0]
