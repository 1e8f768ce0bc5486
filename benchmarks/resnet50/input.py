"""Provides the ResNet-50 input: ImageNet TFRecords (and synthetic batches) to per-replica batches.

Records use the keys of the TPU tools' `imagenet_to_gcs.py` (what `prepare.py` writes):
`image/encoded` (JPEG bytes), `image/class/label` (int64, 1..1000 for ImageNet; see
`DataConfig.label_offset`) and optional `image/object/bbox/{ymin,xmin,ymax,xmax}` (floats in
[0, 1]). Examples come out as `{"image": float32 [size, size, 3], "label": int32 []}`.
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks.resnet50.config import ResNet50Config
from mlperf_tf.data import (
    eval_pipeline,
    image_ops,
    list_files,
    synthetic,
    synthetic_dataset,
    training_pipeline,
)

_BBOX_KEYS = ("ymin", "xmin", "ymax", "xmax")  # the order sample_distorted_bounding_box wants


def parse_record(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """Parses one ImageNet TFRecord.

    Returns:
      {"image/encoded": string [], "label": int64 [] (as stored), "bbox": float32
      [1, num_boxes, 4] boxes as [ymin, xmin, ymax, xmax]}.
    """
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }
    for key in _BBOX_KEYS:
        features[f"image/object/bbox/{key}"] = tf.io.VarLenFeature(tf.float32)
    parsed = tf.io.parse_single_example(serialized, features)
    coords = [tf.sparse.to_dense(parsed[f"image/object/bbox/{key}"]) for key in _BBOX_KEYS]
    bbox = tf.stack(coords, axis=-1)[tf.newaxis]  # [1, num_boxes, 4]
    return {
        "image/encoded": parsed["image/encoded"],
        "label": parsed["image/class/label"],
        "bbox": bbox,
    }


def _label(config: ResNet50Config, stored: tf.Tensor) -> tf.Tensor:
    """The 0-based class of a stored label; fails (a bad record) when out of range."""
    label = tf.cast(stored, tf.int32) - config.data.label_offset
    num_classes = config.model.num_classes
    check = tf.debugging.assert_less(
        label,
        num_classes,
        message=f"label - label_offset ({config.data.label_offset}) must be < {num_classes}",
    )
    check_low = tf.debugging.assert_non_negative(
        label, message=f"label - label_offset ({config.data.label_offset}) must be >= 0"
    )
    with tf.control_dependencies([check, check_low]):
        return tf.identity(label)


def make_train_transform(config: ResNet50Config, *, seed: int | None = None):
    """Returns example -> {"image", "label"}: distorted-bounding-box crop (fused with the JPEG
    decode), resize to `image_size`, random flip, normalize (the MLPerf ResNet training
    preprocessing)."""
    data = config.data

    def transform(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        image = image_ops.decode_and_random_crop(
            example["image/encoded"],
            example["bbox"],
            seed=seed,
            area_range=data.area_range,
            aspect_ratio_range=data.aspect_ratio_range,
            min_object_covered=data.min_object_covered,
            max_attempts=data.crop_max_attempts,
            image_size=data.image_size,
            crop_padding=data.crop_padding,
        )  # float32 [size, size, 3] in [0, 255]
        if data.random_flip:
            image = image_ops.random_flip(image, seed=seed)
        image = image_ops.normalize(image, data.mean_rgb, data.stddev_rgb)
        image = tf.ensure_shape(image, [data.image_size, data.image_size, 3])
        return {"image": image, "label": _label(config, example["label"])}

    return transform


def make_eval_transform(config: ResNet50Config):
    """Returns example -> {"image", "label"}: center crop (224 of 256 at the defaults), resize,
    normalize."""
    data = config.data

    def transform(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        image = image_ops.decode_and_center_crop(
            example["image/encoded"], image_size=data.image_size, crop_padding=data.crop_padding
        )
        image = image_ops.normalize(image, data.mean_rgb, data.stddev_rgb)
        image = tf.ensure_shape(image, [data.image_size, data.image_size, 3])
        return {"image": image, "label": _label(config, example["label"])}

    return transform


def train_dataset(
    config: ResNet50Config,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    seed: int = 0,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Endless per-replica training batches from `config.data_dir` (files sharded per worker).

    Raises:
      DataError: the data folder is missing or holds no file matching `data.train_pattern`.
    """
    files = list_files(
        tf.io.gfile.join(config.data_dir, config.data.train_pattern), what="ImageNet train"
    )
    return training_pipeline(
        files,
        input_context=input_context,
        parse_fn=parse_record,
        transform_fn=make_train_transform(config, seed=seed),
        batch_size=batch_size,
        shuffle_buffer=config.data.shuffle_buffer,
        seed=seed,
        cache=config.data.cache_train,
        skip_bad_records=skip_bad_records,
    )


def eval_dataset(
    config: ResNet50Config,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    num_batches: int,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Exactly `num_batches` per-replica eval batches of this pipeline's shard of the whole eval
    set, padded, with a float32 "valid" key (0 for padding).

    Raises:
      DataError: the data folder is missing or holds no file matching `data.eval_pattern`.
    """
    files = list_files(
        tf.io.gfile.join(config.data_dir, config.data.eval_pattern), what="ImageNet validation"
    )
    return eval_pipeline(
        files,
        input_context=input_context,
        parse_fn=parse_record,
        transform_fn=make_eval_transform(config),
        batch_size=batch_size,
        num_batches=num_batches,
        skip_bad_records=skip_bad_records,
    )


def _synthetic_example_fn(config: ResNet50Config):
    size = config.data.image_size
    specs = {
        "image": tf.TensorSpec([size, size, 3], tf.float32),
        "label": tf.TensorSpec([], tf.int32),
    }
    return lambda seed: synthetic.random_example(specs, seed, maxval=config.model.num_classes)


def synthetic_train_dataset(
    config: ResNet50Config, *, batch_size: int, seed: int = 0
) -> tf.data.Dataset:
    """An endless repeat of one random batch of the real shapes (no input cost)."""
    return synthetic_dataset(_synthetic_example_fn(config), batch_size=batch_size, seed=seed)


def synthetic_eval_dataset(
    config: ResNet50Config, *, batch_size: int, num_batches: int, seed: int = 0
) -> tf.data.Dataset:
    """`eval_examples` random examples (the rest of `num_batches` batches is padding)."""
    return synthetic.synthetic_eval_dataset(
        _synthetic_example_fn(config),
        count=config.eval_examples,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed + 1_000_000,
    )
