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
`skip_bad_records=True` the bad records are skipped instead and reported on stderr (a line per
batch with skips) with the file names and the running count of records skipped by that pipeline
(see README.md).
"""

from __future__ import annotations

import contextlib
import functools
import glob as _glob
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from mlperf_tf.errors import DataError, UserError

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


# What an element between the reader and the checks is: a record, the marker left by a corrupt
# file (strict mode), the end of a finite stream (eval), or (strict mode, cache=True) a parsed
# example flagged because a bad record came just before it in the first stage.
_RECORD, _CORRUPT_FILE, _END, _BAD_BEFORE = 0, 1, 2, 3
# Elements per vectorized bookkeeping step (byte counts, running numbers, checks).
_CHUNK = 64


def _code(value: int) -> tf.Tensor:
    return tf.constant(value, tf.int64)


def _warn(*parts) -> tf.Tensor:
    """Prints one warning line to stderr from inside a pipeline (not subject to TF's log level)."""
    tf.print(tf.strings.join(["WARNING: mlperf_tf data: ", *parts]), output_stream=sys.stderr)
    return tf.constant(True)


def _read_records(
    files: Sequence[str],
    *,
    record_shard: tuple[int, int] | None,
    shuffle_files: bool,
    seed: int | None,
    deterministic: bool | None,
    skip_bad_records: bool,
) -> tf.data.Dataset:
    """`(record, file_index, code)` triples read from `files` with a parallel interleave.

    A corrupt record makes TFRecordDataset fail and, under `ignore_errors`, drop the rest of its
    file; so each file's reader counts the bytes it read and compares them with the file's size
    at the end. For a corrupt file, with `skip_bad_records` a warning naming it is printed;
    without, one marker element with code `_CORRUPT_FILE` travels on, and `_checks` raises.
    (The reader cannot raise itself: the `ignore_errors` of `_apply` would swallow the error.)
    Bookkeeping runs on chunks of records, so it costs little per record.
    """
    paths = tf.constant(list(files), dtype=tf.string)
    sizes = tf.constant(_file_sizes(files), dtype=tf.int64)
    num_files = len(files)

    def read_one(index):
        path, size = paths[index], sizes[index]
        records = tf.data.TFRecordDataset(path, buffer_size=1 << 20).ignore_errors(log_warning=True)
        # [n] records per chunk, then one empty chunk: the end of the file.
        chunks = records.batch(_CHUNK).concatenate(
            tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
        )

        def count_bytes(total, chunk):
            lengths = tf.cast(tf.strings.length(chunk), tf.int64) + _TFRECORD_OVERHEAD
            return total + tf.reduce_sum(lengths), (chunk, total)

        def label(chunk, total):
            corrupt = tf.logical_and(tf.equal(tf.size(chunk), 0), tf.not_equal(total, size))
            if skip_bad_records:
                warned = tf.cond(
                    corrupt,
                    lambda: _warn(
                        "skipped the rest of corrupt TFRecord file '",
                        path,
                        "' (read ",
                        tf.strings.as_string(total),
                        " of ",
                        tf.strings.as_string(size),
                        " bytes)",
                    ),
                    lambda: tf.constant(False),
                )
                with tf.control_dependencies([warned]):
                    chunk = tf.identity(chunk)
                corrupt = tf.constant(False)
            else:
                chunk = tf.concat([chunk, tf.fill([tf.cast(corrupt, tf.int32)], "")], 0)
            n = tf.shape(chunk)[:1]
            code = tf.fill(n, tf.where(corrupt, _code(_CORRUPT_FILE), _code(_RECORD)))
            return chunk, tf.fill(n, index), code

        return chunks.scan(tf.constant(0, tf.int64), count_bytes).map(label).unbatch()

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


def _number(elements: tf.data.Dataset, *, chunked: bool) -> tf.data.Dataset:
    """`(payload, file, code)` -> `(meta, payload)`, meta = `(count, file, previous_file,
    previous_code, code)`: a running number and what came just before, which names the file of
    an element that `_apply` drops. `chunked` numbers 64 at a time (payloads must batch)."""
    init = (tf.constant(0, tf.int64), tf.constant(-1, tf.int64), _code(_RECORD))
    if chunked:

        def number_chunk(state, chunk):
            count, previous_file, previous_code = state
            payload, file, code = chunk
            n = tf.size(code, out_type=tf.int64)
            meta = (
                count + tf.range(n),
                file,
                tf.concat([[previous_file], file[:-1]], 0),
                tf.concat([[previous_code], code[:-1]], 0),
                code,
            )
            return (count + n, file[-1], code[-1]), (meta, payload)

        return elements.batch(_CHUNK).scan(init, number_chunk).unbatch()

    def number_one(state, element):
        count, previous_file, previous_code = state
        payload, file, code = element
        meta = (count, file, previous_file, previous_code, code)
        return (count + 1, file, code), (meta, payload)

    return elements.scan(init, number_one)


def _apply(numbered: tf.data.Dataset, fn: Callable, *, end_dummy: Any = None) -> tf.data.Dataset:
    """Maps `fn` over the payloads in parallel, in order; drops the elements where it fails.

    Corrupt-file markers and flagged elements fail here on purpose (an Assert), so they are
    dropped too and reported by `_checks` through the next element's `previous_code` and
    `previous_file`. End markers (finite streams) pass as `end_dummy`, zeros of `fn`'s output.
    """

    def apply(meta, payload):
        code = meta[4]
        not_marker = tf.debugging.Assert(
            tf.logical_or(tf.equal(code, _RECORD), tf.equal(code, _END)),
            ["marker of a bad record or corrupt file"],
        )
        with tf.control_dependencies([not_marker]):
            payload = tf.nest.map_structure(tf.identity, payload)
        if end_dummy is None:
            return meta, fn(payload)
        return meta, tf.cond(tf.equal(code, _END), lambda: end_dummy, lambda: fn(payload))

    mapped = numbered.map(apply, num_parallel_calls=AUTOTUNE, deterministic=True)
    return mapped.ignore_errors(log_warning=True)


def _checks(
    elements: tf.data.Dataset,
    files: Sequence[str],
    *,
    skip_bad_records: bool,
    batched: bool,
    keep_file: bool = False,
    drop_end: bool = False,
    forward: bool = False,
) -> tf.data.Dataset:
    """Spots the records `_apply` dropped (gaps in the running numbers) and raises or warns.

    A scan finds the gaps (vectorized over a batch when `batched`) and only computes what to
    report, since raising inside a scan would leave its state behind; a stateless map after it
    raises (strict) or prints a warning line per batch with the files and the running count of
    skipped records (`skip_bad_records`), and strips the bookkeeping.

    Args:
      elements: `(meta, example)`, or batches of them when `batched`.
      files: the paths that meta's file indices point into.
      skip_bad_records: warn and go on instead of raising.
      batched: elements are batches (leading dimension on meta and example).
      keep_file: return `(example, file_index)` instead of `example`.
      drop_end: remove end markers (needs `batched`).
      forward: (strict mode, not batched) instead of raising, return `(example, file, code)`
        with the first bad file and a `_CORRUPT_FILE`/`_BAD_BEFORE` code, for the checks of a
        later stage to report: an error raised here would be swallowed by that stage's
        `ignore_errors`.
    """
    if forward and batched:
        raise ValueError("`forward` needs unbatched elements")
    paths = tf.constant(list(files), dtype=tf.string)

    def report(report, element):
        corrupt_name, _, _, num_gaps, _, bad_file = report
        meta, example = element
        if forward and not skip_bad_records:
            code = tf.where(
                tf.not_equal(corrupt_name, ""),
                _code(_CORRUPT_FILE),
                tf.where(num_gaps > 0, _code(_BAD_BEFORE), meta[4]),
            )
            return example, tf.where(num_gaps > 0, bad_file, meta[1]), code
        with tf.control_dependencies(_gap_checks(report, skip_bad_records)):
            example = tf.nest.map_structure(tf.identity, example)
        file = meta[1]
        if drop_end:
            keep = tf.not_equal(meta[4], _END)
            example = tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), example)
            file = tf.boolean_mask(file, keep)
        if forward:
            return example, file, meta[4]
        return (example, file) if keep_file else example

    init = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    find_gaps = functools.partial(_find_gaps, paths, batched)
    return elements.scan(init, find_gaps).map(report)


