"""Measures the optimizer-step time of LARS and LAMB against SGD-momentum and Adam.

The step is `optimizer.apply_gradients` alone (fixed gradients, no model forward/backward) in a
`tf.function`, on the trainable variables of ResNet-50 (`keras.applications.ResNet50`, 214
variables, 25.6M parameters) and of BERT-base (the 206 variable shapes and names of the
uncased 12-layer, 768-wide model with its masked-LM and next-sentence heads, 110M parameters).
Repetitions of the optimizers are interleaved in one run, and each ratio is taken within a
repetition, so that machine noise cancels in the ratios. Goals: LARS <= 1.3x SGD-momentum on
ResNet-50, LAMB <= 1.3x Adam on BERT-base.

    python tools/costs/bench_optimizers.py [--models=resnet50,bert] [--repeats=7] [--steps=5]
        [--bert_layers=12] [--jit_compile]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf.optimizers import LAMB, LARS  # noqa: E402
from tools import harness  # noqa: E402

# Which optimizers are timed on which model's variables, and which ratio is the goal.
PAIRS = {"resnet50": ("lars", "sgd_momentum"), "bert": ("lamb", "adam")}
GOAL = 1.3


def make_optimizer(name: str) -> keras.optimizers.Optimizer:
    """An optimizer with MLPerf-like hyperparameters and a tiny LR (values stay finite)."""
    lr = 1e-6
    if name == "sgd_momentum":
        return keras.optimizers.SGD(lr, momentum=0.9)
    if name == "lars":
        return LARS(lr, momentum=0.9, weight_decay=5e-5, eeta=0.001)
    if name == "adam":
        return keras.optimizers.Adam(lr, epsilon=1e-6)
    if name == "lamb":
        return LAMB(lr, weight_decay=0.01)
    raise ValueError(f"unknown optimizer {name!r}")


def resnet50_variables() -> list[keras.Variable]:
    """The trainable variables of Keras' ResNet-50 (random init, nothing downloaded)."""
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    return list(model.trainable_variables)


def _variable(path: str, shape: tuple[int, ...], rng: np.random.Generator) -> keras.Variable:
    scopes, name = path.split("/")[:-1], path.split("/")[-1]
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(keras.name_scope(scope))
        return keras.Variable(rng.normal(0, 0.02, size=shape).astype("float32"), name=name)


def bert_variables(num_layers: int = 12) -> list[keras.Variable]:
    """Variables with BERT-base's shapes and names (vocab 30522, hidden 768, FFN 3072)."""
    vocab, hidden, ffn, positions = 30522, 768, 3072, 512
    rng = np.random.default_rng(0)
    specs = [
        ("bert/embeddings/word_embeddings", (vocab, hidden)),
        ("bert/embeddings/position_embeddings", (positions, hidden)),
        ("bert/embeddings/token_type_embeddings", (2, hidden)),
        ("bert/embeddings/LayerNorm/gamma", (hidden,)),
        ("bert/embeddings/LayerNorm/beta", (hidden,)),
    ]
    for i in range(num_layers):
        layer = f"bert/encoder/layer_{i}"
        for part in ("query", "key", "value"):
            specs += [
                (f"{layer}/attention/self/{part}/kernel", (hidden, hidden)),
                (f"{layer}/attention/self/{part}/bias", (hidden,)),
            ]
        specs += [
            (f"{layer}/attention/output/dense/kernel", (hidden, hidden)),
            (f"{layer}/attention/output/dense/bias", (hidden,)),
            (f"{layer}/attention/output/LayerNorm/gamma", (hidden,)),
            (f"{layer}/attention/output/LayerNorm/beta", (hidden,)),
            (f"{layer}/intermediate/dense/kernel", (hidden, ffn)),
            (f"{layer}/intermediate/dense/bias", (ffn,)),
            (f"{layer}/output/dense/kernel", (ffn, hidden)),
            (f"{layer}/output/dense/bias", (hidden,)),
            (f"{layer}/output/LayerNorm/gamma", (hidden,)),
            (f"{layer}/output/LayerNorm/beta", (hidden,)),
        ]
    specs += [
        ("bert/pooler/dense/kernel", (hidden, hidden)),
        ("bert/pooler/dense/bias", (hidden,)),
        ("cls/predictions/transform/dense/kernel", (hidden, hidden)),
        ("cls/predictions/transform/dense/bias", (hidden,)),
        ("cls/predictions/transform/LayerNorm/gamma", (hidden,)),
        ("cls/predictions/transform/LayerNorm/beta", (hidden,)),
        ("cls/predictions/output_bias", (vocab,)),
        ("cls/seq_relationship/output_weights", (2, hidden)),
        ("cls/seq_relationship/output_bias", (2,)),
    ]
    return [_variable(path, shape, rng) for path, shape in specs]


def make_step(optimizer, variables, jit_compile: bool):
    """A compiled function running `steps` optimizer updates with the given gradients."""
    optimizer.build(variables)

    @tf.function(jit_compile=jit_compile)
    def apply(grads):
        optimizer.apply_gradients(zip(grads, variables))

    def run(grads, steps):
        for _ in range(steps):
            apply(grads)
        # Wait for the last update: reading one value forces the queued ops to finish.
        variables[-1].numpy()

    return run


def bench_model(name, variables, args) -> harness.Rounds:
    """Interleaved rounds of the model's pair of optimizers (samples = optimizer steps)."""
    rng = np.random.default_rng(1)
    grads = [tf.constant(rng.normal(0, 1e-3, size=v.shape).astype("float32")) for v in variables]
    contestants = {
        o: functools.partial(make_step(make_optimizer(o), variables, args.jit_compile), grads)
        for o in PAIRS[name]
    }
    harness.warm_up(contestants)  # trace, compile
    return harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=args.repeats, samples_per_step=1
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per repetition")
    parser.add_argument("--bert_layers", type=int, default=12)
    parser.add_argument("--jit_compile", action="store_true", help="compile the step with XLA")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in PAIRS:
            parser.error(f"--models: unknown model {m!r} (known: {', '.join(PAIRS)})")
    if args.repeats < 1 or args.steps < 1:
        parser.error(f"--repeats ({args.repeats}) and --steps ({args.steps}) must be >= 1")

    print(
        f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs, "
        f"jit_compile={args.jit_compile}, {args.repeats} interleaved repeats x {args.steps} steps"
    )
    failed = False
    for m in models:
        variables = resnet50_variables() if m == "resnet50" else bert_variables(args.bert_layers)
        params = sum(int(np.prod(v.shape)) for v in variables)
        result = bench_model(m, variables, args)
        ours, base = PAIRS[m]
        print(f"\n{m}: {len(variables)} variables, {params / 1e6:.1f}M parameters")
        print(harness.report(result, base, unit="steps"))
        # CPU time is the verdict: on a shared machine wall time mostly measures the queue.
        ratio = harness.median_ratio(result.cpu[ours], result.cpu[base])
        verdict = "ok" if ratio <= GOAL else "ABOVE GOAL"
        print(f"  verdict (CPU time): {ours}/{base} = {ratio:.2f}x, goal <= {GOAL}: {verdict}")
        failed |= ratio > GOAL
        del variables
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
