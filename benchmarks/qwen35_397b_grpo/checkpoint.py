"""Provides Qwen3.5-397B-A17B's Hugging Face checkpoint layout: the `config.json` of a model
config (`hf_config`), its check (`check_hf_config`), the name map from Hugging Face tensor names
to the model's variables (`entries`) and the import through the shared importer (`load`,
`mlperf_tf.hf_checkpoint`), which `Qwen35GrpoBenchmark.restore_initial_weights` runs for
`--config.init_checkpoint` before `run_start`.

The names and layouts are transformers 5.25.0's (`models/qwen3_5_moe/modeling_qwen3_5_moe.py`,
`Qwen3_5MoeForConditionalGeneration`, and `conversion_mapping.py`): the language model under
`model.language_model.` (`embed_tokens`, `layers.{i}`, `norm`) and `lm_head` at the top;
layer i holds `input_layernorm`, `post_attention_layernorm` and either
`linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj}.weight`,
`linear_attn.conv1d.weight` [channels, 1, K], `linear_attn.dt_bias`, `linear_attn.A_log`,
`linear_attn.norm.weight` (Gated DeltaNet) or `self_attn.{q_proj, k_proj, v_proj,
o_proj}.weight` with `self_attn.{q_norm, k_norm}.weight` (gated attention: `q_proj` is [heads x
2 head_dim, hidden], each head's query then its output gate); the MoE block is
`mlp.gate.weight` [experts, hidden] (the router), `mlp.experts.gate_up_proj` [experts, 2 x
width, hidden] (each expert's gate rows, then its up rows: `chunk(2)`) and
`mlp.experts.down_proj` [experts, hidden, width], `mlp.shared_expert.{gate,up,down}_proj.weight`
and `mlp.shared_expert_gate.weight` [1, hidden]. A checkpoint with one tensor per expert,
`mlp.experts.{e}.{gate,up,down}_proj.weight` (the per-expert layout transformers' `qwen2_moe`
conversion merges on load), imports too. A dense model (no experts) has `mlp.{gate,up,down}_proj`
(`Qwen3_5ForConditionalGeneration`, keras-hub's `qwen3_5` converter).

Norms: `input_layernorm`, `post_attention_layernorm`, `q_norm`, `k_norm` and `norm` are
`Qwen3_5MoeRMSNorm`, which scales by (1 + w) from w = 0; ours scale by s from s = 1, so the
import adds 1. The DeltaNet's `linear_attn.norm` (`Qwen3_5MoeRMSNormGated`) scales by plain w
in both: imported as is.

Not read: the vision tower (`model.visual.*`) and the MTP head (`mtp.*`): the reference runs
the language path only with MTP off (`mtp_num_layers: 0`). Linear weights are torch's [out, in],
transposed into Keras kernels [in, out]. A model split over `--model_parallel` or
`--expert_parallel` imports the same whole tensors, each replica its shard (`hf_checkpoint`).
"""

from __future__ import annotations

import os

import keras
import numpy as np

from benchmarks.qwen35_397b_grpo.config import ModelConfig
from mlperf_tf import hf_checkpoint
from mlperf_tf.hf_checkpoint import Entry, transposed, whole_shape

PREFIX = "model.language_model."
ARCHITECTURE = "Qwen3_5MoeForConditionalGeneration"
DENSE_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"


def hf_config(model: ModelConfig) -> dict:
    """The Hugging Face `config.json` of `model` (`Qwen3_5MoeConfig`, its `text_config` the
    language model's; `Qwen3_5Config` when the model has no experts): what the release's file
    holds for the fields the language path reads."""
    moe = model.moe.enabled
    text = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": model.rms_norm_eps,
        "max_position_embeddings": model.max_position_embeddings,
        "tie_word_embeddings": model.tie_word_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": model.rope_theta,
            "partial_rotary_factor": model.rotary_dim / model.head_dim,
        },
        "full_attention_interval": model.full_attention_interval,
        "layer_types": _layer_types(model),
        "linear_num_key_heads": model.linear_num_key_heads,
        "linear_num_value_heads": model.linear_num_value_heads,
        "linear_key_head_dim": model.linear_key_head_dim,
        "linear_value_head_dim": model.linear_value_head_dim,
        "linear_conv_kernel_dim": model.linear_conv_kernel_dim,
    }
    if moe:
        text.update(
            num_experts=model.moe.num_experts, num_experts_per_tok=model.moe.top_k,
            moe_intermediate_size=model.moe.filter_size,
            shared_expert_intermediate_size=model.shared_expert_size,
        )  # fmt: skip
    else:
        text["intermediate_size"] = model.intermediate_size
    return {
        "architectures": [ARCHITECTURE if moe else DENSE_ARCHITECTURE],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "tie_word_embeddings": model.tie_word_embeddings,
        "text_config": text,
    }


