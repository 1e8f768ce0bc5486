"""Checkpoints of a tensor-parallel Transformer hold whole tensors: written at
`--model_parallel=2` (2 devices: half the tracing of 4), they restore at 1 and 4 model shards and
at another data-axis size to 1e-6, optimizer slots included; a checkpoint of another shape is a
one-line error."""

import pytest
import tensorflow as tf

from mlperf_tf.errors import UserError
from tests import tensor_parallel
from tests.benchmarks.transformer.test_tensor_parallel import benchmark
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tp") / "ckpt")
    result = tensor_parallel.train(
        benchmark(), num_devices=2, model_parallel=2, optimizer="adam", steps=3, save_to=path
    )
    return path, result


def test_checkpoint_holds_whole_tensors(saved):
    path, result = saved
    shapes = dict(tf.train.list_variables(path))
    embedding = [k for k in shapes if "embedding" in k and "OPTIMIZER_SLOT" not in k]
    assert embedding and all(shapes[k] == [64, 32] for k in embedding), shapes
    # 3 Adam steps moved the weights, so the restore below is not of the initial values.
    assert result.losses[0] != result.losses[-1]


@pytest.mark.parametrize(("devices", "model_parallel"), [(1, 1), (4, 4), (4, 2)])
def test_restores_on_another_mesh(saved, devices, model_parallel):
    path, result = saved
    resumed = tensor_parallel.train(
        benchmark(), num_devices=devices, model_parallel=model_parallel, optimizer="adam",
        steps=0, restore_from=path,
    )  # fmt: skip
    for name, a, e in zip(resumed.names, resumed.weights, result.weights, strict=True):
        assert_close(a, e, rtol=1e-6, err_msg=name)
    assert resumed.slots.keys() == result.slots.keys()
    for name, e in result.slots.items():
        assert_close(resumed.slots[name], e, rtol=1e-6, err_msg=name)


def test_checkpoint_of_another_shape_is_a_one_line_error(saved):
    path, _ = saved
    with pytest.raises(UserError, match=r"^checkpoint tensor .*embedding.* has shape \[64, 32\]"):
        tensor_parallel.train(
            benchmark(vocab_size=128), num_devices=2, model_parallel=2, optimizer="adam",
            steps=0, restore_from=path,
        )  # fmt: skip
