"""Provides ResNet-50 data preparation: an ImageNet-style JPEG tree, or the offline digits, to TFRecords.

Input layout (the ImageNet-2012 training and validation archives, unpacked):

    RAW/train/<wnid>/*.JPEG            one folder per class (ImageNet: 1000 wnids)
    RAW/val/*.JPEG + a labels file     or RAW/val/<wnid>/*.JPEG

The labels file (`--val_labels`, default: the first of `val_labels.txt`, `LOC_val_solution.csv`,
`imagenet_2012_validation_synset_labels.txt` found in RAW or RAW/val) is either one wnid per
line for the sorted validation file names (the TPU tools' format), lines `<file name> <wnid>`
(space or comma separated), or Kaggle's `LOC_val_solution.csv` (`ImageId,PredictionString`).
Optional bounding boxes (`--bbox_csv`): lines `<file name>,xmin,ymin,xmax,ymax` in [0, 1].

Output: `OUT/train-00000-of-01024 ...` and `OUT/validation-00000-of-00128 ...`, records with the
keys of the TPU tools' `imagenet_to_gcs.py`; labels are 1 + the index of the wnid in the sorted
training wnids (1..1000). PNG images and CMYK JPEGs are re-encoded as RGB JPEGs (quality 100).
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from benchmarks.resnet50.config import MINI_EVAL_EXAMPLES
from mlperf_tf import prepare_cli
from mlperf_tf.data import tfrecord
from mlperf_tf.errors import DataError, UserError

TRAIN_PREFIX = "train"
EVAL_PREFIX = "validation"
_IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
_VAL_LABEL_FILES = (
    "val_labels.txt",
    "LOC_val_solution.csv",
    "imagenet_2012_validation_synset_labels.txt",
)

# The mini dataset (see `prepare_mini`).
MINI_IMAGE_SIZE = 32  # pixels: the 8x8 digits upscaled 4x
MINI_SPLIT_SEED = 0
MINI_JPEG_QUALITY = 95
MINI_TRAIN_SHARDS = 4
MINI_EVAL_SHARDS = 2

# An item is what one example is made from: (path, label, wnid, boxes [[xmin, ymin, xmax, ymax]]).
Item = tuple[str, int, str, tuple[tuple[float, float, float, float], ...]]


# ------------------------------------------------------------------------------------------------
# Scanning the tree
# ------------------------------------------------------------------------------------------------
def _is_image(name: str) -> bool:
    return name.lower().endswith(_IMAGE_EXTENSIONS)


def _images_in(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if _is_image(n))


def list_synsets(train_dir: str) -> list[str]:
    """The sorted class folder names (wnids) of `train_dir`.

    Raises:
      DataError: the folder is missing or has no class folder.
    """
    if not os.path.isdir(train_dir):
        raise DataError(f"ImageNet train folder '{train_dir}' does not exist")
    synsets = sorted(n for n in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, n)))
    if not synsets:
        raise DataError(f"ImageNet train folder '{train_dir}' has no class folders (<wnid>/)")
    return synsets


def read_val_labels(path: str, file_names: Sequence[str]) -> dict[str, str]:
    """Maps validation file names to wnids from a labels file (formats: see the module doc).

    Args:
      path: the labels file.
      file_names: the validation image file names (sorted), for the one-wnid-per-line format.

    Raises:
      DataError: the file is missing, malformed, or its line count does not match.
    """
    if not os.path.isfile(path):
        raise DataError(f"validation labels file '{path}' does not exist")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise DataError(f"validation labels file '{path}' is empty")
    if lines[0].lower().startswith("imageid,"):  # Kaggle: ImageId,PredictionString
        labels = {}
        for row in csv.DictReader(lines):
            prediction = (row.get("PredictionString") or "").split()
            if not row.get("ImageId") or not prediction:
                raise DataError(f"validation labels file '{path}': malformed row {row!r}")
            labels[row["ImageId"]] = prediction[0]
        by_stem = {os.path.splitext(n)[0]: n for n in file_names}
        return {by_stem.get(k, k): v for k, v in labels.items()}
    rows = [line.replace(",", " ").split() for line in lines]
    if all(len(r) == 1 for r in rows):  # one wnid per line, in sorted file-name order
        if len(rows) != len(file_names):
            raise DataError(
                f"validation labels file '{path}' has {len(rows)} lines for "
                f"{len(file_names)} validation images"
            )
        return {name: r[0] for name, r in zip(file_names, rows)}
    if all(len(r) == 2 for r in rows):
        return {r[0]: r[1] for r in rows}
    raise DataError(f"validation labels file '{path}': expected lines '<wnid>' or '<file> <wnid>'")


def read_bboxes(path: str) -> dict[str, tuple[tuple[float, float, float, float], ...]]:
    """Reads `<file name>,xmin,ymin,xmax,ymax` lines (relative coordinates) into a dict.

    Raises:
      DataError: the file is missing or a line is malformed.
    """
    if not os.path.isfile(path):
        raise DataError(f"bounding box file '{path}' does not exist")
    boxes: dict[str, list[tuple[float, float, float, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for number, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            try:
                name, *coords = row
                xmin, ymin, xmax, ymax = (float(c) for c in coords)
            except ValueError:
                raise DataError(
                    f"bounding box file '{path}' line {number}: expected "
                    f"'<file>,xmin,ymin,xmax,ymax', got {','.join(row)!r}"
                ) from None
            boxes.setdefault(os.path.basename(name), []).append((xmin, ymin, xmax, ymax))
    return {k: tuple(v) for k, v in boxes.items()}


def scan_imagenet(
    raw_dir: str, *, val_labels: str | None = None, bbox_csv: str | None = None
) -> tuple[list[Item], list[Item], list[str]]:
    """Lists the training and validation images of an ImageNet-style tree with their labels.

    Returns:
      (train items, validation items, sorted wnids); labels are 1 + the wnid's index.

    Raises:
      DataError: a folder or labels file is missing, empty or inconsistent (names the path).
    """
    synsets = list_synsets(os.path.join(raw_dir, "train"))
    label_of = {wnid: i + 1 for i, wnid in enumerate(synsets)}
    boxes = read_bboxes(bbox_csv) if bbox_csv else {}

    def item(path: str, wnid: str) -> Item:
        return (path, label_of[wnid], wnid, boxes.get(os.path.basename(path), ()))

    train = []
    for wnid in synsets:
        folder = os.path.join(raw_dir, "train", wnid)
        train.extend(item(os.path.join(folder, n), wnid) for n in _images_in(folder))
    if not train:
        raise DataError(f"no training images (*.JPEG) under '{os.path.join(raw_dir, 'train')}'")

    val_dir = os.path.join(raw_dir, "val")
    if not os.path.isdir(val_dir):
        raise DataError(f"ImageNet validation folder '{val_dir}' does not exist")
    val = []
    subdirs = sorted(n for n in os.listdir(val_dir) if os.path.isdir(os.path.join(val_dir, n)))
    if subdirs:
        for wnid in subdirs:
            if wnid not in label_of:
                raise DataError(f"validation class folder '{wnid}' is not a training class")
            folder = os.path.join(val_dir, wnid)
            val.extend(item(os.path.join(folder, n), wnid) for n in _images_in(folder))
    else:
        names = _images_in(val_dir)
        labels_path = val_labels or _find_val_labels(raw_dir)
        labels = read_val_labels(labels_path, names)
        for name in names:
            wnid = labels.get(name)
            if wnid is None:
                raise DataError(f"validation image '{name}' has no label in '{labels_path}'")
            if wnid not in label_of:
                raise DataError(
                    f"validation image '{name}' is labelled '{wnid}' in '{labels_path}', "
                    "which is not a training class"
                )
            val.append(item(os.path.join(val_dir, name), wnid))
    if not val:
        raise DataError(f"no validation images under '{val_dir}'")
    return train, val, synsets


def _find_val_labels(raw_dir: str) -> str:
    for folder in (raw_dir, os.path.join(raw_dir, "val")):
        for name in _VAL_LABEL_FILES:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    raise DataError(
        f"no validation labels file in '{raw_dir}' (looked for {', '.join(_VAL_LABEL_FILES)}); "
        "pass --val_labels"
    )


# ------------------------------------------------------------------------------------------------
# Examples
# ------------------------------------------------------------------------------------------------
def rgb_jpeg(data: bytes) -> bytes:
    """Returns `data` if it is a JPEG with 1 or 3 channels, else the image re-encoded as an RGB
    JPEG of quality 100 (PNGs and CMYK JPEGs, as `imagenet_to_gcs.py` does).

    Raises:
      tf.errors.InvalidArgumentError: the bytes are not a decodable image.
    """
    if data[:2] == b"\xff\xd8":
        channels = int(tf.io.extract_jpeg_shape(data)[2])
        if channels in (1, 3):
            return data
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    return tf.io.encode_jpeg(image, quality=100, format="rgb").numpy()


def image_example(
    jpeg: bytes,
    *,
    label: int,
    wnid: str,
    file_name: str,
    boxes: Sequence[Sequence[float]] = (),
) -> tf.train.Example:
    """An ImageNet record with the keys of `imagenet_to_gcs.py`.

    Args:
      jpeg: the RGB (or grayscale) JPEG bytes.
      label: the class label as stored (1-based for ImageNet).
      wnid: the class's WordNet id (`image/class/synset`).
      file_name: the image's file name (`image/filename`).
      boxes: `[xmin, ymin, xmax, ymax]` boxes, relative coordinates.
    """
    height, width, _ = (int(v) for v in tf.io.extract_jpeg_shape(jpeg).numpy())
    boxes = [tuple(float(c) for c in b) for b in boxes]
    return tfrecord.make_example(
        {
            "image/height": height,
            "image/width": width,
            "image/colorspace": "RGB",
            "image/channels": 3,
            "image/class/label": int(label),
            "image/class/synset": wnid,
            "image/format": "JPEG",
            "image/filename": file_name,
            "image/encoded": jpeg,
            "image/object/bbox/xmin": tfrecord.float_feature([b[0] for b in boxes]),
            "image/object/bbox/ymin": tfrecord.float_feature([b[1] for b in boxes]),
            "image/object/bbox/xmax": tfrecord.float_feature([b[2] for b in boxes]),
            "image/object/bbox/ymax": tfrecord.float_feature([b[3] for b in boxes]),
            "image/object/bbox/label": tfrecord.int64_feature([int(label)] * len(boxes)),
        }
    )


def example_from_item(item: Item) -> bytes | None:
    """Reads one image file and returns its serialized record; None (skipped, with a warning on
    stderr naming the file) when the file cannot be read or decoded. Runs in worker processes."""
    path, label, wnid, boxes = item
    try:
        with open(path, "rb") as f:
            jpeg = rgb_jpeg(f.read())
        example = image_example(
            jpeg, label=label, wnid=wnid, file_name=os.path.basename(path), boxes=boxes
        )
    except (OSError, tf.errors.OpError) as e:
        print(f"WARNING: skipped unreadable image '{path}': {e}", file=sys.stderr)
        return None
    return example.SerializeToString()


# ------------------------------------------------------------------------------------------------
# Conversions
# ------------------------------------------------------------------------------------------------
def prepare_imagenet(
    raw_dir: str,
    out_dir: str,
    *,
    val_labels: str | None = None,
    bbox_csv: str | None = None,
    train_shards: int = 1024,
    eval_shards: int = 128,
    num_workers: int | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Converts an ImageNet-style JPEG tree into sharded TFRecords, in parallel.

    Training images are written in a fixed shuffled order (seed 0), so every shard mixes classes.

    Args:
      raw_dir: the tree (see the module docstring).
      out_dir: where `train-*` and `validation-*` go (created if missing).
      val_labels: the validation labels file; None searches the usual names.
      bbox_csv: optional training bounding boxes.
      train_shards, eval_shards: number of output files.
      num_workers: worker processes (default: the CPU count; 0 converts in this process).
      progress: show a progress bar on stderr.

    Returns:
      {"train": images found, "validation": images found, "classes": wnids}.

    Raises:
      DataError: the tree or a labels file is missing or inconsistent, or nothing was written.
    """
    train, val, synsets = scan_imagenet(raw_dir, val_labels=val_labels, bbox_csv=bbox_csv)
    order = np.random.RandomState(0).permutation(len(train))
    train = [train[i] for i in order]
    for items, prefix, shards in (
        (train, TRAIN_PREFIX, train_shards),
        (val, EVAL_PREFIX, eval_shards),
    ):
        tfrecord.write_sharded_parallel(
            items,
            example_from_item,
            out_dir,
            prefix=prefix,
            num_shards=shards,
            num_workers=num_workers,
            progress=progress,
        )
    return {"train": len(train), "validation": len(val), "classes": len(synsets)}


