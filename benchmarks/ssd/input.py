"""Provides the SSD input pipelines: COCO TFRecord parsing, SSD augmentation, synthetic data.

Training follows the MLPerf reference's `SSDTransformer`: SSD random crop with minimum-IoU
sampling (`SSDCropping`, `max_samples` trials per chosen IoU), horizontal flip, resize to the
model's input size, optional color jitter, then normalization with ImageNet's mean and stddev.
COCO category ids are mapped to contiguous classes 1..N (0 is background). Eval resizes the
whole image and keeps the COCO image id and original size for the COCO json of detections.

Records use the TF Object Detection API keys that `prepare.py` writes: `image/encoded`,
`image/height`, `image/width`, `image/source_id`, `image/object/bbox/{xmin,ymin,xmax,ymax}`
(normalized), `image/object/class/label` (COCO category id), `image/object/is_crowd`.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from benchmarks.ssd import anchors as anchors_lib
from benchmarks.ssd.config import SSDConfig
from mlperf_tf.data import image_ops, synthetic

# SSDCropping's sampling modes: keep the image, a crop whose IoU with every box is above one
# of these minima, or a crop with no IoU constraint (-inf).
CROP_MIN_IOUS = (0.1, 0.3, 0.5, 0.7, 0.9, -math.inf)
# Crop side range (fraction of the image) and aspect-ratio limits of SSDCropping.
CROP_MIN_SIDE = 0.3
CROP_MAX_ASPECT = 2.0
# The reference's ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05).
JITTER_BRIGHTNESS = 0.125
JITTER_CONTRAST = 0.5
JITTER_SATURATION = 0.5
JITTER_HUE = 0.05
# Bound on SSDCropping's "pick a mode until a crop works" loop; each round ends it with
# probability >= 1/7 (the keep-the-image mode), so this is never reached in practice.
_MAX_CROP_ROUNDS = 100

_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature((), tf.string),
    "image/height": tf.io.FixedLenFeature((), tf.int64),
    "image/width": tf.io.FixedLenFeature((), tf.int64),
    "image/source_id": tf.io.FixedLenFeature((), tf.string),
    "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
    "image/object/class/label": tf.io.VarLenFeature(tf.int64),
    "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
}


def parse_record(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """Parses one COCO detection record into dense tensors (boxes as `[n, 4]` corners)."""
    parsed = tf.io.parse_single_example(serialized, _FEATURES)
    dense = {
        k: tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v for k, v in parsed.items()
    }
    boxes = tf.stack(
        [
            dense["image/object/bbox/ymin"],
            dense["image/object/bbox/xmin"],
            dense["image/object/bbox/ymax"],
            dense["image/object/bbox/xmax"],
        ],
        axis=1,
    )
    labels = dense["image/object/class/label"]
    crowd = dense["image/object/is_crowd"]
    # Records may omit is_crowd (then no box is a crowd).
    crowd = tf.cond(
        tf.equal(tf.size(crowd), tf.size(labels)), lambda: crowd, lambda: tf.zeros_like(labels)
    )
    return {
        "encoded": dense["image/encoded"],
        "height": tf.cast(dense["image/height"], tf.int32),
        "width": tf.cast(dense["image/width"], tf.int32),
        "source_id": tf.strings.to_number(dense["image/source_id"], out_type=tf.int64),
        "boxes": boxes,
        "labels": labels,
        "is_crowd": crowd,
    }


def class_lookup(category_ids) -> tf.Tensor:
    """`[max_id + 1]` int32 table: COCO category id -> contiguous class (0 = not a class)."""
    table = np.zeros(max(category_ids) + 1, np.int32)
    for k, category in enumerate(category_ids):
        table[category] = k + 1
    return tf.constant(table)


def to_classes(labels: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
    """Maps category ids `[n]` to contiguous classes (ids outside the table -> 0)."""
    labels = tf.cast(labels, tf.int32)
    inside = tf.logical_and(labels >= 0, labels < tf.shape(table)[0])
    return tf.where(
        inside, tf.gather(table, tf.clip_by_value(labels, 0, tf.shape(table)[0] - 1)), 0
    )


def ssd_crop_window(
    boxes: tf.Tensor, *, max_samples: int, seed: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Chooses the reference's `SSDCropping` window for one image.

    Repeatedly draws one of 7 modes uniformly: keep the image, or a minimum IoU from
    `CROP_MIN_IOUS`; for an IoU mode it tries `max_samples` random windows (sides uniform in
    [0.3, 1] of the image, aspect ratio within [1/2, 2], position uniform) and takes the first
    whose IoU with every box exceeds the minimum and that contains the center of at least one
    box. A mode whose trials all fail draws a new mode.

    Args:
      boxes: `[n, 4]` normalized corners.
      max_samples: trials per drawn mode (MLPerf's `max_samples`: 1 or 50).
      seed: shape-[2] int stateless seed.

    Returns:
      (window `[4]` normalized `[top, left, bottom, right]`, keep `[n]` bool: boxes whose
      center lies inside the window).
    """
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    n = tf.shape(boxes)[0]
    min_ious = tf.constant(CROP_MIN_IOUS, tf.float32)
    centers = (boxes[:, :2] + boxes[:, 2:]) / 2  # [n, 2] (cy, cx)

    def body(round_index, done, window, keep):
        round_seed = tf.random.experimental.stateless_fold_in(seed, round_index)
        seeds = tf.random.experimental.stateless_split(round_seed, 4)
        mode = tf.random.stateless_uniform([], seeds[0], 0, len(CROP_MIN_IOUS) + 1, tf.int32)
        hw = tf.random.stateless_uniform([max_samples, 2], seeds[1], CROP_MIN_SIDE, 1.0)
        top_left = tf.random.stateless_uniform([max_samples, 2], seeds[2]) * (1.0 - hw)
        windows = tf.concat([top_left, top_left + hw], axis=1)  # [T, 4]
        ratio = hw[:, 1] / hw[:, 0]  # w / h
        ok_ratio = tf.logical_and(ratio >= 1.0 / CROP_MAX_ASPECT, ratio <= CROP_MAX_ASPECT)
        min_iou = min_ious[tf.maximum(mode - 1, 0)]
        ious = anchors_lib.pairwise_iou(windows, boxes)  # [T, n]
        ok_iou = tf.reduce_all(ious > min_iou, axis=1)
        inside = tf.logical_and(
            tf.reduce_all(centers[None] > windows[:, None, :2], axis=2),
            tf.reduce_all(centers[None] < windows[:, None, 2:], axis=2),
        )  # [T, n]
        ok = ok_ratio & ok_iou & tf.reduce_any(inside, axis=1)
        first = tf.argmax(tf.cast(ok, tf.int32), output_type=tf.int32)
        found = tf.reduce_any(ok)
        keep_image = tf.equal(mode, 0)
        new_window = tf.where(keep_image, tf.constant([0.0, 0.0, 1.0, 1.0]), windows[first])
        new_keep = tf.where(keep_image, tf.ones([n], tf.bool), inside[first])
        return round_index + 1, keep_image | found, new_window, new_keep

    _, done, window, keep = tf.while_loop(
        lambda i, done, w, k: tf.logical_not(done),
        body,
        (
            tf.constant(0),
            tf.constant(False),
            tf.constant([0.0, 0.0, 1.0, 1.0]),
            tf.ones([n], tf.bool),
        ),
        maximum_iterations=_MAX_CROP_ROUNDS,
    )
    full = tf.constant([0.0, 0.0, 1.0, 1.0])
    return tf.where(done, window, full), tf.where(done, keep, tf.ones([n], tf.bool))


