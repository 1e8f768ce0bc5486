"""`StageSlots`: each stage's slot pieces in one buffer per slot name and dtype, sized for the
largest stage, read and written through `Piece` views (the exactness and memory of the
stage-sharded update through the runner: `tests/mlperf_tf/test_runner_pipeline.py`)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mlperf_tf.collectives.stages import Piece, StageSlots


def test_each_stage_s_pieces_lie_one_after_the_other_in_the_largest_stage_s_buffer():
    f32, f16 = tf.float32, tf.float16
    slots = StageSlots(("m", "v"), [[(0, 3, f32), (2, 2, f32)], [(1, 4, f32), (3, 1, f16)]])
    widths = {(name, dtype.name): int(b.shape[0]) for (name, dtype), b in slots.buffers.items()}
    assert widths == {("m", "float32"): 5, ("v", "float32"): 5, ("m", "float16"): 1,
                      ("v", "float16"): 1}  # fmt: skip
    assert slots.bytes_per_replica() == 2 * (5 * 4 + 1 * 2)
    pieces = slots.pieces(0)
    assert sorted(pieces) == [0, 2] and [p.shape[0] for p in pieces[0]] == [3, 3]
    for index, (m, v) in pieces.items():
        g = tf.fill(m.shape, float(index + 1))
        m.assign(m + (g - m) * 0.5)  # a rule's arithmetic on the views, as on variables
        v.assign(2.0 * m - (-v) + g**2 / 1.0)
    slots.commit(0, pieces)
    np.testing.assert_array_equal(slots.buffers[("m", f32)].numpy(), [0.5] * 3 + [1.5] * 2)
    np.testing.assert_array_equal(slots.buffers[("v", f32)].numpy(), [2.0] * 3 + [12.0] * 2)


def test_a_piece_reads_as_its_tensor():
    piece = Piece(tf.constant([1.0, 2.0]))
    np.testing.assert_array_equal(tf.convert_to_tensor(piece).numpy(), [1.0, 2.0])
    np.testing.assert_array_equal((tf.square(piece) * piece).numpy(), [1.0, 8.0])
    assert piece.dtype == tf.float32