def mini_images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (bundled, offline) as RGB uint8 images of MINI_IMAGE_SIZE px.

    Returns:
      (train_images [n, 32, 32, 3], train_digits [n], eval_images [360, ...], eval_digits [360]):
      a fixed split (a seeded permutation; legacy `RandomState`, stable across numpy versions).
    """
    from sklearn.datasets import load_digits  # imported here: only the mini dataset needs it

    digits = load_digits()
    pixels = digits.images.astype(np.float32) * (255.0 / 16.0)  # [n, 8, 8], 0..16 -> 0..255
    images = tf.image.resize(pixels[..., np.newaxis], [MINI_IMAGE_SIZE] * 2, method="bilinear")
    images = tf.image.grayscale_to_rgb(images)  # [n, 32, 32, 3]
    images = np.clip(np.round(images.numpy()), 0, 255).astype(np.uint8)
    order = np.random.RandomState(MINI_SPLIT_SEED).permutation(len(images))
    held_out, train = order[:MINI_EVAL_EXAMPLES], order[MINI_EVAL_EXAMPLES:]
    return images[train], digits.target[train], images[held_out], digits.target[held_out]


def mini_wnid(digit: int) -> str:
    """The fake WordNet id of a digit class: 'n00000000'..'n00000009' (sorted = digit order)."""
    return f"n{digit:08d}"


def write_mini_tree(raw_dir: str) -> dict[str, int]:
    """Writes the digits as an ImageNet-style JPEG tree (train/<wnid>/, val/ + val_labels.txt).

    Returns:
      {"train": images, "validation": images}.
    """
    train_x, train_y, eval_x, eval_y = mini_images()
    for digit in range(10):
        os.makedirs(os.path.join(raw_dir, "train", mini_wnid(digit)), exist_ok=True)
    os.makedirs(os.path.join(raw_dir, "val"), exist_ok=True)
    for i, (image, digit) in enumerate(zip(train_x, train_y)):
        path = os.path.join(raw_dir, "train", mini_wnid(digit), f"digit_{i:05d}.JPEG")
        tf.io.write_file(path, tf.io.encode_jpeg(image, quality=MINI_JPEG_QUALITY))
    lines = []
    for i, (image, digit) in enumerate(zip(eval_x, eval_y)):
        name = f"digit_val_{i:05d}.JPEG"
        tf.io.write_file(
            os.path.join(raw_dir, "val", name), tf.io.encode_jpeg(image, quality=MINI_JPEG_QUALITY)
        )
        lines.append(f"{name} {mini_wnid(digit)}\n")
    with open(os.path.join(raw_dir, "val_labels.txt"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    return {"train": len(train_x), "validation": len(eval_x)}


def prepare_mini(data_dir: str, *, progress: bool = False) -> dict[str, int]:
    """Writes the offline mini dataset: the digits as an ImageNet JPEG tree, converted by
    `prepare_imagenet` (the same code path as real ImageNet) into `data_dir`.

    Labels are 1..10 (digit + 1), like ImageNet's 1..1000. The folder appears atomically (it is
    written under a temporary name and renamed), so a half-written one is never used.

    Returns:
      {"train": 1437, "validation": 360, "classes": 10}.

    Raises:
      UserError: `data_dir` already exists and is not empty.
    """
    data_dir = os.path.abspath(data_dir)
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise UserError(f"mini data folder '{data_dir}' already exists; delete it to rewrite it")
    with prepare_cli.staged_folder(data_dir) as staging:  # replaces an empty `data_dir`
        raw_dir = os.path.join(staging, "raw")
        write_mini_tree(raw_dir)
        counts = prepare_imagenet(
            raw_dir,
            staging,
            train_shards=MINI_TRAIN_SHARDS,
            eval_shards=MINI_EVAL_SHARDS,
            num_workers=0,  # 1797 tiny images: worker start-up would cost more than it saves
            progress=progress,
        )
        shutil.rmtree(raw_dir)  # the records hold the JPEG bytes
    return counts


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> prepare_cli.ArgumentParser:
    parser = prepare_cli.parser(
        "resnet50",
        "Convert ImageNet (train/<wnid>/*.JPEG, val/ + labels) into TFRecords, "
        "or write the offline digits mini dataset (--mini).",
        mini_help="write the digits mini dataset",
    )
    parser.add_argument("--raw_dir", help="the ImageNet tree (train/, val/)")
    parser.add_argument("--val_labels", default=None, help="validation labels file")
    parser.add_argument("--bbox_csv", default=None, help="training boxes: file,xmin,ymin,xmax,ymax")
    parser.add_argument("--train_shards", type=int, default=1024)
    parser.add_argument("--eval_shards", type=int, default=128)
    parser.add_argument("--num_workers", type=int, default=None, help="default: CPU count")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare resnet50 ...`: parses `argv` (without the program name), converts.

    Raises:
      UserError: a flag is missing or a path is bad (the CLI prints it as one line).
    """
    args = build_parser().parse_args(argv)
    if args.mini:
        counts = prepare_mini(args.out_dir, progress=True)
    else:
        if not args.raw_dir:
            raise UserError("--raw_dir is required (or --mini for the digits dataset)")
        prepare_cli.require_positive(args, ("train_shards", "eval_shards"))
        prepare_cli.require_positive(args, ("num_workers",), most=1024)
        counts = prepare_imagenet(
            args.raw_dir,
            args.out_dir,
            val_labels=args.val_labels,
            bbox_csv=args.bbox_csv,
            train_shards=args.train_shards,
            eval_shards=args.eval_shards,
            num_workers=args.num_workers,
        )
    print(
        f"wrote {counts['train']} training and {counts['validation']} validation images "
        f"({counts['classes']} classes) to {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