def _find_gaps(paths: tf.Tensor, batched: bool, state, element):
    """`_checks`' scan step: the records missing before this element (or batch) and what to
    report of them, with the running count of skipped records in the state.

    Returns:
      ((next expected running number, skipped so far), (report, element)), where report is
      (the first corrupt file's name, the first other bad file's name, all bad files' names,
      records missing here, skipped so far, the first bad file's index or -1).
    """
    expected, skipped = state
    meta, example = element
    if not batched:
        meta = tuple(m[tf.newaxis] for m in meta)
    count, _, previous_file, previous_code, _ = meta
    gaps = count - tf.concat([[expected], count[:-1] + 1], 0)
    skipped += tf.reduce_sum(gaps)
    bad = gaps > 0
    corrupt = tf.logical_and(bad, tf.equal(previous_code, _CORRUPT_FILE))
    previous_file = tf.maximum(previous_file, 0)
    names = tf.gather(paths, previous_file)
    report = (
        tf.strings.reduce_join(tf.boolean_mask(names, corrupt)[:1]),
        tf.strings.reduce_join(tf.boolean_mask(names, bad & ~corrupt)[:1]),
        tf.strings.reduce_join(tf.boolean_mask(names, bad), separator="', '"),
        tf.reduce_sum(gaps),
        skipped,
        tf.concat([tf.boolean_mask(previous_file, bad), [-1]], 0)[0],
    )
    return (count[-1] + 1, skipped), (report, element)


