"""Provides the DeepSeek-V3 data and starting-checkpoint preparation: the C4 token windows of
`llama31_8b`, by the same code, at the reference's 4,096 tokens, and the `mini` preset's base
checkpoint, trained here untimed and written in the Hugging Face layout.

The reference reads the same C4 files as `llama31_8b`'s, tokenized with the Llama 3.1 tokenizer
(`pretrain_deepseek_v3_671b.py`: `c4-train.en_6_text_document`,
`c4-validation-91205-samples.en_text_document`, the tokenizer in `/tokenizer`); its windows are
4,096 tokens (`--sequence_length`), so prepare with `--sequence_length=4096`. Its run starts from
MLCommons' DeepSeek-V3 checkpoint (Hugging Face layout, after 50 warm-up iterations on the Llama
3.1 vocabulary); the `mini` preset does the same at its scale: `prepare_mini_base` trains the
mini model from its initializers on the mini corpus for `MINI_BASE_STEPS` steps and exports it
(`checkpoint.export`), and the timed run imports it (`checkpoint.load`, the shared importer).

Command line:
  mlperf-tf prepare deepseekv3_671b --c4_dir=C4 --tokenizer=Llama-3.1-8B/tokenizer.json
      --out_dir=DIR --sequence_length=4096 [--train_shards=768-1023] [--max_train_windows=N]
  mlperf-tf prepare deepseekv3_671b --mini --out_dir=DIR
      (the shared mini corpus's windows of `config.MINI_SEQUENCE_LENGTH` tokens in DIR, the
      corpus itself written first if missing, and the mini base, `mini_base_dir`)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from absl import logging

from mlperf_tf import paths, prepare_cli
from mlperf_tf.data import c4

# The mini base: steps of the mini preset's batch and sequence from the initializers, on the
# plain model (s = 1) at this peak rate after `MINI_BASE_WARMUP` steps (the rate the mini's
# parametrization gives the rules' LR: `config.MINI_WEIGHT_SCALE`).
MINI_BASE_STEPS = 300
MINI_BASE_LR = 1.5e-3
MINI_BASE_WARMUP = 20
MINI_BASE_SEED = 4242
# The base's folder names its shape: an older base (another width, sequence or batch) is not
# reused.
MINI_BASE_NAME = "deepseekv3-mini-base-h192-s64-b64"


def mini_base_dir() -> str:
    """Where the `mini` preset's base checkpoint lives (under the shared data root)."""
    return os.path.join(paths.data_root(), MINI_BASE_NAME)


def prepare_mini_base(out_dir: str, *, steps: int = MINI_BASE_STEPS, data_dir: str = "") -> dict:
    """Trains the `mini` model, plain (s = 1), from its initializers for `steps` steps (the
    mini's batch and windows, AdamW at `MINI_BASE_LR` after `MINI_BASE_WARMUP` steps, clip 1.0
    of the gradient with each embedding row once, the selection bias moved every step) on the
    mini corpus (`data_dir`, default the preset's) and writes it to `out_dir` in the Hugging
    Face layout. Untimed: the MLPerf run's starting point, as MLCommons' checkpoint is the real
    run's.

    Returns:
      A summary: steps, the last loss, seconds, the export's tensors and shards.
    """
    import keras  # noqa: PLC0415 (TensorFlow only where a model is trained)
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.deepseekv3_671b import checkpoint  # noqa: PLC0415
    from benchmarks.deepseekv3_671b import config as config_lib  # noqa: PLC0415
    from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark  # noqa: PLC0415
    from mlperf_tf.benchmark import RunContext  # noqa: PLC0415
    from mlperf_tf.optimizers.base import clipped_update  # noqa: PLC0415

    config = config_lib.mini()
    optimizer = dataclasses.replace(
        config.optimizer, opt_base_learning_rate=MINI_BASE_LR,
        opt_learning_rate_warmup_steps=MINI_BASE_WARMUP,
    )  # fmt: skip
    config = dataclasses.replace(
        config, init_checkpoint="", data_dir=data_dir or config.data_dir, optimizer=optimizer,
        model=dataclasses.replace(config.model, weight_scale=1.0),
    )  # fmt: skip
    if not os.path.isdir(config.data_dir):
        c4.prepare_mini_windows(config.data_dir, config_lib.MINI_SEQUENCE_LENGTH)
    bench = DeepseekV3Benchmark(config).with_context(RunContext(num_replicas=1))
    keras.utils.set_random_seed(MINI_BASE_SEED)
    model = bench.build_model()
    optimizer = bench.build_optimizer(steps)
    optimizer.build(model.trainable_variables)
    data = iter(bench.train_dataset(tf.distribute.InputContext()))

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss, metrics = bench.compute_loss_and_metrics(model, batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        # The embedding's sparse gradient lists a row once per lookup: merged before the norm
        # and Adam's second moment, as the runner's trainer does.
        clipped_update(optimizer, grads, model.trainable_variables, config.gradient_clip_norm)
        # The selection bias's move, as the runner's step makes it (`Benchmark.after_update`).
        bench.after_update(model, {name: metrics[name] for name in bench.update_metrics()})
        return loss

    begin, loss = time.time(), float("nan")
    for i in range(steps):
        loss = float(step(next(data)))
        if (i + 1) % 50 == 0:
            logging.info("deepseekv3_671b mini base: step %d/%d loss %.4f", i + 1, steps, loss)
    seconds = round(time.time() - begin, 1)
    perplexity = base_eval_log_perplexity(bench, model)
    logging.info(
        "deepseekv3_671b mini base: eval log perplexity %.4f over the %d eval windows (the "
        "run's target: %.2f)", perplexity, config.eval_examples,
        config.quality_target,
    )  # fmt: skip
    summary = checkpoint.export(model, config.model, out_dir)
    return {"steps": steps, "loss": loss, "seconds": seconds,
            "eval_log_perplexity": round(perplexity, 4), **summary}  # fmt: skip


def base_eval_log_perplexity(bench, model) -> float:
    """The main head's log perplexity of `model` over `bench`'s eval set (every window once, as
    the timed run's eval computes it: `eval_step` folded by `eval_reduce`, `eval_result`), on
    one replica. The base's own quality, which the run's target must lie below."""
    import tensorflow as tf  # noqa: PLC0415

    step = tf.function(lambda batch: bench.eval_step(model, batch))
    data = iter(bench.eval_dataset(tf.distribute.InputContext()))
    state = bench.eval_begin()
    for _ in range(bench.eval_steps(1)):
        outputs = step(next(data))
        state = bench.eval_reduce(state, {k: v.numpy() for k, v in outputs.items()})
    return bench.eval_result(state)


def main(argv: Sequence[str] | None = None) -> int:
    """`mlperf-tf prepare deepseekv3_671b ...` (see the module docstring)."""
    from benchmarks.deepseekv3_671b import config as config_lib  # noqa: PLC0415

    code = c4.main(
        argv, name="deepseekv3_671b", mini_sequence_length=config_lib.MINI_SEQUENCE_LENGTH
    )
    args = sys.argv[1:] if argv is None else list(argv)
    if code == 0 and "--mini" in args and not os.path.isdir(mini_base_dir()):
        print(prepare_mini_base(mini_base_dir()))
    return code


if __name__ == "__main__":
    prepare_cli.module_main(main)
