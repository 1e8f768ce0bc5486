"""Tiny TFRecord data sets for the data tests: integer records and small JPEG images."""

import numpy as np
import tensorflow as tf

from mlperf_tf.data import tfrecord

INT_SPEC = {"x": tf.io.FixedLenFeature([], tf.int64)}
IMAGE_SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def parse_int(record):
    return tf.io.parse_single_example(record, INT_SPEC)


def parse_image(record):
    return tf.io.parse_single_example(record, IMAGE_SPEC)


def write_ints(out_dir, count, num_shards, prefix="train"):
    """Records {x: i} for i in range(count), round-robin over `num_shards` files."""
    examples = (tfrecord.make_example({"x": i}) for i in range(count))
    return tfrecord.write_sharded(examples, str(out_dir), prefix=prefix, num_shards=num_shards)


def photo(rng, height, width):
    """A smooth, photo-like uint8 image (gradients plus a few blobs), so JPEG behaves as on photos."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 180.0
    for _ in range(3):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        radius = rng.uniform(0.1, 0.4) * min(height, width)
        blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * radius**2))
        image += blob[..., None] * rng.uniform(-60, 60, size=3)
    return np.clip(image, 0, 255).astype(np.uint8)


def jpeg(image, quality=90):
    return tf.io.encode_jpeg(image, quality=quality).numpy()


def write_images(out_dir, count, num_shards, *, size=(48, 64), bad=(), prefix="train", seed=0):
    """ImageNet-format records (encoded JPEG + label i); indices in `bad` get undecodable bytes."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(count):
        encoded = b"not a jpeg" if i in bad else jpeg(photo(rng, *size))
        examples.append(tfrecord.make_example({"image/encoded": encoded, "image/class/label": i}))
    return tfrecord.write_sharded(examples, str(out_dir), prefix=prefix, num_shards=num_shards)


def corrupt(path, offset_fraction=0.5):
    """Flips a byte in the middle of a TFRecord file (a record's payload: its CRC fails)."""
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * offset_fraction)] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
