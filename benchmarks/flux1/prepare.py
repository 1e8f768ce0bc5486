"""Converts the MLPerf flux1 reference's preprocessed embeddings to this suite's TFRecords.

The reference (torchtitan `experiments/flux/scripts/preprocess_flux_dataset.py`) writes parquet
files of rows `__key__` (string), `t5_encodings`, `clip_encodings`, `mean`, `logvar` (each a
`np.save`d uint16 array holding bfloat16 bits: [256, 4096], [768], [16, 32, 32] twice) and, for
the COCO validation set, `timestep` (int32, 0..7); `save_empty_encodings.py` writes the empty
caption's `t5_empty.npy` [1, 256, 4096] and `clip_empty.npy` [1, 768] (float16). This command
streams the k-th of N parquet files (sorted) a record batch at a time into one TFRecord file,
`train-0000k-of-0000N.tfrecord` or `eval-...` in `train/` or `eval/` under `--out_dir` (the
shard naming of every `prepare`; nothing is held whole in memory), writing `NAME.partial` and
renaming it when the file is done: a rerun over the same files skips those already converted
(resumable) and a failure leaves no partial file. The empty encodings become
`empty_encodings.npz`. Usage:

    mlperf-tf prepare flux1 --train_dir=/dataset/cc12m_preprocessed_temp \
        --eval_dir=/dataset/coco_preprocessed_temp --empty_dir=/dataset/empty_encodings \
        --out_dir=DIR

`--mini` writes the offline mini set instead: scikit-learn's digits as the latents, captions
through small frozen random encoders, written in the reference's parquet layout and converted
by the same path.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import shutil
import sys
import zlib
from collections.abc import Iterator, Sequence

import numpy as np

from benchmarks.flux1 import config as config_lib
from mlperf_tf import prepare_cli
from mlperf_tf.errors import DataError, UserError

ARRAY_COLUMNS = {"t5_encodings": "t5", "clip_encodings": "clip", "mean": "mean", "logvar": "logvar"}
BATCH_ROWS = 64  # rows read at a time (64 x ~2 MB of T5 encodings)


def bf16_bits(array: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) of `array`: uint16 arrays are taken as bits already (the
    reference's storage), floats are rounded to nearest even."""
    if array.dtype == np.uint16:
        return array
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"an array of dtype {array.dtype} is neither bfloat16 bits nor floats")
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def npy_bytes(array: np.ndarray) -> bytes:
    """`array` as the reference serializes it: `np.save` of its bfloat16 bits."""
    buffer = io.BytesIO()
    np.save(buffer, bf16_bits(array))
    return buffer.getvalue()


def _expected_shapes(args) -> dict[str, tuple[int, ...]]:
    latent = args.image_size // args.latent_downscale
    return {
        "t5": (args.t5_length, args.t5_width),
        "clip": (args.clip_width,),
        "mean": (args.latent_channels, latent, latent),
        "logvar": (args.latent_channels, latent, latent),
    }


_FLAG_OF = {"t5": "--t5_length/--t5_width", "clip": "--clip_width",
            "mean": "--latent_channels/--image_size", "logvar": "--latent_channels/--image_size"}  # fmt: skip


def _record(row: dict, shapes, *, where: str, eval_set: bool) -> bytes:
    """One TFRecord example from one parquet row (see input.py for the features)."""
    from mlperf_tf.data import tfrecord  # noqa: PLC0415 (TF only where records are written)

    features = {}
    for column, key in ARRAY_COLUMNS.items():
        try:
            array = np.load(io.BytesIO(row[column]), allow_pickle=False)
            bits = bf16_bits(array)
        except (ValueError, OSError, TypeError) as error:
            raise DataError(f"{where}: column {column!r} is not a saved array ({error})") from None
        shape = shapes[key]
        if bits.shape != shape:
            # The reference stores a leading batch axis of 1 nowhere but in the empty encodings.
            raise DataError(
                f"{where}: {column} has shape {tuple(bits.shape)}, not {shape} "
                f"(the embedding width or size does not match {_FLAG_OF[key]})"
            )
        features[key] = np.ascontiguousarray(bits, "<u2").tobytes()
    key = str(row.get("__key__", ""))
    features["index"] = zlib.crc32(key.encode()) & 0x7FFFFFFF
    if eval_set:
        timestep = row.get("timestep")
        if timestep is None or not 0 <= int(timestep) < config_lib.EVAL_TIMESTEPS:
            raise DataError(f"{where}: eval row has timestep {timestep!r}, not an integer in 0..7")
        features["timestep"] = int(timestep)
    return tfrecord.make_example(features).SerializeToString()


