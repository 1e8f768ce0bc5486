"""Provides `PipelineStep`: one replica's part of a pipelined training step, the whole schedule
unrolled into one compiled function (replica context).

Each member of a `pipeline` group of the ambient mesh is one stage (`Benchmark.pipeline_stage`:
a run of consecutive layers, the embedding on the first, the head and the loss on the last).
The step's micro-batches (the gradient-accumulation count) run through the stages in the tick
table of `mlperf_tf.parallel.pipeline.Schedule`, unrolled at trace time: static shapes, one
`tf.function` (with `--xla`, each stage's forward pass and its gradient compiled; the
exchanges between them stay outside XLA, which has no collectives on CPUs).

Per tick, on every member of the group, in the same order (so the collectives match):

1. The stage's action, if any. A forward (F m) runs the stage on micro-batch m under a
   `tf.GradientTape` of its own, kept until the backward (the activations in flight). A
   backward (B m) takes that tape's gradient: of the loss on the last stage, else of the
   stage's output with the gradient the next stage sent (`output_gradients`), for the
   model's variables (those of other stages get none: their gradient here is zero) and for
   the stage's input, which goes back to the stage before.
2. If any stage sends at this tick (known from the table, the same on every member): one
   all-to-all over the group (`AxisGroup.all_to_all`, the axis view the layers use) of a
   [P, micro batch, seq, hidden] tensor whose row s + 1 holds this stage's output and row
   s - 1 the gradient of its input (zeros elsewhere): a forward and a backward send in one
   collective. Cost: each member sends P - 1 rows of one activation, of which at most two
   carry data (at P = 2 exactly one: what a point-to-point send costs); a TPU's
   `CollectivePermute` (XLA's `ppermute`) would send those two only. An all-reduce of the
   same table would cost 2 (P - 1) rows per member on a ring.

Gradients of a stage's weights are therefore zero on the other stages of its group. The
runner's update is sharded by the stage map (`stage_owners`, `mlperf_tf/collectives/stages.py`):
each stage sums its own variables' gradients over its data (and other) axes, clips with the
whole model's norm (one scalar all-reduce over the axis) and updates its own variables with its
own slots (whole; with `--weight_update_sharding` in pieces over data), then the stages exchange
the new weights, which stay mirrored (see the package README for what that costs). Keras' own
sum (no summer: tests only) or an optimizer without a rule on pieces sums over `pipeline` too
and every replica applies the whole update with every slot.
"""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.collectives.stages import StageMap
from mlperf_tf.parallel.pipeline import Schedule


class _StageState:
    """One replica's state over the schedule's ticks (`PipelineStep.__call__`)."""

    def __init__(self, variables, *, last: bool):
        self.sources = list(variables)
        self.grads = [None] * len(self.sources)  # summed over micro-batches; None: none yet
        self.last = last  # the last stage computes the loss
        self.total_loss = tf.constant(0.0, tf.float32)
        self.total_metrics: dict[str, tf.Tensor] = {}
        self.inputs = {}  # micro-batch -> this stage's input (received)
        self.output_grads = {}  # micro-batch -> the gradient of this stage's output (received)
        self.pending = {}  # micro-batch -> (tape, input, output, aux loss): in flight


