"""Tests of mlperf_tf.data.image_ops, each op both eagerly and inside Dataset.map."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.data import image_ops
from tests.mlperf_tf.data import helpers

HEIGHT, WIDTH = 96, 128


@pytest.fixture(scope="module")
def image():
    """(uint8 pixels as decoded by TF, JPEG bytes) of one photo-like image."""
    encoded = helpers.jpeg(helpers.photo(np.random.default_rng(1), HEIGHT, WIDTH), quality=95)
    return tf.io.decode_jpeg(encoded, channels=3).numpy(), encoded


def _eager_and_mapped(fn, *args):
    """fn(*args) run eagerly and inside Dataset.map (which traces it into a graph)."""
    eager = fn(*args)
    mapped = next(iter(tf.data.Dataset.from_tensors(args).map(fn)))
    return tf.nest.map_structure(lambda t: t.numpy(), (eager, mapped))


def _window(seed, **kwargs):
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        [HEIGHT, WIDTH, 3],
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
        **kwargs,
    )
    return begin.numpy(), size.numpy()


def test_random_crop_decodes_the_sampled_window(image):
    pixels, encoded = image
    seed = tf.constant([3, 4], tf.int64)
    eager, mapped = _eager_and_mapped(
        lambda b, s: image_ops.decode_and_random_crop(b, None, seed=s), encoded, seed
    )
    np.testing.assert_array_equal(eager, mapped)
    (y, x, _), (h, w, _) = _window(seed)
    assert eager.dtype == np.uint8 and eager.shape == (h, w, 3)
    assert (h, w) != (HEIGHT, WIDTH)
    # The fused op decodes the same pixels as a full decode (chroma upsampling may differ by
    # a level or two at the window's edges).
    diff = np.abs(eager.astype(int) - pixels[y : y + h, x : x + w].astype(int))
    assert diff.mean() < 0.5 and diff.max() <= 8


def test_random_crop_varies_with_seed_and_respects_area_range(image):
    _, encoded = image
    shapes = set()
    for i in range(12):
        crop = image_ops.decode_and_random_crop(
            encoded, None, seed=tf.constant([i, 0]), area_range=(0.25, 0.5)
        )
        area = crop.shape[0] * crop.shape[1] / (HEIGHT * WIDTH)
        assert 0.2 < area < 0.55, (crop.shape, area)
        shapes.add(tuple(crop.shape))
    assert len(shapes) > 3


def test_random_crop_resized_and_reduced_decode_close_to_full_decode(image):
    """image_size set: float32 [s, s, 3]; libjpeg's 1/2..1/8 decoding changes only the
    downscaling filter, so the result stays close to full decoding + bilinear resize."""
    _, encoded = image
    diffs = []
    for i in range(6):
        seed = tf.constant([i, 7])
        reduced, mapped = _eager_and_mapped(
            lambda b, s: image_ops.decode_and_random_crop(b, None, seed=s, image_size=16),
            encoded,
            seed,
        )
        full = image_ops.decode_and_random_crop(
            encoded, None, seed=seed, image_size=16, reduced_decode=False
        ).numpy()
        np.testing.assert_allclose(reduced, mapped, atol=1e-3)
        assert reduced.shape == (16, 16, 3) and reduced.dtype == np.float32
        assert 0 <= reduced.min() and reduced.max() <= 255
        diffs.append(np.abs(reduced - full).mean())
    assert np.mean(diffs) < 8.0, diffs  # pixel levels out of 255
    assert max(diffs) > 0  # some crops were decoded at a reduced scale


def test_random_crop_falls_back_to_center_crop(image):
    """An impossible aspect ratio makes sampling fail; the MLPerf reference then center-crops."""
    _, encoded = image
    crop = image_ops.decode_and_random_crop(
        encoded,
        None,
        seed=tf.constant([0, 0]),
        area_range=(0.95, 1.0),
        aspect_ratio_range=(4.0, 5.0),
        image_size=24,
    )
    center = image_ops.decode_and_center_crop(encoded, image_size=24)
    np.testing.assert_allclose(crop.numpy(), center.numpy(), atol=1e-4)


def test_random_crop_with_int_seed_and_bbox(image):
    _, encoded = image
    bbox = tf.constant([[[0.5, 0.5, 1.0, 1.0]]])  # the lower-right quarter
    eager, mapped = _eager_and_mapped(
        lambda b: image_ops.decode_and_random_crop(
            b, bbox, seed=5, min_object_covered=1.0, area_range=(0.2, 1.0)
        ),
        encoded,
    )
    for crop in (eager, mapped):
        # the crop covers the whole quarter box: at least half of each side
        assert crop.shape[0] >= HEIGHT // 2 and crop.shape[1] >= WIDTH // 2


def test_center_crop_matches_reference_formula(image):
    """Window = int(s / (s + pad) * min(h, w)) square, offsets ((h - side) + 1) // 2 (the
    MLPerf/TPU reference), then a bilinear resize."""
    pixels, encoded = image
    eager, mapped = _eager_and_mapped(
        lambda b: image_ops.decode_and_center_crop(b, image_size=32, crop_padding=32), encoded
    )
    np.testing.assert_allclose(eager, mapped, atol=1e-4)
    side = int(32 / 64 * min(HEIGHT, WIDTH))
    y, x = (HEIGHT - side + 1) // 2, (WIDTH - side + 1) // 2
    expected = tf.image.resize(pixels[y : y + side, x : x + side], [32, 32]).numpy()
    assert eager.shape == (32, 32, 3) and eager.dtype == np.float32
    assert np.abs(eager - expected).mean() < 0.5


def test_center_crop_reduced_decode_option(image):
    _, encoded = image
    full = image_ops.decode_and_center_crop(encoded, image_size=8).numpy()
    reduced = image_ops.decode_and_center_crop(encoded, image_size=8, reduced_decode=True).numpy()
    assert np.abs(full - reduced).mean() < 8.0 and not np.array_equal(full, reduced)


def test_random_flip_stateless_and_stateful(image):
    pixels, _ = image
    outcomes = set()
    for i in range(8):
        eager, mapped = _eager_and_mapped(
            lambda p, s: image_ops.random_flip(p, s), pixels, tf.constant([i, 1])
        )
        np.testing.assert_array_equal(eager, mapped)
        if np.array_equal(eager, pixels):
            outcomes.add("same")
        else:
            np.testing.assert_array_equal(eager, pixels[:, ::-1])
            outcomes.add("flipped")
    assert outcomes == {"same", "flipped"}
    stateful = [image_ops.random_flip(pixels, seed=3).numpy() for _ in range(2)]
    for out in stateful:
        assert np.array_equal(out, pixels) or np.array_equal(out, pixels[:, ::-1])


@pytest.mark.bfloat16
def test_normalize_values_and_dtype(image):
    pixels, _ = image
    eager, mapped = _eager_and_mapped(image_ops.normalize, pixels)
    np.testing.assert_allclose(eager, mapped, rtol=1e-6)
    expected = (pixels.astype(np.float32) - np.array(image_ops.IMAGENET_MEAN_RGB)) / np.array(
        image_ops.IMAGENET_STDDEV_RGB
    )
    np.testing.assert_allclose(eager, expected, rtol=1e-5, atol=1e-5)
    # Unknown height/width (the broadcast path) gives the same values as the tiled path.
    dynamic = tf.function(
        image_ops.normalize, input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)]
    )
    np.testing.assert_allclose(dynamic(pixels).numpy(), eager, rtol=1e-6, atol=1e-6)
    batch = image_ops.normalize(np.stack([pixels, pixels]))  # [batch, h, w, c]
    np.testing.assert_allclose(batch.numpy()[1], eager, rtol=1e-6, atol=1e-6)
    half = image_ops.normalize(pixels, [127.5] * 3, [127.5] * 3, dtype=tf.bfloat16)
    assert half.dtype == tf.bfloat16
    np.testing.assert_allclose(half.numpy().astype(np.float32), pixels / 127.5 - 1, atol=1e-2)


def test_resize(image):
    pixels, _ = image
    eager, mapped = _eager_and_mapped(lambda p: image_ops.resize(p, (10, 20)), pixels)
    assert eager.shape == (10, 20, 3)
    np.testing.assert_allclose(eager, mapped, atol=1e-4)


def test_argument_validation(image):
    _, encoded = image
    with pytest.raises(ValueError, match="area_range"):
        image_ops.decode_and_random_crop(encoded, None, area_range=(0.5, 1.5))
    with pytest.raises(ValueError, match="aspect_ratio_range"):
        image_ops.decode_and_random_crop(encoded, None, aspect_ratio_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="method"):
        image_ops.decode_and_center_crop(encoded, image_size=8, method="cubic")
    with pytest.raises(ValueError, match=r"`image_size` \(0\)"):
        image_ops.decode_and_center_crop(encoded, image_size=0)
    with pytest.raises(ValueError, match="stddev"):
        image_ops.normalize(tf.zeros([2, 2, 3]), [0.0] * 3, [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="one length"):
        image_ops.normalize(tf.zeros([2, 2, 3]), [0.0] * 3, [1.0, 1.0])


def test_undecodable_bytes_raise_in_both_modes():
    with pytest.raises(tf.errors.InvalidArgumentError):
        image_ops.decode_and_center_crop(tf.constant(b"not a jpeg"), image_size=8)
    dataset = tf.data.Dataset.from_tensors(tf.constant(b"not a jpeg")).map(
        lambda b: image_ops.decode_and_random_crop(b, None, seed=tf.constant([0, 0]))
    )
    with pytest.raises(tf.errors.InvalidArgumentError):
        list(dataset)


def test_random_crop_of_decoded_image_matches_fused_decode(image):
    """random_crop on decoded pixels picks the same window as decode_and_random_crop."""
    pixels, encoded = image
    for i in range(4):
        seed = tf.constant([i, 9])
        eager, mapped = _eager_and_mapped(
            lambda p, s: image_ops.random_crop(p, None, seed=s), pixels, seed
        )
        np.testing.assert_array_equal(eager, mapped)
        fused = image_ops.decode_and_random_crop(encoded, None, seed=seed).numpy()
        assert eager.shape == fused.shape and eager.dtype == np.uint8
        assert np.abs(eager.astype(int) - fused.astype(int)).mean() < 0.5
        resized = image_ops.random_crop(pixels, None, seed=seed, image_size=20)
        fused_resized = image_ops.decode_and_random_crop(
            encoded, None, seed=seed, image_size=20, reduced_decode=False
        )
        assert resized.shape == (20, 20, 3)
        np.testing.assert_allclose(resized.numpy(), fused_resized.numpy(), atol=8)


def test_center_crop_of_decoded_image_matches_fused_decode(image):
    pixels, encoded = image
    eager, mapped = _eager_and_mapped(lambda p: image_ops.center_crop(p, image_size=24), pixels)
    np.testing.assert_allclose(eager, mapped, atol=1e-4)
    fused = image_ops.decode_and_center_crop(encoded, image_size=24).numpy()
    assert np.abs(eager - fused).mean() < 0.5


def test_flip_before_resize_equals_flip_after(image):
    """flip=True flips the uint8 crop before resizing; the bilinear resize is mirror-symmetric,
    so each output is the unflipped crop or its mirror image; both occur over seeds."""
    pixels, encoded = image
    outcomes = set()
    for i in range(8):
        seed = tf.constant([i, 3])
        plain = image_ops.random_crop(pixels, None, seed=seed, image_size=20).numpy()
        eager, mapped = _eager_and_mapped(
            lambda p, s: image_ops.random_crop(p, None, seed=s, image_size=20, flip=True),
            pixels,
            seed,
        )
        np.testing.assert_array_equal(eager, mapped)
        if np.allclose(eager, plain, atol=1e-3):
            outcomes.add("same")
        else:
            np.testing.assert_allclose(eager, plain[:, ::-1], atol=1e-3)
            outcomes.add("flipped")
        fused = image_ops.decode_and_random_crop(
            encoded, None, seed=seed, image_size=20, flip=True, reduced_decode=False
        ).numpy()
        np.testing.assert_allclose(fused, eager, atol=8)  # same window, same flip
    assert outcomes == {"same", "flipped"}
