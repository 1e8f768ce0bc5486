"""Provides the base-model checkpoint import: the MLCommons fused-qkv Llama 2 checkpoint and the
plain Hugging Face Llama 2 layout (safetensors shards + `config.json`) to the suite's checkpoint,
and the suite checkpoint's reader, which reads a tensor whole or only a slice of it.

The suite's checkpoint (what `mlperf-tf prepare llama2_70b_lora --checkpoint=DIR` writes to
`OUT/base`): `config.json` (`{"format": FORMAT, "model": the ModelConfig's fields, "source":
"fused_qkv" | "hf"}`), `index.json` (`{"weight_map": name -> shard file}`) and
`model-00000-of-0000N.safetensors` shards of whole tensors in Keras' layout ([in, out] kernels)
under the names of `tensor_shapes`, the dtype of the source (bfloat16 for the real ones). q, k and
v are kept apart (the MLCommons checkpoint's `qkv_proj`, q|k|v stacked along its output rows, is
split), so a replica under `--model_parallel=M` reads just its heads of each with
`safe_open(...).get_slice` and the model fuses them in its own order.

The conversion holds one source tensor (one layer's fused qkv at most: 168 MB for 70B) and one
output shard (`shard_bytes`) at a time; it is written into a temporary sibling folder renamed
at the end, so an error (a corrupt or missing shard, a config or tensor of another model) leaves
nothing half-written, and is one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator

import tensorflow as tf
from safetensors import SafetensorError, safe_open
from safetensors.tensorflow import save_file

from benchmarks.llama2_70b_lora.config import ModelConfig
from mlperf_tf import hf_checkpoint, prepare_cli
from mlperf_tf.hf_checkpoint import CONFIG, CheckpointImportError, check_config, read_json

FORMAT = "mlperf_tf.llama/1"
INDEX = "index.json"
SHARD_BYTES = 2 << 30


def tensor_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The suite checkpoint's tensors and their whole shapes, in Keras' [in, out] layout."""
    h, f, v = model.hidden_size, model.intermediate_size, model.vocab_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_key_value_heads * model.head_dim
    shapes = {"embed_tokens": (v, h)}
    for i in range(model.num_hidden_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm": (h,), p + "q_proj": (h, q), p + "k_proj": (h, kv),
            p + "v_proj": (h, kv), p + "o_proj": (q, h), p + "post_attention_layernorm": (h,),
            p + "gate_proj": (h, f), p + "up_proj": (h, f), p + "down_proj": (f, h),
        })  # fmt: skip
    shapes.update({"norm": (h,), "lm_head": (h, v)})
    return shapes


# ---- the Hugging Face / MLCommons source ---------------------------------------------------------
def _open(path: str):
    """`safe_open` of one shard, its errors one line naming the file."""
    if not os.path.isfile(path):
        raise CheckpointImportError(f"checkpoint shard {path!r} is missing")
    try:
        return safe_open(path, framework="tf")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointImportError(
            f"checkpoint shard {path!r} is not a readable safetensors file ({e})"
        ) from None


def check_hf_config(config: dict, model: ModelConfig, path: str) -> None:
    """Raises CheckpointImportError naming the first field of a Hugging Face `config.json` that
    describes another model than `model` (defaults as `transformers.LlamaConfig` has them)."""
    heads = config.get("num_attention_heads")
    expected = {
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "vocab_size": model.vocab_size,
        "rms_norm_eps": model.rms_norm_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    }
    defaults = {"num_key_value_heads": heads, "rope_theta": 10_000.0, "rope_scaling": None,
                "tie_word_embeddings": False}  # fmt: skip
    check_config(
        config, expected, path, defaults=defaults,
        hint="set --config.model.* to import another Llama",
    )  # fmt: skip
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads)
    if head_dim != model.head_dim:
        raise CheckpointImportError(
            f"checkpoint config {path!r}: head_dim is {head_dim}, the model's is {model.head_dim}"
        )


