"""Provides the Llama 2 base with LoRA adapters: `mlperf_tf.lm`'s blocks in Llama 2's
configuration (plain RoPE base 10,000, grouped-query attention with the MLCommons checkpoint's
fused `qkv_proj`, SwiGLU, RMSNorm, untied output projection, no biases), adapters
(`mlperf_tf.layers.lora`) on the projections `LoraConfig.targets` names, the base frozen and held
in `model.base_dtype`, and the base's weights loaded from the suite checkpoint
(`checkpoint.SuiteCheckpoint`), each replica reading only its shard of every tensor.
"""

from __future__ import annotations

import keras
import numpy as np

from benchmarks.llama2_70b_lora.checkpoint import SuiteCheckpoint
from benchmarks.llama2_70b_lora.config import ModelConfig
from mlperf_tf.layers import lora as lora_lib
from mlperf_tf.layers.lora import LoraConfig
from mlperf_tf.lm.attention import fuse_qkv
from mlperf_tf.lm.decoder import DecoderModel
from mlperf_tf.spmd import assign_shards, current_mesh, layout_of

MODEL_NAME = "llama2"


def _projection(block, name: str):
    """Block's projection `name` (attention's q/k/v/qkv/o, the MLP's gate/up/down) or None."""
    return getattr(block.attention, name, None) or getattr(block.mlp, name, None)


def _in_features(config: ModelConfig, name: str) -> int:
    if name == "o_proj":
        return config.num_attention_heads * config.head_dim
    if name == "down_proj":
        return config.intermediate_size
    return config.hidden_size


def build_model(
    model_config: ModelConfig, lora_config: LoraConfig, *, seed: int = 0
) -> DecoderModel:
    """The built Llama 2 of `model_config` with adapters, base frozen, on the ambient mesh.

    The base's weights are random until `load_base` fills them; the adapters start at B = 0,
    so the model is the base at step 0.

    Raises:
      ConfigError: `lora_config.targets` names a projection the blocks do not have.
    """
    model = DecoderModel(model_config, name=MODEL_NAME)
    block0 = model.decoder_layers[0]
    names = [n for n in ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                         "up_proj", "down_proj") if _projection(block0, n) is not None]  # fmt: skip
    lora_lib.check_targets(lora_config, names)
    if model_config.base_dtype != "float32":
        # The frozen base computes and holds its weights in base_dtype (the reference runs the
        # bf16 model under bf16 autocast); the norms stay float32 (its
        # peft_module_casting_to_bf16) and the adapters follow the run's policy.
        policy = keras.DTypePolicy(model_config.base_dtype)
        frozen = [model, model.token_embedding] + [model.lm_head] * hasattr(model, "lm_head")
        for block in model.decoder_layers:
            frozen += [block, block.attention, block.mlp]
            frozen += [_projection(block, n) for n in names]
        for layer in frozen:
            layer.dtype_policy = policy
    adapters = []
    for i, block in enumerate(model.decoder_layers):
        for t, name in enumerate(lora_config.targets):
            linear = _projection(block, name)
            adapter = lora_lib.attach(linear, lora_config, seed=seed * 7919 + i * 31 + t)
            adapter.dtype_policy = keras.mixed_precision.global_policy()
            adapters.append((linear, _in_features(model_config, name)))
    model.build()
    for linear, in_features in adapters:
        lora_lib.build_adapter(linear, in_features)
    lora_lib.freeze_base(model)
    return model


def _reader(ckpt: SuiteCheckpoint, name: str, variable):
    """shard index -> that shard of tensor `name`, read alone (along the variable's split)."""
    layout = layout_of(variable)

    def read(index: int):
        if not layout.split:
            return ckpt.read(name)
        width = variable.shape[layout.split_axis]
        key = [slice(None)] * len(variable.shape)
        key[layout.split_axis] = slice(index * width, (index + 1) * width)
        return ckpt.read(name, tuple(key))

    return read


def _qkv_reader(ckpt: SuiteCheckpoint, prefix: str, variable, config: ModelConfig):
    """shard index -> that shard of the fused q/k/v kernel in Megatron's grouped order: a model
    shard holds whole key/value heads, so its shard is the fuse of its q, k and v columns."""
    layout = layout_of(variable)
    shards = 1
    if layout.split:
        shards = (config.qkv_width) // variable.shape[1]
    d = config.head_dim
    q_width = config.num_attention_heads * d // shards
    kv_width = config.num_key_value_heads * d // shards

    def read(index: int):
        def part(name, width):
            return ckpt.read(
                prefix + name, (slice(None), slice(index * width, (index + 1) * width))
            )

        q, k, v = part("q_proj", q_width), part("k_proj", kv_width), part("v_proj", kv_width)
        return fuse_qkv(
            np.asarray(q), np.asarray(k), np.asarray(v),
            num_kv_heads=config.num_key_value_heads // shards, head_dim=d,
        )  # fmt: skip

    return read


def load_base(model: DecoderModel, directory: str, config: ModelConfig) -> int:
    """Loads the suite checkpoint `directory` into the base (cross-replica context, ambient
    mesh): each replica reads its own shard of each tensor from the file. Returns the tensors
    loaded.

    Raises:
      CheckpointImportError: the checkpoint is missing, unreadable or of another model.
    """
    ckpt = SuiteCheckpoint(directory, config)
    mesh = current_mesh()
    pairs = [(model.token_embedding.embeddings, "embed_tokens")]
    for i, block in enumerate(model.decoder_layers):
        p = f"layers.{i}."
        pairs.append((block.attention_norm.scale, p + "input_layernorm"))
        if config.fused_qkv:
            kernel = block.attention.qkv_proj.kernel
            assign_shards(kernel, _qkv_reader(ckpt, p, kernel, config), mesh)
        else:
            pairs += [
                (getattr(block.attention, n).kernel, p + n) for n in ("q_proj", "k_proj", "v_proj")
            ]
        pairs.append((block.attention.o_proj.kernel, p + "o_proj"))
        pairs.append((block.mlp_norm.scale, p + "post_attention_layernorm"))
        pairs += [
            (getattr(block.mlp, n).kernel, p + n) for n in ("gate_proj", "up_proj", "down_proj")
        ]
    pairs.append((model.final_norm.scale, "norm"))
    pairs.append((model.lm_head.kernel, "lm_head"))
    for variable, name in pairs:
        assign_shards(variable, _reader(ckpt, name, variable), mesh)
    return len(pairs) + (config.num_hidden_layers if config.fused_qkv else 0)
