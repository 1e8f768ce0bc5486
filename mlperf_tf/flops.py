"""Provides model FLOPs per training sample, counted from a benchmark's own Keras model.

The count is analytic and comes from the graph the suite really runs: the benchmark's
`compute_loss` (model forward plus loss) is traced once into a `tf.function` graph with static
shapes, and every matrix product in it is counted from its operand shapes: `MatMul` and
`BatchMatMul*` (Dense layers, attention scores and context), `Einsum` (Keras `EinsumDense`,
attention), `Conv2D`/`Conv3D` and `DepthwiseConv2dNative`. A multiply-add counts 2 FLOPs, as in
TF's profiler (`tf.compat.v1.profiler` with `ProfileOptionBuilder.float_operation()`), which the
tests compare against. Element-wise work (batch norm, activations, softmax) is left out: it is a
few percent and is not what MFU is defined over.

A training step is counted as 3x the forward pass (the backward pass computes two products per
forward product: the gradient of the input and of the weight); this is the convention of MFU
papers (e.g. PaLM's appendix B) and of MLPerf submitters' FLOP counts. ResNet-50 v1.5 at 224 px
gives 4.1 G multiply-adds forward, about 24.6 GFLOP per training image.

Who uses it: `mlperf-tf bench` (MFU) and `mlperf-tf simulate` (compute time per step). The
simulator reads the counts cached in `mlperf_tf/simulate/data/flops.json`; regenerate that file
with `python -m mlperf_tf.flops --write` after changing a model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import string
import sys
from collections.abc import Callable, Mapping
from typing import Any

# A training step does the forward products once and, in the backward pass, two per product.
TRAINING_FLOPS_PER_FORWARD_FLOP = 3.0

_MATMUL_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
_CONV_OPS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative")
COUNTED_OP_TYPES = (*_MATMUL_OPS, *_CONV_OPS, "Einsum")

# Tracing global batches, tried in order until the config accepts one: small, so that even the
# `mlperf` presets trace in seconds (a Transformer batch counts tokens and must hold one pair of
# the longest length). FLOPs per sample do not depend on it: every counted product is linear in
# the batch.
_TRACE_BATCHES = (2, 64, 512, 4096)


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one traced function, by op type.

    Attributes:
      total: FLOPs of all counted ops (a multiply-add is 2).
      by_op_type: the same split by TF op type (e.g. {"Conv2D": ..., "MatMul": ...}).
      uncounted_calls: names of nested function-call ops that were not looked into (none for the
        suite's models; a non-empty list means the count is a lower bound).
      trainable_parameters: trainable weights of the model (0 when no model was involved).
    """

    total: float
    by_op_type: Mapping[str, float]
    uncounted_calls: tuple[str, ...] = ()
    trainable_parameters: int = 0


def _dims(tensor) -> list[int]:
    shape = tensor.shape
    if not shape.is_fully_defined():
        raise ValueError(
            f"op input {tensor.name} has a dynamic shape {shape}; FLOPs need static shapes"
        )
    return shape.as_list()


def _matmul_flops(op) -> float:
    a, b = _dims(op.inputs[0]), _dims(op.inputs[1])
    if op.type == "MatMul":
        transpose_a, transpose_b = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    else:
        transpose_a, transpose_b = op.get_attr("adj_x"), op.get_attr("adj_y")
    m, k = (a[-1], a[-2]) if transpose_a else (a[-2], a[-1])
    n = b[-2] if transpose_b else b[-1]
    batch = math.prod(_broadcast(a[:-2], b[:-2]))
    return 2.0 * batch * m * n * k


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    width = max(len(a), len(b))
    a, b = [1] * (width - len(a)) + a, [1] * (width - len(b)) + b
    return [max(x, y) for x, y in zip(a, b)]


def _conv_flops(op) -> float:
    out = _dims(op.outputs[0])
    kernel = _dims(op.inputs[1])
    if op.type == "DepthwiseConv2dNative":
        # kernel [kh, kw, in, multiplier]: each output element reads kh*kw inputs.
        return 2.0 * math.prod(out) * kernel[0] * kernel[1]
    # kernel [..spatial.., in, out]: each output element reads prod(spatial) * in inputs.
    return 2.0 * math.prod(out) * math.prod(kernel[:-1])


