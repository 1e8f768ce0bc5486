"""Provides `mirrored(n)`: a MirroredStrategy over the first n logical CPUs, safe to build often.

Every default MirroredStrategy in a process numbers its collectives from the same keys, so two of
them over the same devices whose first all-reduces differ in shape fail ("Shape mismatch in the
collective instance") and break collectives for the rest of the process. Reducing on the host
(`ReductionToOneDevice`), as the runner does on CPUs, uses no collective keys.
"""

import tensorflow as tf


def mirrored(num_devices: int = 2) -> tf.distribute.MirroredStrategy:
    devices = [f"CPU:{i}" for i in range(num_devices)]
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
