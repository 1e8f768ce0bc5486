"""Tests of the base checkpoint import (`benchmarks.llama2_70b_lora.checkpoint`): both source
layouts give the same suite checkpoint; bad input is one line and leaves nothing behind."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama2_70b_lora import checkpoint
from benchmarks.llama2_70b_lora.config import tiny
from tests.benchmarks.llama2_70b_lora.hf_checkpoints import hf_config, write_hf_checkpoint

MODEL = tiny(64)


def _leftovers(parent):
    return [n for n in os.listdir(parent) if ".partial-" in n]


@pytest.mark.parametrize("fused", [False, True])
def test_import_both_layouts_to_keras_kernels(tmp_path, fused):
    weights = write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=fused)
    summary = checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL,
                                           shard_bytes=20_000)  # fmt: skip
    assert summary["source"] == ("fused_qkv" if fused else "hf")
    assert summary["shards"] > 1
    ckpt = checkpoint.SuiteCheckpoint(str(tmp_path / "base"), MODEL)
    for part in ("q_proj", "k_proj", "v_proj"):
        np.testing.assert_array_equal(
            ckpt.read(f"layers.1.{part}").numpy(),
            weights[f"model.layers.1.self_attn.{part}.weight"].T,
        )
    np.testing.assert_array_equal(ckpt.read("lm_head").numpy(), weights["lm_head.weight"].T)
    np.testing.assert_array_equal(
        ckpt.read("embed_tokens").numpy(), weights["model.embed_tokens.weight"]
    )
    # A slice is read alone: the second model shard's heads of k.
    half = MODEL.num_key_value_heads * MODEL.head_dim // 2
    np.testing.assert_array_equal(
        ckpt.read("layers.0.k_proj", (slice(None), slice(half, 2 * half))).numpy(),
        weights["model.layers.0.self_attn.k_proj.weight"].T[:, half:],
    )
    assert _leftovers(str(tmp_path)) == []


def test_bfloat16_kept(tmp_path):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=True, dtype=tf.bfloat16)
    checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL)
    ckpt = checkpoint.SuiteCheckpoint(str(tmp_path / "base"), MODEL)
    assert ckpt.read("layers.0.q_proj").dtype == tf.bfloat16


def _fails(tmp_path, match):
    with pytest.raises(checkpoint.CheckpointImportError, match=match) as info:
        checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL)
    assert "\n" not in str(info.value)
    assert not os.path.exists(tmp_path / "base")
    assert _leftovers(str(tmp_path)) == []


def test_corrupt_shard(tmp_path):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=False)
    path = tmp_path / "src" / "model-00002-of-00002.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    _fails(tmp_path, "model-00002-of-00002.safetensors.*not a readable safetensors")


def test_missing_shard(tmp_path):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=True)
    os.remove(tmp_path / "src" / "model-00001-of-00002.safetensors")
    _fails(tmp_path, "model-00001-of-00002.safetensors.*missing")


@pytest.mark.parametrize(
    "override, match",
    [({"hidden_size": 64}, "`hidden_size` is 64, the model's is 32"),
     ({"num_key_value_heads": 4}, "`num_key_value_heads` is 4"),
     ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "`rope_scaling`")],
)  # fmt: skip
def test_config_of_another_model(tmp_path, override, match):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=False,
                        config=hf_config(MODEL, **override))  # fmt: skip
    _fails(tmp_path, match)


def test_tensor_of_another_shape(tmp_path):
    """config.json says this model, a tensor does not (a shard of another checkpoint)."""
    write_hf_checkpoint(str(tmp_path / "src"), tiny(96), fused=False, config=hf_config(MODEL))
    _fails(tmp_path, "embed_tokens.*shape \\[96, 32\\], the model needs \\[64, 32\\]")


def test_existing_out_dir_refused(tmp_path):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=False)
    os.makedirs(tmp_path / "base")
    with pytest.raises(checkpoint.CheckpointImportError, match="already exists"):
        checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL)


def test_suite_checkpoint_of_another_model(tmp_path):
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=False)
    checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL)
    with pytest.raises(checkpoint.CheckpointImportError, match="model.vocab_size is 64"):
        checkpoint.SuiteCheckpoint(str(tmp_path / "base"), tiny(128))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(hf_config(MODEL)))
    with pytest.raises(checkpoint.CheckpointImportError, match="not a suite checkpoint"):
        checkpoint.SuiteCheckpoint(str(tmp_path / "other"), MODEL)


def test_config_written_before_a_field_was_added_still_loads_at_its_default(tmp_path):
    """A base cached before `DecoderConfig` gained `window_pattern` (null then, [] now) and
    `moe.dispatch` is this model; a missing field whose run value is not its default is not."""
    write_hf_checkpoint(str(tmp_path / "src"), MODEL, fused=False)
    checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), MODEL)
    path = tmp_path / "base" / "config.json"
    config = json.loads(path.read_text())
    config["model"]["window_pattern"] = None
    del config["model"]["moe"]["dispatch"]
    path.write_text(json.dumps(config))
    checkpoint.SuiteCheckpoint(str(tmp_path / "base"), MODEL)
    del config["model"]["hidden_size"]  # no default: never assumed
    path.write_text(json.dumps(config))
    with pytest.raises(checkpoint.CheckpointImportError, match="model.hidden_size is None"):
        checkpoint.SuiteCheckpoint(str(tmp_path / "base"), MODEL)
    config["model"]["hidden_size"] = MODEL.hidden_size
    config["model"]["moe"]["num_experts"] = 4  # present and another value: another model
    path.write_text(json.dumps(config))
    with pytest.raises(checkpoint.CheckpointImportError, match="model.moe is"):
        checkpoint.SuiteCheckpoint(str(tmp_path / "base"), MODEL)
