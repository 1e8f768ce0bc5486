"""Provides the pipeline schedule: which stage runs which micro-batch's forward or backward
pass at each tick (GPipe, 1F1B), its bubble and in-flight activations, and how a decoder's
layers split into stages.

Pipeline parallelism (GPipe, Huang et al. 2019; PipeDream-flush / Megatron's 1F1B, Narayanan
et al. 2021) cuts the model's consecutive layers into P stages, one per member of the mesh's
`pipeline` group, and runs the step's M micro-batches through them. A tick is one stage-step:
every stage runs at most one forward (F m) or backward (B m) of one micro-batch, then
neighbouring stages exchange activations (forward) and their gradients (backward). With an F
and a B each one tick long, every schedule without interleaving takes 2 (M + P - 1) ticks,
of which each stage is busy 2 M: the bubble is (P - 1) / (M + P - 1). GPipe keeps all M
micro-batches' activations in flight on every stage; 1F1B keeps at most P - s on stage s.

The table is computed here once, in Python, at trace time: the runner unrolls it into one
compiled step (`mlperf_tf.runner.pipeline`). This module imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from mlperf_tf.errors import UserError

SCHEDULES = ("gpipe", "1f1b")


@dataclasses.dataclass(frozen=True)
class Action:
    """One stage's work at one tick: the forward ("F") or backward ("B") of micro-batch `micro`."""

    kind: str
    micro: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}"


def _stage_orders(kind: str, stages: int, micro_batches: int) -> list[list[Action]]:
    """Per stage, the order it runs its 2 M actions in."""
    fwd = [Action("F", m) for m in range(micro_batches)]
    bwd = [Action("B", m) for m in range(micro_batches)]
    if kind == "gpipe":  # every forward, then every backward
        return [fwd + bwd for _ in range(stages)]
    orders = []
    for s in range(stages):  # 1F1B: warm-up forwards, one-forward-one-backward, cool-down
        warm = min(stages - 1 - s, micro_batches)
        order = fwd[:warm]
        for m in range(micro_batches - warm):
            order += [fwd[warm + m], bwd[m]]
        orders.append(order + bwd[micro_batches - warm :])
    return orders


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The tick table of one step.

    Attributes:
      kind: "gpipe" or "1f1b".
      stages: P, the pipeline axis' size.
      micro_batches: M, the step's micro-batches (the gradient-accumulation count).
      ticks: per tick, per stage, its `Action` or None (idle: the bubble).
    """

    kind: str
    stages: int
    micro_batches: int
    ticks: tuple[tuple[Action | None, ...], ...]

    @classmethod
    def build(cls, kind: str, *, stages: int, micro_batches: int) -> Schedule:
        """The table: each stage runs its next action as soon as its input is there (the
        forward of the stage before, or the backward of the stage after, done at an earlier
        tick).

        Raises:
          UserError: an unknown `kind`, or sizes that are not positive.
        """
        if kind not in SCHEDULES:
            raise UserError(f"--pipeline_schedule={kind!r} must be one of {', '.join(SCHEDULES)}")
        for name, value in (("pipeline_parallel", stages), ("micro-batch count", micro_batches)):
            if value < 1:
                raise UserError(f"{name} ({value}) must be a positive integer")
        orders = _stage_orders(kind, stages, micro_batches)
        done: dict[tuple[int, Action], int] = {}  # (stage, action) -> its tick
        position = [0] * stages
        ticks = []
        while any(p < len(o) for p, o in zip(position, orders, strict=True)):
            tick = len(ticks)
            row: list[Action | None] = [None] * stages
            for s in range(stages):
                if position[s] == len(orders[s]):
                    continue
                action = orders[s][position[s]]
                if action.kind == "F":
                    needs = (s - 1, action) if s > 0 else None
                else:  # a backward needs this stage's forward and the next stage's backward
                    needs = (s + 1, action) if s < stages - 1 else (s, Action("F", action.micro))
                if needs is None or done.get(needs, tick) < tick:
                    row[s] = action
            for s, action in enumerate(row):
                if action is not None:
                    done[(s, action)] = tick
                    position[s] += 1
            ticks.append(tuple(row))
        return cls(kind, stages, micro_batches, tuple(ticks))

    @property
    def predicted_bubble(self) -> float:
        """(P - 1) / (M + P - 1): the idle fraction of every stage's time, forward and backward
        equally long."""
        return predicted_bubble(self.stages, self.micro_batches)

    @property
    def bubble(self) -> float:
        """The idle fraction of the table's stage-ticks."""
        slots = len(self.ticks) * self.stages
        return sum(a is None for row in self.ticks for a in row) / slots

    def in_flight(self, stage: int) -> int:
        """The most micro-batches whose activations `stage` holds at once (forward run,
        backward not yet)."""
        held = peak = 0
        for row in self.ticks:
            action = row[stage]
            if action is not None:
                held += 1 if action.kind == "F" else -1
                peak = max(peak, held)
        return peak

    def __str__(self) -> str:
        lines = [f"{self.kind} P={self.stages} M={self.micro_batches}: {len(self.ticks)} ticks"]
        for s in range(self.stages):
            lines.append(f"  stage {s}: " + " ".join(str(r[s] or "..") for r in self.ticks))
        return "\n".join(lines)