def _gap_checks(report, skip_bad_records: bool) -> list:
    """The ops that report a `_find_gaps` report: a warning line (`skip_bad_records`), or
    assertions that fail on a corrupt file or a bad record."""
    corrupt_name, bad_name, all_names, num_gaps, skipped, _ = report
    if skip_bad_records:
        return [
            tf.cond(
                num_gaps > 0,
                lambda: _warn(
                    "skipped ",
                    tf.strings.as_string(num_gaps),
                    " bad record(s) (parse_fn or transform_fn failed) in file(s) '",
                    all_names,
                    "' (",
                    tf.strings.as_string(skipped),
                    " skipped by this input pipeline so far)",
                ),
                lambda: tf.constant(False),
            )
        ]
    return [
        tf.debugging.Assert(
            tf.equal(corrupt_name, ""),
            [f"{DATA_ERROR_PREFIX} corrupt TFRecord file", corrupt_name],
        ),
        tf.debugging.Assert(
            tf.equal(bad_name, ""),
            [f"{DATA_ERROR_PREFIX} bad record (parse_fn or transform_fn failed) in file", bad_name],
        ),
    ]


def _end_marker() -> tf.data.Dataset:
    """The element that ends a finite stream of `(record, file, code)` triples."""
    return tf.data.Dataset.from_tensors((tf.constant("", tf.string), _code(-1), _code(_END)))