class HFSource:
    """A Hugging Face Llama folder: `config.json` and safetensors shards (listed by
    `model.safetensors.index.json`, else every `*.safetensors` in the folder), with either the
    MLCommons fused `self_attn.qkv_proj` or Hugging Face's separate q/k/v projections."""

    def __init__(self, directory: str, model: ModelConfig):
        if not os.path.isdir(directory):
            raise CheckpointImportError(f"--checkpoint {directory!r} is not a folder")
        self.directory = directory
        self.model = model
        config_path = os.path.join(directory, CONFIG)
        check_hf_config(read_json(config_path, "config"), model, config_path)
        # The index (or the folder's shards) and its missing-shard check: the shared importer's.
        self.weight_map = hf_checkpoint.HFCheckpoint(directory).weight_map
        self.fused = any(k.endswith("self_attn.qkv_proj.weight") for k in self.weight_map)

    @property
    def layout(self) -> str:
        return "fused_qkv" if self.fused else "hf"

    def read(self, name: str) -> tf.Tensor:
        """The source tensor `name`, whole (one shard opened for it)."""
        path = self.weight_map.get(name)
        if path is None:
            raise CheckpointImportError(
                f"checkpoint {self.directory!r} has no tensor {name!r} (a {self.layout} Llama "
                "checkpoint of this model has one)"
            )
        with _open(path) as handle:
            try:
                return handle.get_tensor(name)
            except (SafetensorError, ValueError) as e:
                raise CheckpointImportError(
                    f"checkpoint shard {path!r}: tensor {name!r} is unreadable ({e})"
                ) from None

    def _kernel(self, name: str, shape: tuple[int, int]) -> tf.Tensor:
        """A torch Linear weight [out, in] as a Keras kernel [in, out], its shape checked."""
        return _checked(tf.transpose(self.read(name)), shape, name, self.directory)

    def tensors(self) -> Iterator[tuple[str, tf.Tensor]]:
        """(suite name, tensor in Keras' layout) for every tensor of `tensor_shapes`, in order."""
        shapes = tensor_shapes(self.model)
        m = self.model
        yield "embed_tokens", _checked(
            self.read("model.embed_tokens.weight"), shapes["embed_tokens"], "embed_tokens",
            self.directory,
        )  # fmt: skip
        for i in range(m.num_hidden_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            yield dst + "input_layernorm", self._vector(src + "input_layernorm.weight")
            if self.fused:
                q = m.num_attention_heads * m.head_dim
                kv = m.num_key_value_heads * m.head_dim
                fused = self._kernel(src + "self_attn.qkv_proj.weight", (m.hidden_size, q + 2 * kv))
                yield dst + "q_proj", fused[:, :q]
                yield dst + "k_proj", fused[:, q : q + kv]
                yield dst + "v_proj", fused[:, q + kv :]
            else:
                for part in ("q_proj", "k_proj", "v_proj"):
                    yield dst + part, self._kernel(src + f"self_attn.{part}.weight",
                                                   shapes[dst + part])  # fmt: skip
            yield (
                dst + "o_proj",
                self._kernel(src + "self_attn.o_proj.weight", shapes[dst + "o_proj"]),
            )
            yield (
                dst + "post_attention_layernorm",
                self._vector(src + "post_attention_layernorm.weight"),
            )
            for part in ("gate_proj", "up_proj", "down_proj"):
                yield dst + part, self._kernel(src + f"mlp.{part}.weight", shapes[dst + part])
        yield "norm", self._vector("model.norm.weight")
        yield "lm_head", self._kernel("lm_head.weight", shapes["lm_head"])

    def _vector(self, name: str) -> tf.Tensor:
        return _checked(self.read(name), (self.model.hidden_size,), name, self.directory)


_checked = hf_checkpoint.checked  # the shared shape check, one line naming the tensor


# ---- the suite's checkpoint ----------------------------------------------------------------------
@contextlib.contextmanager
def staged(out_dir: str) -> Iterator[str]:
    """A temporary sibling folder of `out_dir`, renamed to it when the block succeeds, removed
    when it fails (`mlperf_tf.prepare_cli.staged_folder`): a reader never sees a half-written
    checkpoint; an existing `out_dir` is an error."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        raise CheckpointImportError(f"{out_dir!r} already exists; remove it to import again")
    with prepare_cli.staged_folder(out_dir) as staging:
        yield staging


def write(tensors, out_dir: str, model: ModelConfig, *, source: str,
          shard_bytes: int = SHARD_BYTES) -> dict:  # fmt: skip
    """Writes (name, tensor) pairs as the suite checkpoint `out_dir` (staged; see `staged`).

    Returns:
      A summary: tensors, shards, bytes, source.
    """
    expected = tensor_shapes(model)
    with staged(out_dir) as staging:
        names, shard, size, files, total = [], {}, 0, [], 0
        weight_map = {}

        def flush():
            nonlocal shard, size
            if shard:
                path = os.path.join(staging, f"model-{len(files):05d}.safetensors")
                save_file(shard, path, metadata={"format": "tf"})
                files.append(path)
                for name in shard:
                    weight_map[name] = os.path.basename(path)
                shard, size = {}, 0

        for name, tensor in tensors:
            _checked(tensor, expected[name], name, "source")
            nbytes = tensor.shape.num_elements() * tensor.dtype.size
            if shard and size + nbytes > shard_bytes:
                flush()
            shard[name] = tf.identity(tensor)  # a contiguous copy of a slice
            size += nbytes
            total += nbytes
            names.append(name)
        flush()
        missing = sorted(set(expected) - set(names))
        if missing:
            raise CheckpointImportError(f"the import wrote no {missing[0]!r}")
        # Final names carry the shard count (Hugging Face's `-of-` naming).
        renamed = {}
        for i, path in enumerate(files):
            final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
            os.rename(path, os.path.join(staging, final))
            renamed[os.path.basename(path)] = final
        weight_map = {k: renamed[v] for k, v in weight_map.items()}
        with open(os.path.join(staging, INDEX), "w", encoding="utf-8") as handle:
            json.dump({"weight_map": weight_map}, handle, indent=1)
        with open(os.path.join(staging, CONFIG), "w", encoding="utf-8") as handle:
            json.dump({"format": FORMAT, "model": _as_json(model), "source": source},
                      handle, indent=1)  # fmt: skip
    return {"tensors": len(names), "shards": len(files), "bytes": total, "source": source}


def _as_json(model: ModelConfig) -> dict:
    """The model config's fields as `config.json` holds them (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(model)))


_UNSET = object()


def _defaults_json(cls) -> dict:
    """{field: its default as `config.json` would hold it} for the fields of dataclass `cls`
    that have one (nested dataclasses: their own fields' defaults)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            out[f.name] = _defaults_json(type(value))
        else:
            out[f.name] = json.loads(json.dumps(value))
    return out


def _differs(saved, want, default) -> bool:
    """Whether a saved config value is another model's than the run's `want`. A value the saved
    config lacks or holds as null (a field added, or its default changed, after the checkpoint
    was written) is the run's only when `want` is that field's default."""
    if isinstance(want, dict) and isinstance(saved, dict):
        defaults = default if isinstance(default, dict) else {}
        return any(
            _differs(saved.get(k, _UNSET), v, defaults.get(k, _UNSET)) for k, v in want.items()
        )
    if saved is _UNSET or saved is None:
        return want is not None and (default is _UNSET or want != default)
    return saved != want


def import_checkpoint(directory: str, out_dir: str, model: ModelConfig, **kwargs) -> dict:
    """Converts the Hugging Face or MLCommons checkpoint `directory` into the suite checkpoint
    `out_dir` (one line of error for a corrupt or missing shard or another model's config)."""
    source = HFSource(directory, model)
    return write(source.tensors(), out_dir, model, source=source.layout, **kwargs)


class SuiteCheckpoint:
    """Reads the suite checkpoint `directory`: whole tensors, or slices of them (each replica
    under `--model_parallel` reads its shard only, `safe_open(...).get_slice`).

    Raises (constructor):
      CheckpointImportError: no such checkpoint, another format, or a model other than `model`
        (fields compared one by one, `base_dtype` aside: the weights are cast on load).
    """

    def __init__(self, directory: str, model: ModelConfig):
        self.directory = directory
        config = read_json(os.path.join(directory, CONFIG), "config")
        if config.get("format") != FORMAT:
            raise CheckpointImportError(
                f"{directory!r} is not a suite checkpoint (format {config.get('format')!r}, "
                f"expected {FORMAT!r}: write it with `mlperf-tf prepare llama2_70b_lora "
                "--checkpoint=...`)"
            )
        saved = config.get("model", {})
        defaults = _defaults_json(type(model))
        for name, want in _as_json(model).items():
            value, default = saved.get(name, _UNSET), defaults.get(name, _UNSET)
            if name != "base_dtype" and _differs(value, want, default):
                raise CheckpointImportError(
                    f"base checkpoint {directory!r}: model.{name} is {saved.get(name)!r}, the "
                    f"run's is {want!r}"
                )
        self.weight_map = read_json(os.path.join(directory, INDEX), "index").get("weight_map", {})
        missing = sorted(set(tensor_shapes(model)) - set(self.weight_map))
        if missing:
            raise CheckpointImportError(f"base checkpoint {directory!r} has no {missing[0]!r}")

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> tf.Tensor:
        """Tensor `name`, or its `index` slice read alone from the shard file."""
        path = os.path.join(self.directory, self.weight_map[name])
        with _open(path) as handle:
            try:
                return handle.get_tensor(name) if index is None else handle.get_slice(name)[index]
            except (SafetensorError, ValueError) as e:
                raise CheckpointImportError(
                    f"base checkpoint shard {path!r}: tensor {name!r} is unreadable ({e})"
                ) from None
