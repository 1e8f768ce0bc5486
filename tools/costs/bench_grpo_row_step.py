"""Why is the kept cache's decoding step (each row at its own position:
`HybridDecoderModel.extend`, `CompiledGenerator._row_step`) slower than the shared-position
step (`decode(position=...)`, `_step`)? Times one compiled step of `--rows` rows at the mini's
shape and cache capacity (random weights: the cost does not depend on them), each path and
each `--variants` ablation of the per-row step (a part of it replaced by the shared step's
form, for timing only: the ablated step is not the per-row function), in interleaved rounds
of `--calls` calls (each call of every variant in turn); prints each one's median wall and
CPU ms a call per round and the load average.

    python tools/costs/bench_grpo_row_step.py [--rows=16] [--calls=50] [--rounds=3]
        [--variants=shared,rows,...]

Variants: `shared` (`_step`), `rows` (`_row_step`), `rows_no_real` (the DeltaNet without its
padding mask and per-row conv state), `rows_shared_rope` (RoPE tables of one position for the
batch), `rows_shared_write` (the cache written at row 0's slot for every row),
`rows_via_decode` (`_row_step` calling the shared step's `decode` at row 0's position).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

VARIANTS = (
    "shared",
    "rows",
    "rows_no_real",
    "rows_shared_rope",
    "rows_shared_write",
    "rows_via_decode",
)


@contextlib.contextmanager
def ablated(name: str):
    """Patches the per-row step's part that `name` ablates while a step traces."""
    import tensorflow as tf  # noqa: PLC0415

    from mlperf_tf.lm import attention, gated_deltanet, rope  # noqa: PLC0415

    saved = []

    def patch(owner, attr, value):
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    if name == "rows_no_real":
        call = gated_deltanet.GatedDeltaNet.call
        patch(gated_deltanet.GatedDeltaNet, "call",
              lambda self, x, cache=None, real=None: call(self, x, cache))  # fmt: skip
    if name == "rows_shared_rope":
        tables_at = rope.RotaryEmbedding.tables_at
        patch(rope.RotaryEmbedding, "tables_at", lambda self, p: tuple(
            t + 0.0 * tf.cast(p, tf.float32)[:, None] for t in tables_at(self, p[:1])))  # fmt: skip
    if name == "rows_shared_write":
        write = attention._write_cache
        patch(attention, "_write_cache_rows",
              lambda cache, k, v, position: write(cache, k, v, position[0]))  # fmt: skip
    if name == "rows_via_decode":
        from benchmarks.qwen35_397b_grpo.model import ScaledPolicy  # noqa: PLC0415

        def via_decode(self, ids, cache, position, count):
            valid = tf.ones([ids.shape[0], cache[-1][0].shape[2]], tf.bool)
            return self.decode(ids, cache, valid, position=position[0] + 0 * count[0])

        patch(ScaledPolicy, "extend", via_decode)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if args.rows < 1 or args.calls < 1 or args.rounds < 1 or set(variants) - set(VARIANTS):
        parser.error(f"positive counts; --variants of {VARIANTS}")

    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import build_model  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    config = config_lib.mini()
    model = build_model(config.model)
    capacity = config.rollout.generation_capacity()
    rows = args.rows
    rng = np.random.default_rng(0)
    tokens = tf.constant(rng.integers(0, 256, rows), tf.int32)
    seeds = tf.constant(rng.integers(0, 2**31 - 1, [rows, 2]), tf.int32)  # [rows, (seed, step)]
    at = capacity // 2  # every row half full: the shared step's slot, the rows' own lengths
    length = tf.constant(at - rng.integers(0, 64, rows), tf.int32)
    valid = np.zeros([rows, capacity], bool)
    valid[:, : at + 1] = True
    valid, position = tf.constant(valid), tf.constant(at, tf.int32)
    fed = tf.ones([rows], tf.int32)
    cache = model.empty_cache(rows, capacity)
    steps = {}
    for name in variants:  # a generator each: its own traces, under its ablation
        generator = input_lib.generator(model, config)
        if name == "shared":
            steps[name] = lambda g=generator: g._step(tokens, cache, valid, position, seeds,
                                                      1.0, 1.0)  # fmt: skip
        else:
            steps[name] = lambda g=generator: g._row_step(tokens, cache, length, fed, seeds,
                                                          1.0, 1.0)  # fmt: skip
        begin = time.time()
        with ablated(name):
            steps[name]()[0].numpy()  # traces and compiles
        print(f"{name}: traced in {time.time() - begin:.1f} s", flush=True)
    for index in range(args.rounds):  # each call of every variant in turn: the same load
        wall = {name: [] for name in variants}
        cpu = {name: [] for name in variants}
        for call in range(args.calls):
            for name in variants if call % 2 == 0 else variants[::-1]:
                begin, begin_cpu = time.perf_counter(), time.process_time()
                steps[name]()[0].numpy()
                wall[name].append(time.perf_counter() - begin)
                cpu[name].append(time.process_time() - begin_cpu)
        print(f"round {index + 1}: " + ", ".join(
            f"{n} {1e3 * np.median(wall[n]):.1f} ms ({1e3 * np.median(cpu[n]):.1f} CPU ms)"
            for n in variants) + f" (medians of {args.calls} calls, {rows} rows; load "
            f"{harness.load_average()})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
