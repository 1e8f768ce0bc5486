"""Provides SSD data preparation: COCO images + instances json, or the offline digit canvases, to TFRecords.

Input layout (COCO 2017, unpacked as the reference's `download_dataset.sh` leaves it):

    COCO/train2017/*.jpg   COCO/val2017/*.jpg
    COCO/annotations/instances_train2017.json   COCO/annotations/instances_val2017.json

Output:

    OUT/train-00000-of-00256 ...   training images that have at least one annotation (117266,
                                   as the reference's loader, which skips empty images)
    OUT/val-00000-of-00032 ...     all val images (5000)
    OUT/annotations/instances_val2017.json   the val json (pycocotools' ground truth)

Records carry the TF Object Detection API keys: `image/encoded` (the original file bytes),
`image/format`, `image/filename`, `image/source_id` (the COCO image id as text),
`image/height`, `image/width`, `image/object/bbox/{xmin,ymin,xmax,ymax}` (normalized to
[0, 1]), `image/object/class/label` (the COCO category id), `image/object/is_crowd` and
`image/object/area` (pixels).

The mini dataset (`prepare_mini`) is written by the same converter: canvases with
scikit-learn's 8x8 digits pasted at random scales and positions are saved as JPEG files with a
COCO instances json, then converted exactly like COCO.

Command: `python -m benchmarks.ssd.prepare --coco_dir=COCO --out_dir=OUT`, or
`python -m benchmarks.ssd.prepare --mini --out_dir=OUT`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from benchmarks.ssd.config import MINI_EVAL_EXAMPLES, MINI_TRAIN_EXAMPLES
from mlperf_tf import prepare_cli
from mlperf_tf.data import tfrecord
from mlperf_tf.errors import DataError, UserError

TRAIN_PREFIX = "train"
EVAL_PREFIX = "val"
ANNOTATIONS_DIR = "annotations"
COCO_TRAIN_SHARDS = 256
COCO_EVAL_SHARDS = 32

# The mini dataset.
MINI_CANVAS_SIDES = (96, 160)  # canvas height and width, pixels, uniform in this range
MINI_DIGIT_SIDES = (0.2, 0.5)  # pasted digit side as a fraction of the canvas' shorter side
MINI_MAX_DIGITS = 5  # digits per canvas: 1..this (fewer when they do not fit)
MINI_BOX_ALPHA = 0.25  # the box is the tight box of the digit's pixels above this opacity
MINI_TRAIN_SHARDS = 4
MINI_EVAL_SHARDS = 2
MINI_SEED = 0
MINI_JPEG_QUALITY = 95
MINI_TRAIN_JSON = "instances_train.json"
MINI_EVAL_JSON = "instances_val.json"


# ------------------------------------------------------------------------------------------------
# COCO json -> TFRecords
# ------------------------------------------------------------------------------------------------
def coco_example(
    *, image_bytes: bytes, image: dict, annotations: Sequence[dict], image_format: str
):
    """A `tf.train.Example` of one COCO image with its annotations.

    Args:
      image_bytes: the encoded image file.
      image: the COCO `images` entry (`id`, `file_name`, `height`, `width`).
      annotations: its COCO `annotations` entries (`bbox` [x, y, w, h] pixels, `category_id`,
        `iscrowd`, `area`); boxes with no area are left out.
      image_format: "jpeg" or "png".

    Returns:
      The Example, with the keys listed in this module's docstring.
    """
    height, width = int(image["height"]), int(image["width"])
    xmin, ymin, xmax, ymax, labels, crowd, area = [], [], [], [], [], [], []
    for ann in annotations:
        x, y, w, h = (float(v) for v in ann["bbox"])
        if w <= 0 or h <= 0:
            continue
        xmin.append(min(max(x / width, 0.0), 1.0))
        ymin.append(min(max(y / height, 0.0), 1.0))
        xmax.append(min(max((x + w) / width, 0.0), 1.0))
        ymax.append(min(max((y + h) / height, 0.0), 1.0))
        labels.append(int(ann["category_id"]))
        crowd.append(int(ann.get("iscrowd", 0)))
        area.append(float(ann.get("area", w * h)))
    return tfrecord.make_example(
        {
            "image/encoded": tfrecord.bytes_feature(image_bytes),
            "image/format": tfrecord.bytes_feature(image_format),
            "image/filename": tfrecord.bytes_feature(str(image.get("file_name", ""))),
            "image/source_id": tfrecord.bytes_feature(str(int(image["id"]))),
            "image/height": tfrecord.int64_feature(height),
            "image/width": tfrecord.int64_feature(width),
            "image/object/bbox/xmin": tfrecord.float_feature(xmin),
            "image/object/bbox/ymin": tfrecord.float_feature(ymin),
            "image/object/bbox/xmax": tfrecord.float_feature(xmax),
            "image/object/bbox/ymax": tfrecord.float_feature(ymax),
            "image/object/class/label": tfrecord.int64_feature(labels),
            "image/object/is_crowd": tfrecord.int64_feature(crowd),
            "image/object/area": tfrecord.float_feature(area),
        }
    )


def _example_from_item(item) -> object:
    """Worker: (image path, image entry, annotations) -> Example, or None if unreadable."""
    path, image, annotations = item
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    image_format = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpeg"
    return coco_example(
        image_bytes=data, image=image, annotations=annotations, image_format=image_format
    )


def load_instances(annotations_file: str) -> dict:
    """Reads a COCO instances json.

    Raises:
      DataError: the file is missing, not json, or lacks `images`/`annotations`/`categories`.
    """
    if not os.path.isfile(annotations_file):
        raise DataError(f"COCO annotations file '{annotations_file}' does not exist")
    try:
        with open(annotations_file, encoding="utf-8") as f:
            dataset = json.load(f)
    except ValueError as e:
        raise DataError(
            f"COCO annotations file '{annotations_file}' is not valid json: {e}"
        ) from None
    missing = [k for k in ("images", "annotations", "categories") if k not in dataset]
    if missing:
        raise DataError(f"COCO annotations file '{annotations_file}' lacks {', '.join(missing)}")
    return dataset


def convert_split(
    *,
    image_dir: str,
    annotations_file: str,
    out_dir: str,
    prefix: str,
    num_shards: int,
    skip_empty: bool,
    num_workers: int | None = None,
    progress: bool = True,
) -> list[str]:
    """Converts one COCO split (image folder + instances json) into sharded TFRecords.

    Args:
      image_dir: folder with the split's images (`file_name` of each `images` entry).
      annotations_file: the split's COCO instances json.
      out_dir: output folder.
      prefix: shard name prefix ("train", "val").
      num_shards: number of TFRecord files.
      skip_empty: leave out images without any annotation (the reference's training set).
      num_workers: worker processes (`tfrecord.write_sharded_parallel`; 0 = in process).
      progress: print a progress bar.

    Returns:
      The shard paths.

    Raises:
      DataError: the folder or json is missing or broken, or an image file is missing.
    """
    if not os.path.isdir(image_dir):
        raise DataError(f"COCO image folder '{image_dir}' does not exist")
    dataset = load_instances(annotations_file)
    by_image = defaultdict(list)
    for ann in dataset["annotations"]:
        by_image[int(ann["image_id"])].append(ann)
    items = []
    for image in sorted(dataset["images"], key=lambda im: int(im["id"])):
        annotations = by_image.get(int(image["id"]), [])
        if skip_empty and not annotations:
            continue
        path = os.path.join(image_dir, image["file_name"])
        if not os.path.isfile(path):
            raise DataError(f"image '{path}' listed in '{annotations_file}' does not exist")
        items.append((path, image, annotations))
    if not items:
        raise DataError(f"no images to convert from '{annotations_file}'")
    return tfrecord.write_sharded_parallel(
        items,
        _example_from_item,
        out_dir,
        prefix=prefix,
        num_shards=num_shards,
        num_workers=num_workers,
        progress=progress,
    )


def prepare_coco(
    coco_dir: str,
    out_dir: str,
    *,
    num_train_shards: int = COCO_TRAIN_SHARDS,
    num_eval_shards: int = COCO_EVAL_SHARDS,
    num_workers: int | None = None,
) -> None:
    """Converts COCO 2017 (layout in the module docstring) into `out_dir`.

    Raises:
      DataError: a folder, json or image is missing.
    """
    annotations = os.path.join(coco_dir, ANNOTATIONS_DIR)
    # (COCO split, shard prefix, shards, skip images without boxes): eval keeps every image.
    splits = (
        ("val2017", EVAL_PREFIX, num_eval_shards, False),
        ("train2017", TRAIN_PREFIX, num_train_shards, True),
    )
    for split, prefix, num_shards, skip_empty in splits:
        convert_split(
            image_dir=os.path.join(coco_dir, split),
            annotations_file=os.path.join(annotations, f"instances_{split}.json"),
            out_dir=out_dir,
            prefix=prefix,
            num_shards=num_shards,
            skip_empty=skip_empty,
            num_workers=num_workers,
        )
    os.makedirs(os.path.join(out_dir, ANNOTATIONS_DIR), exist_ok=True)
    val_json = "instances_val2017.json"
    shutil.copyfile(
        os.path.join(annotations, val_json), os.path.join(out_dir, ANNOTATIONS_DIR, val_json)
    )


# ------------------------------------------------------------------------------------------------
# The mini dataset: digit canvases
# ------------------------------------------------------------------------------------------------
def _paste_digit(canvas, alpha_mask, digit, top, left, side, color):
    """Alpha-blends an 8x8 digit (0..16), upscaled to side x side, onto the canvas in place.

    Returns the tight box `[x, y, w, h]` (pixels) of its pixels above `MINI_BOX_ALPHA`.
    """
    from PIL import Image  # Pillow comes with matplotlib; only the mini data needs it

    patch = Image.fromarray((digit * (255.0 / 16.0)).astype(np.uint8))
    alpha = np.asarray(patch.resize((side, side), Image.BILINEAR), np.float32) / 255.0
    region = canvas[top : top + side, left : left + side]
    region[:] = region * (1.0 - alpha[..., None]) + color * alpha[..., None]
    alpha_mask[top : top + side, left : left + side] = np.maximum(
        alpha_mask[top : top + side, left : left + side], alpha
    )
    rows = np.nonzero((alpha > MINI_BOX_ALPHA).any(axis=1))[0]
    cols = np.nonzero((alpha > MINI_BOX_ALPHA).any(axis=0))[0]
    return [
        float(left + cols[0]),
        float(top + rows[0]),
        float(cols[-1] - cols[0] + 1),
        float(rows[-1] - rows[0] + 1),
    ]


def make_canvas(rng: np.random.Generator, digits: np.ndarray, labels: np.ndarray):
    """One mini image: a noisy tinted canvas with 1-3 non-overlapping digits.

    Args:
      rng: the random generator.
      digits: `[n, 8, 8]` digit images (0..16) to draw from.
      labels: `[n]` their digits 0..9.

    Returns:
      (uint8 `[h, w, 3]` image, list of (box `[x, y, w, h]`, digit)).
    """
    height, width = (
        int(v) for v in rng.integers(MINI_CANVAS_SIDES[0], MINI_CANVAS_SIDES[1] + 1, 2)
    )
    background = rng.uniform(0, 110, 3)
    canvas = np.broadcast_to(background, (height, width, 3)).astype(np.float32).copy()
    canvas += rng.normal(0, 8, canvas.shape)
    alpha_mask = np.zeros((height, width), np.float32)
    objects = []
    taken = []  # placed squares (top, left, side)
    for _ in range(int(rng.integers(1, MINI_MAX_DIGITS + 1))):
        side = int(min(height, width) * rng.uniform(*MINI_DIGIT_SIDES))
        for _attempt in range(20):
            top = int(rng.integers(0, height - side + 1))
            left = int(rng.integers(0, width - side + 1))
            if all(
                top + side <= t or t + s <= top or left + side <= x or x + s <= left
                for t, x, s in taken
            ):
                break
        else:
            continue
        taken.append((top, left, side))
        index = int(rng.integers(0, len(digits)))
        color = rng.uniform(150, 255, 3).astype(np.float32)
        box = _paste_digit(canvas, alpha_mask, digits[index], top, left, side, color)
        objects.append((box, int(labels[index])))
    return np.clip(canvas, 0, 255).astype(np.uint8), objects


def write_mini_split(
    rng: np.random.Generator,
    digits: np.ndarray,
    labels: np.ndarray,
    *,
    count: int,
    image_dir: str,
    first_id: int,
) -> dict:
    """Draws `count` canvases into `image_dir` as JPEGs; returns their COCO instances dict."""
    from PIL import Image

    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    for k in range(count):
        image_id = first_id + k
        pixels, objects = make_canvas(rng, digits, labels)
        file_name = f"{image_id:08d}.jpg"
        Image.fromarray(pixels).save(os.path.join(image_dir, file_name), quality=MINI_JPEG_QUALITY)
        images.append(
            {
                "id": image_id,
                "file_name": file_name,
                "height": pixels.shape[0],
                "width": pixels.shape[1],
            }
        )
        for box, digit in objects:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": digit + 1,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    categories = [{"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10)]
    return {"images": images, "annotations": annotations, "categories": categories}


def prepare_mini(
    data_dir: str,
    *,
    num_train: int = MINI_TRAIN_EXAMPLES,
    num_eval: int = MINI_EVAL_EXAMPLES,
    seed: int = MINI_SEED,
) -> None:
    """Writes the mini dataset into `data_dir` (deterministic; no download).

    scikit-learn's 1797 digits are split 80/20 (held-out digits for the eval canvases); each
    canvas (96-160 px per side) gets 1-3 digits at 20-50 % of its shorter side, in random
    bright colors on a dark noisy background, never overlapping. The JPEGs are written to
    `images/{train,val}/` and converted by `convert_split` into `train-*`/`val-*` TFRecords
    (then the JPEG folder is removed); `annotations/instances_{train,val}.json` stay
    (category d + 1 = digit d). Built in a temporary folder and renamed,
    so an interrupted run leaves no partial `data_dir`.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.images))
    cut = int(0.8 * len(order))
    train_idx, eval_idx = order[:cut], order[cut:]
    with prepare_cli.staged_folder(data_dir) as tmp:
        annotations = os.path.join(tmp, ANNOTATIONS_DIR)
        os.makedirs(annotations)
        splits = (
            ("train", train_idx, num_train, MINI_TRAIN_JSON, TRAIN_PREFIX, MINI_TRAIN_SHARDS, 1),
            ("val", eval_idx, num_eval, MINI_EVAL_JSON, EVAL_PREFIX, MINI_EVAL_SHARDS, 1_000_001),
        )
        for split, idx, count, json_name, prefix, shards, first_id in splits:
            image_dir = os.path.join(tmp, "images", split)
            dataset = write_mini_split(
                rng,
                digits.images[idx],
                digits.target[idx],
                count=count,
                image_dir=image_dir,
                first_id=first_id,
            )
            json_path = os.path.join(annotations, json_name)
            with open(json_path, "w", encoding="utf-8") as f:
                json.dump(dataset, f)
            convert_split(
                image_dir=image_dir,
                annotations_file=json_path,
                out_dir=tmp,
                prefix=prefix,
                num_shards=shards,
                skip_empty=split == "train",
                num_workers=0,
                progress=False,
            )
        shutil.rmtree(os.path.join(tmp, "images"))  # the records hold the JPEG bytes
        if os.path.exists(data_dir):  # rewritten whole; staged_folder replaces only an empty one
            shutil.rmtree(data_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare ssd ...`: parses `argv` (without the program name), converts.

    Raises:
      UserError: a flag is missing; DataError: an input is missing or malformed.
    """
    parser = prepare_cli.parser(
        "ssd", __doc__.split("\n")[0], mini_help="write the offline digits dataset"
    )
    parser.add_argument("--coco_dir", help="COCO 2017 folder (train2017/, val2017/, annotations/)")
    parser.add_argument("--num_workers", type=int, default=None, help="processes (default: CPUs)")
    args = parser.parse_args(argv)
    prepare_cli.require_positive(args, ("num_workers",), most=1024)
    if args.mini:
        prepare_mini(args.out_dir)
    elif args.coco_dir:
        prepare_coco(args.coco_dir, args.out_dir, num_workers=args.num_workers)
    else:
        raise UserError("give --coco_dir or --mini")
    return 0


if __name__ == "__main__":
    prepare_cli.module_main(main)
