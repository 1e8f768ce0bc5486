"""Provides image ops for ImageNet-style pipelines: fused decode-and-crop, flips, normalization.

Every op works on one example (no batch dimension) and runs both eagerly and inside
`tf.data.Dataset.map`. Random ops take either an int op-level `seed` (stateful random ops; None
for a random seed) or a shape-[2] integer tensor (stateless random ops, reproducible per element,
e.g. from `tf.random.experimental.stateless_split`).

Speed: `decode_and_random_crop` decodes only the crop window of the JPEG
(`tf.io.decode_and_crop_jpeg`), and, when `image_size` is given and the window is at least twice
the output size on both sides, lets libjpeg downscale it by 2, 4 or 8 during decoding (the IDCT
computes fewer pixels). The crop window is the same; only the downscaling filter differs (libjpeg's
scaled IDCT instead of part of the bilinear resize), see README.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

# ImageNet channel means and standard deviations in pixel units [0, 255] (the MLPerf reference).
IMAGENET_MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Resize methods accepted by `image_size` arguments (tf.image.ResizeMethod names).
_METHODS = (
    "bilinear",
    "bicubic",
    "area",
    "nearest",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)
# Largest [h, w, c] for which `normalize` uses tiled constants (16 MB of float32 each).
_MAX_TILED_ELEMENTS = 1 << 22
# libjpeg scales the IDCT output by 1/1, 1/2, 1/4 or 1/8.
_JPEG_RATIOS = (8, 4, 2)


def _is_stateless_seed(seed) -> bool:
    return seed is not None and not isinstance(seed, int)


def _check_range(name: str, value: Sequence[float]) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    if not 0 < low <= high:
        raise ValueError(f"`{name}` ({tuple(value)}) must be (low, high) with 0 < low <= high.")
    return low, high


def _check_method(method: str) -> str:
    if method not in _METHODS:
        raise ValueError(f"`method` ({method!r}) must be one of {_METHODS}.")
    return method


def decode_and_random_crop(
    image_bytes: tf.Tensor,
    bbox: tf.Tensor | None = None,
    *,
    seed: int | tf.Tensor | None = None,
    area_range: Sequence[float] = (0.08, 1.0),
    aspect_ratio_range: Sequence[float] = (3 / 4, 4 / 3),
    min_object_covered: float = 0.1,
    max_attempts: int = 10,
    image_size: int | None = None,
    crop_padding: int = 32,
    reduced_decode: bool = True,
    flip: bool = False,
    method: str = "bilinear",
) -> tf.Tensor:
    """Decodes a random crop of a JPEG, the Inception/MLPerf ResNet "distorted bounding box" crop.

    Samples a window with `tf.image.sample_distorted_bounding_box` (area fraction in
    `area_range`, aspect ratio in `aspect_ratio_range`, covering `min_object_covered` of a box
    in `bbox`) and decodes only that window. When sampling fails (`max_attempts` tries, which
    the op reports by returning the whole image), it falls back to the center crop of
    `decode_and_center_crop`, like the MLPerf reference.

    Args:
      image_bytes: scalar string tensor, a JPEG (other formats are not supported by the fused op).
      bbox: float32 `[1, num_boxes, 4]` boxes `[ymin, xmin, ymax, xmax]` in [0, 1], or None for
        the whole image.
      seed: int op-level seed, None, or a shape-[2] int tensor for the stateless op.
      area_range: (min, max) fraction of the image area the crop covers.
      aspect_ratio_range: (min, max) width / height of the crop.
      min_object_covered: fraction of a `bbox` box the crop must contain.
      max_attempts: tries before falling back to the center crop.
      image_size: if set, resize the crop to `[image_size, image_size]` (float32 output) and allow
        reduced-resolution decoding; if None, return the uint8 crop at full resolution.
      crop_padding: the fallback center crop keeps `image_size / (image_size + crop_padding)` of
        the shorter side (pixels; only used when `image_size` is set).
      reduced_decode: let libjpeg decode at 1/2, 1/4 or 1/8 resolution when the crop is still at
        least `image_size` on both sides at that scale.
      flip: also flip left-right with probability 1/2 (see `random_flip`), on the uint8 crop
        before resizing: cheaper than flipping the float output, and the same image, since the
        resize is mirror-symmetric.
      method: resize method (a `tf.image.ResizeMethod` name).

    Returns:
      uint8 `[h, w, 3]` when `image_size` is None, else float32 `[image_size, image_size, 3]`
      with values in [0, 255].

    Raises:
      ValueError: an argument is out of range.
      tf.errors.InvalidArgumentError: (when run) the bytes are not a decodable JPEG.
    """
    area_range = _check_range("area_range", area_range)
    aspect_ratio_range = _check_range("aspect_ratio_range", aspect_ratio_range)
    method = _check_method(method)
    shape = tf.io.extract_jpeg_shape(image_bytes)  # [height, width, channels], header only
    window = _sample_window(
        shape,
        bbox,
        seed=seed,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=max_attempts,
        fallback=(image_size, crop_padding) if image_size is not None else None,
    )
    if image_size is None:
        crop = tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
        return random_flip(crop, _flip_seed(seed)) if flip else crop
    crop = _decode_window(image_bytes, window, image_size if reduced_decode else None)
    if flip:
        crop = random_flip(crop, _flip_seed(seed))
    return tf.image.resize(crop, [image_size, image_size], method=method)


def random_crop(
    image: tf.Tensor,
    bbox: tf.Tensor | None = None,
    *,
    seed: int | tf.Tensor | None = None,
    area_range: Sequence[float] = (0.08, 1.0),
    aspect_ratio_range: Sequence[float] = (3 / 4, 4 / 3),
    min_object_covered: float = 0.1,
    max_attempts: int = 10,
    image_size: int | None = None,
    crop_padding: int = 32,
    flip: bool = False,
    method: str = "bilinear",
) -> tf.Tensor:
    """The crop of `decode_and_random_crop`, on an already decoded `[h, w, c]` image.

    For pipelines that cache decoded images (decoding is deterministic, so it may be cached;
    the crop is drawn anew every epoch). Same arguments, same fallback to the center crop, same
    window for the same stateless seed; returns `image`'s dtype when `image_size` is None, else
    float32 `[image_size, image_size, c]`.
    """
    area_range = _check_range("area_range", area_range)
    aspect_ratio_range = _check_range("aspect_ratio_range", aspect_ratio_range)
    method = _check_method(method)
    image = tf.convert_to_tensor(image)
    window = _sample_window(
        tf.shape(image),
        bbox,
        seed=seed,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=max_attempts,
        fallback=(image_size, crop_padding) if image_size is not None else None,
    )
    crop = image[window[0] : window[0] + window[2], window[1] : window[1] + window[3]]
    if flip:
        crop = random_flip(crop, _flip_seed(seed))
    if image_size is None:
        return crop
    return tf.image.resize(crop, [image_size, image_size], method=method)


def center_crop(image: tf.Tensor, *, image_size: int, crop_padding: int = 32, method="bilinear"):
    """The crop of `decode_and_center_crop`, on an already decoded `[h, w, c]` image (float32)."""
    if image_size <= 0:
        raise ValueError(f"`image_size` ({image_size}) must be positive.")
    image = tf.convert_to_tensor(image)
    window = _center_window(tf.shape(image), image_size, crop_padding)
    crop = image[window[0] : window[0] + window[2], window[1] : window[1] + window[3]]
    return tf.image.resize(crop, [image_size, image_size], method=_check_method(method))


def _sample_window(shape, bbox, *, seed, fallback, **sample_args) -> tf.Tensor:
    """[y, x, h, w] of a distorted-bounding-box crop of an image of `shape` ([h, w, c]).

    `fallback` = (image_size, crop_padding): when sampling fails (the op then returns the whole
    image), use the center crop window instead, like the MLPerf reference; None keeps the
    whole image.
    """
    if sample_args["area_range"][1] > 1.0:
        raise ValueError(f"`area_range` ({sample_args['area_range']}) must not exceed 1.0.")
    if sample_args["max_attempts"] <= 0:
        raise ValueError(f"`max_attempts` ({sample_args['max_attempts']}) must be positive.")
    if fallback is not None and fallback[0] <= 0:
        raise ValueError(f"`image_size` ({fallback[0]}) must be positive or None.")
    if bbox is None:
        bbox = tf.constant([[[0.0, 0.0, 1.0, 1.0]]], tf.float32)
    shape = tf.cast(shape, tf.int32)
    args = dict(bounding_boxes=bbox, use_image_if_no_bounding_boxes=True, **sample_args)
    if _is_stateless_seed(seed):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(shape, seed=seed, **args)
    else:
        begin, size, _ = tf.image.sample_distorted_bounding_box(shape, seed=seed, **args)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    if fallback is None:
        return window
    failed = tf.reduce_all(tf.equal(size[:2], shape[:2]))
    return tf.where(failed, _center_window(shape, *fallback), window)


def _flip_seed(seed):
    """The flip's seed: a stateless seed folded with 1 (independent of the crop's), else as is."""
    if _is_stateless_seed(seed):
        return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), 1)
    return seed


def _center_window(shape: tf.Tensor, image_size: int, crop_padding: int) -> tf.Tensor:
    """[y, x, h, w] of the square center crop keeping image_size/(image_size+padding) of the side."""
    height, width = shape[0], shape[1]
    fraction = image_size / (image_size + crop_padding)
    side = tf.cast(fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def _decode_window(image_bytes: tf.Tensor, window: tf.Tensor, min_side: int | None) -> tf.Tensor:
    """Decodes `window` ([y, x, h, w], full-size pixels) at the lowest resolution that keeps both
    sides >= `min_side` (libjpeg's 1/8..1/1 scaled IDCT); None means full resolution."""
    if min_side is None:
        return tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
    short = tf.minimum(window[2], window[3])
    branches = []
    for ratio in _JPEG_RATIOS:
        # libjpeg's crop window is in the scaled image's pixels; keep it inside that image.
        def decode(ratio=ratio):
            scaled = window // ratio
            return tf.io.decode_and_crop_jpeg(image_bytes, scaled, channels=3, ratio=ratio)

        branches.append((short >= min_side * ratio, decode))
    return tf.case(
        branches,
        default=lambda: tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3),
        exclusive=False,
    )


