"""`--model_parallel` through the runner (`runner.run`, what `mlperf-tf run` calls): BERT smoke at
M = 2 on 4 logical CPUs (data = 2) ends at the whole weights of M = 1 on 2 (data = 2), and a run
checkpointed at M = 2 resumes at M = 1 and continues to the unbroken run's weights.

Dropout is off; the smoke data differs between the two data groups (`synthetic.per_batch_shard`,
checked below), so the data-axis gradient sum is exercised in both. The M = 2 run takes BERT's
unpacked path (static shapes under model parallelism), M = 1 the padding-skipping one: the same
math, rounded differently, so weights are compared at a tolerance relative to the model's
largest weight (BERT's key bias is 0 in exact arithmetic and carries only rounding noise).
Each run takes 30-60 s on this 2-core machine: slow tests.
"""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import config as config_lib
from mlperf_tf import registry, runner
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.mesh import build_mesh

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

STEPS, FIRST = 4, 2
RTOL = 1e-5
NO_DROPOUT = {"model.hidden_dropout_prob": "0.0", "model.attention_probs_dropout_prob": "0.0"}


def _bert():
    bert = registry.get("bert")
    return bert(config_lib.override(bert.preset("smoke"), NO_DROPOUT))


def _run(model_dir, *, devices: int, model_parallel: int, steps: int):
    """The run's whole weights by variable path, and its result."""
    # TF starts with the test session's 4 logical CPUs (conftest) before a 2-device run could
    # reconfigure it to 2 (`--num_cpu_devices` splits the CPU when TF has not started yet).
    assert len(tf.config.list_logical_devices("CPU")) >= 4
    config = runner.RunConfig(
        model_dir=str(model_dir), num_cpu_devices=devices, model_parallel=model_parallel,
        max_train_steps=steps, collective_timeout=60,
    )  # fmt: skip
    result = runner.run(_bert(), config)
    assert result.steps == steps
    mesh = build_mesh(devices, model_parallel=model_parallel)
    whole = {v.path: np.asarray(layout_lib.whole_value(v, mesh)) for v in result.model.variables}
    return whole, result


def _assert_same_weights(got: dict, ref: dict):
    assert sorted(got) == sorted(ref)
    scale = max(float(np.max(np.abs(w))) for w in ref.values())
    for path, expected in ref.items():
        np.testing.assert_allclose(
            got[path], expected, rtol=RTOL, atol=RTOL * scale, err_msg=f"weight {path}"
        )


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory):
    """The whole weights of M = 1 on 2 devices (data = 2) after STEPS steps."""
    weights, _ = _run(tmp_path_factory.mktemp("m1"), devices=2, model_parallel=1, steps=STEPS)
    return weights


def test_the_smoke_batches_differ_between_the_data_groups():
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    first, second = list(_bert().train_dataset(context).take(2))
    assert any(
        not np.array_equal(first[k].numpy(), second[k].numpy()) for k in first if k in second
    )


def test_model_parallel_2_ends_at_the_weights_of_model_parallel_1(tmp_path, unsplit):
    split, _ = _run(tmp_path / "m2", devices=4, model_parallel=2, steps=STEPS)
    _assert_same_weights(split, unsplit)


def test_a_checkpoint_written_at_model_parallel_2_resumes_at_model_parallel_1(tmp_path, unsplit):
    model_dir = tmp_path / "resumed"
    halfway, first = _run(model_dir, devices=4, model_parallel=2, steps=FIRST)
    saved = tf.train.latest_checkpoint(str(model_dir / "ckpt"))
    assert saved.endswith(f"-{FIRST}")
    resumed, result = _run(model_dir, devices=2, model_parallel=1, steps=STEPS)
    _assert_same_weights(resumed, unsplit)
    # Not trivially equal: the resumed steps moved the weights far beyond the tolerance.
    # (4 LAMB steps at lr 1e-3 move some weight by 7.5e-4; the tolerance is 1e-5 x the largest
    # weight, a layer norm's scale near 1.)
    scale = max(float(np.max(np.abs(w))) for w in unsplit.values())
    moved = max(float(np.max(np.abs(resumed[p] - halfway[p]))) for p in halfway)
    assert moved > 10 * RTOL * scale
    # The resumed log starts at the checkpoint's step; the first run's log is kept beside it.
    assert (model_dir / "mlperf_log.txt.1").exists()
    assert result.mlperf_log == first.mlperf_log
