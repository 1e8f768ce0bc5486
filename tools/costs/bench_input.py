"""Measures the ResNet-50 input pipeline's speed as ratios measured side by side in one run.

Writes ImageNet-format TFRecords of photo-like JPEGs (about 400x350) into a temporary folder,
then prints:

(a) images/s of the ResNet-50 training preprocessing alone (random distorted-box crop, resize,
    flip, normalize, batch), naive (sequential map, no prefetch, full decode then crop) against
    this suite's pipelines: `fused` (training_pipeline: parallel, fused decode-and-crop with
    reduced-resolution decoding where the crop allows) and `cached` (training_pipeline with
    cache=True: images decoded once, the random crop drawn anew every epoch);
(b) images/s of a ResNet-50 train step (keras.applications.ResNet50, weights=None) fed by the
    fused pipeline against the same step fed by synthetic data, on the same cores (the pipeline
    competes with the model for the CPU).

Repetitions of every variant are interleaved and each ratio is the median over repetitions, so
the load of other processes on a shared host cancels out as far as possible.

    python tools/costs/bench_input.py                      # the README's numbers (15-40 minutes)
    python tools/costs/bench_input.py --skip_model --reps 2 --num_images 512   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from mlperf_tf.data import image_ops, pipeline, synthetic, tfrecord  # noqa: E402
from tools.harness import median_ratio  # noqa: E402

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
NUM_CLASSES = 1000


# ---- data ------------------------------------------------------------------------------------
def photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A photo-like uint8 image: smooth gradients, soft blobs and band-limited texture, so that
    JPEG size and decoding cost are close to a natural photo's (flat synthetic images decode
    much faster)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([x / width, y / height, (x + y) / (width + height)], -1)
    image = image * rng.uniform(100, 200, 3) + rng.uniform(0, 60, 3)
    for _ in range(8):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        radius = rng.uniform(0.05, 0.3) * min(height, width)
        blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * radius**2))
        image += blob[..., None] * rng.uniform(-90, 90, 3)
    coarse = rng.normal(0, 1, (height // 3 + 1, width // 3 + 1, 3)).astype(np.float32)
    coarse = np.repeat(np.repeat(coarse, 3, 0), 3, 1)[:height, :width]
    image += coarse * 14 + rng.normal(0, 5, (height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def write_data(out_dir: str, num_images: int, num_shards: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    sizes = []

    def examples():
        for _ in range(num_images):
            height, width = int(rng.integers(330, 371)), int(rng.integers(380, 421))
            encoded = tf.io.encode_jpeg(photo(rng, height, width), quality=90).numpy()
            sizes.append(len(encoded))
            yield tfrecord.make_example(
                {
                    "image/encoded": encoded,
                    "image/format": "JPEG",
                    "image/height": height,
                    "image/width": width,
                    "image/class/label": int(rng.integers(NUM_CLASSES)),
                }
            )

    files = tfrecord.write_sharded(examples(), out_dir, prefix="train", num_shards=num_shards)
    print(
        f"wrote {num_images} JPEGs in {num_shards} TFRecord files, {np.mean(sizes) / 1024:.0f} KB each"
    )
    return files


# ---- the three input pipelines ---------------------------------------------------------------
def naive_dataset(files, *, batch_size: int, image_size: int) -> tf.data.Dataset:
    """What a first version looks like: one reader, a sequential map, no prefetch, the whole JPEG
    decoded before cropping. (tf.data's own map parallelization and injected prefetch are
    turned off, as they would otherwise make the baseline parallel behind one's back.)"""

    def preprocess(record):
        example = tf.io.parse_single_example(record, FEATURES)
        image = tf.io.decode_jpeg(example["image/encoded"], channels=3)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.slice(image, begin, size)
        image = tf.image.resize(image, [image_size, image_size])
        image = tf.image.random_flip_left_right(image)
        image = (image - image_ops.IMAGENET_MEAN_RGB) / image_ops.IMAGENET_STDDEV_RGB
        return {"image": image, "label": example["image/class/label"]}

    dataset = tf.data.TFRecordDataset(files).shuffle(1000).repeat().map(preprocess)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.parallel_batch = False
    return dataset.batch(batch_size, drop_remainder=True).with_options(options)


def parse(record):
    return tf.io.parse_single_example(record, FEATURES)


def fused_dataset(files, *, batch_size: int, image_size: int) -> tf.data.Dataset:
    def transform(example):
        image = image_ops.decode_and_random_crop(
            example["image/encoded"], None, image_size=image_size, flip=True
        )
        image = image_ops.normalize(image)
        return {"image": image, "label": example["image/class/label"]}

    return pipeline.training_pipeline(
        files, input_context=None, parse_fn=parse, transform_fn=transform, batch_size=batch_size
    )


def cached_dataset(files, *, batch_size: int, image_size: int) -> tf.data.Dataset:
    def parse_and_decode(record):
        example = parse(record)
        image = tf.io.decode_jpeg(example["image/encoded"], channels=3)
        return {"image": image, "label": example["image/class/label"]}

    def transform(example):
        image = image_ops.random_crop(example["image"], None, image_size=image_size, flip=True)
        image = image_ops.normalize(image)
        return {"image": image, "label": example["label"]}

    return pipeline.training_pipeline(
        files,
        input_context=None,
        parse_fn=parse_and_decode,
        transform_fn=transform,
        batch_size=batch_size,
        cache=True,
    )


def reduced_decode_share(image_size: int, shape=(350, 400), samples: int = 4000) -> float:
    """Share of the random crops of a `shape` image that libjpeg decodes at 1/2 scale or less."""
    count = 0
    for i in range(samples):
        _, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            [*shape, 3],
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=[i, 0],
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        count += int(min(size[0], size[1]) >= 2 * image_size)
    return count / samples


# ---- measurements ----------------------------------------------------------------------------
def images_per_second(iterator, *, batches: int, skip: int, batch_size: int):
    """(images/s, CPU ms per image) over `batches` batches, after `skip` unmeasured batches.

    The CPU time is this process's (all threads): the work per image, which other processes'
    load does not change much, unlike the wall-clock rate.
    """
    for _ in range(skip):
        next(iterator)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    images = batches * batch_size
    return images / (time.perf_counter() - start), 1e3 * (time.process_time() - cpu) / images


def bench_pipelines(files, args) -> dict:
    builders = {"naive": naive_dataset, "fused": fused_dataset, "cached": cached_dataset}
    datasets = {
        name: build(files, batch_size=args.batch_size, image_size=args.image_size)
        for name, build in builders.items()
    }
    # The cached pipeline's first epoch decodes every image once and fills the cache, which
    # later iterators of the same dataset reuse.
    start = time.perf_counter()
    iterator = iter(datasets["cached"])
    for _ in range(args.num_images // args.batch_size + 1):
        next(iterator)
    del iterator
    print(f"  filled the cache of decoded images in {time.perf_counter() - start:.1f}s")
    rates = {name: [] for name in builders}
    cpu_ms = {name: [] for name in builders}
    for rep in range(args.reps):
        for name, dataset in datasets.items():
            # A fresh iterator per window: an idle iterator keeps filling its buffers in the
            # background, which would slow down the others and inflate its own next window.
            iterator = iter(dataset)
            rate, cpu = images_per_second(
                iterator, batches=args.batches, skip=2, batch_size=args.batch_size
            )
            del iterator
            rates[name].append(rate)
            cpu_ms[name].append(cpu)
            print(
                f"  rep {rep} {name:6s} {rate:7.1f} images/s  {cpu:5.2f} CPU ms/image "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return rates, cpu_ms


def build_train_step(image_size: int):
    import keras

    model = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=NUM_CLASSES
    )
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(batch):
        with tf.GradientTape() as tape:
            predictions = model(batch["image"], training=True)
            loss = loss_fn(batch["label"], predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step


def bench_model(files, args) -> dict:
    size, batch = args.image_size, args.model_batch_size
    train_step = build_train_step(size)
    example = {
        "image": tf.random.stateless_normal([size, size, 3], [0, 1]),
        "label": tf.constant(7, tf.int64),
    }
    feeds = {
        "synthetic": synthetic.synthetic_dataset(example, batch_size=batch),
        "pipeline": fused_dataset(files, batch_size=batch, image_size=size),
    }
    for dataset in feeds.values():  # trace and warm up with each feed
        train_step(next(iter(dataset)))
    rates = {name: [] for name in feeds}
    cpu_ms = {name: [] for name in feeds}
    for rep in range(args.model_reps):
        for name, dataset in feeds.items():
            # A fresh iterator per window (see bench_pipelines), so that the pipeline does no
            # work during the synthetic window; one unmeasured step covers its start-up.
            iterator = iter(dataset)
            train_step(next(iterator))
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.model_steps):
                loss = train_step(next(iterator))
            float(loss)  # wait for the last step
            images = args.model_steps * batch
            rates[name].append(images / (time.perf_counter() - start))
            cpu_ms[name].append(1e3 * (time.process_time() - cpu) / images)
            del iterator
            print(
                f"  rep {rep} train step fed by {name:9s} {rates[name][-1]:6.2f} images/s "
                f"{cpu_ms[name][-1]:7.1f} CPU ms/image (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return rates, cpu_ms


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_images", type=int, default=2048)
    parser.add_argument("--num_shards", type=int, default=16)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=32, help="pipeline-only batch")
    parser.add_argument("--batches", type=int, default=16, help="measured batches per window")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--model_batch_size", type=int, default=8)
    parser.add_argument("--model_steps", type=int, default=4)
    parser.add_argument("--model_reps", type=int, default=7)
    parser.add_argument("--skip_model", action="store_true")
    parser.add_argument("--data_dir", default="", help="reuse/keep the TFRecords here")
    args = parser.parse_args(argv)
    print(
        f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; TF {tf.__version__}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or tmp
        files = sorted(tf.io.gfile.glob(os.path.join(data_dir, "train-*")))
        if len(files) != args.num_shards:
            files = write_data(data_dir, args.num_images, args.num_shards)
        results = {"args": vars(args)}
        for size in sorted({args.image_size, 128}):
            share = reduced_decode_share(size)
            results[f"reduced_decode_share_{size}"] = share
            print(f"random crops decoded at reduced resolution at {size} px: {share:.1%}")

        print("(a) input pipeline alone:")
        rates, cpu_ms = bench_pipelines(files, args)
        results["pipeline_images_per_s"] = rates
        results["pipeline_cpu_ms_per_image"] = cpu_ms
        for name in ("fused", "cached"):
            ratio = median_ratio(rates[name], rates["naive"])
            best = max(rates[name]) / max(rates["naive"])
            work = statistics.median(cpu_ms["naive"]) / statistics.median(cpu_ms[name])
            results[f"ratio_{name}_vs_naive"] = ratio
            results[f"best_ratio_{name}_vs_naive"] = best
            results[f"cpu_work_ratio_naive_vs_{name}"] = work
            print(
                f"(a) {name} / naive images/s: median of per-rep ratios {ratio:.2f}x, "
                f"best rep / best rep {best:.2f}x; naive uses {work:.2f}x the CPU per image"
            )

        if not args.skip_model:
            print("(b) ResNet-50 train step:")
            rates, cpu_ms = bench_model(files, args)
            results["train_step_images_per_s"] = rates
            results["train_step_cpu_ms_per_image"] = cpu_ms
            ratio = median_ratio(rates["pipeline"], rates["synthetic"])
            best = max(rates["pipeline"]) / max(rates["synthetic"])
            # With the model using every core, images/s scale as 1 / CPU per image: the CPU
            # ratio is what the wall-clock ratio would be on an otherwise idle host.
            work = statistics.median(cpu_ms["synthetic"]) / statistics.median(cpu_ms["pipeline"])
            results["ratio_pipeline_vs_synthetic"] = ratio
            results["best_ratio_pipeline_vs_synthetic"] = best
            results["cpu_ratio_pipeline_vs_synthetic"] = work
            print(
                f"(b) pipeline-fed / synthetic-fed train step images/s: median of per-rep "
                f"ratios {ratio:.3f}, best rep / best rep {best:.3f}; CPU per image "
                f"synthetic / pipeline-fed {work:.3f}"
            )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print("RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
