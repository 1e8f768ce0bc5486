"""Tensor parallelism with the model axis across processes: two MultiWorkerMirroredStrategy
workers on 127.0.0.1 (one replica each, M = 2, data = 1) train BERT smoke for a few LAMB steps
and end at the losses and weights of the unsplit model on one device (dropout off, the same
initial weights); each worker holds its half of every split weight. And the Transformer's
beam-search eval split over the two workers translates as the unsplit model does.

Every wait is bounded (collectives 60 s, each worker 240 s); workers are killed by pid.
"""

import numpy as np
import pytest

from tests import processes, tensor_parallel
from tests.benchmarks.bert.test_tensor_parallel import benchmark
from tests.numerics import assert_close

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

STEPS = 3
RTOL = 1e-5
TIMEOUT_S = 240


def _workers(tmp_path, mode: str):
    processes.run_workers(
        lambda index: ["-m", "tests.tensor_parallel_worker", str(tmp_path / f"w{index}.npz"), mode],
        tmp_path,
        TIMEOUT_S,
    )
    outputs = []
    for index in range(2):
        with np.load(tmp_path / f"w{index}.npz") as f:
            outputs.append({k: f[k] for k in f.files})
    return outputs


def test_a_model_axis_across_two_workers_trains_as_the_unsplit_model(tmp_path):
    first, second = _workers(tmp_path, str(STEPS))
    ref = tensor_parallel.train(
        benchmark(), num_devices=1, model_parallel=1, optimizer="lamb", steps=STEPS
    )
    assert_close(first["losses"], ref.losses, rtol=RTOL, err_msg="losses")
    np.testing.assert_array_equal(first["losses"], second["losses"])
    scale = max(float(np.max(np.abs(w))) for w in ref.weights)
    split = 0
    for i, (name, expected) in enumerate(zip(ref.names, ref.weights, strict=True)):
        axis = int(first[f"axis_{i}"])
        a, b = first[f"value_{i}"], second[f"value_{i}"]
        if axis >= 0:  # each worker holds one half; together the whole tensor
            split += 1
            assert a.shape[axis] * 2 == expected.shape[axis]
            whole = np.concatenate([a, b], axis=axis)
        else:  # replicated: the same on both workers
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale, err_msg=name)
            whole = a
        np.testing.assert_allclose(
            whole, expected, rtol=RTOL, atol=RTOL * scale, err_msg=f"weight {name}"
        )
    assert split >= 8  # the heads, the feed-forward width and the vocabulary are split


def test_a_model_axis_across_two_workers_translates_as_the_unsplit_model(tmp_path):
    # The Transformer's beam search with its decoding loop's all-reduces between two processes
    # (each traces its one replica under the same names, so the loop frames agree).
    from tests.benchmarks.transformer.test_tensor_parallel_eval import _evaluate  # noqa: PLC0415

    first, second = _workers(tmp_path, "eval")
    _, ref, ref_bleu = _evaluate(1, 4)
    for output in (first, second):
        assert float(output["bleu"]) == ref_bleu > 0
        for i, (hypothesis, _) in ref.items():
            np.testing.assert_array_equal(output[f"hypothesis_{i}"], hypothesis)
