"""Tests of mlperf_tf.data.synthetic."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.data import synthetic


def test_synthetic_dataset_from_example_repeats_one_batch():
    ds = synthetic.synthetic_dataset(
        {"image": tf.ones([4, 4, 3]), "label": tf.constant(3, tf.int32)}, batch_size=2
    )
    assert ds.element_spec["image"].shape.as_list() == [2, 4, 4, 3]
    first, second = list(ds.take(2))
    np.testing.assert_array_equal(first["label"].numpy(), [3, 3])
    np.testing.assert_array_equal(first["image"].numpy(), second["image"].numpy())


def test_synthetic_dataset_from_function_differs_per_example():
    specs = {"image": tf.TensorSpec([8, 8, 3], tf.float32), "label": tf.TensorSpec([], tf.int32)}
    ds = synthetic.synthetic_dataset(
        lambda seed: synthetic.random_example(specs, seed, maxval=1000), batch_size=3, seed=10
    )
    batch = next(iter(ds))
    assert batch["image"].dtype == tf.float32 and batch["label"].dtype == tf.int32
    images = batch["image"].numpy()
    assert not np.array_equal(images[0], images[1])
    again = next(
        iter(
            synthetic.synthetic_dataset(
                lambda seed: synthetic.random_example(specs, seed, maxval=1000),
                batch_size=3,
                seed=10,
            )
        )
    )
    np.testing.assert_array_equal(images, again["image"].numpy())  # deterministic in the seed


def test_synthetic_dataset_validates():
    with pytest.raises(ValueError, match="batch_size"):
        synthetic.synthetic_dataset({"x": 1}, batch_size=0)
    with pytest.raises(ValueError, match="dict"):
        synthetic.synthetic_dataset([1, 2], batch_size=1)
    with pytest.raises(ValueError, match="fixed shape"):
        synthetic.random_example({"x": tf.TensorSpec([None], tf.float32)})


def test_without_autotune_turns_the_tuner_off_over_a_tuned_pipeline():
    options = tf.data.Options()
    options.autotune.enabled = True
    tuned = tf.data.Dataset.range(4).with_options(options)
    assert tuned.options().autotune.enabled
    untuned = synthetic.without_autotune(tuned.map(lambda x: x + 1))
    assert untuned.options().autotune.enabled is False
    assert [int(x) for x in untuned] == [1, 2, 3, 4]  # the elements are unchanged


def test_the_runner_turns_the_tuner_off_for_synthetic_data_only():
    """`controller._distribute`: synthetic input untuned and, on one device, the pipeline read
    itself (no per-device pipelines); real input goes to TF's `distribute_datasets_from_function`
    as the benchmark made it."""
    import dataclasses
    from unittest import mock

    from mlperf_tf.runner import controller
    from tests.tiny_benchmark import TinyBenchmark, smoke

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    benchmark = TinyBenchmark(smoke())
    assert benchmark.config.synthetic
    untuned = controller._distribute(strategy, benchmark, benchmark.train_dataset)
    assert isinstance(untuned, tf.data.Dataset)
    assert untuned.options().autotune.enabled is False
    real = TinyBenchmark(dataclasses.replace(smoke(), data_dir="/data"))
    with mock.patch.object(strategy, "distribute_datasets_from_function") as distribute:
        controller._distribute(strategy, real, real.train_dataset)
    distribute.assert_called_once_with(real.train_dataset)