def decode_and_center_crop(
    image_bytes: tf.Tensor,
    *,
    image_size: int,
    crop_padding: int = 32,
    reduced_decode: bool = False,
    method: str = "bilinear",
) -> tf.Tensor:
    """Decodes the square center crop of a JPEG and resizes it: the ResNet eval preprocessing.

    The crop keeps `image_size / (image_size + crop_padding)` of the shorter side (224/256 =
    0.875 for the MLPerf defaults), decoded with the fused op.

    Args:
      image_bytes: scalar string tensor, a JPEG.
      image_size: output side in pixels.
      crop_padding: pixels of padding that define the crop fraction.
      reduced_decode: allow libjpeg's reduced-resolution decoding (off by default for eval, so the
        eval images match the reference exactly).
      method: resize method (a `tf.image.ResizeMethod` name).

    Returns:
      float32 `[image_size, image_size, 3]`, values in [0, 255].

    Raises:
      ValueError: `image_size` is not positive or `crop_padding` is negative.
    """
    if image_size <= 0:
        raise ValueError(f"`image_size` ({image_size}) must be positive.")
    if crop_padding < 0:
        raise ValueError(f"`crop_padding` ({crop_padding}) must not be negative.")
    method = _check_method(method)
    shape = tf.io.extract_jpeg_shape(image_bytes)
    window = _center_window(shape, image_size, crop_padding)
    crop = _decode_window(image_bytes, window, image_size if reduced_decode else None)
    return tf.image.resize(crop, [image_size, image_size], method=method)