class PipelineStep:
    """Runs one step's micro-batches through this replica's pipeline stage.

    Made once per run, before any replica context (it finds its group on the ambient mesh).

    Args:
      benchmark: supplies `pipeline_stage(model, stage, stages)`.
      model: the Keras model.
      optimizer: the run's optimizer (its `scale_loss`).
      micro_batches: the accumulated batches of one step; each is cut into
        `per_replica_batch_size / pipeline_micro_batch` micro-batches of the schedule.
      schedule: "gpipe" or "1f1b".
      loss_scale: the runner's factor on each loss before its gradient (`group_loss_scale`).
      mesh: the run's mesh (None: the ambient one).
      timeout_s: the least timeout of the exchanges (0: the replica context's).
      xla: compile each stage's forward pass (and so its gradient) with XLA. The exchanges
        stay outside: XLA has no collectives on CPUs (`mlperf_tf/layers/README.md`), and the
        runner's other collectives are outside its compiled functions alike.
    """

    def __init__(self, *, benchmark, model, optimizer, micro_batches: int,
                 schedule: str = "1f1b", loss_scale: float = 1.0, mesh=None,
                 timeout_s: float = 0.0, xla: bool = False):  # fmt: skip
        self.benchmark = benchmark
        self.model = model
        self.optimizer = optimizer
        self.loss_scale = loss_scale
        # Under context parallelism too: the stage splits its micro-batches' sequences itself
        # (`Benchmark.pipeline_stage`) and sends its tokens' activations to the next stage's
        # member of the same context index (a `pipeline` group shares the context index).
        self.group = AxisGroup("pipeline", owner="pipeline", mesh=mesh, timeout_s=timeout_s)
        # Each accumulated batch in pieces of `--micro_batch_size` (1: the batch whole).
        self.timed = False  # set before the first trace (`metric_shapes`)
        self.xla = xla
        self.micro_batch = benchmark.pipeline_micro_batch
        self.pieces = benchmark.per_replica_batch_size // self.micro_batch
        self.schedule = Schedule.build(
            schedule, stages=self.group.size, micro_batches=micro_batches * self.pieces
        )

    # With `timed`, each replica also returns the seconds its stage computed (`busy`) and the
    # seconds from its first action to its last exchange (`span`): the bubble it measured is
    # 1 - busy / span (`mlperf-tf bench`). Two `tf.timestamp`s per action; not under XLA.
    TIMING_METRICS = {"pipeline/busy_s": (), "pipeline/span_s": ()}

    def metric_shapes(self) -> dict[str, tuple[int, ...]]:
        """The metrics this step adds to the benchmark's (`TIMING_METRICS` when `timed`)."""
        return dict(self.TIMING_METRICS) if self.timed else {}

    def _scaled(self, loss):
        loss = loss * self.loss_scale if self.loss_scale != 1.0 else loss
        return self.optimizer.scale_loss(loss)

    def __call__(self, micro_batches):
        """(loss summed over micro-batches, gradients summed over them, metrics summed over
        them) of this replica (replica context). The loss and metrics are the whole model's
        on every stage; the gradients are zero outside this stage's variables.
        """
        micro_batches = self._pieces(micro_batches)
        stages = self.schedule.stages
        stage = self.group.rank()
        part = self.benchmark.pipeline_stage(self.model, stage, stages)
        forward, loss_of = part.forward, part.loss
        if self.xla:  # traced for this replica: its stage's layers
            forward = tf.function(forward, jit_compile=True, autograph=False)
            loss_of = tf.function(loss_of, jit_compile=True, autograph=False)
        state = _StageState(self.model.trainable_variables, last=stage == stages - 1)
        shape, dtype = part.activation_shape(micro_batches[0]), part.activation_dtype
        busy, started = tf.constant(0.0, tf.float64), None
        for row in self.schedule.ticks:
            action = row[stage]
            send_forward = send_backward = None
            if self.timed and action is not None:
                # It starts when its input is there: the forward's activations or the
                # backward's gradient from the neighbouring stage (the wait is the bubble).
                waits_on = state.inputs if action.kind == "F" else state.output_grads
                ready = waits_on.get(action.micro)
                with tf.control_dependencies([] if ready is None else [ready]):
                    begin = tf.timestamp()
                started = begin if started is None else started
            gate = _after(begin) if self.timed and action is not None else (lambda t: t)
            if action is not None and action.kind == "F":
                batch = micro_batches[action.micro]
                send_forward = self._forward(state, action.micro, batch, gate, forward, loss_of)
            elif action is not None:
                send_backward = self._backward(state, action.micro, gate)
            if self.timed and action is not None:
                done = [t for t in (send_forward, send_backward) if t is not None]
                done = done or [g for g in state.grads if g is not None] or [state.total_loss]
                with tf.control_dependencies(done):
                    busy += tf.timestamp() - begin
            self._exchange(row, stage, send_forward, send_backward, shape, dtype,
                           state.inputs, state.output_grads)  # fmt: skip
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(state.grads, state.sources)]
        if self.timed:
            with tf.control_dependencies(grads):
                span = tf.timestamp() - started
            state.total_metrics["pipeline/busy_s"] = tf.cast(busy, tf.float32)
            state.total_metrics["pipeline/span_s"] = tf.cast(span, tf.float32)
        total_loss, total_metrics = self._combine(state.total_loss, state.total_metrics, part)
        return total_loss, grads, total_metrics

    def _pieces(self, micro_batches) -> list:
        """Each accumulated batch cut into pieces of `--micro_batch_size`, in order."""
        if self.pieces == 1:
            return list(micro_batches)
        return [
            tf.nest.map_structure(lambda t, i=i: t[i * self.micro_batch : (i + 1) * self.micro_batch], b)
            for b in micro_batches
            for i in range(self.pieces)
        ]  # fmt: skip

    def _forward(self, state: _StageState, m: int, batch, gate, forward, loss_of):
        """Micro-batch `m`'s forward pass on this stage, its tape kept until its backward:
        the activations to send on (None on the last stage, which computes the loss)."""
        x = state.inputs.pop(m, None)
        if x is None:  # the first stage: its work starts with the batch
            batch = tf.nest.map_structure(gate, batch)
        else:
            x = gate(x)
        send = None
        with tf.GradientTape(watch_accessed_variables=True) as tape:
            if x is not None:
                tape.watch(x)
            if state.last:
                loss, metrics = loss_of(batch, x)
                out, aux = self._scaled(loss), None
                state.total_loss += tf.cast(loss, tf.float32)
            else:
                out, aux, metrics = forward(batch, x)
                if aux is not None:  # this stage's MoE auxiliary loss is part of the step's
                    state.total_loss += tf.cast(aux, tf.float32)
                    aux = self._scaled(aux)
                send = out
            for name, value in metrics.items():
                value = tf.cast(value, tf.float32)
                state.total_metrics[name] = state.total_metrics.get(name, 0.0) + value
        state.pending[m] = (tape, x, out, aux)
        return send

    def _backward(self, state: _StageState, m: int, gate):
        """Micro-batch `m`'s backward pass on this stage, its gradients added to the stage's:
        the gradient of its input to send back (None on the first stage)."""
        tape, x, out, aux = state.pending.pop(m)
        if state.last:
            targets, seeds = [out], [gate(tf.ones_like(out))]
        else:
            targets, seeds = [out], [gate(state.output_grads.pop(m))]
            if aux is not None:
                targets.append(aux)
                seeds.append(tf.ones_like(aux))
        with_input = state.sources + ([x] if x is not None else [])
        got = tape.gradient(targets, with_input, output_gradients=seeds)
        for i, g in enumerate(got[: len(state.sources)]):
            if g is not None:
                g = tf.convert_to_tensor(g)  # dense: equal types on every stage
                state.grads[i] = g if state.grads[i] is None else state.grads[i] + g
        return got[-1] if x is not None else None

    def _combine(self, total_loss, total_metrics: dict, part):
        """The step's loss and the whole model's metrics on every stage (the runner averages
        them over replicas): the last stage's loss plus the earlier stages' MoE auxiliary losses
        (which an unpipelined step's loss holds too) and each stage's part of the metrics,
        combined over the group (a few scalars and small tables)."""
        total_loss = self.group.all_reduce(total_loss, what="loss")
        for name in sorted(total_metrics):
            value = total_metrics[name]
            if name in self.TIMING_METRICS:  # this replica's own: averaged by the runner
                continue
            if name in part.metric_max:
                total_metrics[name] = self.group.max(value)
            else:
                total_metrics[name] = self.group.all_reduce(value, what=f"metric/{name}")
        return total_loss, total_metrics

    def _exchange(self, row, stage, send_forward, send_backward, shape, dtype,
                  inputs, output_grads):  # fmt: skip
        """The tick's one all-to-all over the group, if any stage sends (same on every member)."""
        stages = len(row)
        forward = [s < stages - 1 and a is not None and a.kind == "F" for s, a in enumerate(row)]
        backward = [s > 0 and a is not None and a.kind == "B" for s, a in enumerate(row)]
        if not any(forward) and not any(backward):
            return
        zeros = tf.zeros(shape, dtype)
        rows = [zeros] * stages  # [P] x [micro batch, seq, hidden]: row j goes to stage j
        if send_forward is not None:
            rows[stage + 1] = tf.cast(send_forward, dtype)
        if send_backward is not None:
            rows[stage - 1] = tf.cast(send_backward, dtype)
        received = self.group.all_to_all(tf.stack(rows), what="exchange")  # row i from stage i
        if stage > 0 and forward[stage - 1]:
            inputs[row[stage - 1].micro] = tf.stop_gradient(received[stage - 1])
        if stage < stages - 1 and backward[stage + 1]:
            output_grads[row[stage + 1].micro] = tf.stop_gradient(received[stage + 1])