def einsum_flops(equation: str, shapes: list[list[int]]) -> float:
    """FLOPs of a two-operand einsum: 2 x the product of the sizes of every distinct index.

    Args:
      equation: e.g. "abc,cd->abd"; an ellipsis stands for the same leading dims in each operand.
      shapes: the operands' static shapes.

    Returns:
      2 * prod(size of each distinct index), the cost of the multiply-adds (for one operand,
      the number of input elements).
    """
    inputs, _, _ = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum '{equation}' has {len(terms)} operands, got {len(shapes)} shapes")
    free_letters = iter(sorted(set(string.ascii_uppercase) - set(equation)))
    ellipsis_rank = max(
        (len(shape) - (len(term) - 3) for term, shape in zip(terms, shapes) if "..." in term),
        default=0,
    )
    ellipsis = "".join(next(free_letters) for _ in range(ellipsis_rank))
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if "..." in term:
            head, tail = term.split("...")
            rank = len(shape) - len(head) - len(tail)
            term = head + ellipsis[ellipsis_rank - rank :] + tail
        if len(term) != len(shape):
            raise ValueError(f"einsum term '{term}' does not match shape {shape} in '{equation}'")
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if len(terms) == 1:
        return float(math.prod(sizes.values()))
    return 2.0 * math.prod(sizes.values())


def count_graph_flops(graph) -> FlopCount:
    """Counts the matmul, einsum and convolution FLOPs of a `tf.Graph` with static shapes."""
    by_type: dict[str, float] = {}
    calls = []
    for op in graph.get_operations():
        if op.type in _MATMUL_OPS:
            flops = _matmul_flops(op)
        elif op.type in _CONV_OPS:
            flops = _conv_flops(op)
        elif op.type == "Einsum":
            equation = op.get_attr("equation").decode()
            flops = einsum_flops(equation, [_dims(t) for t in op.inputs])
        else:
            if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
                calls.append(op.name)
            continue
        by_type[op.type] = by_type.get(op.type, 0.0) + flops
    return FlopCount(total=sum(by_type.values()), by_op_type=by_type, uncounted_calls=tuple(calls))


def count_function_flops(fn: Callable, *input_signature) -> FlopCount:
    """Traces `fn` with `tf.function` for the given `tf.TensorSpec`s and counts its FLOPs."""
    import tensorflow as tf

    concrete = tf.function(fn, autograph=False).get_concrete_function(*input_signature)
    return count_graph_flops(concrete.graph)


def _tracing_benchmark(benchmark):
    """The benchmark with synthetic data and a small global batch (same model, same shapes per
    sample), and that batch."""
    from mlperf_tf.config import ConfigError

    for batch in _TRACE_BATCHES:
        try:
            config = dataclasses.replace(
                benchmark.config,
                data_dir="",
                global_batch_size=batch,
                gradient_accumulation_steps=1,
            )
        except ConfigError:
            continue
        # Static shapes: every slot of the batch is counted, padding included (the model's FLOPs).
        context = dataclasses.replace(benchmark.context, static_shapes=True)
        return type(benchmark)(config, context=context), batch
    raise ValueError(f"no tracing batch in {_TRACE_BATCHES} fits the config of '{benchmark.name}'")


def forward_flops_per_sample(benchmark) -> FlopCount:
    """Forward FLOPs per training sample of a `Benchmark` instance: its `compute_loss`, traced.

    A "sample" is the unit of the benchmark's `global_batch_size`: an image, a sequence, or for
    the Transformer a token (its batches count tokens; its synthetic pairs have the longest
    length, so attention is counted at `max_sequence_length`).

    The model is built (weights allocated) and `compute_loss(model, batch, training=True)` is
    traced, not run, on a batch of the training dataset's per-sample shapes.

    Returns:
      A `FlopCount` divided by the tracing batch (per sample).
    """
    import tensorflow as tf

    tracer, batch = _tracing_benchmark(benchmark)
    spec = tracer.train_dataset(tf.distribute.InputContext()).element_spec
    model = tracer.build_model()
    count = count_function_flops(
        lambda batch: tracer.compute_loss(model, batch, training=True), spec
    )
    per_sample = {k: v / batch for k, v in count.by_op_type.items()}
    return FlopCount(
        total=count.total / batch,
        by_op_type=per_sample,
        uncounted_calls=count.uncounted_calls,
        trainable_parameters=int(sum(math.prod(v.shape) for v in model.trainable_variables)),
    )


def training_flops_per_sample(benchmark: Any, preset: str = "mlperf") -> float:
    """Training FLOPs per sample (forward + backward, 3x the forward products) of a benchmark:
    its declared `training_flops_per_sample()`, or counted from its traced graph.

    Args:
      benchmark: a registered benchmark name (then `preset` picks its config) or a `Benchmark`
        instance (its own config is used; `preset` is ignored).
      preset: the preset of a named benchmark: "mlperf", "mini" or "smoke".

    Returns:
      FLOPs (a multiply-add is 2) per training example of the global batch.

    Raises:
      UserError: unknown benchmark or preset.
    """
    if isinstance(benchmark, str):
        from mlperf_tf import registry
        from mlperf_tf.errors import UserError

        benchmark_class = registry.get(benchmark)
        try:
            benchmark = benchmark_class(benchmark_class.preset(preset))
        except KeyError as e:
            raise UserError(e.args[0]) from None
    return declared_or_traced(benchmark)["training_flops_per_sample"]