def _layer_types(model: ModelConfig) -> list[str]:
    return [
        "linear_attention" if model.is_linear(i) else "full_attention"
        for i in range(model.num_hidden_layers)
    ]


def _text_fields(config: dict) -> dict:
    """The language model's fields of a `config.json`, flat: `text_config` (or the file itself,
    a text-only config), the RoPE settings out of `rope_parameters`, `layer_types` from
    `full_attention_interval` where the file omits them (transformers' default)."""
    text = dict(config.get("text_config", config))
    rope = text.get("rope_parameters") or {}
    text["rope_theta"] = rope.get("rope_theta", text.get("rope_theta", "missing"))
    text["partial_rotary_factor"] = rope.get(
        "partial_rotary_factor", text.get("partial_rotary_factor", 0.25)
    )
    if "layer_types" not in text and isinstance(text.get("num_hidden_layers"), int):
        every = text.get("full_attention_interval", 4)
        text["layer_types"] = [
            "full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(text["num_hidden_layers"])
        ]
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return text


# The fields a checkpoint must share with the run's model (the rest describe inference).
CHECKED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "layer_types", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "rope_theta", "partial_rotary_factor", "tie_word_embeddings",
)  # fmt: skip
MOE_FIELDS = (
    "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size",
)  # fmt: skip


def check_hf_config(config: dict, model: ModelConfig, path: str) -> None:
    """Raises CheckpointImportError naming the first field of `config.json` that is another
    model's (another size, another layer pattern, experts where the model has none)."""
    want = _text_fields(hf_config(model))
    fields = CHECKED_FIELDS + (MOE_FIELDS if model.moe.enabled else ("intermediate_size",))
    hf_checkpoint.check_config(
        _text_fields(config), {k: want[k] for k in fields}, path,
        hint="a checkpoint of another model; --config.model.* sets the model",
    )  # fmt: skip


def plus_one(t: np.ndarray) -> np.ndarray:
    """A (1 + w) RMSNorm weight (`Qwen3_5MoeRMSNorm`) as our scale s = 1 + w."""
    return t + 1.0


def conv_kernel(t: np.ndarray) -> np.ndarray:
    """The depthwise `conv1d.weight` [channels, 1, K] as our kernel [channels, K]."""
    return np.ascontiguousarray(t[:, 0, :])


def experts_transposed(t: np.ndarray) -> np.ndarray:
    """Stacked torch weights [experts, out, in] as stacked kernels [experts, in, out] (a view:
    the assignment copies each target once)."""
    return t.transpose(0, 2, 1)


def _mixer_entries(block, src: str) -> list[Entry]:
    """The token mixer's entries: the Gated DeltaNet's or the gated attention's."""
    a, out = block.attention, []

    def kernel(name, layer):
        out.append(Entry(src + name + ".weight", whole_shape(layer.kernel), layer.kernel,
                         transposed))  # fmt: skip

    def weight(name, variable, convert=hf_checkpoint.as_is):
        out.append(Entry(src + name, whole_shape(variable), variable, convert))

    if block.linear:
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
            kernel("linear_attn." + name, getattr(a, name))
        weight("linear_attn.conv1d.weight", a.conv_kernel, conv_kernel)
        weight("linear_attn.dt_bias", a.dt_bias)
        weight("linear_attn.A_log", a.A_log)
        weight("linear_attn.norm.weight", a.norm.scale)  # plain w (RMSNormGated)
        return out
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        kernel("self_attn." + name, getattr(a, name))
    weight("self_attn.q_norm.weight", a.q_norm.scale, plus_one)
    weight("self_attn.k_norm.weight", a.k_norm.scale, plus_one)
    return out


def _expert_entries(mlp, src: str, fused: bool) -> list[Entry]:
    """The routed experts: fused `gate_up_proj` / `down_proj` (targets (gate, up) and the down
    variable) or one tensor per expert (targets (variable, expert))."""
    e, h, f = whole_shape(mlp.w_gate)
    if fused:
        return [
            Entry(src + "mlp.experts.gate_up_proj", (e, h, 2 * f), (mlp.w_gate, mlp.w_up),
                  experts_transposed),
            Entry(src + "mlp.experts.down_proj", (e, f, h), mlp.w_down, experts_transposed),
        ]  # fmt: skip
    return [
        Entry(f"{src}mlp.experts.{i}.{part}.weight", whole_shape(var)[1:], (var, i), transposed)
        for part, var in (("gate_proj", mlp.w_gate), ("up_proj", mlp.w_up),
                          ("down_proj", mlp.w_down))
        for i in range(e)
    ]  # fmt: skip