def _after(begin):
    """t -> t, computed after `begin` (a timestamp): the stage's work cannot start before it."""

    def gate(t):
        with tf.control_dependencies([begin]):
            return tf.identity(t)

    return gate


def stage_owners(*, strategy, benchmark, model, batch_spec) -> StageMap | None:
    """The stage map of `model` (`StageMap`): per trainable variable, the pipeline stages whose
    parts read it; None when a variable is read by no stage (the update is then sharded evenly
    with `--weight_update_sharding`, or not at all).

    Found by tracing (not running) each stage's forward pass, or its loss on the last stage,
    and its gradient on every replica (`strategy.run` in a `tf.function` that is only traced):
    a variable belongs to the stage that gives it a gradient, as in `PipelineStep._backward`.
    A worker of a multi-worker run sees its own replicas only: the stages none of them holds
    are traced on them too (with the stage given), so every worker finds the same map.
    No benchmark declares its stages' variables, and the trace sees shared ones as the step
    does.

    Args:
      strategy: the run's strategy (its replicas are the mesh's).
      benchmark: supplies `pipeline_stage` and the ambient mesh.
      model: the built model.
      batch_spec: one replica's training batch (`tf.TensorSpec`s; any batch size).
    """
    mesh = benchmark.mesh
    stages = mesh.pipeline
    variables = model.trainable_variables
    readers = [set() for _ in variables]
    group = AxisGroup("pipeline", owner="pipeline", mesh=mesh)
    rows = benchmark.pipeline_micro_batch

    traced = set()

    def probe(batch, stage=None):
        stage = group.rank() if stage is None else stage
        traced.add(stage)
        part = benchmark.pipeline_stage(model, stage, stages)
        batch = tf.nest.map_structure(lambda t: t[:rows], batch)
        x = None
        if stage > 0:
            x = tf.zeros(part.activation_shape(batch), part.activation_dtype)
        with tf.GradientTape() as tape:
            if x is not None:
                tape.watch(x)
            out = part.loss(batch, x)[0] if stage == stages - 1 else part.forward(batch, x)[0]
        for i, grad in enumerate(tape.gradient(out, variables)):
            if grad is not None:
                readers[i].add(stage)

    specs = tf.nest.map_structure(
        lambda s: tf.TensorSpec([rows, *s.shape[1:]], s.dtype), batch_spec
    )
    tf.function(lambda batch: strategy.run(probe, args=(batch,))).get_concrete_function(specs)
    missing = [s for s in range(stages) if s not in traced]
    if missing:  # several workers: this one's replicas hold some stages only; trace the others

        def others(batch):
            for stage in missing:
                probe(batch, stage)

        tf.function(lambda batch: strategy.run(others, args=(batch,))).get_concrete_function(specs)
    if any(not r for r in readers):
        return None
    shared = tuple(i for i, r in enumerate(readers) if len(r) > 1)
    return StageMap([min(r) for r in readers], shared)


def summer_stages(*, strategy, benchmark, model, summer) -> StageMap | None:
    """The stage map to build `summer` with (`stage_owners`) on a `pipeline` axis; else None
    (nothing traced: no cost without a pipeline). Call under the strategy's scope and the run's
    mesh."""
    if summer is None or benchmark.mesh.pipeline == 1:
        return None
    rows = benchmark.pipeline_micro_batch
    data = benchmark.synthetic_train_data(tf.distribute.InputContext(), rows)
    return stage_owners(
        strategy=strategy, benchmark=benchmark, model=model, batch_spec=data.element_spec
    )
