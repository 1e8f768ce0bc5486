"""Provides DLRMv4's input: the streaming window records in time order, and synthetic batches.

The prepared data (`prepare.py`) is one TFRecord file per time window plus a manifest,
`manifest.json`, that names each window's file, its time span, its sample count and the number
of rows each id feature needs. Training reads the windows in time order, each once, as the
reference's streaming loop does (train on window T, never on the future); the eval set is the
window after the last training window. A record is one anchor listen:

    uih_item, uih_artist, uih_album, uih_action, uih_time   int64 lists, oldest first (l <= H)
    contextual                                              int64 [8]: uid, the 7 cross ids
    cand_item, cand_artist, cand_album, cand_time, label    int64 scalars

A history longer than the config's H keeps its newest H events (yambda.py truncates so).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from benchmarks.dlrmv4.config import DlrmConfig, ModelConfig
from mlperf_tf.data.pipeline import DATA_ERROR_PREFIX
from mlperf_tf.errors import UserError

MANIFEST = "manifest.json"
SEQUENCE_KEYS = ("uih_item", "uih_artist", "uih_album", "uih_action", "uih_time")
SCALAR_KEYS = ("cand_item", "cand_artist", "cand_album", "cand_time", "label")
# Manifest table name -> the record features whose ids index it.
TABLE_FEATURES = {
    "item_id": ("uih_item", "cand_item"),
    "artist_id": ("uih_artist", "cand_artist"),
    "album_id": ("uih_album", "cand_album"),
}


class DataError(UserError):
    """The prepared data does not fit the config or is out of time order."""


def read_manifest(data_dir: str) -> dict:
    """The manifest of `data_dir`; raises DataError when it is missing or unreadable."""
    path = os.path.join(data_dir, MANIFEST)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(
            f"`data_dir` {data_dir} has no {MANIFEST}: run `mlperf-tf prepare dlrmv4`"
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is corrupt: {e}") from None


def check_manifest(manifest: dict, config: DlrmConfig) -> None:
    """Raises DataError unless the windows are in time order, the eval window follows the
    training windows, and every id fits its table.

    Args:
      manifest: `read_manifest`'s dict.
      config: the run's config (its table sizes and window count).
    """
    windows = manifest["train_windows"]
    if len(windows) < config.data.num_train_windows:
        raise DataError(
            f"`data.num_train_windows` ({config.data.num_train_windows}) is more than the "
            f"{len(windows)} prepared training windows"
        )
    spans = [*windows[: config.data.num_train_windows], manifest["eval_window"]]
    for before, after in zip(spans, spans[1:]):
        if not (before["start"] < before["end"] <= after["start"] < after["end"]):
            raise DataError(
                f"window {after['file']} [{after['start']}, {after['end']}) is out of time "
                f"order after {before['file']} [{before['start']}, {before['end']})"
            )
    rows = config.model.table_rows()
    for table, needed in manifest["table_rows"].items():
        if table in rows and needed > rows[table]:
            raise DataError(
                f"the data has ids up to {needed - 1} in table {table}, outside its "
                f"{rows[table]} rows (`model.{table.removesuffix('_id')}_rows`)"
            )


def parse_fn(history: int, num_contextual: int, model: ModelConfig | None = None):
    """serialized record -> example dict of the model's inputs (histories padded to
    `history`, newest kept), with `label` float32. With `model`, `parse(record, file)` also
    fails (a one-line `DataError` on the host, naming the file) on an id outside its table."""
    spec = {key: tf.io.VarLenFeature(tf.int64) for key in SEQUENCE_KEYS}
    spec.update({key: tf.io.FixedLenFeature([], tf.int64) for key in SCALAR_KEYS})
    spec["contextual"] = tf.io.FixedLenFeature([num_contextual], tf.int64)

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        out = {}
        for key in SEQUENCE_KEYS:
            values = tf.sparse.to_dense(ex[key])[-history:]  # newest `history` events
            length = tf.shape(values)[0]
            dtype = tf.int64 if key == "uih_time" else tf.int32
            out[key] = tf.ensure_shape(
                tf.pad(tf.cast(values, dtype), [[0, history - length]]), [history]
            )
        out["uih_length"] = tf.cast(tf.shape(tf.sparse.to_dense(ex["uih_item"])[-history:])[0],
                                    tf.int32)  # fmt: skip
        out["contextual"] = tf.cast(ex["contextual"], tf.int32)
        for key in ("cand_item", "cand_artist", "cand_album"):
            out[key] = tf.cast(ex[key], tf.int32)
        out["cand_time"] = ex["cand_time"]
        out["label"] = tf.cast(ex["label"], tf.float32)
        return out

    if model is None:
        return parse
    limits = {
        ("uih_item", "cand_item"): ("item_rows", model.item_rows),
        ("uih_artist", "cand_artist"): ("artist_rows", model.artist_rows),
        ("uih_album", "cand_album"): ("album_rows", model.album_rows),
    }
    contextual_rows = tf.constant([model.uid_rows, *model.cross_rows], tf.int32)

    def checked(record, file):
        out = parse(record)
        checks = []
        for keys, (field, rows) in limits.items():
            ids = tf.concat([tf.reshape(out[k], [-1]) for k in keys], 0)
            checks.append(tf.debugging.Assert(
                tf.reduce_all((ids >= 0) & (ids < rows)),
                [f"{DATA_ERROR_PREFIX} an id outside its table (`model.{field}` {rows}) in", file],
            ))  # fmt: skip
        checks.append(tf.debugging.Assert(
            tf.reduce_all((out["contextual"] >= 0) & (out["contextual"] < contextual_rows)),
            [f"{DATA_ERROR_PREFIX} a uid or cross id outside its table (`model.uid_rows`, "
             "`model.cross_rows`) in", file],
        ))  # fmt: skip
        with tf.control_dependencies(checks):
            return {k: tf.identity(v) for k, v in out.items()}

    return checked


def _records(files, input_context):
    """(record, its file) of `files` in order, this pipeline's share round-robin (time order
    kept)."""
    records = tf.data.Dataset.from_tensor_slices(files).flat_map(
        lambda f: tf.data.TFRecordDataset(f).map(lambda r: (r, f))
    )
    if input_context and input_context.num_input_pipelines > 1:
        records = records.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return records


def train_dataset(config: DlrmConfig, *, input_context, batch_size: int, seed: int,
                  skip_bad_records: bool):  # fmt: skip
    """Per-replica training batches: the training windows in time order, then again (a run
    that outlives the stream, which the schedule does not allow, would see them again)."""
    del seed, skip_bad_records  # streaming order is the data's; no shuffle within a window
    manifest = read_manifest(config.data_dir)
    check_manifest(manifest, config)
    if "generator" in manifest:
        examples = generated_examples(config, manifest["generator"])
        if input_context and input_context.num_input_pipelines > 1:
            examples = examples.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
        return examples.repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    files = [
        os.path.join(config.data_dir, w["file"])
        for w in manifest["train_windows"][: config.data.num_train_windows]
    ]
    parse = parse_fn(config.model.history_length, config.model.num_contextual, config.model)
    records = _records(files, input_context).repeat()
    return (
        records.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def generated_examples(config: DlrmConfig, generator: dict) -> tf.data.Dataset:
    """The `mini` stream's training examples (`mini_stream.MiniStream`): its days in time order,
    each generated (vectorized, on the host) when the pipeline reaches it, never written; the
    ids are in their tables by construction. `generator` is the manifest's
    {seed, window_samples}."""
    from benchmarks.dlrmv4.mini_stream import MiniStream  # noqa: PLC0415

    m = config.model
    h = m.history_length
    stream = MiniStream(seed=generator["seed"], history=h, cross_rows=m.cross_rows)
    signature = {key: tf.TensorSpec([None, h], tf.int64 if key == "uih_time" else tf.int32)
                 for key in SEQUENCE_KEYS}  # fmt: skip
    signature.update({key: tf.TensorSpec([None], tf.int32) for key in
                      ("uih_length", "cand_item", "cand_artist", "cand_album")})  # fmt: skip
    signature["contextual"] = tf.TensorSpec([None, m.num_contextual], tf.int32)
    signature["cand_time"] = tf.TensorSpec([None], tf.int64)
    signature["label"] = tf.TensorSpec([None], tf.float32)

    def days():
        count, last = generator["window_samples"], config.data.num_train_windows
        for _, events in stream.days(0, last, count):
            yield stream.examples(events)

    return tf.data.Dataset.from_generator(days, output_signature=signature).unbatch()


def eval_dataset(config: DlrmConfig, *, input_context, batch_size: int, num_batches: int,
                 skip_bad_records: bool):  # fmt: skip
    """`num_batches` eval batches of the held-out future window, padding marked `valid` 0."""
    from mlperf_tf.data import pipeline  # noqa: PLC0415

    del skip_bad_records
    manifest = read_manifest(config.data_dir)
    check_manifest(manifest, config)
    path = os.path.join(config.data_dir, manifest["eval_window"]["file"])
    parse = parse_fn(config.model.history_length, config.model.num_contextual, config.model)
    examples = _records([path], input_context).map(parse)
    return pipeline.pad_eval_dataset(examples, batch_size=batch_size, num_batches=num_batches)


def synthetic_example(config: ModelConfig, seed) -> dict[str, tf.Tensor]:
    """A random example of the model's input shapes: ids in range, a random history length,
    times increasing by up to an hour, a random label."""
    h = config.history_length

    def uniform(shape, high, index, dtype=tf.int32):
        s = tf.stack([tf.cast(seed, tf.int32), tf.constant(index, tf.int32)])
        return tf.random.stateless_uniform(shape, s, 0, high, dtype=tf.int64 if dtype ==
                                           tf.int64 else tf.int32)  # fmt: skip

    length = uniform([], h, 0) + 1
    valid = tf.range(h) < length
    masked = lambda x: tf.where(valid, x, tf.zeros_like(x))  # noqa: E731
    steps = uniform([h], 3600, 1, tf.int64)
    times = masked(1_000_000 + tf.cumsum(steps))
    rows = config.table_rows()
    ctx_rows = [config.uid_rows, *config.cross_rows]
    return {
        "uih_item": masked(uniform([h], config.item_rows, 2)),
        "uih_artist": masked(uniform([h], config.artist_rows, 3)),
        "uih_album": masked(uniform([h], config.album_rows, 4)),
        "uih_action": masked(uniform([h], 8, 5)),
        "uih_time": times,
        "uih_length": length,
        "contextual": tf.stack([uniform([], n, 10 + i) for i, n in enumerate(ctx_rows)]),
        "cand_item": uniform([], rows["item_id"], 6),
        "cand_artist": uniform([], rows["artist_id"], 7),
        "cand_album": uniform([], rows["album_id"], 8),
        "cand_time": tf.reduce_max(times) + 60,
        "label": tf.cast(uniform([], 2, 9), tf.float32),
    }


def synthetic_train_dataset(config: DlrmConfig, *, batch_size: int, seed: int):
    """Endless synthetic batches (every example its own)."""
    from mlperf_tf.data import synthetic  # noqa: PLC0415

    return synthetic.synthetic_dataset(
        lambda s: synthetic_example(config.model, s), batch_size=batch_size, seed=seed
    )


def synthetic_eval_dataset(config: DlrmConfig, *, batch_size: int, num_batches: int, seed: int):
    """`eval_examples` synthetic examples, padded to `num_batches` batches."""
    from mlperf_tf.data import synthetic  # noqa: PLC0415

    return synthetic.synthetic_eval_dataset(
        lambda s: synthetic_example(config.model, s),
        count=config.eval_examples,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed + 1_000_000,
    )
