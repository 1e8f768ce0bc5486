"""Provides `scan_log` and `parse_records`: bounded, streaming reading of MLPerf result logs.

A log is read the way the official checker reads it (Latin-1, universal newlines, only lines that
contain the `:::MLL` token matter), but line by line in bounded chunks: other lines are dropped as
they stream past, whatever their length, and the token lines kept are capped in total, so a 200 MB
log or a 10 MB line cannot exhaust memory. Records are parsed with `json` (and, for the 0.6.0
format, the official line pattern); nothing from a log is ever evaluated as code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from mlperf_tf.errors import UserError

# Lines of the 0.6.0 format contain ':::MLL', later formats ':::MLLOG ' (which contains it too).
TOKEN_ANY = ":::MLL"
TOKEN_V06 = ":::MLL"
TOKEN_JSON = ":::MLLOG "

# This suite's own lines in a log, outside MLPerf's records: `# mlperf-tf <kind> <json>`.
SUITE_PREFIX = "# mlperf-tf "
_MAX_NOTES = 100

DEFAULT_MAX_LOG_BYTES = 64 * 2**20
# The official parser strips prefixes with re.sub(".*" + TOKEN, ...), which takes time quadratic in
# a line's length (measured here: 0.4 s at 10 KB, 37 s at 100 KB; a 10 MB line would take days).
# The longest line of the real-log corpus is 1.1 KB.
DEFAULT_MAX_LINE_BYTES = 16 * 2**10
_READ_CHUNK_CHARS = 2**20

# The official 0.6.0 parser's line pattern (mlp_parser/ruleset_060.py), applied to the text from the
# token on.
_V06_LINE = re.compile(r"^:::MLL ([\d\.]+) ([A-Za-z0-9_]+) ?:\s+(.+)$")


@dataclasses.dataclass(frozen=True)
class LogScan:
    """The token lines of one log file.

    Attributes:
      path: the file.
      lines: every line containing ':::MLL', as the official checker reads it (Latin-1 text, line
        ends translated to '\\n').
      line_numbers: the 1-based line number in the file of each entry of `lines`.
      total_lines: the number of lines in the file.
      size_bytes: the file's size in bytes.
      notes: (line number, text) of this suite's own lines (`# mlperf-tf <kind> <json>`, e.g.
        the runner's mark of a resumed run), which are not MLPerf records; at most 100.
    """

    path: str
    lines: tuple[str, ...]
    line_numbers: tuple[int, ...]
    total_lines: int
    size_bytes: int
    notes: tuple[tuple[int, str], ...] = ()
    # parse_records' results by format, so that a log is parsed once whatever asks for it.
    _parsed: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def official_line_numbers(self, ruleset: str) -> tuple[int, ...]:
        """File line numbers of the records the official checker counts for `ruleset`.

        The checker numbers ("failed in line N") only the lines that contain its ruleset's token,
        from 0; entry N of the result is the file line of its record N.
        """
        token = token_for(ruleset)
        if token == TOKEN_ANY:
            return self.line_numbers
        return tuple(n for line, n in zip(self.lines, self.line_numbers) if token in line)


@dataclasses.dataclass(frozen=True)
class Record:
    """One parsed log line.

    Attributes:
      key: the MLPerf key, e.g. "eval_accuracy".
      value: its value (any JSON value).
      metadata: its metadata dict ({} when absent or not a dict).
      time_s: the timestamp in seconds, or None.
      line: the 1-based line number in the file.
      timestamp: the timestamp as logged: seconds in 0.6.0 logs, milliseconds (`time_ms`) later.
      units_per_second: 1 or 1000, the unit of `timestamp`.
    """

    key: str
    value: Any
    metadata: dict
    time_s: float | None
    line: int
    timestamp: float | None = None
    units_per_second: float = 1.0


def suite_notes(scan: LogScan, kind: str) -> list[tuple[int, Any]]:
    """(line number, JSON value) of the suite lines `# mlperf-tf <kind> <json>` of a log.

    A line whose JSON does not parse gives the value None.
    """
    prefix = f"{SUITE_PREFIX}{kind} "
    found = []
    for number, text in scan.notes:
        if text.startswith(prefix):
            try:
                found.append((number, json.loads(text[len(prefix) :])))
            except (ValueError, RecursionError):
                found.append((number, None))
    return found


def token_for(ruleset: str) -> str:
    """The token the official parser of `ruleset` looks for."""
    return TOKEN_V06 if ruleset == "0.6.0" else TOKEN_JSON


def _open_checked(path: str):
    """Opens `path` as the official parser does, or raises a one-line UserError."""
    if not isinstance(path, str | os.PathLike):
        raise UserError(f"log path must be a string, got {path!r}")
    path = os.fspath(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: does not exist") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror or error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path}: is a directory, not a log file")
    try:
        return open(path, encoding="latin-1", newline=None), info  # noqa: SIM115
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror or error}") from None


def scan_log(
    path: str,
    *,
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> LogScan:
    """Reads the token lines of a log in bounded memory.

    Args:
      path: the log file.
      max_log_bytes: the most text, in bytes (= Latin-1 characters), of lines containing ':::MLL'
        to accept; other lines do not count, whatever their length.
      max_line_bytes: the longest line containing ':::MLL' to accept.

    Returns:
      A LogScan.

    Raises:
      UserError: the path is missing, a directory or unreadable, a token line is longer than
        `max_line_bytes`, or the token lines exceed `max_log_bytes` in total.
    """
    for name, value in (("max_log_bytes", max_log_bytes), ("max_line_bytes", max_line_bytes)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"`{name}` ({value!r}) must be a positive integer.")
    handle, info = _open_checked(path)
    scanner = _Scanner(os.fspath(path), max_log_bytes=max_log_bytes, max_line_bytes=max_line_bytes)
    try:
        with handle:
            while piece := handle.readline(_READ_CHUNK_CHARS):
                scanner.feed(piece)
            scanner.finish()
    except (OSError, UnicodeError) as error:
        raise UserError(f"{scanner.path}: cannot read: {error}") from None
    return LogScan(
        path=scanner.path,
        lines=tuple(scanner.lines),
        line_numbers=tuple(scanner.numbers),
        total_lines=scanner.line_number,
        size_bytes=info.st_size,
        notes=tuple(scanner.notes),
    )


class _Scanner:
    """`scan_log`'s streaming state: the token lines kept (with their numbers and total size),
    the suite's note lines, and the line being read, piece by piece."""

    def __init__(self, path: str, *, max_log_bytes: int, max_line_bytes: int):
        self.path = path
        self.max_log_bytes = max_log_bytes
        self.max_line_bytes = max_line_bytes
        self.lines: list[str] = []
        self.numbers: list[int] = []
        self.notes: list[tuple[int, str]] = []
        self.kept = 0
        self.line_number = 0
        self._start_line()

    def _start_line(self) -> None:
        self.parts: list[str] = []  # pieces of the current line, while it may still be kept
        self.length = 0
        self.previous_tail = ""  # the end of the previous piece: a token may be cut in two
        self.has_token = False
        self.dropped = False  # the current line outgrew a limit: its text is no longer kept

    def too_big(self) -> UserError:
        return UserError(
            f"{self.path}: more than {self.max_log_bytes / 2**20:g} MiB of ':::MLL' log lines "
            f"(through line {self.line_number}); refusing to check it (raise the limit with "
            f"--max-log-mb)"
        )

    def too_long(self) -> UserError:
        return UserError(
            f"{self.path}: line {self.line_number} is a ':::MLL' log line longer than "
            f"{self.max_line_bytes / 2**10:g} KiB; the official parser's time grows with the "
            f"square of a line's length, so it is refused (raise the limit with --max-line-kb)"
        )

    def feed(self, piece: str) -> None:
        """Takes the next piece read (the rest of a line, or a chunk of a long one)."""
        if not self.has_token and TOKEN_ANY in self.previous_tail + piece:
            self.has_token = True
        self.previous_tail = (self.previous_tail + piece)[-(len(TOKEN_ANY) - 1) :]
        if self.dropped or self.length + len(piece) > self.max_line_bytes + 1:  # +1: line end
            self._drop(self.too_long)
        elif self.kept + self.length + len(piece) > self.max_log_bytes:
            self._drop(self.too_big)
        else:
            self.parts.append(piece)
            self.length += len(piece)
        if piece.endswith("\n"):  # else the line goes on in the next piece (or the file ends)
            self._end_line()

    def _drop(self, error: Callable[[], UserError]) -> None:
        """Stops keeping the current line's text; a token line past a limit is refused."""
        self.dropped, self.parts, self.length = True, [], 0
        if self.has_token:
            self.line_number += 1
            raise error()

    def _end_line(self) -> None:
        self.line_number += 1
        if self.has_token:
            if self.length - 1 > self.max_line_bytes:
                raise self.too_long()
            self._keep()
        elif self.parts and self.parts[0].startswith(SUITE_PREFIX) and len(self.notes) < _MAX_NOTES:
            self.notes.append((self.line_number, "".join(self.parts).rstrip("\n")))
        self._start_line()

    def _keep(self) -> None:
        self.lines.append("".join(self.parts))
        self.numbers.append(self.line_number)
        self.kept += self.length

    def finish(self) -> None:
        """After the last piece: a last line without a line end counts too."""
        if self.parts or self.dropped:
            self.line_number += 1
            if self.has_token:
                if self.length > self.max_line_bytes:
                    raise self.too_long()
                self._keep()


