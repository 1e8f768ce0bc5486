"""Provides the tf.data plumbing every benchmark shares: file listing, sharding, training and eval.

A benchmark supplies two functions and gets a tuned pipeline:

- `parse_fn(serialized_record) -> dict` (e.g. `tf.io.parse_single_example`), and
- `transform_fn(dict) -> dict` (decode, augment, cast; per example, static output shapes).

`training_pipeline` shards the files per input pipeline, reads them with a parallel interleave,
shuffles with a seed, repeats, maps with `num_parallel_calls=AUTOTUNE`, batches with
`drop_remainder=True` and prefetches, under `tf.data.Options` tuned for throughput.
`eval_pipeline` does the same in a deterministic order, caches the decoded examples and pads every
pipeline to exactly `num_batches` batches, marking real examples with a float32 `valid` key.

Bad data. Every record is checked on the way, without slowing the pipeline down: a corrupt record
(the reader stops in the middle of a file, which the pipeline sees as "bytes read != file size")
and a record whose `parse_fn`/`transform_fn` fails (dropped by `ignore_errors`, which the pipeline
sees as a gap in a running record number) both raise an error naming the file. The error surfaces
from the iterator as a `tf.errors.InvalidArgumentError` whose message starts with
`DATA_ERROR_PREFIX`; `translate_errors()` turns it into a one-line `DataError` on the host. With
`skip_bad_records=True` the bad records are skipped instead, and each one is reported on stderr
with the file name and the running count of records skipped by that pipeline (see README.md).
"""

from __future__ import annotations

import contextlib
import glob as _glob
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from mlperf_tf.errors import DataError

AUTOTUNE = tf.data.AUTOTUNE
# Marks errors raised from inside a pipeline by the bad-record checks (see `translate_errors`).
DATA_ERROR_PREFIX = "mlperf_tf DataError:"
# Bytes of framing around each TFRecord payload: length (8) + length CRC (4) + data CRC (4).
_TFRECORD_OVERHEAD = 16
# Files read at once by one pipeline's interleave; more only adds memory on a few-core host.
_MAX_CYCLE_LENGTH = 16
# Share of the host's RAM that tf.data's autotuner may use for buffers, per input pipeline.
_RAM_BUDGET_FRACTION = 0.3

ParseFn = Callable[[tf.Tensor], Any]
TransformFn = Callable[[Any], Any]


