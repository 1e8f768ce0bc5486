"""What does DeepSeek-V3's block cost? Our train step of one DeepSeek-V3 block (MLA + DeepSeekMoE:
group-limited sigmoid routing, a shared expert) at the `deepseekv3_671b` mini's width, against
the suite's `gpt_oss_20b` block (grouped-query attention + top-k-then-softmax MoE) with experts
sized for equal active feed-forward FLOPs, and a dense Llama block of that active width.

No keras-hub DeepSeek exists, so the peers are the suite's own blocks. Each contestant is a
one-block decoder (the embedding and output head of the mini vocabulary included, no MTP) under
the same custom loop (`tools.harness.custom_loop`: tape, AdamW `apply_gradients`) on the same
synthetic tokens; tokens/s are medians over rounds that alternate the contestants.

    python tools/costs/bench_deepseek_block.py [--batch=8] [--sequence=256] [--steps=5] [--rounds=3]
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.deepseekv3_671b import config as dsv3_config  # noqa: E402
from benchmarks.gpt_oss_20b import config as gpt_oss_config  # noqa: E402
from mlperf_tf.lm import loss as loss_lib  # noqa: E402
from mlperf_tf.lm.config import DecoderConfig  # noqa: E402
from mlperf_tf.lm.decoder import build_decoder  # noqa: E402
from tools import harness  # noqa: E402


def configs() -> dict[str, DecoderConfig]:
    """The three one-block decoders at equal active feed-forward width (the DeepSeek mini's
    top-2 routed experts + its shared expert: 3 x 128 = 384)."""
    deepseek = dsv3_config.mini_model()
    deepseek = dataclasses.replace(
        deepseek, num_hidden_layers=1, mtp_layers=0,
        moe=dataclasses.replace(deepseek.moe, first_dense=0),
    )  # fmt: skip
    m = deepseek.moe
    active = m.top_k * m.filter_size + m.shared_filter_size
    common = dict(vocab_size=deepseek.vocab_size, hidden_size=deepseek.hidden_size,
                  num_hidden_layers=1, max_position_embeddings=deepseek.max_position_embeddings)  # fmt: skip
    gpt_oss = gpt_oss_config.ModelConfig(
        **common, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        intermediate_size=active, sliding_window=0,
        moe=dataclasses.replace(gpt_oss_config.REFERENCE_MOE, num_experts=m.num_experts,
                                top_k=m.top_k, filter_size=active // m.top_k),
    )  # fmt: skip
    llama = DecoderConfig(
        **common, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        intermediate_size=active,
    )  # fmt: skip
    return {"mlperf_tf": deepseek, "gpt_oss_block": gpt_oss, "llama_block": llama}


def contestant(config: DecoderConfig, batch: int, sequence: int):
    keras.utils.set_random_seed(0)
    model = build_decoder(config, name="block")
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    tokens = tf.random.uniform([batch, sequence + 1], 0, config.vocab_size, tf.int32, seed=1)
    data = tf.data.Dataset.from_tensors({"x": tokens[:, :-1], "y": tokens[:, 1:]}).repeat()
    iterator = iter(data)

    def loss_of(model, b):
        logits = model(b["x"], training=True)
        losses = loss_lib.token_cross_entropy(logits, b["y"], vocab_size=config.vocab_size)
        return tf.reduce_mean(losses)

    return harness.custom_loop(model, optimizer, iterator, loss_of)


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.split("\n")[0], steps=5, rounds=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=256)
    args = harness.parse_rounds(parser, argv, "batch", "sequence")
    contestants = {name: contestant(c, args.batch, args.sequence) for name, c in configs().items()}
    harness.compare(
        contestants, steps=args.steps, rounds=args.rounds,
        samples_per_step=args.batch * args.sequence, reference="mlperf_tf", unit="tokens",
        title=f"one block at the deepseekv3_671b mini width, batch {args.batch} x sequence "
        f"{args.sequence}; TF {tf.__version__}, Keras {keras.__version__}",
    )  # fmt: skip


if __name__ == "__main__":
    main()
