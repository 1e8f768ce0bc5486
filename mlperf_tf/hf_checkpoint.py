"""Provides the Hugging Face checkpoint import every benchmark that starts from a released model
shares: the folder's index (`model.safetensors.index.json`, else its `*.safetensors`), one shard
read at a time, FP8 block-scaled weights dequantized, name maps declared by each benchmark, and
one-line errors naming the tensor and the file.

A benchmark declares what its model holds as a list of `Entry`s (a Hugging Face tensor name, the
target's shape, how the tensor becomes it: `as_is`, `transposed` for a torch Linear weight
[out, in] into a Keras kernel [in, out]); `HFCheckpoint.load` reads them grouped by shard (each
shard opened once, nothing of another shard in memory) and hands each converted tensor to the
caller's `assign` (`assign` writes a variable, or one expert's slice of a stacked one). A
model built on a mesh that splits tensors (`--model_parallel`, `--expert_parallel`) imports
as the unsplit one: the name map asks for whole shapes (`whole_shape`) and `assign` hands each
replica its shard of each tensor (`mlperf_tf.parallel.layout.assign_whole`, and
`assign_whole_row` for one expert of a stacked weight), so the whole model is never held on
one device, only one tensor of it on the host. The config check (`check_config`) compares a
checkpoint's `config.json` with the model's fields, one named field per error.

The shard reader parses the safetensors format itself (an 8-byte little-endian header length, a
JSON header of dtype, shape and byte offsets, the data; huggingface/safetensors' README): the
`safetensors` package's NumPy and TensorFlow readers have no FP8 type, and DeepSeek's release
stores its projections as `float8_e4m3fn` with a `<name>_scale_inv` float32 [ceil(out/128),
ceil(in/128)] beside each (`inference/fp8_cast_bf16.py` and `kernel.py` `weight_dequant`:
`weight * scale_inv` per 128 x 128 block). A shard shorter than its header says is an error
naming it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct
from collections.abc import Callable, Iterable

import ml_dtypes
import numpy as np

from mlperf_tf.errors import UserError
from mlperf_tf.parallel import layout
from mlperf_tf.parallel.context import current_mesh

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
FP8_BLOCK = 128  # DeepSeek-V3's `weight_block_size` [128, 128]
SCALE_SUFFIX = "_scale_inv"
# safetensors dtype names -> NumPy (ml_dtypes for bfloat16 and the FP8 formats).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}  # fmt: skip
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


class CheckpointImportError(UserError):
    """A checkpoint that cannot be read as the configured model (one line, naming the file)."""


def read_json(path: str, what: str) -> dict:
    """A JSON object file; missing, invalid or not an object: one line naming `what` and it."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        raise CheckpointImportError(f"checkpoint {what} {path!r} is missing") from None
    except (OSError, ValueError) as e:
        raise CheckpointImportError(f"checkpoint {what} {path!r} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointImportError(f"checkpoint {what} {path!r} is not a JSON object")
    return value


def checked(tensor, shape: tuple[int, ...], name: str, where: str):
    """`tensor` when its shape is `shape`, else one line naming the tensor and `where`."""
    if tuple(tensor.shape) != tuple(shape):
        raise CheckpointImportError(
            f"checkpoint {where!r}: tensor {name!r} has shape {list(tensor.shape)}, the model "
            f"needs {list(shape)} (Keras layout)"
        )
    return tensor


def check_config(config: dict, expected: dict, path: str, *, defaults: dict | None = None,
                 hint: str = "") -> None:  # fmt: skip
    """Raises CheckpointImportError naming the first key of `expected` whose value in `config`
    (or `defaults`, where the file omits it) differs: the checkpoint is another model's."""
    defaults = defaults or {}
    for key, want in expected.items():
        have = config.get(key, defaults.get(key, "missing"))
        same = (
            abs(float(have) - float(want)) <= 1e-9 * max(1.0, abs(float(want)))
            if isinstance(want, float) and isinstance(have, (int, float))
            else have == want
        )
        if not same:
            raise CheckpointImportError(
                f"checkpoint config {path!r}: `{key}` is {have!r}, the model's is {want!r}"
                + (f" ({hint})" if hint else "")
            )


class Shard:
    """One safetensors file, read tensor by tensor (its header parsed once; see the module)."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise CheckpointImportError(f"checkpoint shard {path!r} is missing")
        size = os.path.getsize(path)
        try:
            with open(path, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > size - 8:
                    raise ValueError(f"header of {length} bytes in a file of {size}")
                header = json.loads(handle.read(length))
        except (OSError, ValueError, struct.error) as e:
            raise CheckpointImportError(
                f"checkpoint shard {path!r} is not a readable safetensors file ({e})"
            ) from None
        header.pop("__metadata__", None)
        self.start = 8 + length
        self.header = header
        end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
        if self.start + end > size:
            raise CheckpointImportError(
                f"checkpoint shard {path!r} is truncated: {size} bytes, its header needs "
                f"{self.start + end}"
            )

    def keys(self) -> list[str]:
        return list(self.header)

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` as NumPy, in its stored dtype."""
        entry = self.header.get(name)
        if entry is None:
            raise CheckpointImportError(f"checkpoint shard {self.path!r} has no tensor {name!r}")
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise CheckpointImportError(
                f"checkpoint shard {self.path!r}: tensor {name!r} has dtype {entry['dtype']}, "
                "which the import does not read"
            )
        begin, end = (int(x) for x in entry["data_offsets"])
        with open(self.path, "rb") as handle:
            handle.seek(self.start + begin)
            data = handle.read(end - begin)
        shape = tuple(int(x) for x in entry["shape"])
        if len(data) != end - begin or np.dtype(dtype).itemsize * int(np.prod(shape)) != len(data):
            raise CheckpointImportError(
                f"checkpoint shard {self.path!r}: tensor {name!r} is truncated or mis-sized"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)


def dequantize_fp8(weight: np.ndarray, scale_inv: np.ndarray, block: int = FP8_BLOCK) -> np.ndarray:
    """float32 `weight` [out, in] (FP8) x its per-block `scale_inv` [ceil(out/b), ceil(in/b)]
    (DeepSeek's `weight_dequant`: every b x b block times its one scale)."""
    rows, cols = weight.shape
    want = (-(-rows // block), -(-cols // block))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv shape {list(scale_inv.shape)}, expected {list(want)}")
    scale = np.repeat(np.repeat(scale_inv.astype(np.float32), block, 0), block, 1)
    return weight.astype(np.float32) * scale[:rows, :cols]


def as_is(t: np.ndarray) -> np.ndarray:
    return t


def transposed(t: np.ndarray) -> np.ndarray:
    """A torch Linear weight [out, in] as a Keras kernel [in, out]."""
    return np.ascontiguousarray(t.T)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of a benchmark's name map: the Hugging Face `name`, the `shape` the model
    needs after `convert`, and `target`, the caller's key of where it goes (e.g. a variable
    path, or (variable path, expert index) for a stacked expert)."""

    name: str
    shape: tuple[int, ...]
    target: object
    convert: Callable[[np.ndarray], np.ndarray] = as_is


class HFCheckpoint:
    """A Hugging Face checkpoint folder: `config.json`, `model.safetensors.index.json` (else
    every `*.safetensors` of the folder) and its shards.

    Raises (constructor):
      CheckpointImportError: not a folder, no shards, a shard the index names is missing.
    """

    def __init__(self, directory: str):
        if not os.path.isdir(directory):
            raise CheckpointImportError(f"checkpoint {directory!r} is not a folder")
        self.directory = directory
        index_path = os.path.join(directory, INDEX)
        if os.path.exists(index_path):
            weight_map = read_json(index_path, "index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointImportError(f"checkpoint index {index_path!r} has no weight_map")
            self.weight_map = {k: os.path.join(directory, v) for k, v in weight_map.items()}
            for path in sorted(set(self.weight_map.values())):
                if not os.path.isfile(path):
                    raise CheckpointImportError(
                        f"checkpoint shard {path!r} (named by {INDEX}) is missing"
                    )
        else:
            files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
            if not files:
                raise CheckpointImportError(f"checkpoint {directory!r} has no *.safetensors")
            self.weight_map = {}
            for path in files:
                self.weight_map.update(dict.fromkeys(Shard(path).keys(), path))

    def config(self) -> dict:
        """Its `config.json`."""
        return read_json(os.path.join(self.directory, CONFIG), "config")

    def load(self, entries: Iterable[Entry], assign: Callable[[Entry, np.ndarray], None]) -> int:
        """Reads every entry's tensor, shard by shard (each opened once, in file order),
        dequantizes FP8 weights with their `_scale_inv`, converts it and checks its shape and
        that it is a float tensor, then calls `assign(entry, float32 array)`.

        Returns:
          The number of tensors assigned.

        Raises:
          CheckpointImportError: a tensor missing, of another shape or dtype, or unreadable.
        """
        by_shard: dict[str, list[Entry]] = {}
        for entry in entries:
            path = self.weight_map.get(entry.name)
            if path is None:
                raise CheckpointImportError(
                    f"checkpoint {self.directory!r} has no tensor {entry.name!r} (the model's "
                    "name map needs it)"
                )
            by_shard.setdefault(path, []).append(entry)
        count = 0
        for path in sorted(by_shard):
            shard = Shard(path)
            for entry in by_shard[path]:
                assign(entry, self._converted(shard, entry))
                count += 1
        return count

    def _converted(self, shard: Shard, entry: Entry) -> np.ndarray:
        if shard.dtype(entry.name) not in FLOAT_DTYPES:
            raise CheckpointImportError(
                f"checkpoint shard {shard.path!r}: tensor {entry.name!r} has dtype "
                f"{shard.dtype(entry.name)}, the model needs floats"
            )
        tensor = shard.read(entry.name)
        if shard.dtype(entry.name).startswith("F8"):
            scale_name = entry.name + SCALE_SUFFIX
            scale_path = self.weight_map.get(scale_name)
            if scale_path is None:
                raise CheckpointImportError(
                    f"checkpoint shard {shard.path!r}: FP8 tensor {entry.name!r} has no "
                    f"{scale_name!r}"
                )
            scale = (shard if scale_path == shard.path else Shard(scale_path)).read(scale_name)
            try:
                tensor = dequantize_fp8(tensor, scale)
            except ValueError as e:
                raise CheckpointImportError(
                    f"checkpoint shard {shard.path!r}: tensor {scale_name!r}: {e}"
                ) from None
        tensor = entry.convert(tensor.astype(np.float32))
        return checked(tensor, entry.shape, entry.name, shard.path)


def whole_shape(variable) -> tuple[int, ...]:
    """`variable`'s whole shape on the ambient mesh (a split variable holds one shard of it):
    the shape a name map's `Entry` asks of the checkpoint's tensor."""
    mesh = current_mesh()
    if mesh is None:
        return tuple(int(d) for d in variable.shape)
    return tuple(int(d) for d in layout.whole_shape(variable, mesh))


def assign(entry: Entry, value: np.ndarray) -> None:
    """Writes a converted tensor into `entry.target` (`write`)."""
    write(entry.target, value)


def write(target, value: np.ndarray) -> None:
    """Writes a whole tensor into `target` on the ambient mesh (cross-replica context): a
    variable, each replica its shard; or (stacked variable, index) for one expert of an
    [E, ...] weight (the backing variable's slice, so no whole [E, ...] copy is made)."""
    mesh = current_mesh()
    if isinstance(target, tuple):
        variable, index = target
        layout.assign_whole_row(variable, index, value, mesh)
    else:
        layout.assign_whole(target, value, mesh)
