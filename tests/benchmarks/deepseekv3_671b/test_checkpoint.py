"""Tests of the shared Hugging Face import (`mlperf_tf.hf_checkpoint`) with DeepSeek-V3's name
map: tiny checkpoints written in the Hugging Face layout by the tests, read back shard by shard
into another model (its forward then equals the written model's, MTP and the selection bias
included), FP8 block-scaled weights dequantized, and one-line errors for another model's config,
a missing or truncated shard and a tensor of the wrong shape."""

import dataclasses
import json
import os

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from benchmarks.deepseekv3_671b import checkpoint
from benchmarks.deepseekv3_671b import config as config_lib
from benchmarks.deepseekv3_671b import model as model_lib
from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from mlperf_tf import hf_checkpoint
from mlperf_tf.hf_checkpoint import CheckpointImportError
from tests import tensor_parallel
from tests.numerics import assert_close

TOKENS = np.random.default_rng(0).integers(0, 128, (2, 10)).astype(np.int32)


def _model(seed, config=None):
    keras.utils.set_random_seed(seed)
    return model_lib.build_model(config or config_lib.tiny())


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny model (its selection biases set off zero) and its checkpoint folder."""
    config = config_lib.tiny()
    model = _model(1)
    rng = np.random.default_rng(2)
    for layer in model.moe_layers:
        layer.router_bias.assign(rng.normal(0, 0.1, layer.router_bias.shape).astype(np.float32))
    path = str(tmp_path_factory.mktemp("ckpt") / "hf")
    summary = checkpoint.export(model, config, path, shards=3)
    return model, config, path, summary


def _copy(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(dst, name), "wb") as b:
            b.write(a.read())
    return dst


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_the_written_layout_is_hugging_faces(written):
    _, config, path, summary = written
    index = json.load(open(os.path.join(path, hf_checkpoint.INDEX)))["weight_map"]
    assert summary["shards"] == 3 and len(set(index.values())) == 3
    layers, mtp = config.num_hidden_layers, f"model.layers.{config.num_hidden_layers}."
    for name in ("model.layers.1.mlp.gate.e_score_correction_bias",
                 "model.layers.1.mlp.experts.7.down_proj.weight",
                 "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                 mtp + "eh_proj.weight", mtp + "enorm.weight", mtp + "shared_head.norm.weight",
                 mtp + "mlp.shared_experts.up_proj.weight"):  # fmt: skip
        assert name in index, name
    shard = load_file(os.path.join(path, index["model.layers.0.self_attn.q_b_proj.weight"]))
    q_b = shard["model.layers.0.self_attn.q_b_proj.weight"]
    heads = config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim)
    assert q_b.shape == (heads, config.q_lora_rank)  # torch's [out, in]
    assert f"model.layers.{layers + 1}.enorm.weight" not in index


def test_import_reproduces_the_written_model_forward(written):
    model, config, path, summary = written
    other = _model(7)
    count = checkpoint.load(path, other, config)
    assert count == summary["tensors"]
    want_main, (want_mtp,) = model.with_mtp(tf.constant(TOKENS))
    got_main, (got_mtp,) = other.with_mtp(tf.constant(TOKENS))
    assert_close(got_main, want_main, rtol=1e-6)
    assert_close(got_mtp, want_mtp, rtol=1e-6)
    for a, b in zip(model.moe_layers, other.moe_layers, strict=True):
        np.testing.assert_array_equal(a.router_bias.numpy(), b.router_bias.numpy())
    # The loaded model differs from its own initializers: the import did the work.
    assert np.max(np.abs(_model(7)(tf.constant(TOKENS)).numpy() - want_main.numpy())) > 1e-3


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "weight_scale"),
    # slow: the other two pairs (each ~2 s at load 3)
    tensor_parallel.crossed_split_cases({"plain": 1.0, "scaled": 20.0}, default=("plain", "scaled")),
)  # fmt: skip
def test_a_split_model_imports_the_unsplit_models_whole_tensors(
    written, weight_scale, expert_parallel, model_parallel
):
    """The import on the smoke model split over 2 logical devices (`--expert_parallel=2`: each
    routed expert written into its replica's shard; `--model_parallel=2`: MLA's
    up-projections, its output and the vocabulary) gives every variable the unsplit import's
    whole tensor, bit for bit; the parametrized model (the mini's) stores each replica's own
    shard divided by s (`ScaledWeights.store_scaled`), not the first replica's everywhere."""
    _, config, path, _ = written
    bench = tensor_parallel.smoke(DeepseekV3Benchmark, weight_scale=weight_scale)
    assert bench.config.model == dataclasses.replace(config, weight_scale=weight_scale)

    def load(model):
        checkpoint.load(path, model, bench.config.model)

    tensor_parallel.assert_split_import_is_whole(
        bench, load, min_split=6 if model_parallel > 1 else 3, expert_parallel=expert_parallel,
        model_parallel=model_parallel,
    )  # fmt: skip


@pytest.mark.numerics
def test_the_parametrized_model_imports_and_exports_the_plain_function(written, tmp_path):
    """The mini's `ScaledDeepseekV3` (weights stored / s): the plain checkpoint loads as the
    same function (`call` and `with_mtp`), stored at 1/s of the file's values, and exports the
    effective weights (the file a plain model reads)."""
    model, config, path, _ = written
    scaled_config = dataclasses.replace(config, weight_scale=40.0)
    scaled = _model(7, scaled_config)
    assert isinstance(scaled, model_lib.ScaledDeepseekV3)
    checkpoint.load(path, scaled, scaled_config)
    plain_kernel = model.lm_head.kernel.numpy()
    np.testing.assert_allclose(scaled.lm_head.kernel.numpy() * 40.0, plain_kernel, rtol=1e-6)
    want_main, (want_mtp,) = model.with_mtp(tf.constant(TOKENS))
    got_main, (got_mtp,) = scaled.with_mtp(tf.constant(TOKENS))
    assert_close(got_main, want_main, rtol=1e-5)
    assert_close(got_mtp, want_mtp, rtol=1e-5)
    assert_close(scaled(tf.constant(TOKENS)), want_main, rtol=1e-5)
    out = str(tmp_path / "again")
    checkpoint.export(scaled, scaled_config, out)
    again = _model(9)
    checkpoint.load(out, again, config)
    assert_close(again(tf.constant(TOKENS)), want_main, rtol=1e-5)


@pytest.mark.numerics
def test_fp8_block_scaled_weights_are_dequantized_per_128_block():
    rng = np.random.default_rng(3)
    weight = rng.normal(0, 1, (300, 200)).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.5, 2.0, (3, 2)).astype(np.float32)
    got = hf_checkpoint.dequantize_fp8(weight, scale)
    want = np.empty((300, 200), np.float32)
    for i in range(300):
        for j in range(200):
            want[i, j] = float(weight[i, j]) * scale[i // 128, j // 128]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="scale_inv"):
        hf_checkpoint.dequantize_fp8(weight, scale[:2])


def test_an_fp8_checkpoint_imports_as_its_dequantized_weights(written, tmp_path):
    model, config, path, _ = written
    fp8 = _copy(path, str(tmp_path / "fp8"))
    index = json.load(open(os.path.join(fp8, hf_checkpoint.INDEX)))
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    file = os.path.join(fp8, index["weight_map"][name])
    tensors = load_file(file)
    quantized = tensors[name].astype(ml_dtypes.float8_e4m3fn)
    tensors[name] = quantized
    tensors[name + "_scale_inv"] = np.full((1, 1), 0.5, np.float32)
    save_file(tensors, file)
    index["weight_map"][name + "_scale_inv"] = index["weight_map"][name]
    json.dump(index, open(os.path.join(fp8, hf_checkpoint.INDEX), "w"))
    other = _model(9)
    checkpoint.load(fp8, other, config)
    got = other.decoder_layers[1].attention.kv_b_proj.kernel.numpy()
    np.testing.assert_array_equal(got, quantized.astype(np.float32).T * 0.5)


def test_a_checkpoint_of_another_vocabulary_is_one_line(written, tmp_path):
    _, config, path, _ = written
    bad = _copy(path, str(tmp_path / "vocab"))
    hf = json.load(open(os.path.join(bad, "config.json")))
    hf["vocab_size"] = 129_280  # DeepSeek's own tokenizer
    json.dump(hf, open(os.path.join(bad, "config.json"), "w"))
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(bad, _model(1), config)
    assert "vocab_size" in _one_line(e) and "129280" in str(e.value)


def test_a_missing_shard_is_one_line(written, tmp_path):
    _, config, path, _ = written
    bad = _copy(path, str(tmp_path / "missing"))
    os.remove(os.path.join(bad, "model-00002-of-00003.safetensors"))
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(bad, _model(1), config)
    assert "model-00002-of-00003.safetensors" in _one_line(e) and "missing" in str(e.value)


def test_a_truncated_shard_is_one_line(written, tmp_path):
    _, config, path, _ = written
    bad = _copy(path, str(tmp_path / "truncated"))
    file = os.path.join(bad, "model-00003-of-00003.safetensors")
    os.truncate(file, os.path.getsize(file) - 100)
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(bad, _model(1), config)
    assert "model-00003-of-00003" in _one_line(e) and "truncated" in str(e.value)


def test_a_tensor_of_the_wrong_shape_is_one_line_naming_it(written, tmp_path):
    _, config, path, _ = written
    bad = _copy(path, str(tmp_path / "shape"))
    index = json.load(open(os.path.join(bad, hf_checkpoint.INDEX)))["weight_map"]
    name = "model.layers.2.mlp.experts.3.up_proj.weight"
    file = os.path.join(bad, index[name])
    tensors = load_file(file)
    tensors[name] = tensors[name][:, :-1].copy()
    save_file(tensors, file)
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(bad, _model(1), config)
    assert name in _one_line(e) and "shape" in str(e.value) and file in str(e.value)