def predicted_bubble(stages: int, micro_batches: int) -> float:
    """(P - 1) / (M + P - 1): the pipeline's idle fraction without interleaving."""
    return (stages - 1) / (micro_batches + stages - 1)


def in_flight(kind: str, *, stages: int, micro_batches: int, stage: int) -> int:
    """`Schedule.in_flight` without the table (the memory estimate asks it of layouts with
    thousands of micro-batches): GPipe holds all M; 1F1B's stage s runs min(P - 1 - s, M)
    warm-up forwards, then one more before its first backward, so min(P - s, M).

    Raises:
      UserError: an unknown `kind`.
    """
    if kind not in SCHEDULES:
        raise UserError(f"--pipeline_schedule={kind!r} must be one of {', '.join(SCHEDULES)}")
    return micro_batches if kind == "gpipe" else min(stages - stage, micro_batches)


def stage_bounds(
    num_layers: int, stages: int, declared: Sequence[str] = ()
) -> list[tuple[int, int]]:
    """The [first, end) decoder layers of each of `stages` stages: the map `declared` for that
    many stages (a model's `pipeline_layers`, "+"-joined layer counts, e.g. DeepSeek-V3's
    uneven PP4 "16+16+16+13") when there is one, else equal consecutive runs.

    Stages of unequal length change only which layers a stage runs: what it sends to the next
    is the hidden state [micro batch, seq, hidden] whatever its layers, so the exchange and the
    schedule are those of equal stages (the longest stage sets the tick).

    Raises:
      UserError: a declared map for `stages` that does not sum to `num_layers`, or no map and
        `stages` not dividing `num_layers` (one line naming P, the layers and the maps).
    """
    counts = next((c for c in layer_maps(declared) if len(c) == stages), None)
    if counts is not None:
        if sum(counts) != num_layers:
            raise UserError(
                f"--pipeline_parallel={stages}: model.pipeline_layers' map "
                f"{'+'.join(map(str, counts))} sums to {sum(counts)}, not "
                f"model.num_hidden_layers ({num_layers})"
            )
    elif num_layers % stages:
        maps = ", ".join(declared) or "none"
        raise UserError(
            f"--pipeline_parallel={stages} must divide model.num_hidden_layers ({num_layers}) "
            f"or be declared in model.pipeline_layers (declared: {maps})"
        )
    else:
        counts = (num_layers // stages,) * stages
    ends = list(itertools.accumulate(counts))
    return [(end - count, end) for count, end in zip(counts, ends, strict=True)]


def layer_maps(declared: Sequence[str]) -> list[tuple[int, ...]]:
    """The layer counts of each "+"-joined map in `declared` (first stage first).

    Raises:
      UserError: a count that is not a positive integer, or two maps of one stage count.
    """
    maps = [tuple(int(c) if c.isdigit() else 0 for c in m.split("+")) for m in declared]
    if any(0 in m for m in maps) or len({len(m) for m in maps}) < len(maps):
        raise UserError(
            f"model.pipeline_layers ({', '.join(declared)}) must be maps like '16+16+13' of "
            "positive layer counts, one per stage count"
        )
    return maps


def sum_over_stages(variables, mesh) -> None:
    """Adds the `pipeline` axis to the gradient sum of every variable in `variables` (a model
    built under `mesh`; nothing when `mesh` has one stage).

    A stage computes the gradient of its own layers only (zero on the other stages of its
    group): summed over the group, every replica gets the whole model's gradient, applies the
    same update, and the weights stay equal on every stage, so the evaluation (the whole model
    on each replica) and the checkpoint (any replica's copy) need nothing new. Tied weights (an
    embedding the first stage reads and the last stage's head reuses) get both stages' parts.
    """
    if mesh is None or mesh.pipeline == 1:
        return
    from mlperf_tf.parallel import layout as layout_lib  # noqa: PLC0415 (imports TensorFlow)

    for variable in variables:
        layout = layout_lib.layout_of(variable)
        if "pipeline" not in layout.sum_over:
            summed = dataclasses.replace(layout, sum_over=(*layout.sum_over, "pipeline"))
            layout_lib.set_layout(variable, summed)
