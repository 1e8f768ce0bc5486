"""Provides `SplitDecoding`: a decoder split over the mesh's `model` or `expert` axis, seen by the
generators (`mlperf_tf.rl.generation.generate`, `CompiledGenerator`) as an unsplit one.

A split model's layers issue collectives (the row-parallel projections' all-reduce, the MoE's
all-to-all), which run only in replica context, and each replica holds its own heads' cache and
its own vocabulary shard's logits. `SplitDecoding` runs every `decode` / `extend` call on every
replica (`strategy.run`: each replica decodes the same rows; the expert group's members send
their tokens to each other's experts) and joins what the generator reads: the logits of the
members of one model group concatenated along the vocabulary (their order is the shards'), and
each layer's cache with the members' local caches concatenated along axis 1 (heads for the
key/value cache and the DeltaNet's state, the convolution state's window for the DeltaNet's
conv: a storage order only, split back the same way). The cache's batch axis is untouched, so
the generators slice and join rows as they do for an unsplit model. Inside a `tf.function` (the
compiled steps) the whole call is one graph.

Cost: every replica of the mesh decodes the whole batch (the expert group's members too: no row
is split over `data` or `expert` here), so the split buys memory, not decoding speed.

One call at a time (`lock`, `exclusive`): a split decoding program's collectives have static
instance keys (`mlperf_tf.collectives.ops`: the layer, the op, its count in the program and the
shape), so two runs of one program at once, from two threads (the training rollouts' and the
evaluation's `tf.data` pipelines share the benchmark's one generator), issue the same keys and
TensorFlow pairs their halves crosswise (measured, two threads generating on the M2 smoke
model: the process's collectives abort, "BufRendezvous::ProvideBuf already called", and every
later collective fails too).
Whoever runs a program on a `SplitDecoding` (`CompiledGenerator`'s compiled calls; the eager
`decode` / `extend` here) holds its lock for the call, so the two pipelines take turns call by
call (a prefill, a decoding step), not rollout batch by batch.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from mlperf_tf.parallel.layout import splits_weights
from mlperf_tf.parallel.mesh import DeviceMesh


class SplitDecoding:
    """`model`'s `decode`, `extend` and `empty_cache` across the replicas of `strategy` on
    `mesh` (replica 0's model group answers: the other groups compute the same).

    Args:
      model: a decoder built under `mesh` in `strategy.scope()` (`HybridDecoderModel`).
      strategy: the run's strategy (one replica per mesh position).
      mesh: the run's mesh.
    """

    def __init__(self, model, strategy: tf.distribute.Strategy, mesh: DeviceMesh):
        self.model, self.strategy, self.mesh = model, strategy, mesh
        self.members = mesh.group(0, "model")  # replica ids of model shards 0 .. M - 1
        # Held for each run of a program that decodes with this model (module docstring):
        # re-entrant, since a compiled call that traces runs `_run` inside its own hold.
        self.lock = threading.RLock()

    def __getattr__(self, name):  # config, compute_dtype, ...: the model's
        if name == "model":  # not set yet (a copy or unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def _own(self, cache):
        """Inside a replica: this replica's part of a joined cache."""
        parts = len(self.members)
        if parts == 1:
            return cache
        index = self.model.axis.index()
        return tf.nest.map_structure(lambda x: tf.split(x, parts, axis=1)[index], cache)

    def _run(self, fn):
        """`fn()` (-> (logits [..., vocab/M], local cache)) on every replica; the joined
        (logits [..., vocab], cache)."""
        with self.lock:  # eager: this call is the run; traced: held by the compiled call too
            results = self.strategy.experimental_local_results(self.strategy.run(fn))
        logits, caches = zip(*(results[r] for r in self.members), strict=True)
        if len(self.members) == 1:
            return logits[0], caches[0]
        joined = tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=1), *caches)
        return tf.concat(logits, axis=-1), joined

    def empty_cache(self, batch: int, capacity: int = 0) -> list:
        """The model's empty cache (local shapes), joined over the model group."""
        with self.strategy.scope():
            local = self.model.empty_cache(batch, capacity)
        parts = len(self.members)
        return tf.nest.map_structure(lambda x: tf.concat([x] * parts, axis=1), local)

    def decode(self, token_ids, cache, key_valid, position=None):
        """`HybridDecoderModel.decode` on the split model."""
        return self._run(
            lambda: self.model.decode(token_ids, self._own(cache), key_valid, position)
        )

    def extend(self, token_ids, cache, position, count):
        """`HybridDecoderModel.extend` on the split model."""
        return self._run(lambda: self.model.extend(token_ids, self._own(cache), position, count))


def for_generation(model, mesh: DeviceMesh | None, strategy: tf.distribute.Strategy | None = None):
    """What a generator should decode with: `model` itself on an unsplit mesh, else a
    `SplitDecoding` of it on `strategy` (default: the model's own)."""
    if not splits_weights(mesh):
        return model
    return SplitDecoding(model, strategy or model.distribute_strategy, mesh)


def exclusive(model):
    """What a caller holds while it runs a program that decodes with `model`: the lock of a
    `SplitDecoding` (its collectives' keys allow one run at a time: module docstring), else
    nothing (an unsplit model issues no collectives)."""
    return model.lock if isinstance(model, SplitDecoding) else contextlib.nullcontext()
