"""Tests of the gpt_oss_20b benchmark: the reference's settings, parameter counts, RCP
hyperparameters, eval schedule, the eod-masked loss, bad input, and the MLPerf keys of the
`mlperf` preset under the rules of 6.0.0 and 6.1.0."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.data import c4
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import DeviceMesh
from tests.closed_rules import logged_hparams

RULESETS = ("6.0.0", "6.1.0")


def _bench(preset="mlperf", mesh=None, **changes):
    config = dataclasses.replace(GptOssBenchmark.preset(preset), **changes)
    return GptOssBenchmark(config).with_context(RunContext(num_replicas=1, mesh=mesh))


def test_the_mlperf_model_is_the_references():
    m = config_lib.mlperf().model
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads) == (24, 2880, 64)
    assert (m.num_key_value_heads, m.head_dim, m.vocab_size) == (8, 64, 128_256)
    assert m.qk_norm and not m.tie_word_embeddings
    assert (m.rope_theta, m.rms_norm_eps, m.initializer_range) == (150_000, 1e-6, 0.008)
    moe = m.moe
    assert (moe.num_experts, moe.top_k, moe.every, moe.filter_size) == (32, 4, 1, 2880)
    assert moe.router_softmax == "after" and moe.capacity_factor == moe.eval_capacity_factor == 0
    assert moe.z_loss_coef == moe.balance_loss_coef == 0


def test_parameter_counts_of_the_mlperf_preset():
    bench = _bench()
    assert bench.parameter_count() == 20_488_418_112  # 20.49 B
    assert bench.active_parameter_count() == 3_766_907_712  # 3.77 B per token


def test_window_pattern_is_megatrons_for_the_references_list():
    """Megatron's `is_layer_window_attention`: list entry 1 = sliding (1-based layer numbers);
    the int 2 the config keeps makes the same layers sliding: 0-based layers 0, 2, ..., 22."""
    m = config_lib.mlperf().model
    from_list = [config_lib.is_window_layer(list(config_lib.REFERENCE_WINDOW_PATTERN), i + 1)
                 for i in range(24)]  # fmt: skip
    windows = [m.layer_window(i) for i in range(24)]
    assert from_list == [bool(w) for w in windows]
    assert windows[:4] == [129, 0, 129, 0] and sum(bool(w) for w in windows) == 12
    assert [config_lib.is_window_layer(4, n) for n in range(1, 9)] == [1, 1, 1, 0, 1, 1, 1, 0]


@pytest.mark.parametrize("batch, every", [(16, 768), (32, 384), (64, 192), (24, 512), (40, 308)])
def test_eval_every_ceil_12288_over_gbs_steps_with_samples_count(batch, every):
    opt = config_lib.OptimizerConfig(opt_base_learning_rate=1e-3, opt_learning_rate_warmup_steps=1)
    points = _bench(global_batch_size=batch, optimizer=opt).eval_schedule()
    assert points[0].step == every and points[1].step == 2 * every
    assert points[0].samples_count == every * batch


def test_bad_input_is_one_line_naming_the_setting():
    model = config_lib.tiny()
    with pytest.raises(ConfigError, match="top_k") as e:
        dataclasses.replace(model, moe=dataclasses.replace(model.moe, top_k=5))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="sliding_window"):
        dataclasses.replace(config_lib.smoke(), model=dataclasses.replace(model, sliding_window=33))
    with pytest.raises(UserError, match="--expert_parallel=3 must divide"):
        _bench("smoke", mesh=DeviceMesh(expert=3)).check_layout()
    with pytest.raises(ConfigError, match="eod_token_id"):
        dataclasses.replace(
            config_lib.smoke(), data=config_lib.DataConfig(max_sequence_length=32, eod_token_id=500)
        )


def test_the_loss_leaves_out_positions_whose_input_is_the_end_of_document():
    keras.utils.set_random_seed(0)
    bench = _bench("smoke")
    model = bench.build_model()
    tokens = tf.random.uniform([2, 33], 3, 128, tf.int32, seed=1)
    tokens = tf.tensor_scatter_nd_update(tokens, [[0, 5], [1, 20], [1, 32]], [2, 2, 2])
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "valid": tf.ones([2])}
    logits = model(batch["input_ids"]).numpy().astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, batch["labels"].numpy()[..., None], -1)[..., 0]
    keep = batch["input_ids"].numpy() != 2  # [0, 5] and [1, 20] (the label 2 at [1, 31] stays)
    assert keep.sum() == 62
    loss = bench.compute_loss(model, batch, training=False)
    assert float(loss) == pytest.approx(nll[keep].mean() * 2 / 8, rel=1e-5)  # 2 of 8 examples
    state = bench.eval_reduce({}, {k: v.numpy() for k, v in bench.eval_step(model, batch).items()})
    assert state["tokens"] == 62
    assert bench.eval_result(state) == pytest.approx(nll[keep].mean(), rel=1e-5)


def test_mini_reads_the_shared_mini_corpus_with_its_end_of_text_id():
    mini = config_lib.mini()
    assert mini.data_dir == c4.mini_data_dir()
    from benchmarks.llama31_8b import config as llama_config

    assert llama_config.mini().data_dir == mini.data_dir
    assert mini.model.vocab_size == c4.MINI_VOCAB_SIZE
    assert mini.data.eod_token_id == c4.MINI_EOS_ID
    assert mini.quality_target == 3.34


def test_parameters_are_listed_by_mlperf_tf_list_json(capsys):
    from mlperf_tf import cli

    assert cli.main(["list", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert listed["gpt_oss_20b"]["parameters"] == 20_488_418_112
    assert listed["gpt_oss_20b"]["active_parameters"] == 3_766_907_712
    assert "active_parameters" not in listed["resnet50"]  # dense models: every weight is active
    assert listed["gpt_oss_20b"]["mlperf_benchmark"] == "gpt_oss_20b"


@pytest.mark.parametrize("ruleset", RULESETS)
def test_mlperf_preset_logs_every_key_the_closed_rules_require(ruleset):
    bench = _bench()
    hparams = logged_hparams(bench, ruleset)
    assert hparams[C.MAX_SEQUENCE_LENGTH] == 8192 and hparams["max_steps"] == 1_200_000
    assert hparams[C.OPT_BASE_LR] == 4e-4 and hparams[C.OPT_LR_WARMUP_STEPS] == 128
    assert hparams[C.OPT_END_LR] == pytest.approx(4e-5)
    assert hparams[C.OPT_LR_DECAY_STEPS] == 1_200_000 - 128
    assert bench.eval_samples() == 1024
    assert ("expert_parallelism" in hparams) == (ruleset == "6.1.0")
    assert "expert_parallelism" not in bench.mlperf_hparams()  # the runner's, for every benchmark


def test_training_flops_count_active_experts_and_windows_at_their_window():
    seq = 8192
    flops = _bench().training_flops_per_sample()
    # The active projections: 3.77 B less the embedding lookup and the norms.
    projections = 3_766_907_712 - 128_256 * 2880 - 24 * (2 * 2880 + 128) - 2880
    attention = 12 * 4 * seq * 64 * 64 * (seq + 129)  # 12 full layers + 12 windowed
    assert flops == pytest.approx(6 * seq * projections + 3 * attention, rel=1e-12)
    assert _bench().tokens_per_sample() == 8192


def test_analytic_training_flops_equal_the_traced_count_at_a_full_window():
    """At a window as long as the sequence the traced graph (which computes the masked square)
    and the analytic count agree; the sorted dispatch traces only the active experts."""
    from mlperf_tf import flops

    smoke = config_lib.smoke()
    model = dataclasses.replace(smoke.model, sliding_window=32)
    bench = _bench("smoke", model=model)
    traced = flops.training_flops_per_sample(bench)
    assert bench.training_flops_per_sample() == pytest.approx(traced, rel=1e-9)


def test_static_shapes_use_the_capacity_buffers_and_the_loss_compiles_with_xla():
    """Under `--xla` (static shapes) the MoE layers take the dropless capacity buffers, whose
    shapes XLA can compile; otherwise the sorted dispatch."""
    from mlperf_tf.layers import moe

    smoke = config_lib.smoke()
    assert all(
        type(layer) is moe.SortedMoEFeedForward
        for layer in _bench("smoke").build_model().moe_layers
    )
    bench = GptOssBenchmark(smoke).with_context(RunContext(num_replicas=1, static_shapes=True))
    keras.utils.set_random_seed(0)
    model = bench.build_model()
    assert all(type(layer) is moe.MoEFeedForward for layer in model.moe_layers)
    ids = tf.random.stateless_uniform([8, 33], [5, 6], 0, 128, tf.int32)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    eager = bench.compute_loss(model, batch)
    compiled = tf.function(lambda b: bench.compute_loss(model, b), jit_compile=True)(batch)
    assert float(compiled) == pytest.approx(float(eager), rel=1e-5)