def _rows(path: str) -> Iterator[tuple[int, dict]]:
    """(row number, row) of a parquet file, a record batch at a time."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        parquet = pq.ParquetFile(path)
        missing = [c for c in ARRAY_COLUMNS if c not in parquet.schema_arrow.names]
        if missing:
            raise DataError(f"parquet file '{path}' has no column(s) {', '.join(missing)}")
        number = 0
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
            for row in batch.to_pylist():
                yield number, row
                number += 1
    except (pa.ArrowException, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"cannot read parquet file '{path}' ({message})") from None


def _num_rows(path: str) -> int:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"cannot read parquet file '{path}' ({message})") from None


def convert_split(src_dir: str, out_dir: str, shapes, *, eval_set: bool, progress=True) -> dict:
    """Converts the k-th of the N `*.parquet` files under `src_dir` (sorted) to
    `out_dir/{train,eval}-0000k-of-0000N.tfrecord` (`tfrecord.shard_paths`, the naming of every
    `prepare`), skipping those done. Returns {"files", "skipped_files", "rows"}.

    Raises:
      DataError: no parquet file, an unreadable file, or a row of the wrong shapes (the
        file being written is removed; finished files stay).
    """
    import tensorflow as tf  # noqa: PLC0415

    from mlperf_tf.data.tfrecord import Progress, shard_paths  # noqa: PLC0415

    files = sorted(glob.glob(os.path.join(src_dir, "**", "*.parquet"), recursive=True))
    if not files:
        raise DataError(f"no parquet file under '{src_dir}'")
    os.makedirs(out_dir, exist_ok=True)
    what = "eval" if eval_set else "train"
    targets = shard_paths(out_dir, prefix=what, num_shards=len(files), suffix=".tfrecord")
    todo, skipped = [], 0
    for path, target in zip(files, targets):
        if os.path.exists(target):
            skipped += 1
        else:
            todo.append((path, target))
    # Every file's footer is read before anything is written: a corrupt file fails up front.
    total = sum(_num_rows(p) for p, _ in todo)
    bar = Progress(total, prefix=f"flux1 {what}") if progress else None
    rows = 0
    try:
        for path, target in todo:
            partial = target + ".partial"
            try:
                with tf.io.TFRecordWriter(partial) as writer:
                    for number, row in _rows(path):
                        where = f"{path} row {number}"
                        writer.write(_record(row, shapes, where=where, eval_set=eval_set))
                        rows += 1
                        if bar and number % BATCH_ROWS == BATCH_ROWS - 1:
                            bar.update(BATCH_ROWS)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(partial)
                raise
            os.replace(partial, target)
    finally:
        if bar:
            bar.done = rows
            bar.close()
    return {"files": len(todo), "skipped_files": skipped, "rows": rows}


def convert_empty_encodings(empty_dir: str, out_path: str, shapes) -> None:
    """`t5_empty.npy` and `clip_empty.npy` (leading axis 1) -> `empty_encodings.npz` (float32)."""
    arrays = {}
    for name, key in (("t5_empty.npy", "t5"), ("clip_empty.npy", "clip")):
        path = os.path.join(empty_dir, name)
        try:
            array = np.load(path, allow_pickle=False).astype(np.float32)
        except (OSError, ValueError) as error:
            raise DataError(f"cannot read the empty encoding '{path}' ({error})") from None
        if array.shape[:1] == (1,):
            array = array[0]
        if array.shape != shapes[key]:
            raise DataError(
                f"the empty encoding '{path}' has shape {array.shape}, not {shapes[key]} "
                f"({_FLAG_OF[key]})"
            )
        arrays[key] = array
    partial = out_path + ".partial.npz"
    np.savez(partial, **arrays)
    os.replace(partial, out_path)


def prepare(args) -> dict:
    """Converts the splits given (train, eval, empty encodings) under `args.out_dir`."""
    shapes = _expected_shapes(args)
    summary = {}
    os.makedirs(args.out_dir, exist_ok=True)
    if args.empty_dir:
        convert_empty_encodings(
            args.empty_dir, os.path.join(args.out_dir, "empty_encodings.npz"), shapes
        )
    for name, src, eval_set in (("train", args.train_dir, False), ("eval", args.eval_dir, True)):
        if src:
            summary[name] = convert_split(
                src, os.path.join(args.out_dir, name), shapes, eval_set=eval_set,
                progress=args.progress,
            )  # fmt: skip
    return summary


# ---- the mini data set ------------------------------------------------------------------------

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEMPLATES = (
    "a handwritten digit {}",
    "the number {} written by hand",
    "a scan of a handwritten {}",
)
MINI_LOGVAR = -20.0  # a sharp posterior: the digit is the latent


class FrozenTextEncoders:
    """Small random text encoders, seeded once and never trained: the mini's stand-ins for T5
    (per-token encodings [T, t]: a word embedding plus a position embedding through one fixed
    tanh layer; padding tokens are the empty caption's) and CLIP (a pooled vector [v]: the mean
    of the words' embeddings through another fixed tanh layer)."""

    def __init__(self, *, length: int, t5_width: int, clip_width: int, seed: int = 1234):
        words = sorted({w for t in TEMPLATES for w in t.split()} | set(DIGIT_NAMES))
        self.vocab = {w: i + 1 for i, w in enumerate(words)}  # 0: padding
        rng = np.random.RandomState(seed)
        width = 32
        self.embed = rng.normal(size=(len(self.vocab) + 1, width)).astype(np.float32)
        self.position = rng.normal(scale=0.5, size=(length, width)).astype(np.float32)
        self.t5_proj = rng.normal(scale=width**-0.5, size=(width, t5_width)).astype(np.float32)
        self.clip_proj = rng.normal(scale=width**-0.5, size=(width, clip_width)).astype(np.float32)
        self.length = length

    def __call__(self, caption: str) -> tuple[np.ndarray, np.ndarray]:
        ids = [self.vocab[w] for w in caption.split()][: self.length]
        ids += [0] * (self.length - len(ids))
        tokens = self.embed[ids] + self.position
        t5 = np.tanh(tokens @ self.t5_proj)
        words = self.embed[[i for i in ids if i]] if any(ids) else self.embed[:1]
        clip = np.tanh(words.mean(0) @ self.clip_proj)
        return t5.astype(np.float32), clip.astype(np.float32)


def mini_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits upsampled (bicubic) to `size` x `size`, in [-1, 1]: [N, size,
    size] float32 and the labels."""
    from PIL import Image  # noqa: PLC0415
    from sklearn.datasets import load_digits  # noqa: PLC0415

    digits = load_digits()
    out = np.empty((len(digits.images), size, size), np.float32)
    for i, image in enumerate(digits.images):
        pixels = Image.fromarray((image * (255.0 / 16.0)).astype(np.float32), mode="F")
        out[i] = np.asarray(pixels.resize((size, size), Image.BICUBIC)) / 127.5 - 1.0
    return np.clip(out, -1.0, 1.0), digits.target.astype(np.int64)


def _write_parquet(path: str, rows: list[dict], *, eval_set: bool) -> None:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    fields = [("__key__", pa.string())] + [(c, pa.binary()) for c in ARRAY_COLUMNS]
    if eval_set:
        fields.append(("timestep", pa.int32()))
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(fields)), path)


def write_mini_source(src: str, config: config_lib.FluxConfig) -> None:
    """The mini set in the reference's preprocessed layout under `src` (parquet + empty .npy)."""
    d = config.data
    encoders = FrozenTextEncoders(length=d.t5_length, t5_width=d.t5_width, clip_width=d.clip_width)
    images, labels = mini_images(d.image_size)
    order = np.random.RandomState(0).permutation(len(images))
    eval_ids, train_ids = order[: config.eval_examples], order[config.eval_examples :]
    logvar = np.full((1, d.image_size, d.image_size), MINI_LOGVAR, np.float32)
    for split, ids, eval_set in (("train", train_ids, False), ("eval", eval_ids, True)):
        os.makedirs(os.path.join(src, split))
        rows = []
        for n, i in enumerate(ids):
            caption = TEMPLATES[i % len(TEMPLATES)].format(DIGIT_NAMES[labels[i]])
            t5, clip = encoders(caption)
            row = {"__key__": f"digit{i:04d}", "t5_encodings": npy_bytes(t5),
                   "clip_encodings": npy_bytes(clip), "mean": npy_bytes(images[i][None]),
                   "logvar": npy_bytes(logvar)}  # fmt: skip
            if eval_set:
                row["timestep"] = n % config_lib.EVAL_TIMESTEPS
            rows.append(row)
        for shard in range(2):
            _write_parquet(
                os.path.join(src, split, f"data_0_{shard:04d}.parquet"), rows[shard::2],
                eval_set=eval_set,
            )  # fmt: skip
    os.makedirs(os.path.join(src, "empty"))
    t5, clip = encoders("")
    np.save(os.path.join(src, "empty", "t5_empty.npy"), t5[None].astype(np.float16))
    np.save(os.path.join(src, "empty", "clip_empty.npy"), clip[None].astype(np.float16))
    classes = [encoders(TEMPLATES[0].format(name)) for name in DIGIT_NAMES]
    np.savez(
        os.path.join(src, "class_encodings.npz"),
        t5=np.stack([c[0] for c in classes]),
        clip=np.stack([c[1] for c in classes]),
    )


def prepare_mini(data_dir: str) -> dict:
    """Writes the mini set to `data_dir` (staged beside it and renamed when complete)."""
    config = config_lib.mini()
    staging = data_dir.rstrip("/") + ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        src = os.path.join(staging, "source")
        write_mini_source(src, config)
        d = config.data
        args = _Args(
            train_dir=os.path.join(src, "train"), eval_dir=os.path.join(src, "eval"),
            empty_dir=os.path.join(src, "empty"), out_dir=staging, image_size=d.image_size,
            latent_downscale=d.latent_downscale, latent_channels=d.latent_channels,
            t5_length=d.t5_length, t5_width=d.t5_width, clip_width=d.clip_width, progress=False,
        )  # fmt: skip
        summary = prepare(args)
        shutil.move(os.path.join(src, "class_encodings.npz"), staging)
        shutil.rmtree(src)
        if os.path.exists(data_dir):
            shutil.rmtree(data_dir)
        os.replace(staging, data_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


class _Args:
    def __init__(self, **values):
        self.__dict__.update(values)


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare flux1 ...` (see the module docstring)."""
    parser = prepare_cli.parser(
        "flux1", __doc__.split("\n")[0], mini_help="write the offline mini data set"
    )
    parser.add_argument("--train_dir", default="", help="the preprocessed CC12M parquet files")
    parser.add_argument("--eval_dir", default="", help="the preprocessed COCO parquet files")
    parser.add_argument("--empty_dir", default="", help="folder of t5_empty.npy, clip_empty.npy")
    d = config_lib.DataConfig()
    for name in ("image_size", "latent_downscale", "latent_channels", "t5_length", "t5_width",
                 "clip_width"):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=getattr(d, name))
    args = parser.parse_args(argv)
    if args.mini:
        print(json.dumps(prepare_mini(args.out_dir)))
        return 0
    prepare_cli.require_positive(
        args, ("image_size", "latent_downscale", "latent_channels", "t5_length", "t5_width",
               "clip_width"),
    )  # fmt: skip
    if args.image_size % (args.latent_downscale * config_lib.PATCH):
        raise UserError(
            f"--image_size ({args.image_size}) must be a multiple of "
            f"{args.latent_downscale * config_lib.PATCH}: the latent (1/{args.latent_downscale} "
            "a side) is cut into 2x2 patches"
        )
    if not (args.train_dir or args.eval_dir or args.empty_dir):
        raise UserError("give --train_dir, --eval_dir and/or --empty_dir (or --mini)")
    args.progress = sys.stderr is not None
    print(json.dumps(prepare(args)))
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