def _block_entries(block, src: str, fused: bool) -> list[Entry]:
    """Entries of one `HybridDecoderBlock` under Hugging Face prefix `src`."""
    out = [Entry(src + "input_layernorm.weight", whole_shape(block.attention_norm.scale),
                 block.attention_norm.scale, plus_one)]  # fmt: skip
    out += _mixer_entries(block, src)
    out.append(Entry(src + "post_attention_layernorm.weight", whole_shape(block.mlp_norm.scale),
                     block.mlp_norm.scale, plus_one))  # fmt: skip
    mlp = block.mlp

    def kernel(name, layer):
        out.append(Entry(src + name + ".weight", whole_shape(layer.kernel), layer.kernel,
                         transposed))  # fmt: skip

    if not block.is_moe:
        for part in ("gate_proj", "up_proj", "down_proj"):
            kernel("mlp." + part, getattr(mlp, part))
        return out
    out.append(Entry(src + "mlp.gate.weight", whole_shape(mlp.router_kernel), mlp.router_kernel,
                     transposed))  # fmt: skip
    out += _expert_entries(mlp, src, fused)
    if block.shared_expert is not None:
        for part in ("gate_proj", "up_proj", "down_proj"):
            kernel("mlp.shared_expert." + part, getattr(block.shared_expert, part))
        kernel("mlp.shared_expert_gate", block.shared_expert_gate)
    return out


def entries(keras_model, model: ModelConfig, *, fused: bool = True) -> list[Entry]:
    """Qwen3.5's name map onto a built model of `model` (targets: a variable, (variable,
    expert) for one expert of a stacked [E, ...] weight, or (gate, up) for a fused
    `gate_up_proj`); `fused`: the experts as transformers stores them (see the module)."""
    out = [
        Entry(PREFIX + "embed_tokens.weight", (model.vocab_size, model.hidden_size),
              keras_model.token_embedding.embeddings)
    ]  # fmt: skip
    for i, block in enumerate(keras_model.decoder_layers):
        out += _block_entries(block, f"{PREFIX}layers.{i}.", fused)
    out.append(Entry(PREFIX + "norm.weight", (model.hidden_size,), keras_model.final_norm.scale,
                     plus_one))  # fmt: skip
    if not model.tie_word_embeddings:
        kernel = keras_model.lm_head.kernel
        out.append(Entry("lm_head.weight", whole_shape(kernel), kernel, transposed))
    return out


def _assign(entry: Entry, value: np.ndarray) -> None:
    """Writes a converted tensor into its variable(s): `hf_checkpoint.assign`, or the two
    halves of a fused `gate_up_proj` [E, hidden, 2 width] into (gate, up)."""
    target = entry.target
    if not (isinstance(target, tuple) and isinstance(target[1], keras.Variable)):
        hf_checkpoint.assign(entry, value)
        return
    gate, up = target
    width = whole_shape(gate)[-1]
    hf_checkpoint.write(gate, value[..., :width])
    hf_checkpoint.write(up, value[..., width:])


def has_fused_experts(source: hf_checkpoint.HFCheckpoint, model: ModelConfig) -> bool:
    """Whether the checkpoint stores its experts fused (transformers' layout) or one tensor per
    expert; the first MoE layer's names decide."""
    first = next((i for i in range(model.num_hidden_layers) if model.moe.is_moe(i)), None)
    return first is None or f"{PREFIX}layers.{first}.mlp.experts.0.gate_proj.weight" not in (
        source.weight_map
    )


def load(directory: str, keras_model, model: ModelConfig) -> int:
    """Imports the Qwen3.5 folder `directory` into `keras_model` (built from `model`): its
    `config.json` checked, its experts' layout found, then shard by shard.

    Returns:
      The number of tensors imported.

    Raises:
      CheckpointImportError: one line naming the field, file or tensor (`HFCheckpoint`,
        `check_hf_config`, `HFCheckpoint.load`).
    """
    source = hf_checkpoint.HFCheckpoint(directory)
    check_hf_config(source.config(), model, os.path.join(directory, hf_checkpoint.CONFIG))
    fused = has_fused_experts(source, model)
    return source.load(entries(keras_model, model, fused=fused), _assign)