def _as_float(value: Any) -> float | None:
    # As the official parser reads time_ms: float(value), so numeric strings count too.
    if isinstance(value, dict | list) or value is None:
        return None
    try:
        return _finite(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _finite(number: Any) -> float | None:
    if isinstance(number, bool) or not isinstance(number, int | float):
        return None
    number = float(number)
    return number if math.isfinite(number) else None


def parse_line(line: str, ruleset: str) -> tuple[str, Any, dict, float | None] | None:
    """Parses one token line as `ruleset`'s parser reads it; None when it does not parse.

    Returns:
      (key, value, metadata, timestamp as logged or None): the timestamp is in seconds for the
      0.6.0 format, in milliseconds for later ones.
    """
    token = token_for(ruleset)
    position = line.rfind(token)  # the official parser strips everything up to the last token
    if position == -1:
        return None
    text = line[position:].strip()
    try:
        if token == TOKEN_V06:
            match = _V06_LINE.match(text)
            if match is None:
                return None
            payload = json.loads(match.group(3))
            key = match.group(2)
            timestamp = _finite(float(match.group(1)))
            if not isinstance(payload, dict):
                return key, None, {}, timestamp
        else:
            payload = json.loads(text[len(token) :])
            if not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
                return None
            key = payload["key"]
            timestamp = _as_float(payload.get("time_ms"))
    except (ValueError, RecursionError):  # bad JSON, or nesting deeper than the parser allows
        return None
    metadata = payload.get("metadata")
    return key, payload.get("value"), metadata if isinstance(metadata, dict) else {}, timestamp


def parse_records(scan: LogScan, ruleset: str) -> list[Record]:
    """Parses the records of a scanned log as `ruleset`'s format; unparsable lines are skipped.

    The result is kept on `scan` (one parse per format); callers get their own list.
    """
    token = token_for(ruleset)
    if token not in scan._parsed:
        scan._parsed[token] = _parse_records(scan, ruleset)
    return list(scan._parsed[token])


def _parse_records(scan: LogScan, ruleset: str) -> tuple[Record, ...]:
    units = 1.0 if token_for(ruleset) == TOKEN_V06 else 1000.0
    records = []
    for line, number in zip(scan.lines, scan.line_numbers):
        parsed = parse_line(line, ruleset)
        if parsed is not None:
            key, value, metadata, timestamp = parsed
            time_s = None if timestamp is None else timestamp / units
            records.append(Record(key, value, metadata, time_s, number, timestamp, units))
    return tuple(records)


def guess_format(scan: LogScan) -> str | None:
    """Returns "json" (':::MLLOG {...}', v0.7 and later), "0.6" (':::MLL <ts> <key>: ...') or None.

    The majority of the token lines that parse decides, so that one stray line of the other format
    does not change the answer.
    """
    json_lines = {record.line for record in parse_records(scan, "1.0.0")}
    votes = {"json": len(json_lines), "0.6": 0}
    for line, number in zip(scan.lines, scan.line_numbers):
        if number not in json_lines and parse_line(line, "0.6.0") is not None:
            votes["0.6"] += 1
    if not any(votes.values()):
        return None
    return "json" if votes["json"] >= votes["0.6"] else "0.6"
