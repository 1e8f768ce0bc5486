"""The Transformer with mixture-of-experts blocks (`model.moe`): config, losses, metrics, decoding."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.transformer import model as model_lib
from benchmarks.transformer.benchmark import TransformerBenchmark
from mlperf_tf import config as config_lib
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.layers import moe
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import e2e
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

MOE = {"model.moe.num_experts": "4", "model.moe.every": "2"}


def _benchmark(overrides=MOE, mesh=None):
    cfg = config_lib.override(TransformerBenchmark.preset("smoke"), dict(overrides))
    context = RunContext(mesh=mesh) if mesh is not None else None
    return TransformerBenchmark(cfg, context=context)


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 64, size=(4, 8)).astype(np.int32)
    ids[:, 6:] = 0
    return {"inputs": tf.constant(ids), "targets": tf.constant(ids[:, ::-1].copy())}


def test_every_second_block_is_moe_and_the_aux_loss_joins_the_loss():
    benchmark = _benchmark()
    model = benchmark.build_model()
    assert len(model.moe_layers) == 2  # block 1 of the encoder and of the decoder
    assert isinstance(model.encoder_layers[0].ffn, model_lib.FeedForward)
    loss, metrics = benchmark.compute_loss_and_metrics(model, _batch(), training=False)
    assert {k: tuple(v.shape) for k, v in metrics.items()} == benchmark.train_metric_shapes()
    # The same model without the auxiliary losses: the difference is their weighted sum.
    for layer in model.moe_layers:
        layer.z_loss_coef = layer.balance_loss_coef = 0.0
    plain, _ = benchmark.compute_loss_and_metrics(model, _batch(), training=False)
    np.testing.assert_allclose(float(loss - plain), float(metrics["moe/aux_loss"]), rtol=1e-5)
    assert float(metrics["moe/aux_loss"]) > 0
    np.testing.assert_allclose(np.sum(metrics["moe/load"].numpy(), axis=1), 1.0, rtol=1e-6)


def test_moe_model_decodes():
    benchmark = _benchmark()
    model = benchmark.build_model()
    out = benchmark.eval_step(
        model, {**_batch(), "index": tf.range(4), "valid": tf.ones([4], tf.int32)}
    )
    assert out["hypotheses"].shape[0] == 4


def test_dense_config_has_no_metrics_and_refuses_expert_parallelism():
    dense = _benchmark({})
    assert dense.train_metric_shapes() == {}
    assert "expert" not in dense.parallel_axes
    assert "expert" in _benchmark().parallel_axes


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.moe.num_experts": "2", "model.moe.top_k": "4"}, "top_k"),
        ({"model.moe.num_experts": "2", "model.moe.capacity_factor": "-1"}, "capacity_factor"),
        ({"model.moe.every": "0"}, "every"),
    ],
)
def test_bad_moe_settings_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        _benchmark(overrides)
    assert "\n" not in str(error.value)


def test_expert_parallel_must_divide_the_experts():
    benchmark = _benchmark(
        {"model.moe.num_experts": "6", "model.moe.every": "2"}, mesh=DeviceMesh(expert=4)
    )
    with (
        pytest.raises(ConfigError, match="--expert_parallel=4 must divide"),
        use_mesh(benchmark.mesh),
    ):
        benchmark.build_model()


def test_moe_config_defaults_are_st_moe():
    cfg = moe.MoEConfig(num_experts=8)
    assert (cfg.top_k, cfg.capacity_factor, cfg.eval_capacity_factor) == (2, 1.25, 2.0)
    assert (cfg.z_loss_coef, cfg.balance_loss_coef) == (1e-3, 1e-2)
    assert [cfg.is_moe(i) for i in range(4)] == [False, True, False, True]


def test_moe_layers_take_the_runs_collective_timeout():
    # `--collective_timeout` must bound the all-to-alls too, so that a deadlock is an error
    # naming the collective: before, the runner's MoE layers were built with no limit.
    mesh = DeviceMesh(data=1, expert=2)
    cfg = config_lib.override(TransformerBenchmark.preset("smoke"), MOE)
    bench = TransformerBenchmark(cfg, context=RunContext(mesh=mesh, collective_timeout_s=42.0))
    with use_mesh(mesh):
        model = bench.build_model()
    assert [layer.collective_timeout_s for layer in model.moe_layers] == [42.0, 42.0]


# Extended (CI runs it after README's default run); the default run covers its case by
# layers/test_moe_parallel.py (E2 = one replica per expert set) and llama31_8b/test_moe.py (E2 x
# M2).
@pytest.mark.extended
def test_expert_parallel_transformer_trains_and_evaluates_through_the_runner(tmp_path, caplog):
    """E=2 on 2 logical devices through the runner (warm-up, 2 steps of 2 MoE layers' all-to-alls
    and their gradients, the layout sum, beam-search eval with gathered experts). Every
    collective is bounded by --collective_timeout, so a deadlock fails this test in a minute
    with "Collective has timed out" instead of hanging the suite."""
    cfg = config_lib.override(TransformerBenchmark.preset("smoke"), {**MOE, "max_epochs": "1"})
    result = e2e.run_two_steps_on_two_replicas(
        TransformerBenchmark(cfg), tmp_path, expert_parallel=2, collective_timeout=60
    )
    assert result.steps == 2
    assert len(result.evals) == 1
    assert "warm-up failed" not in caplog.text  # the warm-up ran the same collectives first
    # Each replica holds its own half of the experts (different parts, not copies).
    for layer in result.model.moe_layers:
        parts = [p.numpy() for p in layer.w_in.value.values]
        assert len(parts) == 2 and parts[0].shape[0] == 2
        assert not np.allclose(parts[0], parts[1])


@pytest.mark.slow
def test_expert_parallel_run_equals_the_unsplit_run(tmp_path):
    """E=2 on 4 devices ends 3 Adam steps at E=1's weights (dropless, dropout off): the same
    initial experts (the whole tensor drawn once, sliced), the same per-replica batches."""
    from mlperf_tf import runner  # noqa: PLC0415 (the runner only for this test)
    from mlperf_tf.parallel import layout  # noqa: PLC0415

    overrides = {
        **MOE, "max_epochs": "1", "model.moe.capacity_factor": "0", "model.dropout": "0",
        "model.attention_dropout": "0", "model.relu_dropout": "0",
    }  # fmt: skip
    cfg = config_lib.override(TransformerBenchmark.preset("smoke"), overrides)
    weights = {}
    for expert_parallel in (1, 2):
        result = runner.run(
            TransformerBenchmark(cfg),
            runner.RunConfig(
                model_dir=str(tmp_path / f"e{expert_parallel}"), distribution="mirrored",
                num_cpu_devices=4, expert_parallel=expert_parallel, collective_timeout=60,
                steps_per_loop=3, max_train_steps=3, warm_up=False,
            ),
        )  # fmt: skip
        assert result.steps == 3
        mesh = DeviceMesh(data=4 // expert_parallel, expert=expert_parallel)
        weights[expert_parallel] = [
            (v.path, np.asarray(layout.whole_value(v, mesh)))
            for v in result.model.trainable_variables
        ]
    # Adam divides by sqrt(v): where a gradient is ~0, the two runs' different summation orders
    # move a weight differently by up to ~lr. Measured: 1 of 8,192 elements of one expert
    # kernel off by 2.2e-5 (6e-5 of its scale, 0.35); every other tensor within 1e-5.
    for (name, split), (_, whole) in zip(weights[2], weights[1], strict=True):
        assert_close(split, whole, rtol=1e-4, err_msg=name)


def _unregularized(overrides):
    """A smoke Transformer with MoE blocks, dropout off (exactness tests)."""
    off = {"model.dropout": "0", "model.attention_dropout": "0", "model.relu_dropout": "0"}
    cfg = config_lib.override(TransformerBenchmark.preset("smoke"), {**MOE, **off, **overrides})
    return TransformerBenchmark(cfg)


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "all_reduce"),
    [pytest.param(2, 2, "ring", marks=pytest.mark.slow),  # 60 s; the layer-level E x M
     pytest.param(2, 1, "hierarchical", marks=pytest.mark.slow)],  # test runs by default
)  # fmt: skip
def test_expert_parallelism_composes_with_model_parallelism(
    expert_parallel, model_parallel, all_reduce
):
    """E x M logical devices (2 batch shards, each read by one model group: E2xM2 on 4, E2 on
    2) end 3 Adam steps where the unsplit run on 2 devices (data only) does: losses, first gradients (whole,
    summed over the batch shards) and weights. The runner's one summer sums tensor-parallel
    shards over `data`, experts over `data` (not `expert`), replicated weights over `data` and
    `expert`; the all-to-alls of each model shard go to the same-index shard of the other expert
    group. Capacity factor 1.0: choices are really dropped, per replica as in the unsplit run."""
    from tests import tensor_parallel  # noqa: PLC0415 (the shared exactness harness)

    b = _unregularized({"model.moe.capacity_factor": "1.0"})
    ref = tensor_parallel.train(b, num_devices=2, model_parallel=1, optimizer="adam", steps=3)
    got = tensor_parallel.train(
        b, num_devices=2 * expert_parallel * model_parallel // 2, model_parallel=model_parallel,
        expert_parallel=expert_parallel, optimizer="adam", steps=3, all_reduce=all_reduce,
    )  # fmt: skip
    split = [n for n in got.names if "moe_ffn/w_in" in n]
    assert split, got.names
    tensor_parallel.assert_same_run(got, ref, rtol=1e-5)