def apply_crop(image, boxes, classes, window, keep):
    """Crops `image` `[h, w, c]` to `window` and moves the kept boxes into its frame."""
    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    top, left = tf.cast(window[0] * h, tf.int32), tf.cast(window[1] * w, tf.int32)
    bottom, right = tf.cast(window[2] * h, tf.int32), tf.cast(window[3] * w, tf.int32)
    image = image[top : tf.maximum(bottom, top + 1), left : tf.maximum(right, left + 1)]
    boxes = tf.boolean_mask(boxes, keep)
    classes = tf.boolean_mask(classes, keep)
    origin = tf.tile(window[:2], [2])
    size = tf.tile(window[2:] - window[:2], [2])
    boxes = (tf.clip_by_value(boxes, origin, tf.tile(window[2:], [2])) - origin) / size
    return image, boxes, classes


def flip_boxes(boxes: tf.Tensor) -> tf.Tensor:
    """Left-right flip of normalized corners `[n, 4]`."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=1)
    return tf.stack([ymin, 1.0 - xmax, ymax, 1.0 - xmin], axis=1)


def color_jitter(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """torchvision's ColorJitter(0.125, 0.5, 0.5, 0.05) on a float `[h, w, 3]` 0..255 image
    (fixed order: brightness, contrast, saturation, hue)."""
    seeds = tf.random.experimental.stateless_split(seed, 4)
    image = image / 255.0
    factor = tf.random.stateless_uniform([], seeds[0], 1 - JITTER_BRIGHTNESS, 1 + JITTER_BRIGHTNESS)
    image = tf.clip_by_value(image * factor, 0.0, 1.0)
    gray = tf.image.rgb_to_grayscale(image)  # [h, w, 1]
    factor = tf.random.stateless_uniform([], seeds[1], 1 - JITTER_CONTRAST, 1 + JITTER_CONTRAST)
    mean = tf.reduce_mean(gray)
    image = tf.clip_by_value((image - mean) * factor + mean, 0.0, 1.0)
    gray = tf.image.rgb_to_grayscale(image)
    factor = tf.random.stateless_uniform([], seeds[2], 1 - JITTER_SATURATION, 1 + JITTER_SATURATION)
    image = tf.clip_by_value((image - gray) * factor + gray, 0.0, 1.0)
    delta = tf.random.stateless_uniform([], seeds[3], -JITTER_HUE, JITTER_HUE)
    image = tf.image.adjust_hue(image, delta)
    return image * 255.0


def pad_boxes(boxes: tf.Tensor, classes: tf.Tensor, max_num_boxes: int):
    """Pads (or truncates) `[n, 4]` boxes and `[n]` classes to `max_num_boxes` (class 0 = pad)."""
    boxes = boxes[:max_num_boxes]
    classes = classes[:max_num_boxes]
    pad = max_num_boxes - tf.shape(classes)[0]
    boxes = tf.pad(boxes, [[0, pad], [0, 0]])
    classes = tf.pad(classes, [[0, pad]])
    return tf.ensure_shape(boxes, [max_num_boxes, 4]), tf.ensure_shape(classes, [max_num_boxes])


def decode_image(encoded: tf.Tensor) -> tf.Tensor:
    """JPEG or PNG bytes -> uint8 `[h, w, 3]`."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return tf.ensure_shape(image, [None, None, 3])


