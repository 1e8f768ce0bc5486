"""Provides `ContextAxis`: the mesh's `context` axis as one replica sees it, and the zig-zag split
of a sequence over it (context parallelism, `--context_parallel=C`).

Each sequence of S tokens is cut into 2C chunks of S / 2C; the replica of context index c holds
chunks c and 2C-1-c (Megatron-core's `get_batch_on_this_cp_rank`, the load balance of a causal
mask: an early chunk, whose queries see few keys, paired with a late one, whose queries see
many, so every member does the same attention work). Every layer but attention is per token and
runs on the replica's 2S / 2C tokens unchanged; attention gathers the keys and values of the
whole sequence over the axis (one all-gather, as Llama 3's training does, not a ring) and masks
by the tokens' true positions (`positions`, `key_positions`); RoPE rotates at the true positions
too. The loss of a replica is its tokens' share of the whole sequence's weighted mean, so the
replicas' losses, and their gradients, sum to the unsplit one (`mlperf_tf.lm.loss`).

The gather's backward is the all-reduce of the upstream gradient over the axis, then the
replica's own rows (`AxisGroup.gather`): C times the bytes of the reduce-scatter Megatron uses,
the price of one collective kind that every `tf.distribute` path has.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.mesh import DeviceMesh


def check_sequence(seq_len: int, size: int) -> None:
    """Refuses a sequence that does not cut into 2 x `size` equal chunks.

    Raises:
      UserError: one line naming `--context_parallel` and the sequence length.
    """
    if size > 1 and seq_len % (2 * size):
        raise UserError(
            f"--context_parallel={size} cuts each sequence into {2 * size} equal chunks: the "
            f"sequence length ({seq_len}, data.max_sequence_length) must divide by {2 * size}"
        )


def zigzag_positions(seq_len: int, size: int, index: int) -> np.ndarray:
    """int32 [seq_len / size]: the positions of the tokens context member `index` of `size`
    holds, in its order (chunk `index`, then chunk 2 `size` - 1 - `index`, each S / 2C long)."""
    check_sequence(seq_len, size)
    chunk = seq_len // (2 * size)
    first = np.arange(index * chunk, (index + 1) * chunk)
    second = np.arange((2 * size - 1 - index) * chunk, (2 * size - index) * chunk)
    return np.concatenate([first, second]).astype(np.int32)


class ContextAxis(AxisGroup):
    """The `context` axis of the mesh from one replica: its chunks of each sequence, their true
    positions, and the gather of keys and values over the axis. Of size 1 (no mesh, or C = 1)
    every method is the identity and positions are 0..S-1, with no replica context needed.

    Args:
      owner: the layer that issues the collectives (its `path` names them), or a string.
      mesh: the run's mesh (None: the ambient one).
    """

    def __init__(self, owner, mesh: DeviceMesh | None = None, timeout_s: float = 0.0):
        super().__init__("context", owner=owner, mesh=mesh, timeout_s=timeout_s)

    def positions(self, local_len: int) -> np.ndarray:
        """int32 [local_len]: the true positions of this replica's `local_len` tokens."""
        if self.size == 1:
            return np.arange(local_len, dtype=np.int32)
        return zigzag_positions(local_len * self.size, self.size, self.index())

    def key_positions(self, local_len: int) -> np.ndarray:
        """int32 [size local_len]: the true positions of the gathered keys (`gather_sequence`):
        every member's tokens, in rank order."""
        if self.size == 1:
            return np.arange(local_len, dtype=np.int32)
        whole = local_len * self.size
        return np.concatenate([zigzag_positions(whole, self.size, c) for c in range(self.size)])

    def split(self, x, axis: int = 1):
        """This replica's tokens of a whole-sequence tensor (its chunks c and 2C-1-c along
        `axis`, whose length must be static): [..., S, ...] -> [..., S / C, ...]."""
        if self.size == 1:
            return x
        seq = x.shape[axis]
        if seq is None:
            raise ValueError("context parallelism needs the sequence length static")
        return tf.gather(x, self.positions(seq // self.size), axis=axis)

    def gather_sequence(self, x, axis: int = 1):
        """Every member's `x` concatenated along `axis` in rank order (the keys' order of
        `key_positions`), with its gradient: [..., L, ...] -> [..., size L, ...]."""
        if self.size == 1:
            return x
        stacked = self.gather(tf.expand_dims(x, 0), what="gather_kv")  # [size, ..., L, ...]
        stacked = tf.experimental.numpy.moveaxis(stacked, 0, axis)  # [..., size, L, ...]
        shape = stacked.shape.as_list()
        return tf.reshape(stacked, shape[:axis] + [-1] + shape[axis + 2 :])

    def total(self, x):
        """The sum of `x` over the axis, forward only (a loss's token count)."""
        return self.all_reduce(tf.stop_gradient(x), what="total")
