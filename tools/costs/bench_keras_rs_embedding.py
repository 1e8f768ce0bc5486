"""Our dlrmv4 train step at the mini shape against the same model whose embedding tables are
keras-rs' `DistributedEmbedding` (issue 56, item 3).

Both contestants are `benchmarks.dlrmv4.model.DlrmHstu` at the `mini` preset's shapes (batch
128, histories of 39, 2 STU layers of 32; synthetic batches), trained by the benchmark's own
loss and optimizer (Adam on dense weights, row-wise Adagrad on the tables) in one custom loop
(`tools.harness.custom_loop`) on one device:

* `ours`: the tables in `mlperf_tf.layers.sharded_embedding.ShardedEmbeddings` (at one shard:
  every table in one `[sum of rows, dim]` variable, every lookup of a step in one gather);
* `keras_rs`: the same tables as `keras_rs.layers.DistributedEmbedding`, one `TableConfig`
  per table and one `FeatureConfig` per lookup (the merged item, artist and album sequences
  flattened to 1-D ids, no combiner reduction; the 8 contextual ids), the same initial values
  (ours, `draw_rows`, as a Keras initializer). On a
  CPU (no SparseCore) keras-rs places every table on the default device: one `EmbedReduce`
  (a Keras `Embedding`) per table, so a step makes eleven gathers. Its layer is named as ours,
  so the row-wise Adagrad finds its tables by path.

Only the tables differ. Rounds alternate the contestants (`tools.harness.compare`), so load
drifts hit them alike. keras-rs' SparseCore path (TPU v5p/v6e) does not run here: this measures
what it costs on a host, not what it would save on a TPU.

    python tools/costs/bench_keras_rs_embedding.py [--steps=10] [--rounds=5] [--batch=128]
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.dlrmv4 import model as model_lib  # noqa: E402
from benchmarks.dlrmv4.benchmark import DlrmV4Benchmark  # noqa: E402
from mlperf_tf.layers.sharded_embedding import draw_rows  # noqa: E402
from tools import harness  # noqa: E402


class RowBlockInitializer(keras.initializers.Initializer):
    """Our tables' initial values (`sharded_embedding.draw_rows`) as a Keras initializer, so
    keras-rs' tables start from the same values as ours."""

    def __init__(self, seed: int, bound: float):
        self.seed, self.bound = seed, bound

    def __call__(self, shape, dtype=None):
        return draw_rows(self.seed, self.bound, 0, shape[0], shape[1], dtype or "float32")

    def get_config(self):
        return {"seed": self.seed, "bound": self.bound}


class KerasRsTables(keras.layers.Layer):
    """`ShardedEmbeddings`' interface (`call(ids, tables=...)`) over keras-rs'
    `DistributedEmbedding`: one table config per table, one feature per lookup of `lookups`
    ((table, ids a batch), in the model's call order: keras-rs fixes a feature's shape)."""

    def __init__(self, rows: dict[str, int], dim: int, *, bounds: dict, seed: int, lookups,
                 **kwargs):  # fmt: skip
        for unused in ("memory_limit_bytes", "limit_setting", "timeout_s"):
            kwargs.pop(unused, None)
        super().__init__(**kwargs)
        import keras_rs  # noqa: PLC0415 - a peer, imported only by this tool

        self.keras_rs = keras_rs
        self.dim = dim
        self.table_configs = {
            name: keras_rs.layers.TableConfig(
                name=name, vocabulary_size=n, embedding_dim=dim,
                initializer=RowBlockInitializer(seed + k, bounds[name]), placement="auto",
            )
            for k, (name, n) in enumerate(rows.items())
        }  # fmt: skip
        features = {
            f"f{k}": keras_rs.layers.FeatureConfig(
                name=f"f{k}", table=self.table_configs[name], input_shape=(n,),
                output_shape=(n, dim),
            )
            for k, (name, n) in enumerate(lookups)
        }  # fmt: skip
        self.embedding = keras_rs.layers.DistributedEmbedding(features, name="rs")

    def call(self, ids, tables=()):
        """Embeddings of `ids[k]` in table `tables[k]`, each `ids[k].shape + [dim]`."""
        del tables  # the features' order is the call's (`lookups`)
        flat = [tf.reshape(tf.cast(i, tf.int32), [-1]) for i in ids]  # [n_k] each
        out = self.embedding({f"f{k}": f for k, f in enumerate(flat)})
        return [
            tf.reshape(out[f"f{k}"], tf.concat([tf.shape(i), [self.dim]], 0))
            for k, i in enumerate(ids)
        ]


def contestant(benchmark: DlrmV4Benchmark, tables_class, steps_seed: int = 0):
    """`run(steps)` of the mini model with `tables_class` as its tables layer."""
    c = benchmark.config
    if tables_class is KerasRsTables:  # the model's lookups (`DlrmHstu.embed`), in order
        sequence = c.global_batch_size * (c.model.history_length + 1)
        names = list(c.model.table_rows())  # item, artist, album, uid, the crosses
        lookups = [(n, sequence) for n in names[:3]]
        lookups += [(n, c.global_batch_size) for n in names[3:]]
        tables_class = functools.partial(KerasRsTables, lookups=lookups)
    original = model_lib.ShardedEmbeddings
    model_lib.ShardedEmbeddings = tables_class
    try:
        keras.utils.set_random_seed(1)
        model = model_lib.build(
            benchmark.config.model, seed=1, batch=benchmark.config.global_batch_size
        )
    finally:
        model_lib.ShardedEmbeddings = original
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.build(model.trainable_variables)
    tables = [v.path for v in model.trainable_variables if optimizer.is_sparse(v)]
    # keras-rs' tables are `.../sparse_tables/rs/<table>/embeddings`: the optimizer's pattern.
    assert len(tables) in (1, len(c.model.table_rows())), tables
    print(f"{len(tables)} table variable(s) under row-wise Adagrad: {', '.join(tables)}")
    dataset = benchmark.train_dataset(tf.distribute.InputContext())
    return harness.custom_loop(
        model, optimizer, iter(dataset.repeat()),
        lambda m, b: benchmark.compute_loss(m, b, training=True),
    )  # fmt: skip


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=10)
    parser.add_argument("--batch", type=int, default=128, help="global batch (mini: 128)")
    args = harness.parse_rounds(parser, argv, "batch")
    config = DlrmV4Benchmark.preset("mini")
    config = dataclasses.replace(config, data_dir="", global_batch_size=args.batch)
    benchmark = DlrmV4Benchmark(config)
    import keras_rs  # noqa: PLC0415

    contestants = {
        "ours": contestant(benchmark, model_lib.ShardedEmbeddings),
        "keras_rs": contestant(benchmark, KerasRsTables),
    }
    harness.compare(
        contestants, steps=args.steps, rounds=args.rounds, samples_per_step=args.batch,
        reference="ours",
        title=f"dlrmv4 mini train step, batch {args.batch}, keras-rs {keras_rs.__version__}, "
        f"TF {tf.__version__}, Keras {keras.__version__}",
    )  # fmt: skip


if __name__ == "__main__":
    main()