def _zeros_of_output(fn: Callable[[tf.Tensor], Any]):
    """Zeros of fn's output structure for a serialized record (fn is traced, not run)."""
    probe = tf.data.Dataset.from_tensors(tf.constant("", tf.string)).map(fn)
    return _zeros_of_spec(probe.element_spec)


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
      DataError: a pipeline met a corrupt record or a record its parse/transform could not handle
        (the message names the file and suggests `--skip_bad_records`), or a host-side
        generator of the pipeline (`tf.data.Dataset.from_generator`: e.g. GRPO's rollouts)
        raised a `UserError` (its message: e.g. a task whose environment does not start).
    """
    try:
        yield
    except tf.errors.OpError as e:
        message = data_error_message(e) or host_error_message(e)
        if message is None:
            raise
        raise DataError(message) from None


# The last line of the Python traceback TF carries in the OpError of a failed `PyFunc` (the op
# behind `from_generator`): "package.module.ErrorClass: message".
_PYTHON_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)\.([A-Za-z_]\w*): (.*)$", re.MULTILINE)


def host_error_message(error: BaseException) -> str | None:
    """The message of a `UserError` (or subclass) that a host-side generator raised inside a
    pipeline, from the OpError TF turned it into; None for any other error. The class is
    looked up among the modules already imported (nothing is imported by name from text)."""
    for module, name, message in reversed(_PYTHON_ERROR_LINE.findall(str(error))):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, UserError):
            return message.strip()
    return None


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
    interleave; records are shuffled, repeated, parsed and transformed with
    `num_parallel_calls=AUTOTUNE`, batched with `drop_remainder=True` (static shapes) and
    prefetched. With `cache=True`, records are parsed first, `parse_fn`'s outputs are cached in
    memory and shuffled, and only `transform_fn` runs every epoch.

    Put deterministic work (parsing; decoding, when caching) in `parse_fn` and random
    augmentation in `transform_fn`: caching what comes before the random augmentation is legal
    under the MLPerf rules (the augmentation still differs every epoch).

    Args:
      files: TFRecord files (see `list_files`), in the same order on every worker.
      input_context: the dataset function's `tf.distribute.InputContext`, or None.
      parse_fn: serialized record -> example dict (runs in the map, per example).
      transform_fn: example -> example (decode, augment); None for parse only. Its outputs must
        have static shapes, since batches are.
      batch_size: examples per batch: the per-replica batch size.
      shuffle_buffer: elements in the shuffle buffer (serialized records; parsed examples when
        caching, which share memory with the cache); 1 disables shuffling.
      seed: seed of the file and record shuffles (None: random each run).
      cache: parse once and cache `parse_fn`'s outputs in memory (RAM: this pipeline's whole
        parsed shard, e.g. decoded images); the first epoch fills the cache.
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
    if num_epochs is not None:
        _check_positive("num_epochs", num_epochs)
    shard, record_shard = shard_files(files, input_context)
    records = _read_records(
        shard, record_shard=record_shard, shuffle_files=True, seed=seed, deterministic=None,
        skip_bad_records=skip_bad_records,
    )  # fmt: skip
    checks = dict(files=shard, skip_bad_records=skip_bad_records)
    if cache:
        # parse_fn's (deterministic) output is cached, so only transform_fn runs every epoch.
        # Parsed examples may differ in shape (decoded images): they are numbered one by one.
        records = _parsed_once(records, parse_fn, checks)
        last_fn, chunked = transform_fn or (lambda x: x), False
    else:
        last_fn, chunked = _compose(parse_fn, transform_fn), True
    stream = _shuffle_repeat(records, shuffle_buffer, seed, num_epochs)
    if num_epochs is None:
        examples = _apply(_number(stream, chunked=chunked), last_fn)
        # In order (unlike the pipeline's other parallel steps): the checks read the running
        # numbers.
        batches = examples.batch(
            batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE, deterministic=True
        )
        batches = _checks(batches, **checks, batched=True)
    else:
        batches = _finite_batches(stream, last_fn, chunked, batch_size, checks)
    # Options before the final prefetch, so the slack optimization finds that prefetch.
    return batches.with_options(pipeline_options(training=True)).prefetch(AUTOTUNE)


def _parsed_once(records: tf.data.Dataset, parse_fn: ParseFn, checks: dict) -> tf.data.Dataset:
    """`training_pipeline(cache=True)`'s first stage: the shard's records parsed once, checked
    and cached, as `(example, file, code)`.

    An end marker follows the records, so that a bad last record of this finite stage is seen.
    """
    numbered = _number(records.concatenate(_end_marker()), chunked=True)
    parsed = _apply(numbered, parse_fn, end_dummy=_zeros_of_output(parse_fn))
    parsed = _checks(parsed, **checks, batched=False, forward=True)
    return parsed.filter(lambda example, file, code: tf.not_equal(code, _END)).cache()


def _finite_batches(
    stream: tf.data.Dataset, last_fn, chunked: bool, batch_size: int, checks: dict
) -> tf.data.Dataset:
    """Batches of a finite stream (`num_epochs` set), checked before batching.

    A dropped record or a corrupt file's marker is reported through the element after it, and
    the shuffle puts one last now and then (a truncated file went unreported for 10 of 150
    seeds): so an end marker follows the last element, and the checks run before batching (a
    batch remainder is dropped, and its gaps with it).
    """
    end_payload = _zeros_of_spec(stream.element_spec[0])
    end = tf.data.Dataset.from_tensors((end_payload, _code(-1), _code(_END)))
    numbered = _number(stream.concatenate(end), chunked=chunked)
    end_dummy = _zeros_of_spec(tf.data.Dataset.from_tensors(end_payload).map(last_fn).element_spec)
    examples = _apply(numbered, last_fn, end_dummy=end_dummy)
    examples = _checks(examples, **checks, batched=False, keep_file=True)
    examples = examples.filter(lambda example, file: file >= 0)
    return examples.map(lambda example, file: example).batch(
        batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE, deterministic=True
    )


def _shuffle_repeat(dataset, shuffle_buffer: int, seed: int | None, num_epochs: int | None):
    if shuffle_buffer > 1:
        # Shuffle before repeat: each epoch is a permutation of the shard's records (epochs stay
        # epochs, which MLPerf's epoch accounting assumes).
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return dataset.repeat(num_epochs)


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
    numbered = _number(records.concatenate(_end_marker()), chunked=True)
    # The end marker passes fn as zeros of its output: a bad last record leaves a visible gap.
    examples = _apply(numbered, fn, end_dummy=_zeros_of_output(fn))
    examples = _checks(
        examples.batch(_CHUNK),
        shard,
        skip_bad_records=skip_bad_records,
        batched=True,
        drop_end=True,
    ).unbatch()
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
