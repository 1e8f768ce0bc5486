"""Saves checkpoints back to back until killed, for the kill-during-save test.

usage: python -m tests.faults.save_forever DIR
Before saving step N it sets every value of its variables to N, so a restored checkpoint can be
checked for consistency; after each save it prints `saved N`.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from mlperf_tf.checkpoints import Checkpointer  # noqa: E402

SHAPES = ([1024, 1024], [2048, 1024], [16])  # ~12 MB: a save takes a measurable time


def make_checkpoint() -> tf.train.Checkpoint:
    return tf.train.Checkpoint(**{f"v{i}": tf.Variable(tf.zeros(s)) for i, s in enumerate(SHAPES)})


def main(directory: str) -> None:
    checkpoint = make_checkpoint()
    saver = Checkpointer(checkpoint=checkpoint, model_dir=directory, max_to_keep=2)
    step = 0
    while True:
        step += 1
        for i in range(len(SHAPES)):
            getattr(checkpoint, f"v{i}").assign(tf.fill(SHAPES[i], float(step)))
        saver.save(step)
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
