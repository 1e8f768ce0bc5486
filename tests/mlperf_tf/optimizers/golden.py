"""Provides a tiny two-layer problem with NumPy gradients, for golden tests of the optimizers.

The model is y = tanh(x W1 + b1) W2 + b2 with loss sum((y - target)**2) / batch; NumPy computes
the same forward pass and gradients, so a NumPy transcription of an optimizer's algorithm can be
stepped side by side with the Keras optimizer on the Keras model.
"""

import keras
import numpy as np
import tensorflow as tf

BATCH, IN, HIDDEN, OUT = 8, 4, 3, 2


def problem(seed: int = 0, steps: int = 6):
    """Initial weights [W1, b1, W2, b2] and one (x, target) batch per step."""
    rng = np.random.default_rng(seed)
    weights = [
        rng.normal(scale=0.5, size=(IN, HIDDEN)),
        rng.normal(scale=0.1, size=(HIDDEN,)),
        rng.normal(scale=0.5, size=(HIDDEN, OUT)),
        rng.normal(scale=0.1, size=(OUT,)),
    ]
    batches = [(rng.normal(size=(BATCH, IN)), rng.normal(size=(BATCH, OUT))) for _ in range(steps)]
    cast = lambda a: a.astype("float32")  # noqa: E731
    return [cast(w) for w in weights], [(cast(x), cast(y)) for x, y in batches]


def forward_backward(weights, x, y):
    """Returns (gradients, layer inputs [x, h], output gradients [dz1, dz2]) in float64."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    z1 = x @ w1 + b1
    h = np.tanh(z1)
    out = h @ w2 + b2
    dz2 = 2.0 * (out - y) / len(x)  # d loss / d out
    dh = dz2 @ w2.T
    dz1 = dh * (1.0 - h**2)
    grads = [x.T @ dz1, dz1.sum(0), h.T @ dz2, dz2.sum(0)]
    return grads, [x, h], [dz1, dz2]


def model(weights, dtype=None) -> keras.Model:
    built = keras.Sequential(
        [
            keras.Input((IN,)),
            keras.layers.Dense(HIDDEN, activation="tanh", dtype=dtype),
            keras.layers.Dense(OUT, dtype=dtype),
        ]
    )
    built.set_weights(weights)
    return built


def loss_fn(net, x, y, global_batch: int = BATCH):
    out = tf.cast(net(x, training=True), tf.float32)
    return tf.reduce_sum(tf.square(out - y)) / global_batch


def train_step(strategy, net, optimizer, loss=loss_fn):
    """A `tf.function` of one training step on (x, y): each replica applies its gradient of
    `loss(net, x, y)` with `optimizer` (Keras sums the replicas' gradients inside)."""

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = loss(net, x, y)
            grads = tape.gradient(value, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))

        strategy.run(replica_step, args=(x, y))

    return step


def replica_batches(strategy, batches):
    """Yields each (x, y) of `batches`, split over the strategy's replicas when it has several."""
    for x, y in batches:
        if strategy.num_replicas_in_sync > 1:
            dataset = tf.data.Dataset.from_tensors((x, y)).unbatch().batch(BATCH)
            x, y = next(iter(strategy.experimental_distribute_dataset(dataset)))
        yield x, y


def run_keras(optimizer, weights, batches, strategy=None):
    """Trains `model(weights)` on `batches` with `optimizer` (or a factory of one); returns the
    model and its final weights.

    With a strategy, each replica gets its slice of the batch and the loss is divided by the
    global batch (Keras sums the replicas' gradients).
    """
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        net = model(weights)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            optimizer = optimizer()  # a factory: optimizers are built in the strategy's scope
        optimizer.build(net.trainable_variables)
    step = train_step(strategy, net, optimizer)
    for x, y in replica_batches(strategy, batches):
        step(x, y)
    return net, [v.numpy() for v in net.trainable_variables]