# Models over this many parameters cannot be traced (tracing builds the model, and Llama 3.1 8B's
# weights alone are 32 GB): such a benchmark must declare `training_flops_per_sample()`.
TRACE_PARAMETER_LIMIT = 1_000_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """A decoder-only language model as its FLOPs see it: what a benchmark's config gives
    `decoder_forward_flops_per_token` (no names: a Llama, a GPT-OSS, a LoRA-tuned Llama are
    each a shape).

    Attributes:
      vocab_size, hidden_size, num_layers: the model's size.
      num_attention_heads, num_key_value_heads, head_dim: grouped-query attention.
      intermediate_size: the dense feed-forward's inner width.
      mlp_matrices: weight matrices of one feed-forward (3: SwiGLU's gate, up, down; 2: an MLP).
      moe_layers: layers whose feed-forward is a mixture of experts (0: dense).
      num_experts: experts of an MoE layer (its router is hidden x experts).
      experts_per_token: experts a token runs (top-k): only those count (active parameters).
      expert_intermediate_size: an expert's inner width (0: `intermediate_size`).
      sliding_window: tokens a sliding-window layer attends to (0: none).
      sliding_layers: layers that attend over `sliding_window` tokens instead of the sequence.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    mlp_matrices: int = 3
    moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0


def decoder_forward_flops_per_token(shape: DecoderShape, sequence_length: int) -> dict[str, float]:
    """Forward FLOPs per token of a decoder-only language model, counted from its shape.

    The products the tracer counts, written out: every weight matrix a token multiplies is one
    multiply-add per element (2 FLOPs): q, k, v, o and the feed-forward of each layer, and the
    untied output projection; an MoE layer's token multiplies the router and its top-k experts
    only (the active parameters; capacity padding is not counted). The input embedding is a
    lookup and the norm scales are element-wise (neither counted). Attention adds, per layer, the
    scores Q·Kᵀ and the context P·V: 2 x 2 x keys x (query heads x head size) per token, where
    keys is the whole sequence, the full S x S square as the model computes it (the causal mask
    zeroes half of it but the products are made; PaLM's appendix-B convention,
    6N + 12·L·H·Q·T per training token), and the window for a sliding-window layer.

    Returns:
      {"dense": weight products, "attention": scores and context, "total": both}, FLOPs per
      token (a multiply-add is 2).
    """
    h, d = shape.hidden_size, shape.head_dim
    q, kv, layers = shape.num_attention_heads, shape.num_key_value_heads, shape.num_layers
    attention_weights = h * q * d * 2 + h * kv * d * 2  # q, o; k, v
    dense_mlp = shape.mlp_matrices * h * shape.intermediate_size
    expert = shape.mlp_matrices * h * (shape.expert_intermediate_size or shape.intermediate_size)
    moe_mlp = h * shape.num_experts + shape.experts_per_token * expert  # router + active experts
    weights = (
        layers * attention_weights
        + (layers - shape.moe_layers) * dense_mlp
        + shape.moe_layers * moe_mlp
        + h * shape.vocab_size  # the output projection
    )
    window = min(shape.sliding_window, sequence_length) if shape.sliding_window else sequence_length
    keys = (layers - shape.sliding_layers) * sequence_length + shape.sliding_layers * window
    dense = 2.0 * weights
    attention = 2.0 * 2.0 * keys * q * d
    return {"dense": dense, "attention": attention, "total": dense + attention}


def decoder_training_flops_per_sample(shape: DecoderShape, sequence_length: int) -> float:
    """Training FLOPs of one sequence of `sequence_length` tokens (3x the forward products):
    what a language-model benchmark's `training_flops_per_sample()` returns."""
    per_token = decoder_forward_flops_per_token(shape, sequence_length)["total"]
    return TRAINING_FLOPS_PER_FORWARD_FLOP * per_token * sequence_length


