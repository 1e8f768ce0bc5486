"""Llama with mixture-of-experts blocks (`--config.model.moe.*`, the Transformer's settings):
SwiGLU experts in every `moe.every`-th block, the auxiliary losses in the loss and the metrics,
parameter counts, and expert parallelism (alone and with tensor parallelism) equal to the
unsplit run on 4 logical devices."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf import config as config_lib
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.lm import FeedForward
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import strategies, tensor_parallel

pytestmark = pytest.mark.numerics

MOE = {"model.moe.num_experts": "4", "model.moe.every": "2"}


def _benchmark(overrides=MOE, mesh=None) -> Llama31Benchmark:
    cfg = config_lib.override(Llama31Benchmark.preset("smoke"), dict(overrides))
    context = RunContext(mesh=mesh) if mesh is not None else None
    return Llama31Benchmark(cfg, context=context)


def _batch(benchmark, seed=0):
    seq = benchmark.config.data.max_sequence_length
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, benchmark.config.model.vocab_size, size=(2, seq + 1))
    return {
        "input_ids": tf.constant(ids[:, :-1], tf.int32),
        "labels": tf.constant(ids[:, 1:], tf.int32),
    }


def test_every_second_block_is_swiglu_moe_and_the_aux_loss_joins_the_loss():
    benchmark = _benchmark()
    model = benchmark.build_model()
    layers = model.decoder_layers
    assert [layer.is_moe for layer in layers] == [False, True]
    assert isinstance(layers[0].mlp, FeedForward)
    (moe_layer,) = model.moe_layers
    assert moe_layer.expert_mlp == "swiglu" and moe_layer.num_experts == 4
    assert moe_layer.filter_size == benchmark.config.model.intermediate_size
    loss, metrics = benchmark.compute_loss_and_metrics(model, _batch(benchmark), training=True)
    assert {k: tuple(v.shape) for k, v in metrics.items()} == benchmark.train_metric_shapes()
    # The same model without the auxiliary losses: the difference is their weighted sum, scaled
    # by the replica's share of the micro batch (2 of 8 sequences here).
    moe_layer.z_loss_coef = moe_layer.balance_loss_coef = 0.0
    plain, _ = benchmark.compute_loss_and_metrics(model, _batch(benchmark), training=True)
    share = 2 / benchmark.micro_batch_size
    np.testing.assert_allclose(
        float(loss - plain), share * float(metrics["moe/aux_loss"]), rtol=1e-4
    )
    assert float(metrics["moe/aux_loss"]) > 0
    np.testing.assert_allclose(np.sum(metrics["moe/load"].numpy(), axis=1), 1.0, rtol=1e-6)
    out = benchmark.eval_step(model, {**_batch(benchmark), "valid": tf.ones([2])})
    assert out["loss"].shape == (2,)


@pytest.mark.parametrize(
    "overrides",
    [{}, MOE, {**MOE, "model.moe.every": "1", "model.moe.filter_size": "48"}],
    ids=["dense", "every2", "every1_width48"],
)
def test_parameter_count_accounts_for_the_experts(overrides):
    benchmark = _benchmark(overrides)
    model = benchmark.build_model()
    assert model.count_params() == benchmark.parameter_count()
    if overrides:
        dense = _benchmark({}).parameter_count()
        assert benchmark.parameter_count() > dense


def test_active_flops_count_top_k_experts():
    dense = _benchmark({}).config.model
    # 4 experts of the dense width, top-1, in every block: the same active weights as the dense
    # model plus the routers.
    top1 = _benchmark({**MOE, "model.moe.every": "1", "model.moe.top_k": "1"}).config.model
    seq = 32
    router = 2 * 3.0 * seq * top1.hidden_size * 4 * top1.num_hidden_layers
    assert top1.training_flops(seq) == pytest.approx(dense.training_flops(seq) + router)
    # The benchmark's declared count (the shared decoder helper of `mlperf_tf.flops`, from its
    # shape) is the config's, MoE or not.
    for overrides in ({}, MOE, {**MOE, "model.moe.every": "1", "model.moe.top_k": "1"}):
        bench = _benchmark(overrides)
        m, length = bench.config.model, bench.config.data.max_sequence_length
        assert bench.training_flops_per_sample() == pytest.approx(m.training_flops(length))


def test_expert_axis_only_with_moe_and_bad_sizes_are_one_line():
    assert "expert" not in _benchmark({}).parallel_axes
    assert _benchmark().parallel_axes == ("data", "model", "pipeline", "context", "expert")
    # The shared layout check (LanguageModelBenchmark.check_layout) refuses it before any layer.
    with pytest.raises(UserError, match="--expert_parallel=4 must divide") as error:
        _benchmark({**MOE, "model.moe.num_experts": "6"}, mesh=DeviceMesh(expert=4)).build_model()
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="top_k"):
        _benchmark({**MOE, "model.moe.num_experts": "2", "model.moe.top_k": "4"})


def test_moe_layers_take_the_runs_collective_timeout():
    cfg = config_lib.override(Llama31Benchmark.preset("smoke"), MOE)
    mesh = DeviceMesh(data=1, expert=2)
    bench = Llama31Benchmark(cfg, context=RunContext(mesh=mesh, collective_timeout_s=42.0))
    strategy = strategies.mirrored(2)
    with strategy.scope():
        model = bench.build_model()
    assert [layer.collective_timeout_s for layer in model.moe_layers] == [42.0]
    assert [layer.local_experts for layer in model.moe_layers] == [2]


def _unsplit_and_split(overrides, *, expert_parallel, model_parallel, steps=3):
    """The run on 4 devices at E x M against the unsplit run of the same batch shards."""
    b = _benchmark({**MOE, **overrides})
    shards = 4 // model_parallel
    ref = tensor_parallel.train(b, num_devices=shards, model_parallel=1, optimizer="adam",
                                steps=steps)  # fmt: skip
    got = tensor_parallel.train(
        b, num_devices=4, model_parallel=model_parallel, expert_parallel=expert_parallel,
        optimizer="adam", steps=steps,
    )  # fmt: skip
    assert any("moe/w_gate" in name for name in got.names), got.names
    return got, ref


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "overrides"),
    [
        # E2 alone (11 s) is slow: E2xM2 splits the same experts over the same 2 expert groups,
        # and GPT-OSS's E2 (tests/benchmarks/gpt_oss_20b/test_parallel.py) runs by default.
        pytest.param(2, 1, {"model.moe.capacity_factor": "1.0"}, marks=pytest.mark.slow),
        (2, 2, {"model.moe.capacity_factor": "1.0"}),  # choices really dropped
        pytest.param(4, 1, {"model.moe.capacity_factor": "0"}, marks=pytest.mark.slow),
    ],
    ids=["E2", "E2xM2", "E4_dropless"],
)
def test_expert_parallel_llama_equals_the_unsplit_run(expert_parallel, model_parallel, overrides):
    """3 Adam steps of the smoke Llama with an MoE block on 4 logical devices, each batch shard
    reading its own synthetic tokens: E = 2 (data 2) against data 4, and E = 2 x M = 2 against
    data 2 on 2 devices; losses, first-step whole gradients and final whole weights at a
    scale-aware 1e-5 (`tests.tensor_parallel.assert_same_run`)."""
    got, ref = _unsplit_and_split(
        overrides, expert_parallel=expert_parallel, model_parallel=model_parallel
    )
    tensor_parallel.assert_same_run(got, ref, rtol=1e-5)
    assert got.losses[-1] < got.losses[0]  # it trains


def test_the_trainer_clips_a_sparse_embedding_gradient_under_keras_sum():
    """Llama (its embedding's gradient is `IndexedSlices`) on 2 replicas with Keras' own sum and
    the rules' clip 1.0: the trainer sums, clips and hands Keras each replica's share. Before,
    `IndexedSlices / int` raised in the warm-up and `mlperf-tf run` of a 2-device Llama ended
    in a TypeError."""
    from mlperf_tf.parallel.input import for_mesh  # noqa: PLC0415
    from mlperf_tf.runner.trainer import Trainer  # noqa: PLC0415

    strategy = strategies.mirrored(2)
    b = _benchmark().with_context(RunContext(num_replicas=2, mesh=DeviceMesh(data=2)))
    with strategy.scope():
        model = b.build_model()
        optimizer = b.build_optimizer(10)
        optimizer.build(model.trainable_variables)
    before = [v.numpy() for v in model.trainable_variables]
    data = strategy.distribute_datasets_from_function(for_mesh(b.train_dataset, b.mesh))
    trainer = Trainer(strategy=strategy, benchmark=b, model=model, optimizer=optimizer, xla=False)
    assert trainer.clip_norm == 1.0
    loss, done, _, metrics = trainer.loop(iter(data), tf.constant(2, tf.int32))
    assert int(done) == 2 and np.isfinite(float(loss))
    assert "moe/aux_loss" in metrics
    assert not np.allclose(model.token_embedding.embeddings.numpy(), before[0])