# ------------------------------------------------------------------------------------------------
# Files and sharding
# ------------------------------------------------------------------------------------------------
def list_files(patterns: str | os.PathLike | Sequence[str | os.PathLike], *, what: str = "data"):
    """Lists the files matching glob patterns, sorted and without duplicates.

    A pattern that names a directory means every file in it.

    Args:
      patterns: one glob pattern (`/data/train-*`) or a list of them; local or `gs://` paths.
      what: what the files are, for error messages (e.g. "ImageNet train").

    Returns:
      The matching file paths: sorted per pattern, in the order of the patterns.

    Raises:
      DataError: no pattern is given, a pattern's directory does not exist, or a pattern matches
        no file.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    patterns = [os.fspath(p) for p in patterns]
    if not patterns or not all(patterns):
        raise DataError(f"no {what} file pattern given (got {patterns!r})")
    files: list[str] = []
    for pattern in patterns:
        if tf.io.gfile.isdir(pattern):
            pattern = os.path.join(pattern, "*")
        directory = os.path.dirname(pattern)
        if directory and not _glob.has_magic(directory) and not tf.io.gfile.isdir(directory):
            raise DataError(f"{what} directory '{directory}' does not exist")
        matches = sorted(m for m in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(m))
        if not matches:
            raise DataError(f"no {what} files match '{pattern}'")
        files.extend(matches)
    return list(dict.fromkeys(files))


def shard_files(
    files: Sequence[str], input_context: tf.distribute.InputContext | None
) -> tuple[list[str], tuple[int, int] | None]:
    """Picks one input pipeline's share of the files.

    With at least as many files as pipelines, pipeline `i` of `n` reads files `i, i+n, i+2n, ...`
    (file-level sharding: no pipeline reads a byte it does not use). With fewer files, every
    pipeline reads every file and keeps records `i, i+n, ...` (record-level sharding), which reads
    `n` times the data; a warning says so.

    Args:
      files: all the files, in a fixed order (the same on every worker).
      input_context: the `tf.distribute.InputContext` given to a dataset function, or None for a
        single pipeline.

    Returns:
      `(files, record_shard)`: the files this pipeline reads, and `(num_shards, index)` when the
      pipeline must keep only its records of them, else None.

    Raises:
      DataError: `files` is empty.
    """
    files = list(files)
    if not files:
        raise DataError("no input files to shard")
    if input_context is None or input_context.num_input_pipelines <= 1:
        return files, None
    n = input_context.num_input_pipelines
    i = input_context.input_pipeline_id
    if len(files) >= n:
        return files[i::n], None
    logging.warning(
        "%d input files for %d input pipelines: every pipeline reads all files and keeps every "
        "%d-th record (record-level sharding); write at least %d files to avoid the extra reads.",
        len(files),
        n,
        n,
        n,
    )
    return files, (n, i)


def pipeline_options(*, training: bool, ram_budget_bytes: int | None = None) -> tf.data.Options:
    """The `tf.data.Options` of this suite's pipelines.

    Autotuning within a RAM budget, a private thread pool of one thread per core (so the model's
    inter-op pool does not starve the input pipeline and vice versa), one thread per op, map
    parallelization, prefetch slack, and a non-deterministic order for training (an element that
    is ready is not held back behind a slow one) but a deterministic one for eval.

    Args:
      training: True for a training pipeline, False for eval.
      ram_budget_bytes: autotuner RAM budget in bytes; default 30 % of the host's RAM.
    """
    options = tf.data.Options()
    options.autotune.enabled = True
    options.autotune.ram_budget = int(ram_budget_bytes or _RAM_BUDGET_FRACTION * _host_ram_bytes())
    options.threading.private_threadpool_size = os.cpu_count() or 1
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    options.experimental_slack = True
    options.deterministic = not training
    return options


def _host_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a modest host
        return 8 << 30


def eval_batches_per_pipeline(
    steps_per_replica: int, input_context: tf.distribute.InputContext | None
) -> int:
    """Batches one eval pipeline must yield so that each of its replicas runs `steps_per_replica`.

    `distribute_datasets_from_function` hands a pipeline's batches to its local replicas in turn,
    so a pipeline feeding R replicas yields R x `steps_per_replica` batches.
    """
    if steps_per_replica <= 0:
        raise ValueError(f"`steps_per_replica` ({steps_per_replica}) must be positive.")
    if input_context is None:
        return steps_per_replica
    replicas = input_context.num_replicas_in_sync // max(1, input_context.num_input_pipelines)
    return steps_per_replica * max(1, replicas)


# ------------------------------------------------------------------------------------------------
# Reading records, with the bad-record checks
# ------------------------------------------------------------------------------------------------
def _file_sizes(files: Sequence[str]) -> list[int]:
    sizes = []
    for path in files:
        try:
            sizes.append(tf.io.gfile.stat(path).length)
        except tf.errors.NotFoundError:
            raise DataError(f"data file '{path}' does not exist") from None
    return sizes


# Status of an element between the reader and the checks: a record, the end marker of a corrupt
# file (strict mode), or the end of a finite stream.
_RECORD, _CORRUPT_FILE, _END = 0, 1, 2


def _read_records(
    files: Sequence[str],
    *,
    record_shard: tuple[int, int] | None,
    shuffle_files: bool,
    seed: int | None,
    deterministic: bool | None,
    skip_bad_records: bool,
) -> tf.data.Dataset:
    """`(record, file_index, status)` triples read from `files` with a parallel interleave.

    Each file is read by a TFRecordDataset whose read errors are ignored (a corrupt record makes
    it drop the rest of its file), and a marker at the file's end compares the bytes read with the
    file's size. For a corrupt file, with `skip_bad_records` a warning naming the file is printed;
    without it, the marker travels on with status `_CORRUPT_FILE` and `_checked_map` raises. (The
    reader cannot raise itself: `_checked_map`'s `ignore_errors` would swallow the error.)
    """
    paths = tf.constant(list(files), dtype=tf.string)
    sizes = tf.constant(_file_sizes(files), dtype=tf.int64)
    num_files = len(files)

    def read_one(index):
        path, size = paths[index], sizes[index]
        records = tf.data.TFRecordDataset(path, buffer_size=1 << 20).ignore_errors(log_warning=True)
        records = records.map(lambda r: (r, False)).concatenate(
            tf.data.Dataset.from_tensors((tf.constant("", tf.string), True))
        )

        # [record, is_end, bytes of the records before it]
        def count_bytes(total, element):
            record, is_end = element
            length = tf.cast(tf.strings.length(record), tf.int64) + _TFRECORD_OVERHEAD
            return total + length, (record, is_end, total)

        records = records.scan(tf.constant(0, tf.int64), count_bytes)

        def status(record, is_end, total):
            corrupt = tf.logical_and(is_end, tf.not_equal(total, size))
            if skip_bad_records:

                def warn():
                    _warn(
                        "skipped the rest of corrupt TFRecord file '",
                        path,
                        "' (read ",
                        tf.strings.as_string(total),
                        " of ",
                        tf.strings.as_string(size),
                        " bytes)",
                    )
                    return tf.constant(True)

                corrupt = tf.cond(corrupt, warn, lambda: tf.constant(False))
                keep = tf.logical_not(is_end)
            else:
                keep = tf.logical_or(tf.logical_not(is_end), corrupt)
            code = tf.where(corrupt, _CORRUPT_FILE, _RECORD)
            return record, index, code, keep

        records = records.map(status).filter(lambda record, index, code, keep: keep)
        return records.map(lambda record, index, code, keep: (record, index, code))

    indices = tf.data.Dataset.range(num_files)
    if shuffle_files and record_shard is None and num_files > 1:
        indices = indices.shuffle(num_files, seed=seed, reshuffle_each_iteration=True)
    if record_shard is not None:
        deterministic = True  # every pipeline must see the same record order to shard it
    cycle = min(num_files, _MAX_CYCLE_LENGTH)
    if cycle > 1:
        records = indices.interleave(
            read_one,
            cycle_length=cycle,
            block_length=1,
            num_parallel_calls=cycle,
            deterministic=deterministic,
        )
    else:
        records = indices.interleave(read_one, cycle_length=1)
    if record_shard is not None:
        records = records.shard(*record_shard)
    return records


def _warn(*parts) -> None:
    """Prints one warning line to stderr from inside a pipeline (not subject to TF's log level)."""
    tf.print(tf.strings.join(["WARNING: mlperf_tf data: ", *parts]), output_stream=sys.stderr)


def _checked_map(
    records: tf.data.Dataset,
    fn: Callable[[tf.Tensor], Any],
    files: Sequence[str],
    *,
    skip_bad_records: bool,
    with_end: bool,
) -> tf.data.Dataset:
    """Maps `fn` over `_read_records`' triples in parallel; bad records fail or are skipped.

    Each element gets a running number before the parallel map; `ignore_errors` drops the
    elements whose `fn` raised, and a scan after it spots the gap in the numbers. The element
    after a gap carries the file index of its predecessor, which is the dropped record's file.
    The map keeps the order (`deterministic=True`) so that gaps are visible; the interleave
    before it need not. The scan only computes a status (raising inside it would leave its state
    behind and misreport later elements); a stateless map after it raises or warns.

    Args:
      records: `(serialized_record, file_index, status)` triples from `_read_records`.
      fn: serialized record -> example.
      files: the file paths that `file_index` points into.
      skip_bad_records: skip and report bad records instead of failing.
      with_end: add an end marker so that a bad last record is also seen (finite datasets).
    """
    paths = tf.constant(list(files), dtype=tf.string)
    if with_end:
        records = records.concatenate(
            tf.data.Dataset.from_tensors(
                (tf.constant("", tf.string), tf.constant(-1, tf.int64), tf.constant(_END))
            )
        )
    # Markers pass the map as zeros of fn's output structure (traced here, not run).
    probe = tf.data.Dataset.from_tensors(tf.constant("", tf.string)).map(fn)
    dummy = _zeros_of_spec(probe.element_spec)

    # [running number, file index of the previous element, record, file index, status]
    def number(state, element):
        count, previous_file = state
        record, file_index, code = element
        return (count + 1, file_index), (count, previous_file, record, file_index, code)

    numbered = records.scan((tf.constant(0, tf.int64), tf.constant(-1, tf.int64)), number)

    def apply(count, previous_file, record, file_index, code):
        example = tf.cond(tf.equal(code, _RECORD), lambda: fn(record), lambda: dummy)
        return count, previous_file, file_index, code, example

    mapped = numbered.map(apply, num_parallel_calls=AUTOTUNE, deterministic=True)
    mapped = mapped.ignore_errors(log_warning=True)

    # -> [gap (records dropped just before this element), skipped so far, name, code, example]
    def check(state, element):
        expected, skipped = state
        count, previous_file, file_index, code, example = element
        gap = count - expected
        corrupt = tf.equal(code, _CORRUPT_FILE)
        name = tf.where(
            corrupt, paths[tf.maximum(file_index, 0)], paths[tf.maximum(previous_file, 0)]
        )
        return (count + 1, skipped + gap), (gap, skipped + gap, name, code, example)

    checked = mapped.scan((tf.constant(0, tf.int64), tf.constant(0, tf.int64)), check)

    def report(gap, skipped, name, code, example):
        bad_record = gap > 0
        if skip_bad_records:

            def warn():
                _warn(
                    "skipped a bad record (parse_fn or transform_fn failed) in file '",
                    name,
                    "' (",
                    tf.strings.as_string(skipped),
                    " skipped by this input pipeline so far)",
                )
                return tf.constant(True)

            checks = [tf.cond(bad_record, warn, lambda: tf.constant(False))]
        else:
            corrupt = tf.equal(code, _CORRUPT_FILE)
            checks = [
                tf.debugging.Assert(
                    tf.logical_not(corrupt),
                    [f"{DATA_ERROR_PREFIX} corrupt TFRecord file", name],
                ),
                tf.debugging.Assert(
                    tf.logical_not(bad_record),
                    [
                        f"{DATA_ERROR_PREFIX} bad record (parse_fn or transform_fn failed) in file",
                        name,
                    ],
                ),
            ]
        with tf.control_dependencies(checks):
            return tf.identity(code), example

    reported = checked.map(report)
    reported = reported.filter(lambda code, example: tf.equal(code, _RECORD))
    return reported.map(lambda code, example: example)


def _zeros_of_spec(spec):
    def zeros(s: tf.TensorSpec):
        shape = [d if d is not None else 0 for d in s.shape.as_list()]
        if s.dtype == tf.string:
            return tf.fill(shape, tf.constant("", tf.string))
        return tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turns the pipelines' bad-record errors into a one-line `DataError` (host side).

    Wrap the code that iterates a dataset built here (the runner's train and eval loops):

        with translate_errors():
            for batch in dataset: ...

    Raises:
      DataError: a pipeline met a corrupt record or a record its parse/transform could not handle;
        the message names the file and suggests `--skip_bad_records`.
    """
    try:
        yield
    except tf.errors.OpError as e:
        message = data_error_message(e)
        if message is None:
            raise
        raise DataError(message) from None


def data_error_message(error: BaseException) -> str | None:
    """The one-line message of a pipeline's bad-record error, or None for any other error."""
    text = str(error)
    start = text.find(DATA_ERROR_PREFIX)
    if start < 0:
        return None
    # tf.debugging.Assert prints its data on one line as `[what] [path]`.
    line = text[start:].splitlines()[0]
    what, _, path = line[len(DATA_ERROR_PREFIX) :].partition("] [")
    path = path[:-1] if path.endswith("]") else path
    return f"{what.strip()} '{path}'; rerun with --skip_bad_records to skip bad records"


# ------------------------------------------------------------------------------------------------
# The pipelines
# ------------------------------------------------------------------------------------------------
def _compose(parse_fn: ParseFn, transform_fn: TransformFn | None) -> Callable[[tf.Tensor], Any]:
    if not callable(parse_fn):
        raise TypeError(f"`parse_fn` ({parse_fn!r}) must be callable.")
    if transform_fn is None:
        return parse_fn
    if not callable(transform_fn):
        raise TypeError(f"`transform_fn` ({transform_fn!r}) must be callable or None.")
    return lambda record: transform_fn(parse_fn(record))


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` ({value!r}) must be a positive integer.")


def training_pipeline(
    files: Sequence[str],
    *,
    input_context: tf.distribute.InputContext | None,
    parse_fn: ParseFn,
    transform_fn: TransformFn | None,
    batch_size: int,
    shuffle_buffer: int = 10000,
    seed: int | None = 0,
    cache: bool = False,
    skip_bad_records: bool = False,
    num_epochs: int | None = None,
) -> tf.data.Dataset:
    """An endless dataset of training batches for one input pipeline.

    Files are sharded per pipeline (see `shard_files`), shuffled and read with a parallel
    interleave; records are (optionally cached,) shuffled, repeated, then parsed and transformed
    with `num_parallel_calls=AUTOTUNE`, batched with `drop_remainder=True` (static shapes) and
    prefetched.

    Args:
      files: TFRecord files (see `list_files`), in the same order on every worker.
      input_context: the dataset function's `tf.distribute.InputContext`, or None.
      parse_fn: serialized record -> example dict (runs in the map, per example).
      transform_fn: example -> example (decode, augment); None for parse only. Its outputs must
        have static shapes, since batches are.
      batch_size: examples per batch: the per-replica batch size.
      shuffle_buffer: records in the shuffle buffer (serialized, so cheap); 1 disables shuffling.
      seed: seed of the file and record shuffles (None: random each run).
      cache: cache the raw records in memory after the first epoch (legal for training: it is
        before any random augmentation; needs RAM for this pipeline's share of the files).
      skip_bad_records: skip (and report) corrupt records and records whose parse or transform
        fails, instead of failing with an error naming the file.
      num_epochs: passes over this pipeline's shard; None (the default) repeats forever.

    Returns:
      A dataset of batches: `transform_fn`'s structure with a leading `batch_size` dimension.

    Raises:
      ValueError: a size argument is not a positive integer.
      DataError: `files` is empty or a file does not exist.
    """
    _check_positive("batch_size", batch_size)
    _check_positive("shuffle_buffer", shuffle_buffer)
    fn = _compose(parse_fn, transform_fn)
    shard, record_shard = shard_files(files, input_context)
    records = _read_records(
        shard,
        record_shard=record_shard,
        shuffle_files=True,
        seed=seed,
        deterministic=None,
        skip_bad_records=skip_bad_records,
    )
    if cache:
        records = records.cache()
    if shuffle_buffer > 1:
        # Shuffle before repeat: each epoch is a permutation of the shard's records (epochs stay
        # epochs, which MLPerf's epoch accounting assumes).
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if num_epochs is not None:
        _check_positive("num_epochs", num_epochs)
    records = records.repeat(num_epochs)
    examples = _checked_map(
        records,
        fn,
        shard,
        skip_bad_records=skip_bad_records,
        with_end=False,
    )
    batches = examples.batch(batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE)
    # Options before the final prefetch, so the slack optimization finds that prefetch.
    return batches.with_options(pipeline_options(training=True)).prefetch(AUTOTUNE)


def eval_pipeline(
    files: Sequence[str],
    *,
    input_context: tf.distribute.InputContext | None,
    parse_fn: ParseFn,
    transform_fn: TransformFn | None,
    batch_size: int,
    num_batches: int,
    cache: bool = True,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Exactly `num_batches` eval batches of one pipeline's shard, in a deterministic order.

    Every pipeline reads its shard once (files sharded as in `training_pipeline`), parses and
    transforms in parallel but in order, caches the decoded examples (so later evals skip the
    decoding), adds a float32 `valid` key (1.0) and pads with all-zero examples (`valid` 0.0) up to
    `num_batches * batch_size` examples. So all pipelines, hence all replicas, run the same
    number of eval steps; `eval_step` weighs its metrics by `valid`.

    Args:
      files: TFRecord files of the whole eval set, in the same order on every worker.
      input_context: the dataset function's `tf.distribute.InputContext`, or None.
      parse_fn: serialized record -> example dict.
      transform_fn: example dict -> example dict with static shapes; None for parse only.
      batch_size: examples per batch (per replica).
      num_batches: batches this pipeline yields; a pipeline feeding R replicas must yield R times
        the per-replica eval steps (`eval_batches_per_pipeline`).
      cache: cache the decoded examples in memory (RAM: this shard's decoded size).
      skip_bad_records: skip and report bad records instead of failing.

    Returns:
      A finite dataset of `num_batches` batches of dicts (`transform_fn`'s keys plus `valid`).
      Iterating it raises if the shard holds more than `num_batches * batch_size` examples.

    Raises:
      ValueError: a size argument is not a positive integer, or examples are not dicts of
        fixed-shape tensors.
      DataError: `files` is empty or a file does not exist.
    """
    _check_positive("batch_size", batch_size)
    _check_positive("num_batches", num_batches)
    fn = _compose(parse_fn, transform_fn)
    shard, record_shard = shard_files(files, input_context)
    records = _read_records(
        shard,
        record_shard=record_shard,
        shuffle_files=False,
        seed=None,
        deterministic=True,
        skip_bad_records=skip_bad_records,
    )
    examples = _checked_map(
        records,
        fn,
        shard,
        skip_bad_records=skip_bad_records,
        with_end=True,
    )
    if cache:
        examples = examples.cache()
    batches = pad_eval_dataset(examples, batch_size=batch_size, num_batches=num_batches)
    return batches.with_options(pipeline_options(training=False)).prefetch(AUTOTUNE)


def pad_eval_dataset(
    examples_ds: tf.data.Dataset, *, batch_size: int, num_batches: int
) -> tf.data.Dataset:
    """Batches examples and pads them to exactly `num_batches` batches, marking the padding.

    Args:
      examples_ds: a finite dataset of dicts of fixed-shape tensors (one example each), with no
        `valid` key.
      batch_size: examples per batch.
      num_batches: batches to yield.

    Returns:
      `num_batches` batches of `batch_size` examples: the real ones first, each with a float32
      `valid` 1.0, then all-zero (empty-string) examples with `valid` 0.0. Its cardinality is
      `num_batches`. Iterating it raises `InvalidArgumentError` if `examples_ds` holds more than
      `num_batches * batch_size` examples (they would be silently dropped otherwise).

    Raises:
      ValueError: a size is not a positive integer, or the examples are not dicts of fixed-shape
        tensors, or already have a `valid` key.
    """
    _check_positive("batch_size", batch_size)
    _check_positive("num_batches", num_batches)
    spec = examples_ds.element_spec
    if not isinstance(spec, dict):
        raise ValueError(f"eval examples must be dicts of tensors, got element_spec {spec!r}")
    if "valid" in spec:
        raise ValueError("eval examples already have a 'valid' key, which padding adds")
    for key, value in spec.items():
        if not isinstance(value, tf.TensorSpec) or not value.shape.is_fully_defined():
            raise ValueError(f"eval example key '{key}' needs a fixed shape to pad, got {value!r}")
    capacity = batch_size * num_batches

    real = examples_ds.map(lambda ex: {**ex, "valid": tf.constant(1.0, tf.float32)})
    padding = dict(_zeros_of_spec(spec))
    padding["valid"] = tf.constant(0.0, tf.float32)
    padded = real.concatenate(tf.data.Dataset.from_tensors(padding).repeat())
    # One element past the capacity is read, checked to be padding, and dropped.
    padded = padded.take(capacity + 1)

    def check(index, example):
        fits = tf.logical_or(index < capacity, tf.equal(example["valid"], 0.0))
        assert_fits = tf.debugging.Assert(
            fits,
            [
                f"eval shard has more than num_batches * batch_size = {num_batches} * "
                f"{batch_size} = {capacity} examples; raise num_batches"
            ],
        )
        with tf.control_dependencies([assert_fits]):
            return index + 1, (index, {k: tf.identity(v) for k, v in example.items()})

    padded = padded.scan(tf.constant(0, tf.int64), check)
    padded = padded.filter(lambda index, example: index < capacity)
    padded = padded.map(lambda index, example: example)
    batches = padded.batch(batch_size, drop_remainder=True)
    return batches.apply(tf.data.experimental.assert_cardinality(num_batches))
