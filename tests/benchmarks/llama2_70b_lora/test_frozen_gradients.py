"""The frozen base takes no weight gradient: a LoRA step executes, for every base projection,
only the input-gradient product, and for each adapter both. The traced graph holds both
products of every MatMul (the tape builds them); the unused ones are pruned when the step runs,
so this is checked on the ops the step executed (TF's profiler), not on the graph."""

import tensorflow as tf

from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark
from mlperf_tf.benchmark import RunContext
from tools.profile_ops import read_op_events

PROJECTIONS = ("qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def _executed_gradient_matmuls(tmp_path) -> set[str]:
    benchmark = LoraBenchmark(config_lib.smoke()).with_context(RunContext(num_replicas=1))
    model = benchmark.build_model()
    batch = next(iter(benchmark.train_dataset(tf.distribute.InputContext())))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch, training=True)
        return tape.gradient(loss, model.trainable_variables)

    step()  # traced and run once outside the trace
    tf.profiler.experimental.start(str(tmp_path))
    try:
        grads = step()
    finally:
        tf.profiler.experimental.stop()
    assert all(g is not None for g in grads)
    return {name for name, kind, _ in read_op_events(str(tmp_path)) if "MatMul" in kind
            and name.startswith("gradient_tape/")}  # fmt: skip


def test_base_projections_get_only_the_input_gradient(tmp_path):
    executed = _executed_gradient_matmuls(tmp_path)
    base = {n for n in executed if "/lora" not in n and any(p in n for p in PROJECTIONS)}
    adapters = {n for n in executed if "/lora" in n}
    # tf.matmul's gradient: ".../MatMul/MatMul" is d input, ".../MatMul/MatMul_1" d weight.
    assert base and all(n.endswith("/MatMul/MatMul") for n in base), sorted(base)
    # Each adapter's A and B get their weight gradient (x A: d A; (x A) B: d B).
    weight_grads = {n for n in adapters if n.endswith("/MatMul_1")}
    assert len([n for n in weight_grads if "/lora_1/MatMul/" in n]) == 4  # d A, 4 adapters
    assert len([n for n in weight_grads if "/lora_1/MatMul_1/" in n]) == 4  # d B
    # Layer 0's input is the frozen embedding's: its qkv takes no input gradient either.
    assert not any("decoder_0" in n and "qkv_proj_1/MatMul/" in n for n in base)
