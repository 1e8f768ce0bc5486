"""Records the Transformer's and BERT's numerics (seeded smoke-preset models, dropout off) to
compare a refactor against: forward outputs (padded, packed, cached decoding), the first step's
gradients, three SGD steps' losses and weights, three Adam steps' losses, and every variable's
path, shape and checkpoint key. (Adam's weights are not compared: a weight whose gradient is
zero but for rounding, e.g. an attention key bias, moves by +-lr on the rounding's sign.)

Run it before a change with `--out=before.npz`, after it with `--compare=before.npz`: it prints
each array's max |after - before| relative to the array's scale and exits 1 when one exceeds
`--rtol` or a variable's path, shape or checkpoint key changed. Single-threaded with oneDNN off
(set before TensorFlow loads), so two runs of one commit agree bit for bit.

Usage:
  python tools/dev/model_snapshot.py --out=/tmp/before.npz
  python tools/dev/model_snapshot.py --compare=/tmp/before.npz [--rtol=1e-6]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np


def _seeded_transformer():
    import keras  # noqa: PLC0415

    from benchmarks.transformer import config as config_lib  # noqa: PLC0415
    from benchmarks.transformer import model as model_lib  # noqa: PLC0415

    keras.utils.set_random_seed(0)
    c = config_lib.smoke().model
    params = model_lib.TransformerParams(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_layers,
        num_heads=c.num_heads, filter_size=c.filter_size, dropout=0.0, attention_dropout=0.0,
        relu_dropout=0.0,
    )  # fmt: skip
    model = model_lib.Transformer(params)
    model.build()
    return model


def _transformer(out: dict) -> None:
    import tensorflow as tf  # noqa: PLC0415

    model = _seeded_transformer()
    rng = np.random.default_rng(1)
    inputs = rng.integers(3, 64, (4, 8)).astype(np.int32)
    targets = rng.integers(3, 64, (4, 7)).astype(np.int32)
    inputs[1, 5:], targets[2, 4:] = 0, 0
    batch = {"inputs": tf.constant(inputs), "targets": tf.constant(targets)}
    out["tr/logits"] = model(batch).numpy()
    out["tr/packed_states"] = model.teacher_forced_states(batch, packed=True).numpy()
    encoded, mask = model.encode(batch["inputs"])
    for grow in (False, True):
        cache, static = model.init_cache(encoded, mask, 4, grow=grow)
        ids = tf.zeros([4, 1], tf.int32)
        steps = []
        for step in range(4):
            logits, cache = model.decode_step(ids, tf.constant(step), cache, static, grow=grow)
            steps.append(logits.numpy())
            ids = tf.argmax(logits, -1, output_type=tf.int32)[:, None]
        out[f"tr/decode_grow{int(grow)}"] = np.stack(steps)

    def loss_fn():
        logits = model(batch, training=True)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(batch["targets"], logits)
        )

    _train(out, "tr", model, loss_fn)


def _bert(out: dict) -> None:
    import dataclasses  # noqa: PLC0415

    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.bert import config as config_lib  # noqa: PLC0415
    from benchmarks.bert import model as model_lib  # noqa: PLC0415

    keras.utils.set_random_seed(0)
    c = dataclasses.replace(
        config_lib.smoke().model, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model = model_lib.build_pretrainer(c)
    rng = np.random.default_rng(2)
    mask = np.ones((4, 16), np.int32)
    mask[1, 10:], mask[3, 5:] = 0, 0
    batch = {
        "input_ids": tf.constant(rng.integers(1, c.vocab_size, (4, 16)) * mask, tf.int32),
        "input_mask": tf.constant(mask),
        "segment_ids": tf.constant((np.arange(16) >= 8) * mask, tf.int32),
        "masked_lm_positions": tf.constant(rng.integers(0, 5, (4, 3)), tf.int32),
    }
    labels = tf.constant(rng.integers(0, c.vocab_size, (4, 3)), tf.int32)
    nsp = tf.constant([0, 1, 1, 0], tf.int32)
    for packed in (False, True):
        result = model(batch, packed=packed)
        out[f"bert/mlm_packed{int(packed)}"] = result["mlm_logits"].numpy()
        out[f"bert/nsp_packed{int(packed)}"] = result["nsp_logits"].numpy()

    def loss_fn():
        result = model(batch, training=True)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels, result["mlm_logits"])
        ) + tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(nsp, result["nsp_logits"])
        )

    _train(out, "bert", model, loss_fn)
    out["bert/tf1_names"] = np.array(
        sorted(f"{k}={v.path}:{tuple(v.shape)}" for k, v in model.tf1_variables().items())
    )


def _train(out: dict, prefix: str, model, loss_fn) -> None:
    """First-step gradients, then 3 SGD steps (losses, weights), then 3 Adam steps (losses)."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    for name, optimizer in (
        ("sgd", keras.optimizers.SGD(0.1)),
        ("adam", keras.optimizers.Adam(1e-2)),
    ):
        losses = []
        for step in range(3):
            with tf.GradientTape() as tape:
                loss = loss_fn()
            grads = tape.gradient(loss, model.trainable_variables)
            if name == "sgd" and step == 0:
                for i, g in enumerate(grads):
                    out[f"{prefix}/grad{i:03d}"] = tf.convert_to_tensor(g).numpy()
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            losses.append(loss.numpy())
        out[f"{prefix}/{name}_losses"] = np.array(losses)
        if name == "sgd":
            _weights(out, prefix, model)


