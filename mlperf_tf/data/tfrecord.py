"""Provides `tf.train.Example` builders and sharded TFRecord writers (sequential and parallel).

The writers are what every benchmark's `prepare` uses to turn raw data into TFRecords, all
named by `shard_paths` (`prefix-00000-of-00008`): `write_sharded` for data that fits one
process, `write_sharded_parallel` for big conversions (ImageNet's 1.28M JPEGs): items are split
into shards, each shard is built and written by a worker process, and a progress line on stderr
counts the examples written; `write_streamed` for a stream of unknown length (C4's token
windows), in files of a fixed size.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import numpy as np
import tensorflow as tf

from mlperf_tf.errors import DataError


def _as_list(values: Any) -> list:
    if isinstance(values, np.ndarray):
        return values.reshape(-1).tolist()
    if isinstance(values, (list, tuple)):
        return list(values)
    if isinstance(values, tf.Tensor):
        return _as_list(values.numpy())
    return [values]


def bytes_feature(values: bytes | str | Sequence[bytes | str]) -> tf.train.Feature:
    """A bytes_list Feature; str values are UTF-8 encoded."""
    items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in _as_list(values)]
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=items))


def int64_feature(values: int | Sequence[int] | np.ndarray) -> tf.train.Feature:
    """An int64_list Feature (bools become 0/1)."""
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in _as_list(values)]))


def float_feature(values: float | Sequence[float] | np.ndarray) -> tf.train.Feature:
    """A float_list Feature (stored as float32)."""
    return tf.train.Feature(
        float_list=tf.train.FloatList(value=[float(v) for v in _as_list(values)])
    )


def _to_feature(name: str, value: Any) -> tf.train.Feature:
    if isinstance(value, tf.train.Feature):
        return value
    items = _as_list(value)
    if not items:
        raise ValueError(f"feature '{name}' is empty; give a typed empty tf.train.Feature instead")
    first = items[0]
    if isinstance(first, (bytes, str)):
        return bytes_feature(items)
    if isinstance(first, (bool, int, np.integer, np.bool_)):
        return int64_feature(items)
    if isinstance(first, (float, np.floating)):
        return float_feature(items)
    raise ValueError(f"feature '{name}' has values of unsupported type {type(first).__name__}")


def make_example(features: dict[str, Any]) -> tf.train.Example:
    """A `tf.train.Example` from a dict of feature name -> Feature or plain values.

    Plain values are typed by their first item: bytes/str -> bytes_list, int/bool -> int64_list,
    float -> float_list; scalars, lists and numpy arrays (flattened) are accepted.

    Raises:
      ValueError: a value is empty or of an unsupported type (the message names the feature).
    """
    return tf.train.Example(
        features=tf.train.Features(
            feature={name: _to_feature(name, value) for name, value in features.items()}
        )
    )


def shard_paths(out_dir: str, *, prefix: str, num_shards: int, suffix: str = "") -> list[str]:
    """`out_dir/prefix-00000-of-00008`-style paths (the ImageNet/Model Garden naming), each
    ending in `suffix` (e.g. ".tfrecord", where a benchmark's readers glob for it)."""
    if num_shards <= 0:
        raise ValueError(f"`num_shards` ({num_shards}) must be positive.")
    return [
        os.path.join(out_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}{suffix}")
        for i in range(num_shards)
    ]


def _serialize(example: bytes | tf.train.Example) -> bytes:
    if isinstance(example, tf.train.Example):
        # deterministic=True sorts the feature map's keys: without it the byte order of a
        # protobuf map may differ between processes (hash seeds), and so would the files.
        return example.SerializeToString(deterministic=True)
    if isinstance(example, (bytes, bytearray)):
        return bytes(example)
    raise TypeError(f"expected a tf.train.Example or bytes, got {type(example).__name__}")


def write_sharded(
    examples: Iterable[bytes | tf.train.Example],
    out_dir: str,
    *,
    prefix: str,
    num_shards: int,
    suffix: str = "",
) -> list[str]:
    """Writes examples round-robin into `num_shards` TFRecord files.

    Example i goes to shard i % num_shards, so shards differ in size by at most one example and
    an ordered input (e.g. sorted by class) is spread over all shards.

    Args:
      examples: serialized records or `tf.train.Example`s.
      out_dir: output folder (created if missing).
      prefix: file name prefix, e.g. "train".
      num_shards: number of files.
      suffix: file name ending (`shard_paths`).

    Returns:
      The shard paths, in order (empty shards are still written, as empty files).
    """
    paths = shard_paths(out_dir, prefix=prefix, num_shards=num_shards, suffix=suffix)
    tf.io.gfile.makedirs(out_dir)
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    with _removed_on_failure(paths):
        try:
            for i, example in enumerate(examples):
                writers[i % num_shards].write(_serialize(example))
        finally:
            for writer in writers:
                writer.close()
    return paths


def write_streamed(
    examples: Iterable[bytes | tf.train.Example],
    out_dir: str,
    *,
    prefix: str,
    per_file: int,
    limit: int | None = None,
    suffix: str = "",
) -> tuple[list[str], int]:
    """Writes a stream of unknown length in order into files of `per_file` records each.

    The count of files is known only at the end, so they are written as `prefix.partial-N` and
    renamed to `shard_paths` names once the stream ends; a failure removes them all.

    Args:
      examples: serialized records or `tf.train.Example`s, in the order to keep.
      out_dir: output folder (created if missing).
      prefix: file name prefix, e.g. "train".
      per_file: records a file (the last holds the rest).
      limit: the most records to take from `examples` (None: all).
      suffix: file name ending (`shard_paths`).

    Returns:
      The file paths, in order, and the count of records written.
    """
    if per_file <= 0:
        raise ValueError(f"`per_file` ({per_file}) must be positive.")
    tf.io.gfile.makedirs(out_dir)
    staged: list[str] = []
    count, writer = 0, None
    with _removed_on_failure(staged):
        try:
            for example in examples:
                if limit is not None and count >= limit:
                    break
                if count % per_file == 0:
                    if writer:
                        writer.close()
                    staged.append(os.path.join(out_dir, f"{prefix}.partial-{len(staged):05d}"))
                    writer = tf.io.TFRecordWriter(staged[-1])
                writer.write(_serialize(example))
                count += 1
        finally:
            if writer:
                writer.close()
    paths = (
        shard_paths(out_dir, prefix=prefix, num_shards=len(staged), suffix=suffix) if staged else []
    )
    for source, target in zip(staged, paths):
        os.replace(source, target)
    return paths, count


@contextlib.contextmanager
def _removed_on_failure(paths: Sequence[str]):
    """Deletes the shards `paths` when the block raises: a failed conversion leaves no empty or
    partial shards that a later run would read as data."""
    try:
        yield
    except BaseException:
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise


class Progress:
    """A progress line: `prefix [####......] 1234/5000 310/s eta 12s`.

    On a terminal it is redrawn in place (`\\r`) at most every `TTY_INTERVAL_S`; to a file or a
    pipe it is a plain line at most every `PLAIN_INTERVAL_S` (a log file once held 55 KB of
    carriage returns from one redraw per shard). The last state is always written by `close`.
    """

    TTY_INTERVAL_S = 0.2
    PLAIN_INTERVAL_S = 10.0

    def __init__(self, total: int, *, prefix: str = "", stream: TextIO | None = None):
        self.total = max(0, int(total))
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._start = time.monotonic()
        isatty = getattr(self.stream, "isatty", None)
        self._tty = bool(isatty and isatty())
        self._interval = self.TTY_INTERVAL_S if self._tty else self.PLAIN_INTERVAL_S
        self._last_draw = -math.inf
        self._drawn = None

    def _text(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = self.done / elapsed
        width = 30
        filled = min(width, int(width * self.done / self.total)) if self.total else width
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        return (
            f"{self.prefix} [{'#' * filled}{'.' * (width - filled)}] "
            f"{self.done}/{self.total} {rate:.0f}/s eta {eta:.0f}s"
        )

    def _draw(self) -> None:
        text = self._text()
        self.stream.write(f"\r{text}" if self._tty else f"{text}\n")
        self.stream.flush()
        self._drawn = self.done
        self._last_draw = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count
        if time.monotonic() - self._last_draw >= self._interval:
            self._draw()

    def close(self) -> None:
        if self._drawn != self.done:
            self._draw()
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def _write_shard(
    path: str, items: list, make_example_fn: Callable[[Any], bytes | tf.train.Example | None]
) -> tuple[int, int]:
    """Worker: builds and writes one shard; returns (written, skipped) counts."""
    written = skipped = 0
    with tf.io.TFRecordWriter(path) as writer:
        for item in items:
            example = make_example_fn(item)
            if example is None:  # the maker may reject an item (e.g. an unreadable image)
                skipped += 1
                continue
            writer.write(_serialize(example))
            written += 1
    return written, skipped


def write_sharded_parallel(
    items: Sequence[Any],
    make_example_fn: Callable[[Any], bytes | tf.train.Example | None],
    out_dir: str,
    *,
    prefix: str,
    num_shards: int,
    num_workers: int | None = None,
    progress: bool = True,
) -> list[str]:
    """Converts items to examples in worker processes and writes them as sharded TFRecords.

    Shard k holds items `k, k + num_shards, ...` (as in `write_sharded`), built by
    `make_example_fn(item)` in a worker process. Workers are spawned, not forked, so a parent
    that has initialized TensorFlow is safe; `make_example_fn` must therefore be a picklable
    module-level function, and items picklable (e.g. file paths and labels).

    Args:
      items: what each example is made from.
      make_example_fn: item -> serialized record, Example, or None to skip the item.
      out_dir: output folder (created if missing).
      prefix: file name prefix.
      num_shards: number of files (the unit of work of a worker).
      num_workers: worker processes; default the CPU count; 0 runs in this process.
      progress: print a progress bar to stderr, updated per finished shard.

    Returns:
      The shard paths, in order.

    Raises:
      DataError: every item was skipped (nothing was written).
    """
    paths = shard_paths(out_dir, prefix=prefix, num_shards=num_shards)
    if num_workers is None:
        num_workers = os.cpu_count() or 1
    if num_workers < 0:
        raise ValueError(f"`num_workers` ({num_workers}) must not be negative.")
    tf.io.gfile.makedirs(out_dir)
    items = list(items)
    jobs = [(paths[k], items[k::num_shards]) for k in range(num_shards)]
    bar = Progress(len(items), prefix=prefix) if progress else None
    written = skipped = 0
    with _removed_on_failure(paths), _closing(bar):
        if num_workers == 0:
            for path, shard_items in jobs:
                w, s = _write_shard(path, shard_items, make_example_fn)
                written, skipped = written + w, skipped + s
                if bar:
                    bar.update(w + s)
        else:
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=context) as pool:
                futures = [
                    pool.submit(_write_shard, path, shard_items, make_example_fn)
                    for path, shard_items in jobs
                ]
                for future in concurrent.futures.as_completed(futures):
                    w, s = future.result()
                    written, skipped = written + w, skipped + s
                    if bar:
                        bar.update(w + s)
        if items and not written:
            raise DataError(
                f"no {prefix} examples written to '{out_dir}': all {skipped} items skipped"
            )
    return paths


@contextlib.contextmanager
def _closing(bar: Progress | None):
    try:
        yield
    finally:
        if bar:
            bar.close()