def train_transform(config: SSDConfig, example: dict, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """One training example: decode, SSD crop, flip, resize, jitter, normalize, pad boxes.

    Args:
      config: the benchmark config.
      example: `parse_record`'s output.
      seed: shape-[2] int stateless seed of this example's augmentation.

    Returns:
      `image` `[S, S, 3]` float32 normalized, `boxes` `[G, 4]` float32 corners, `classes`
      `[G]` int32 (0 = padding).
    """
    data = config.data
    size = config.model.image_size
    seeds = tf.random.experimental.stateless_split(seed, 3)
    image = decode_image(example["encoded"])
    boxes = tf.clip_by_value(example["boxes"], 0.0, 1.0)
    classes = to_classes(example["labels"], class_lookup(data.category_ids))
    keep = classes > 0
    keep &= (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    if data.drop_crowd:
        keep &= tf.equal(example["is_crowd"], 0)
    boxes, classes = tf.boolean_mask(boxes, keep), tf.boolean_mask(classes, keep)

    window, inside = ssd_crop_window(boxes, max_samples=data.max_samples, seed=seeds[0])
    image, boxes, classes = apply_crop(image, boxes, classes, window, inside)
    if data.random_flip:
        flip = tf.random.stateless_uniform([], seeds[1]) < 0.5
        image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
        boxes = tf.cond(flip, lambda: flip_boxes(boxes), lambda: boxes)
    image = tf.image.resize(image, [size, size])  # float32, 0..255
    if data.color_jitter:
        image = color_jitter(image, seeds[2])
    image = image_ops.normalize(image, data.mean_rgb, data.stddev_rgb)
    boxes, classes = pad_boxes(boxes, classes, config.loss.max_num_boxes)
    return {"image": image, "boxes": boxes, "classes": classes}


def eval_transform(config: SSDConfig, example: dict) -> dict[str, tf.Tensor]:
    """One eval example: the whole image resized and normalized, plus its COCO id and size."""
    size = config.model.image_size
    image = tf.image.resize(decode_image(example["encoded"]), [size, size])
    image = image_ops.normalize(image, config.data.mean_rgb, config.data.stddev_rgb)
    return {
        "image": tf.ensure_shape(image, [size, size, 3]),
        "source_id": example["source_id"],
        "height": example["height"],
        "width": example["width"],
    }


def synthetic_train_dataset(
    config: SSDConfig, *, batch_size: int, seed: int = 0
) -> tf.data.Dataset:
    """An endless repeat of one batch of `synthetic_example`s' training keys (no input cost);
    `Benchmark.synthetic_train_data` gives each batch shard its own seed."""
    keys = ("image", "boxes", "classes")
    return synthetic.synthetic_dataset(
        lambda index: {k: v for k, v in synthetic_example(config, index).items() if k in keys},
        batch_size=batch_size,
        seed=seed,
    )


def synthetic_example(config: SSDConfig, index: int) -> dict[str, np.ndarray]:
    """A deterministic random example `index`: noise image, 1-3 random boxes and classes.

    Returns the training keys (`image`, `boxes`, `classes`) plus `source_id`, `height` and
    `width` (the eval keys), in numpy.
    """
    rng = np.random.default_rng(index)
    size = config.model.image_size
    image = rng.standard_normal((size, size, 3)).astype(np.float32)
    count = int(rng.integers(1, 4))
    centers = rng.uniform(0.2, 0.8, (count, 2))
    sides = rng.uniform(0.1, 0.4, (count, 2))
    boxes = np.concatenate([centers - sides / 2, centers + sides / 2], 1).astype(np.float32)
    classes = rng.integers(1, config.model.num_classes, count).astype(np.int32)
    g = config.loss.max_num_boxes
    padded_boxes = np.zeros((g, 4), np.float32)
    padded_classes = np.zeros((g,), np.int32)
    padded_boxes[: min(count, g)] = boxes[:g]
    padded_classes[: min(count, g)] = classes[:g]
    return {
        "image": image,
        "boxes": padded_boxes,
        "classes": padded_classes,
        "source_id": np.int64(index + 1),
        "height": np.int32(size),
        "width": np.int32(size),
    }