def _weights(out: dict, prefix: str, model) -> None:
    import tensorflow as tf  # noqa: PLC0415

    for i, v in enumerate(model.weights):
        out[f"{prefix}/w{i:03d}"] = v.numpy()
    out[f"{prefix}/paths"] = np.array([f"{v.path}:{tuple(v.shape)}" for v in model.weights])
    with tempfile.TemporaryDirectory() as tmp:
        path = tf.train.Checkpoint(model=model).write(os.path.join(tmp, "ckpt"))
        keys = [f"{k}:{tuple(s)}" for k, s in tf.train.list_variables(path)]
    out[f"{prefix}/ckpt_keys"] = np.array(sorted(keys))


def snapshot() -> dict:
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    out: dict = {}
    _transformer(out)
    _bert(out)
    return out


def compare(before: dict, after: dict, rtol: float) -> bool:
    """Prints each entry's difference; True when all match (names exactly, numbers at rtol)."""
    ok = True
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            print(f"{key}: only {'after' if key in after else 'before'}")
            ok = False
            continue
        a, b = np.asarray(after[key]), np.asarray(before[key])
        if a.dtype.kind in "US" or b.dtype.kind in "US":
            same = a.shape == b.shape and bool((a == b).all())
            if not same:
                print(
                    f"{key}: differs\n  before {sorted(set(b) - set(a))}\n  after {sorted(set(a) - set(b))}"
                )
            ok &= same
            continue
        if a.shape != b.shape:
            print(f"{key}: shape {b.shape} -> {a.shape}")
            ok = False
            continue
        scale = max(float(np.abs(b).max()), 1e-30) if b.size else 1.0
        rel = float(np.abs(a - b).max()) / scale if b.size else 0.0
        if rel > rtol:
            ok = False
        if rel > 0 or key.endswith(("losses", "logits")):
            print(f"{key}: max |diff| / scale = {rel:.3g}{'  FAIL' if rel > rtol else ''}")
    print("same" if ok else "DIFFERENT")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", help="write the snapshot (.npz) here")
    group.add_argument("--compare", help="compare this commit against a snapshot (.npz)")
    parser.add_argument("--rtol", type=float, default=1e-6, help="allowed |diff| / scale")
    args = parser.parse_args(argv)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    out = snapshot()
    if args.out:
        np.savez(args.out, **out)
        print(f"wrote {len(out)} arrays to {args.out}")
        return 0
    with np.load(args.compare) as before:
        return 0 if compare(dict(before), out, args.rtol) else 1


if __name__ == "__main__":
    sys.exit(main())
