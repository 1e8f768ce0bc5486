"""The runner's TPUStrategy path for `--spatial_partition` and `--model_parallel`
(`mlperf_tf.parallel.tpu`), driven through `runner.run` on a stand-in strategy.

There is no TPU here. The stand-in is a one-device MirroredStrategy that the runner takes for a
TPU (`distribute.is_tpu` patched) and whose annotation methods record their calls and return
their input: so the run must build the unsplit model on the data axis, call the annotations in
its replica steps, and train exactly as the plain one-device run (annotations change placement,
never values; to 1e-5). What XLA does with the annotations on a TPU is not tested (not run)."""

import dataclasses
from unittest import mock

import pytest
import tensorflow as tf

from mlperf_tf import distribute, registry, runner
from tests.numerics import assert_close

pytestmark = [pytest.mark.numerics]

STEPS = 2
RTOL = 1e-5


class RecordingStrategy(tf.distribute.MirroredStrategy):
    """One CPU device; records `experimental_split_to_logical_devices` and
    `experimental_replicate_to_logical_devices` calls as TPUStrategy's would be made."""

    def __init__(self):
        super().__init__(["CPU:0"], cross_device_ops=tf.distribute.ReductionToOneDevice())
        self.calls = []

    def experimental_split_to_logical_devices(self, tensor, partition_dimensions):
        self.calls.append(("split", list(partition_dimensions)))
        return tf.identity(tensor)

    def experimental_replicate_to_logical_devices(self, tensor):
        self.calls.append(("replicate", None))
        return tf.identity(tensor)


def _run(model_dir, benchmark: str, *, tpu: bool, **flags):
    strategy = RecordingStrategy()
    config = runner.RunConfig(
        model_dir=str(model_dir), max_train_steps=STEPS, warm_up=False, **flags
    )
    b = registry.get(benchmark)
    config_b = b.preset("smoke")
    if hasattr(config_b.optimizer, "opt_name"):
        # SGD: LAMB's and Adam's update m / sqrt(v) of a near-zero gradient turns a last-ulp
        # difference (below) into a visible one; the comparison is of the annotations, not them.
        config_b = dataclasses.replace(
            config_b, optimizer=dataclasses.replace(config_b.optimizer, opt_name="sgd")
        )
    with (
        mock.patch.object(distribute, "resolve_strategy", return_value=strategy),
        mock.patch.object(distribute, "is_tpu", return_value=tpu),
    ):
        result = runner.run(b(config_b), config)
    assert result.steps == STEPS
    # In order (Keras numbers seed generators per process, so their paths differ between runs).
    return [(v.path, v.numpy()) for v in result.model.variables], strategy.calls


@pytest.mark.parametrize(
    ("name", "flags", "dims"),
    [("resnet50", {"spatial_partition": "2x2"}, [1, 2, 2, 1]),
     # Extended (CI runs it after README's default run); the default run covers its case by the
     # resnet50 case (the TPU path's annotations) and bert/test_tensor_parallel.py (M2 = M1).
     pytest.param("bert", {"model_parallel": 2}, None, marks=pytest.mark.extended)],
)  # fmt: skip
def test_tpu_path_annotates_and_trains_as_the_unsplit_run(tmp_path, name, flags, dims):
    plain, none = _run(tmp_path / "plain", name, tpu=False)
    assert none == []
    annotated, calls = _run(tmp_path / "tpu", name, tpu=True, **flags)
    assert calls, "the replica steps called no annotation"
    if dims is not None:  # spatial: the images only, [1, K, L, 1], in train and eval steps
        assert {tuple(c[1]) for c in calls} == {tuple(dims)}
    else:  # model: split weights [.., 2, ..] and replicated ones
        splits = [c[1] for c in calls if c[0] == "split"]
        assert splits and all(sorted(d) == [1] * (len(d) - 1) + [2] for d in splits)
        assert any(c[0] == "replicate" for c in calls)
    assert len(annotated) == len(plain)  # the unsplit model: the same variables
    for (path, value), (ref_path, expected) in zip(annotated, plain, strict=True):
        assert "seed_generator" in path or path == ref_path
        # Not bit-equal for the embeddings: read through the annotated tensor, a lookup's
        # gradient is a dense sum rather than the variable's sparse one (another order).
        assert_close(value, expected, rtol=RTOL)
