"""Provides `StageSlots`: the sharded update's optimizer slots laid out by pipeline stage.

Weight-update sharding (`summer.py`) gives each member of a sum group an even 1/n piece of every
variable's summed gradient and slots. With a `pipeline` axis the stages' gradients are already
apart: stage s computes the gradient of its own layers only (zero on the other stages). So the
update is sharded over the pipeline axis by the stage map instead of even slices: each variable
has one owner stage (`owners`), its gradient is summed over its layout's axes but `pipeline`
(the owner stage's data, expert, ... members), the owner's members update their even pieces of
it with their slot pieces, and one all-gather over the pipeline group (`exchange`) hands every
stage the others' new weights, so the weights stay mirrored (evaluation and checkpoints read any
replica's copy). A replica holds the slot pieces of its stage's variables only: Adam's moments
per replica are its stage's share, divided by the data axis as without a pipeline.

A distributed variable has one shape on every replica, and the stages own different variables:
the slots live in one flat sync-on-read buffer per slot name and dtype, of the largest stage's
piece count (`cols`), in which each replica keeps its stage's pieces one after the other
(`Piece` views, written back by `commit`); the buffer's tail is padding on the smaller stages.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class StageMap:
    """The stage map of a stage-sharded update (`GradientSummer.build(stages=...)`), found by
    `mlperf_tf.runner.pipeline.stage_owners`.

    Attributes:
      owners: per trainable variable, the stage that updates it: the one whose part reads it,
        the first of them for a variable several stages read.
      shared: the variables several stages read (a tied embedding, one an MTP head reads):
        their gradients are summed over the pipeline group before their owner's update.
    """

    owners: list[int]
    shared: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where variable `index`'s slot piece lies in its stage's buffers."""

    index: int
    offset: int
    cols: int


class Piece:
    """One variable's slot piece of a replica's buffer, as the optimizer's rule sees a slot:
    read as a tensor ([cols]), `assign`ed a new value (kept until `StageSlots.commit`)."""

    def __init__(self, value):
        self.value = value

    def assign(self, value):
        self.value = tf.convert_to_tensor(value)
        return self.value

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self.value, dtype=dtype, name=name)

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def shape(self):
        return self.value.shape


def _delegate(name: str):
    def method(self, *args):
        return getattr(self.value, name)(*args)

    return method


# The arithmetic the rules do on a slot (`m + (g - m) * c`, `m * mu`, ...), on its value.
for _name in ("add", "sub", "mul", "truediv", "pow"):
    for _fmt in ("__{}__", "__r{}__"):
        setattr(Piece, _fmt.format(_name), _delegate(_fmt.format(_name)))
Piece.__neg__ = _delegate("__neg__")


class StageSlots:
    """The slot buffers of a stage-sharded update (see the module docstring).

    Args:
      slot_names: the rule's slot names (`ShardedUpdate.slot_names`).
      stage_pieces: per stage, [(variable index, piece cols, dtype)] in the order the stage's
        sum groups hold its variables.

    Build under `strategy.scope()` (the buffers are sync-on-read variables: one per replica).
    """

    def __init__(self, slot_names, stage_pieces: list[list[tuple[int, int, tf.DType]]]):
        self.slot_names = tuple(slot_names)
        self.places: list[dict[tf.DType, list[_Place]]] = []
        cols: dict[tf.DType, int] = {}
        for pieces in stage_pieces:
            places: dict[tf.DType, list[_Place]] = {}
            for index, width, dtype in pieces:
                row = places.setdefault(tf.as_dtype(dtype), [])
                offset = row[-1].offset + row[-1].cols if row else 0
                row.append(_Place(index, offset, width))
            for dtype, row in places.items():
                cols[dtype] = max(cols.get(dtype, 0), row[-1].offset + row[-1].cols)
            self.places.append(places)
        self.buffers = {
            (name, dtype): tf.Variable(
                tf.zeros([width], dtype),
                trainable=False,
                name=f"stage_{name}_{dtype.name}",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )  # fmt: skip
            for name in self.slot_names
            for dtype, width in sorted(cols.items(), key=lambda kv: kv[0].name)
        }

    def variables(self) -> list[tf.Variable]:
        """The buffers (each replica's component holds its stage's pieces)."""
        return list(self.buffers.values())

    def bytes_per_replica(self) -> int:
        return sum(int(v.shape.num_elements()) * v.dtype.size for v in self.buffers.values())

    def pieces(self, stage: int) -> dict[int, list[Piece]]:
        """Per variable of `stage`, its slot pieces in `slot_names` order, read from this
        replica's buffers (replica context)."""
        out: dict[int, list[Piece]] = {}
        for dtype, row in self.places[stage].items():
            for name in self.slot_names:
                whole = tf.convert_to_tensor(self.buffers[(name, dtype)])
                for place in row:
                    value = whole[place.offset : place.offset + place.cols]
                    out.setdefault(place.index, []).append(Piece(value))
        return out

    def commit(self, stage: int, pieces: dict[int, list[Piece]]) -> list:
        """Writes the pieces' values back into this replica's buffers (replica context); the
        assign ops."""
        ops = []
        for dtype, row in self.places[stage].items():
            for position, name in enumerate(self.slot_names):
                buffer = self.buffers[(name, dtype)]
                parts = [pieces[place.index][position].value for place in row]
                pad = int(buffer.shape[0]) - (row[-1].offset + row[-1].cols)
                if pad:
                    parts.append(tf.zeros([pad], dtype))
                ops.append(buffer.assign(tf.concat(parts, 0) if len(parts) > 1 else parts[0]))
        return ops


def exchange(ops, members: list[int], stage: int, owned: dict[int, tf.Tensor], owners,
             shapes, dtypes, name: str) -> list[tf.Tensor]:  # fmt: skip
    """Every variable's tensor on every stage from each stage's own (replica context).

    Args:
      ops: this replica's `Collectives`.
      members: its pipeline group (rank s: stage s).
      stage: its stage.
      owned: this stage's tensors, by variable index (each of its variable's shape).
      owners: per variable, its stage.
      shapes, dtypes: per variable.
      name: the collectives' purpose.

    One all-gather per dtype over the group, of each stage's tensors flattened and padded to
    the largest stage's: (P - 1) / P of the model's bytes received per replica.
    """
    out: list[tf.Tensor | None] = [None] * len(owners)
    for dtype in sorted({tf.as_dtype(d) for d in dtypes}, key=lambda d: d.name):
        rows = [[i for i, s in enumerate(owners) if s == t and tf.as_dtype(dtypes[i]) == dtype]
                for t in range(len(members))]  # fmt: skip
        sizes = [[int(tf.TensorShape(shapes[i]).num_elements()) for i in row] for row in rows]
        width = max(sum(row) for row in sizes)
        if not width:
            continue
        mine = [tf.reshape(owned[i], [-1]) for i in rows[stage]]
        pad = width - sum(sizes[stage])
        flat = tf.concat([*mine, tf.zeros([pad], dtype)], 0) if pad or len(mine) != 1 else mine[0]
        gathered = tf.reshape(ops.all_gather(flat, members, f"{name}/{dtype.name}"), [-1, width])
        for t, row in enumerate(rows):
            if t == stage:  # this stage's own, not a copy back
                for i in row:
                    out[i] = owned[i]
                continue
            parts = tf.split(gathered[t, : sum(sizes[t])], sizes[t]) if row else []
            for i, part in zip(row, parts, strict=True):
                out[i] = tf.reshape(part, shapes[i])
    return out