def declared_or_traced(benchmark) -> dict[str, Any]:
    """The FLOPs and parameters of a `Benchmark` instance: its declared
    `training_flops_per_sample()` and `trainable_parameter_count()`, or, where it declares none, the
    traced `compute_loss` (`forward_flops_per_sample`).

    Raises:
      ValueError: nothing is declared and the model is too large to trace.
    """
    declared = benchmark.training_flops_per_sample()
    params = benchmark.parameter_count()
    if declared is not None:
        return {
            "counted": f"declared ({type(benchmark).__name__}.training_flops_per_sample)",
            "forward_flops_per_sample": declared / TRAINING_FLOPS_PER_FORWARD_FLOP,
            "training_flops_per_sample": float(declared),
            "trainable_parameters": benchmark.trainable_parameter_count(),
        }
    if params is not None and params > TRACE_PARAMETER_LIMIT:
        raise ValueError(
            f"'{benchmark.name}' has {params:,} parameters, too many to trace: declare its "
            "`training_flops_per_sample()`"
        )
    count = forward_flops_per_sample(benchmark)
    return {
        "forward_flops_per_sample": count.total,
        "forward_by_op_type": dict(sorted(count.by_op_type.items())),
        "training_flops_per_sample": TRAINING_FLOPS_PER_FORWARD_FLOP * count.total,
        "trainable_parameters": count.trainable_parameters,
    }


def _cache_entry(benchmark) -> dict[str, Any]:
    """One preset's entry: its FLOPs and parameters (declared or traced), and what else the
    simulator needs of it, so that it never imports TF: the preset's sizes, the benchmark's
    `simulator_shape()` and `convergence`."""
    config = benchmark.config
    entry = declared_or_traced(benchmark)
    parameters = benchmark.parameter_count()
    if parameters is not None:  # the model's count (`simulate --json` reports it)
        entry["parameters"] = parameters
        active = benchmark.active_parameter_count()
        if active is not None and active != parameters:  # a mixture of experts
            entry["active_parameters"] = active
    convergence = type(benchmark).convergence
    entry.update(
        mlperf_benchmark=type(benchmark).mlperf_benchmark,
        global_batch_size=config.global_batch_size,
        train_examples=config.train_examples,
        eval_examples=config.eval_examples,
        **eval_facts(benchmark),
        shape=benchmark.simulator_shape().as_dict(),
        convergence=convergence.as_dict() if convergence is not None else None,
    )
    model = getattr(config, "model", None)
    if callable(getattr(model, "attention_parameters", None)):  # a decoder's sizes: the
        from mlperf_tf.parallel import memory  # simulator's memory count reads them

        entry["decoder"] = memory.DecoderSizes.of(model).as_dict()
    return entry


def eval_facts(benchmark) -> dict[str, Any]:
    """A preset's evaluation cadence for the simulator: its declared `eval_cadence()` (when the
    runner's `eval_schedule()` evaluates, at any batch) and, for a reader of the older cache,
    `eval_every_epochs` at the preset's batch."""
    cadence = benchmark.eval_cadence()
    config = benchmark.config
    every = cadence.every_epochs or cadence.every_samples / config.train_examples
    return {"eval_cadence": cadence.as_dict(), "eval_every_epochs": float(every)}


def cache_path() -> str:
    """The committed cache of per-sample FLOPs of every built-in benchmark and preset."""
    return os.path.join(os.path.dirname(__file__), "simulate", "data", "flops.json")


def build_cache(
    names: list[str] | None = None, presets: list[str] | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Counts every (or the named) preset of every (or the named) registered benchmark:
    {name: {preset: entry}}.

    Raises:
      UserError: an unknown benchmark or preset.
    """
    from mlperf_tf import registry
    from mlperf_tf.errors import UserError

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names or list(registry.available()):
        benchmark_class = registry.get(name)
        table[name] = {}
        for preset in presets or benchmark_class.presets:
            try:
                config = benchmark_class.preset(preset)
            except KeyError as e:
                raise UserError(e.args[0]) from None
            table[name][preset] = _cache_entry(benchmark_class(config))
    return table


def main(argv: list[str]) -> int:
    """`python -m mlperf_tf.flops [--write [--builtin]] [NAME...]`: prints (or writes) FLOPs.

    `--write` adds the counts to the user's cache (`$MLPERF_TF_DATA/flops.json`), which
    `mlperf-tf simulate` reads after the committed one; `--builtin` writes the committed cache
    instead (the suite's own benchmarks, for maintainers).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    write = "--write" in argv
    names = [a for a in argv if not a.startswith("--")]
    table = build_cache(names or None)
    text = json.dumps(table, indent=2, sort_keys=True) + "\n"
    if write:
        # The committed cache is the suite's; a user's counts (plug-in benchmarks) go to the
        # user cache, which `simulate` reads too: no one edits a file inside the package.
        from mlperf_tf import paths

        path = cache_path() if "--builtin" in argv else paths.user_flops_cache()
        existing = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                existing = json.load(f)
        existing.update(table)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(existing, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
