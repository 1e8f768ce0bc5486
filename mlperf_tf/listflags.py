"""Provides `parse_list`: the one parser of comma-list flag values (`--chips=8,16`,
`--batch_sizes=`, `--optimizers=`, `--grid.KEY=`, tuple config fields).

The rules, the same for every list flag (README, "Reliability"):
- elements are separated by commas outside brackets: `(1,2),(3,4)` is two elements;
- an empty element (`8,,16`, a trailing comma) is an error, not dropped;
- an element with spaces around it (`8, 16`) is an error: write `8,16`;
- an element that is not of the flag's type is an error naming the element;
- a value given twice is an error (a grid cell or a chip count run twice means nothing), unless
  the flag says duplicates are allowed;
- an empty list is an error unless the flag allows it.
Every error is a `UserError` naming the flag, the whole value and the element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mlperf_tf.errors import UserError

T = TypeVar("T")


def split_top_level(text: str) -> list[str]:
    """Splits `text` at commas outside brackets, keeping every element (empty ones too).

    `(1,2),(3,4)` -> [`(1,2)`, `(3,4)`]; `8,,16` -> [`8`, ``, `16`]; `` -> [].
    """
    if text == "":
        return []
    items, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return items


def _type_name(kind: Callable) -> str:
    return {int: "an integer", float: "a number", str: "a word"}.get(
        kind, getattr(kind, "__name__", "a value")
    )


def parse_list(
    text: str,
    flag: str,
    kind: Callable[[str], T] = str,
    *,
    allow_empty: bool = False,
    allow_duplicates: bool = False,
) -> tuple[T, ...]:
    """The elements of the comma list `text`, each converted by `kind`.

    Args:
      text: the flag's value.
      flag: the flag's name as the user wrote it (`--chips`); it leads every error.
      kind: converts one element (`int`, `float`, `str`, or a function raising ValueError).
      allow_empty: an empty `text` gives `()` instead of an error.
      allow_duplicates: keep repeated values (in order) instead of refusing them.

    Raises:
      UserError: an empty element, an element with surrounding spaces, one that `kind` refuses,
        a duplicate, or (unless allowed) no element at all.
    """
    items = split_top_level(text)
    if not items:
        if allow_empty:
            return ()
        raise UserError(f"{flag}: give at least one value")
    values: list[T] = []
    for number, item in enumerate(items, 1):
        if item == "":
            raise UserError(f"{flag}={text!r}: element {number} is empty (no ',,' or end comma)")
        if item != item.strip():
            raise UserError(
                f"{flag}={text!r}: element {number} {item!r} has spaces around it; write the "
                "list without spaces"
            )
        try:
            value = kind(item)
        except (ValueError, TypeError, OverflowError):
            raise UserError(
                f"{flag}={text!r}: element {number} {item!r} is not {_type_name(kind)}"
            ) from None
        if kind is float and value != value:  # nan: never a meaningful list element
            raise UserError(f"{flag}={text!r}: element {number} {item!r} is not a number")
        if not allow_duplicates and value in values:
            raise UserError(f"{flag}={text!r}: {item!r} is given twice")
        values.append(value)
    return tuple(values)