def resize(image: tf.Tensor, image_size: int | Sequence[int], *, method: str = "bilinear"):
    """Resizes `[h, w, c]` to `image_size` (an int for a square, or (height, width)); float32."""
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    return tf.image.resize(image, list(image_size), method=_check_method(method))


def random_flip(image: tf.Tensor, seed: int | tf.Tensor | None = None) -> tf.Tensor:
    """Flips `[h, w, c]` left-right with probability 1/2.

    Args:
      image: `[h, w, c]` tensor of any dtype.
      seed: int op-level seed, None, or a shape-[2] int tensor (stateless).
    """
    if _is_stateless_seed(seed):
        return tf.image.stateless_random_flip_left_right(image, seed=seed)
    return tf.image.random_flip_left_right(image, seed=seed)


def normalize(
    image: tf.Tensor,
    mean: Sequence[float] = IMAGENET_MEAN_RGB,
    stddev: Sequence[float] = IMAGENET_STDDEV_RGB,
    *,
    dtype: tf.DType = tf.float32,
) -> tf.Tensor:
    """`(image - mean) / stddev` per channel, in `dtype`.

    Computed as one multiply-add, `image * (1 / stddev) + (-mean / stddev)`. When the last three
    dimensions are static (e.g. after a resize), the two per-channel vectors are tiled to
    `[h, w, c]` constants: broadcasting a 3-vector along the innermost axis is about 3x slower
    in TF's CPU kernels than a plain elementwise op (measured 0.6 vs 0.2 ms per 224 px image).

    Args:
      image: `[..., c]` image with values in [0, 255] (any numeric dtype).
      mean: per-channel means, in the image's units (pixel values).
      stddev: per-channel standard deviations, same units; all positive.
      dtype: output float dtype (e.g. tf.bfloat16 to halve the batch's memory traffic).

    Raises:
      ValueError: `mean` and `stddev` differ in length or a stddev is not positive.
    """
    mean = np.asarray(mean, np.float64)
    stddev = np.asarray(stddev, np.float64)
    if mean.shape != stddev.shape or mean.ndim != 1:
        raise ValueError(f"`mean` ({mean}) and `stddev` ({stddev}) must be vectors of one length.")
    if np.any(stddev <= 0):
        raise ValueError(f"`stddev` ({stddev}) must be positive.")
    scale = (1.0 / stddev).astype(np.float32)
    offset = (-mean / stddev).astype(np.float32)
    image = tf.cast(image, tf.float32)
    shape = image.shape
    if (
        shape.rank is not None
        and shape.rank >= 3
        and shape[-3:].is_fully_defined()
        and shape[-1] == len(scale)
        and shape[-3:].num_elements() <= _MAX_TILED_ELEMENTS
    ):
        height, width = shape[-3], shape[-2]
        scale = np.tile(scale, (height, width, 1))
        offset = np.tile(offset, (height, width, 1))
    return tf.cast(image * tf.constant(scale) + tf.constant(offset), dtype)
