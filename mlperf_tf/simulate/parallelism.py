"""Provides the simulator's costs of model parallelism: tensor-parallel activation all-reduces,
spatial-partition halo exchanges, and mixture-of-experts all-to-alls, on a system's topology.

The run's chips form the mesh of `mlperf_tf/parallel/mesh.py` (data, expert, spatial, model;
`model` fastest): a model group of M chips (`--model_parallel`) or a spatial group of K
(`--spatial_partition`) shares one batch and splits its work, and sits on consecutive chips:
inside one node of a switched cluster when it fits (else across nodes), or along one dimension
of a torus. Each cost is an α–β time (`collectives.Cost`) per training step.

- **Tensor parallelism** (Megatron, Shoeybi et al. 2019): each transformer block does one
  all-reduce of its activations (batch x tokens x hidden, bf16) after the row-parallel attention
  output and one after the feed-forward, in the forward pass, and the same two in the backward
  pass (the conjugate operators), over the M chips of the group; none overlaps computation.
- **Spatial partitioning** (Kumar et al. 2019, SSD on TPU-v3): on K x L tiles each
  convolution of kernel k exchanges k // 2 halo rows with the tiles above and below, then
  k // 2 columns of the row-extended tile (corners included) with the tiles left and right
  (forward, and the same for the gradients in the backward pass) over neighbour links; each
  batch norm sums its statistics over the K x L tiles (a small all-reduce, latency-bound).
- **Expert parallelism** (GShard, ST-MoE): each MoE layer sends its tokens' hidden vectors to
  the experts' chips and back (dispatch and return), forward and backward: 4 all-to-alls of
  tokens x top_k x capacity x hidden bf16 values per chip, (E-1)/E of which leave the chip.
  The experts are the benchmark's own where it declares them (`SimulatorShape.experts`:
  GPT-OSS's 32 per layer, top-4, dropless), else those `--config.model.moe.*` adds to a dense
  model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from mlperf_tf.errors import UserError
from mlperf_tf.facts import Blocks, Conv, Embeddings, SimulatorShape, is_moe_layer
from mlperf_tf.simulate import collectives
from mlperf_tf.simulate.systems import Layout, System

ACTIVATION_BYTES = 2  # bf16 activations (every run modelled here trains in bf16/fp16)


def blocks_of(shape: SimulatorShape, flag: str, benchmark: str, family: Iterable[str]) -> Blocks:
    """The transformer blocks of `shape` for `--flag`.

    Raises:
      UserError: the benchmark declares none (`family`: the benchmarks that do, for the message).
    """
    if shape.blocks is None:
        raise UserError(
            f"--{flag} needs a Transformer-family benchmark ({', '.join(sorted(family))}); "
            f"'{benchmark}' has no tensor-parallel or MoE layers"
        )
    return shape.blocks


def convs_of(shape: SimulatorShape, benchmark: str, family: Iterable[str]) -> tuple[Conv, ...]:
    """The convolutions of `shape` for `--spatial_partition`.

    Raises:
      UserError: the benchmark declares none (`family`: the benchmarks that do).
    """
    if not shape.convs:
        raise UserError(
            f"--spatial_partition needs a benchmark with a convolutional trunk "
            f"({', '.join(sorted(family))}); '{benchmark}' has none"
        )
    return shape.convs


def _group_ring(system: System, layout: Layout, size: int) -> tuple[collectives.Link, bool, int]:
    """(link, bidirectional, nodes spanned) of a group of `size` consecutive chips."""
    if system.kind == "torus":
        # Along one torus dim: the whole dim (a ring, both directions when it wraps) or a segment
        # of a line (one direction, as the folded ring of a mesh line).
        dims = [(d, w) for d, w in zip(layout.shape, layout.wraps) if d % size == 0]
        wraps = any(d == size and w for d, w in dims)
        return system.link, wraps, 1
    if system.kind == "switched" and size > layout.chips_per_node:
        return system.network, False, size // max(1, layout.chips_per_node)
    return system.link, False, 1


def switched_allreduce(
    system: System, nbytes: float, per_node: int, nodes: int, algorithm: str = "hierarchical"
) -> collectives.Cost:
    """All-reduce of `nbytes` per chip over `nodes` nodes of `per_node` chips of a switched
    `system` (its `link` inside a node, its `network` across): NCCL's "hierarchical" form, or
    any other `algorithm` as one flat ring through every chip."""
    fn = (
        collectives.hierarchical_allreduce
        if algorithm == "hierarchical"
        else collectives.flat_ring_allreduce
    )
    return fn(nbytes, gpus_per_node=per_node, nodes=nodes, intra=system.link, inter=system.network)


def group_allreduce(system: System, layout: Layout, size: int, nbytes: float) -> collectives.Cost:
    """All-reduce of `nbytes` per chip over a group of `size` consecutive chips."""
    if size <= 1:
        return collectives.ZERO
    if system.kind == "switched" and size > layout.chips_per_node:
        per_node = layout.chips_per_node
        return switched_allreduce(system, nbytes, per_node, size // per_node)
    link, both, _ = _group_ring(system, layout, size)
    return collectives.ring_allreduce(nbytes, size, link, bidirectional=both)


def data_layout(system: System, layout: Layout, split: int) -> Layout:
    """Where the data-parallel replicas of one shard sit once groups of `split` chips share a
    batch: every `split`-th chip (so the gradient all-reduce runs over chips / split)."""
    if split <= 1:
        return layout
    groups = layout.chips // split
    if layout.shape:
        shape = list(layout.shape)
        i = max((j for j, d in enumerate(shape) if d % split == 0), key=lambda j: shape[j])
        shape[i] //= split
        wraps = list(layout.wraps)
        wraps[i] = wraps[i] and shape[i] > 2
        return Layout(chips=groups, shape=tuple(shape), wraps=tuple(wraps))
    if layout.chips_per_node >= split:
        return Layout(
            chips=groups, nodes=layout.nodes, chips_per_node=layout.chips_per_node // split
        )
    return Layout(chips=groups, nodes=groups, chips_per_node=1)


def check_fits(layout: Layout, split: int, what: str) -> None:
    """A group of `split` must fit one torus dim (a divisor of one) or whole nodes/one node."""
    if split <= 1:
        return
    if layout.shape and not any(d % split == 0 for d in layout.shape):
        raise UserError(
            f"{what} does not divide any dimension of the {layout.describe()} slice; a group "
            "runs along one torus dimension"
        )
    if not layout.shape and layout.nodes > 1 and split > layout.chips_per_node:
        if split % layout.chips_per_node:
            raise UserError(
                f"{what} must divide the {layout.chips_per_node} chips of a node or be whole nodes"
            )


def tensor_parallel_cost(
    system: System, layout: Layout, blocks: Blocks | None, model_parallel: int, group_batch: float
) -> collectives.Cost:
    """The activation all-reduces of one step: 2 x blocks x per-block all-reduces (forward and
    backward) of group batch x tokens x hidden bf16 values each, over the model group."""
    if model_parallel <= 1:
        return collectives.ZERO
    b = blocks
    nbytes = group_batch * b.tokens_per_sample * b.hidden * ACTIVATION_BYTES
    one = group_allreduce(system, layout, model_parallel, nbytes)
    count = 2 * b.blocks * b.allreduces_per_block
    return collectives.Cost(one.latency_s * count, one.bandwidth_s * count)


def check_splits(convs: tuple[Conv, ...], rows: int, cols: int) -> None:
    """Refuses a K x L tiling in which no convolution of the model splits, as the model does.

    `benchmarks/ssd/model.py` and `benchmarks/resnet50/model.py` keep a layer on tiles while its
    input's rows (columns) split into K (L) equal parts of a multiple of its stride
    (`mlperf_tf.parallel.spatial.splits`), and refuse a layout in which no layer does
    (`spatial.stem_refusal`): SSD300's maps (300, 75, 38, 19, 10, 5, 3 rows) at K or L = 4. The
    same test runs here on the benchmark's declared convolutions (`SimulatorShape.convs`), with
    the model's message.

    Raises:
      UserError: no map of `convs` splits into `rows` x `cols` tiles.
    """
    if rows * cols <= 1:
        return
    from mlperf_tf.parallel import spatial as spatial_lib  # imports TensorFlow: only when asked
    from mlperf_tf.parallel.mesh import DeviceMesh

    layout = spatial_lib.SpatialLayout(DeviceMesh(spatial=rows * cols, spatial_cols=cols))
    for conv in convs:
        window = ((conv.kernel, conv.stride, conv.kernel // 2),)
        if spatial_lib.image_splits(conv.height, conv.width, layout, window):
            return
    size = convs[0].height
    raise UserError(spatial_lib.stem_refusal(layout, size=size, setting="model.image_size"))


@dataclasses.dataclass(frozen=True)
class HaloBytes:
    """Bytes one chip sends to each neighbour for one convolution's halo, forward pass.

    Attributes:
      rows: the row exchange (to the tiles above and below): halo rows x tile width x channels
        x batch x 2 bytes.
      cols: the column exchange (to the tiles left and right) of the row-extended tile: halo
        columns x (tile height + the row halos above and below) x channels x batch x 2 bytes;
        the corners a tile needs from its diagonal neighbours come along with it, as
        `mlperf_tf/layers/spatial.py` exchanges them (two exchanges, no diagonal one).
    """

    rows: float
    cols: float


def halo_bytes(conv: Conv, rows: int, cols: int, group_batch: float) -> HaloBytes:
    """The halo of one convolution of `conv` on `rows` x `cols` tiles (see `HaloBytes`).

    A window of kernel k needs k // 2 rows (columns) from each neighbour; a tile thinner than
    that (a map of fewer rows than tiles) sends the whole tile: ceil(height / rows) rows.
    """
    halo = conv.kernel // 2
    tile_h = math.ceil(conv.height / rows)
    tile_w = math.ceil(conv.width / cols)
    per_value = group_batch * conv.channels * ACTIVATION_BYTES
    row_halo = min(halo, tile_h) if rows > 1 else 0
    col_halo = min(halo, tile_w) if cols > 1 else 0
    return HaloBytes(
        rows=row_halo * tile_w * per_value,
        cols=col_halo * (tile_h + 2 * row_halo) * per_value,
    )


def halo_cost(
    system: System, layout: Layout, shape: SimulatorShape, rows: int, group_batch: float,
    cols: int = 1,
) -> collectives.Cost:  # fmt: skip
    """Halo exchanges and batch-norm sums of one step on `rows` x `cols` tiles.

    Per convolution of kernel k > 1: the row exchange (k // 2 rows of the tile's width x
    channels to each neighbour above and below, both at once, over two links or one link's two
    directions), then the column exchange of the row-extended tile (`halo_bytes`); each an α
    plus its bytes over the link, forward and backward. Per batch norm: an all-reduce of
    2 x 256 fp32 statistics (a latency-bound message) over the K x L tiles, forward and
    backward.
    """
    parts = rows * cols
    if parts <= 1:
        return collectives.ZERO
    link, _, _ = _group_ring(system, layout, parts)
    cost = collectives.ZERO
    for conv in shape.convs:
        if conv.kernel <= 1:
            continue
        sent = halo_bytes(conv, rows, cols, group_batch)
        for nbytes in (sent.rows, sent.cols):
            if nbytes:
                times = 2 * conv.count  # forward and backward
                cost = cost + collectives.Cost(link.alpha * times, nbytes / link.bandwidth * times)
    stats = group_allreduce(system, layout, parts, 2 * 256 * 4)
    norms = 2 * shape.batch_norms
    return cost + collectives.Cost(stats.latency_s * norms, stats.bandwidth_s * norms)


@dataclasses.dataclass(frozen=True)
class Moe:
    """A mixture-of-experts config, named as `model.moe` in the benchmarks' configs.

    Attributes:
      num_experts: experts per MoE layer (0: dense).
      every: an MoE layer every N-th block.
      top_k: experts per token.
      capacity_factor: slots per expert over the even share (0: dropless, charged as 1.0 plus
        no padding).
      first_dense: the first blocks that stay dense (a benchmark's declaration,
        `facts.Experts.first_dense`).
    """

    num_experts: int = 0
    every: int = 1
    top_k: int = 2
    capacity_factor: float = 1.25
    first_dense: int = 0

    def __post_init__(self):
        for name in ("num_experts", "every", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"--config.model.moe.{name} ({value!r}) must be an integer >= 0")
        if self.every < 1 or self.top_k < 1:
            raise UserError("--config.model.moe.every and top_k must be >= 1")
        if self.num_experts and self.top_k > self.num_experts:
            raise UserError(
                f"--config.model.moe.top_k ({self.top_k}) exceeds num_experts ({self.num_experts})"
            )
        if self.capacity_factor < 0:
            raise UserError(
                f"--config.model.moe.capacity_factor ({self.capacity_factor}) must be > 0 "
                "(0: dropless)"
            )

    def layers(self, blocks: int) -> int:
        """The MoE layers among `blocks` blocks (`facts.is_moe_layer`)."""
        if not self.first_dense:
            return blocks // self.every if self.num_experts else 0
        rule = dict(num_experts=self.num_experts, every=self.every, first_dense=self.first_dense)
        return sum(is_moe_layer(i, **rule) for i in range(blocks))

    @property
    def slots(self) -> float:
        """Expert slots per token: top_k x capacity factor (dropless: top_k)."""
        return self.top_k * (self.capacity_factor or 1.0)


def all_to_all(system: System, layout: Layout, size: int, nbytes: float) -> collectives.Cost:
    """All-to-all of `nbytes` per chip among `size` consecutive chips ((size-1)/size leaves).

    NVSwitch (one node): every chip sends at its link rate: (p-1)α + (p-1)/p · n/B. Across
    nodes: the off-node part (1 - g/p of n) goes through each GPU's NIC share. Torus dim of p:
    the bisection bounds it: a byte travels p/4 hops on average over 2 directions, so
    n · p / (8 B) on a wrapped ring, twice that on a line; (p-1) steps of α.
    """
    if size <= 1:
        return collectives.ZERO
    steps = (size - 1) * system.link.alpha
    if system.kind == "torus":
        link, both, _ = _group_ring(system, layout, size)
        return collectives.Cost(steps, nbytes * size / ((8 if both else 4) * link.bandwidth))
    per_node = layout.chips_per_node
    if system.kind == "switched" and size > per_node:
        off_node = nbytes * (1 - per_node / size)
        on_node = nbytes * (per_node - 1) / size
        return collectives.Cost(
            (per_node - 1) * system.link.alpha + (size // per_node - 1) * system.network.alpha,
            max(on_node / system.link.bandwidth, off_node / system.network.bandwidth),
        )
    return collectives.Cost(steps, nbytes * (size - 1) / size / system.link.bandwidth)


def moe_all_to_all_cost(
    system: System, layout: Layout, blocks: Blocks | None, moe: Moe, expert_parallel: int,
    group_batch: float, whole: Blocks | None = None,
) -> collectives.Cost:  # fmt: skip
    """4 all-to-alls (dispatch, return; forward, backward) per MoE layer per step, over the
    MoE layers of `blocks` (a pipeline stage's, `Stages.local_blocks`, of the model's `whole`
    blocks: the longest stage's, its dense blocks, the first ones, on the first stage)."""
    if not moe.num_experts or expert_parallel <= 1:
        return collectives.ZERO
    b = blocks
    nbytes = group_batch * b.tokens_per_sample * moe.slots * b.hidden * ACTIVATION_BYTES
    one = all_to_all(system, layout, expert_parallel, nbytes)
    layers = moe.layers(b.blocks)
    if whole is not None and whole.blocks > b.blocks:  # a stage: the MoE-only later stages
        layers = min(b.blocks, moe.layers(whole.blocks))
    count = 4 * layers
    return collectives.Cost(one.latency_s * count, one.bandwidth_s * count)


def embedding_all_to_all_cost(
    system: System, layout: Layout, embeddings: Embeddings | None, chips: int,
    samples_per_chip: float,
) -> collectives.Cost:  # fmt: skip
    """The three all-to-alls of sharded tables in one step (`facts.Embeddings`): each chip
    sends its samples' ids to the rows' owners, gets the rows back, and sends the rows'
    gradients, over every chip holding a share of the tables; (chips-1)/chips of it leaves."""
    if embeddings is None or chips <= 1:
        return collectives.ZERO
    cost = collectives.ZERO
    for per_sample in embeddings.all_to_all_bytes_per_sample():
        cost = cost + all_to_all(system, layout, chips, samples_per_chip * per_sample)
    return cost


def embedding_memory_s(system: System, embeddings: Embeddings | None, samples_per_chip: float):
    """Seconds the owners spend streaming looked-up rows through memory in one step: rows
    spread evenly over the chips, each holds the rows of as many lookups as its own samples
    make (`Embeddings.memory_bytes_per_sample`), at the memory bandwidth."""
    if embeddings is None:
        return 0.0
    return samples_per_chip * embeddings.memory_bytes_per_sample() / system.memory_bandwidth


def embedding_eval_s(
    system: System, layout: Layout | None, embeddings: Embeddings | None, chips: int,
    samples_per_chip: float,
) -> float:  # fmt: skip
    """Seconds an evaluation's lookups take: the forward half of a training step's (the ids out
    and the rows back, no gradients; the gather's row read, no update), for `samples_per_chip`
    eval samples a chip. The eval forward passes' FLOPs are timed apart (`_time_to_train`)."""
    if embeddings is None:
        return 0.0
    read_s = samples_per_chip * embeddings.lookups_per_sample * embeddings.row_bytes
    seconds = read_s / system.memory_bandwidth
    if layout is not None and chips > 1:
        ids, rows, _ = embeddings.all_to_all_bytes_per_sample()
        for per_sample in (ids, rows):
            seconds += all_to_all(system, layout, chips, samples_per_chip * per_sample).total_s
    return seconds


@dataclasses.dataclass(frozen=True)
class Stages:
    """Pipeline and context parallelism of a run, around the (data, expert, spatial, model) mesh
    of each stage and context shard.

    Attributes:
      pipeline: P chips hold consecutive 1/P of the blocks; a 1F1B schedule (Narayanan et al.
        2021) runs the step's micro-batches through them.
      context: C chips share every sample, 1/C of its tokens each; attention passes the keys
        and values around them (ring attention, Liu et al. 2023).
      micro_batch_size: samples per pipeline micro-batch.
      virtual: model chunks per stage of an interleaved 1F1B schedule (Narayanan et al. 2021,
        sec. 2.2.2: each chip holds V chunks of consecutive blocks, round-robin over the
        stages; Megatron's `virtual_pipeline_model_parallel_size`): the bubble shrinks V-fold,
        each micro-batch crosses V times as many stage boundaries (1: plain 1F1B).
    """

    pipeline: int = 1
    context: int = 1
    micro_batch_size: int = 1
    longest_stage: int = 0  # blocks of the longest stage (0: equal stages)
    virtual: int = 1
    accumulates: bool = False  # the run splits a group's samples into micro-batches

    @property
    def size(self) -> int:
        return self.pipeline * self.context

    def imbalance(self, blocks: Blocks | None) -> float:
        """The longest stage's blocks over the mean stage's: the tick of a pipeline with uneven
        stages (`SimulatorShape.pipeline_stages`) over that of equal ones (1: equal)."""
        if self.pipeline <= 1 or blocks is None or not self.longest_stage:
            return 1.0
        return self.longest_stage * self.pipeline / blocks.blocks

    @classmethod
    def checked(
        cls, shape: SimulatorShape, benchmark: str, working: int, pipeline: int, context: int,
        micro_batch_size: int | None, family: Iterable[str], virtual: int = 1,
        accumulate: bool = False,
    ) -> Stages:  # fmt: skip
        """The stages of the flags, after checking them against the model and the chips; the
        run accumulates micro-batches with a pipeline, a `micro_batch_size` given, or where the
        caller says so (`accumulate`: a decoder, whose memory is counted per micro-batch).

        Raises:
          UserError: a flag below 1, a model without blocks, blocks or tokens that the flag
            does not divide, chips that are not a multiple of P x C, or virtual stages without
            a pipeline or with more chunks than the shortest stage has blocks.
        """
        flags = {
            "--pipeline_parallel": pipeline,
            "--context_parallel": context,
            "--micro_batch_size": 1 if micro_batch_size is None else micro_batch_size,
            "--virtual_stages": virtual,
        }
        for flag, value in flags.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{flag} ({value!r}) must be a positive integer")
        longest = 0
        if pipeline > 1:
            b = blocks_of(shape, "pipeline_parallel", benchmark, family)
            stages = shape.stage_blocks(pipeline)
            if stages is None:
                fits = [d for d in range(1, b.blocks + 1) if shape.stage_blocks(d)]
                raise UserError(
                    f"--pipeline_parallel ({pipeline}) must divide the {b.blocks} blocks of "
                    f"'{benchmark}' or be one of its declared stage maps: use one of "
                    f"{', '.join(map(str, fits))}"
                )
            longest = max(stages) if len(set(stages)) > 1 else 0
            if virtual > min(stages):
                raise UserError(
                    f"--virtual_stages ({virtual}) exceeds the {min(stages)} blocks of the "
                    f"shortest of the {pipeline} stages of '{benchmark}': each chunk holds "
                    f"at least one block; use at most {min(stages)}"
                )
        elif virtual > 1:
            raise UserError(
                f"--virtual_stages ({virtual}) interleaves a pipeline: give "
                "--pipeline_parallel > 1 or leave it out"
            )
        if context > 1:
            b = blocks_of(shape, "context_parallel", benchmark, family)
            if b.tokens_per_sample % context:
                raise UserError(
                    f"--context_parallel ({context}) must divide the {b.tokens_per_sample} tokens "
                    f"of a '{benchmark}' sample"
                )
        if working % (pipeline * context):
            raise UserError(
                f"--pipeline_parallel={pipeline} x --context_parallel={context} needs a multiple "
                f"of {pipeline * context} chips; {working} work"
            )
        accumulates = accumulate or pipeline > 1 or micro_batch_size is not None
        return cls(pipeline, context, flags["--micro_batch_size"], longest, virtual, accumulates)

    def check_batch(self, group_batch: float) -> None:
        """Refuses micro-batches that do not divide a data-parallel group's samples."""
        if self.pipeline > 1 and (
            group_batch < self.micro_batch_size or group_batch % self.micro_batch_size
        ):
            raise UserError(
                f"--micro_batch_size ({self.micro_batch_size}) must divide the {group_batch:g} "
                "samples a pipeline runs per step (global batch / data-parallel groups)"
            )

    def micro_batches(self, group_batch: float) -> float:
        return max(1.0, group_batch / self.micro_batch_size)

    def bubble(self, group_batch: float) -> float:
        """The 1F1B pipeline's idle time over its busy time: (P - 1) / (V m) (V = 1: plain
        1F1B; V chunks a stage: the interleaved schedule's, Narayanan et al. 2021, eq. 2.2.2)."""
        if self.pipeline <= 1:
            return 0.0
        return (self.pipeline - 1) / (self.virtual * self.micro_batches(group_batch))

    def issues(self, group_batch: float) -> float:
        """How many times a layer's collectives are issued in one step: once per micro-batch
        where the run accumulates (`checked`: each micro-batch passes every layer on its own and
        pays each collective's latency), once for the group's samples where it does not."""
        return self.micro_batches(group_batch) if self.accumulates else 1.0

    def local_blocks(self, blocks: Blocks | None) -> Blocks | None:
        """One stage's blocks over one context shard's tokens."""
        if blocks is None or self.size == 1:
            return blocks
        return dataclasses.replace(
            blocks,
            blocks=self.longest_stage or blocks.blocks // self.pipeline,
            tokens_per_sample=blocks.tokens_per_sample // self.context,
        )

    def context_cost(
        self, system: System, layout: Layout, blocks: Blocks | None, group: int,
        group_batch: float,
    ) -> collectives.Cost:  # fmt: skip
        """The ring passes of keys and values: C - 1 steps per block forward, twice that
        backward (the values and their gradients), each of a shard's group batch x tokens x
        the keys' and values' width (`Blocks.kv_width`; undeclared, 2 x hidden: an upper bound,
        grouped-query attention sends fewer key/value heads) bf16 values over the tensor
        group."""
        if self.context <= 1 or blocks is None:
            return collectives.ZERO
        width = blocks.kv_width or 2 * blocks.hidden
        nbytes = group_batch * blocks.tokens_per_sample * width * ACTIVATION_BYTES
        link, _, _ = _group_ring(system, layout, group * self.context)
        steps = 3 * blocks.blocks * (self.context - 1)
        return collectives.Cost(steps * link.alpha, steps * nbytes / group / link.bandwidth)

    def pipeline_cost(
        self, system: System, layout: Layout, blocks: Blocks | None, group: int,
        group_batch: float,
    ) -> collectives.Cost:  # fmt: skip
        """The sends between stages on the schedule's critical path: 2 (m + P - 2) of one
        micro-batch's activations (micro-batch x tokens x hidden bf16 values, split over the
        tensor group as Megatron's scatter-gather does), V times as many with V chunks a stage
        (every micro-batch crosses P V - 1 boundaries instead of P - 1)."""
        if self.pipeline <= 1 or blocks is None:
            return collectives.ZERO
        nbytes = self.micro_batch_size * blocks.tokens_per_sample * blocks.hidden
        nbytes *= ACTIVATION_BYTES / group
        link, _, _ = _group_ring(system, layout, group * self.size)
        sends = 2 * (self.micro_batches(group_batch) + self.pipeline - 2) * self.virtual
        return collectives.Cost(sends * link.alpha, sends * nbytes / link.bandwidth)
