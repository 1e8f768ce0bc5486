"""Tests of the step's micro-batch terms (issue 48's remaining misses): collectives issued once
per micro-batch pay their latency per micro-batch, and the interleaved 1F1B schedule's bubble
and sends (`--virtual_stages`), each against a count written out here."""

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.simulate import collectives, model, systems

B200 = systems.load("b200-dgx")
LLAMA = dict(benchmark="llama31_8b", system=B200, precision="fp8")


def test_tensor_parallel_latency_is_paid_per_micro_batch():
    """8 groups of 2 chips, 4 sequences a group: a decoder accumulates micro-batches of 1 (its
    memory is counted so), each paying the all-reduce's 2 (p - 1) alpha; micro-batches of 2
    pay it twice. A model without a decoder count (BERT) sends its group's samples at once."""
    kw = dict(chips=16, global_batch=32, model_parallel=2, **LLAMA)
    ones = model.simulate(**kw)
    twos = model.simulate(micro_batch_size=2, **kw)
    one = collectives.ring_allreduce(4 * 8192 * 4096 * 2, 2, B200.link)  # the group's 4 samples
    count = 4 * 32  # 2 forward + 2 backward all-reduces a block, 32 blocks
    assert ones.model_parallel_s == pytest.approx(count * (4 * one.latency_s + one.bandwidth_s))
    assert twos.model_parallel_s == pytest.approx(count * (2 * one.latency_s + one.bandwidth_s))
    assert twos.compute_s == pytest.approx(ones.compute_s)  # the products are the same
    v3 = systems.load("tpu-v3")
    bert = model.simulate(benchmark="bert", system=v3, chips=64, global_batch=256,
                          model_parallel=2)  # 8 samples a group, at once  # fmt: skip
    micro = model.simulate(benchmark="bert", system=v3, chips=64, global_batch=256,
                           model_parallel=2, micro_batch_size=1)  # fmt: skip
    assert micro.model_parallel_s - bert.model_parallel_s == pytest.approx(
        4 * 24 * 7 * 2 * v3.link.alpha, rel=1e-6
    )  # 7 more issues of the 2 (p - 1) = 2 alpha steps


def test_interleaved_stages_shrink_the_bubble_and_multiply_the_sends():
    """P = 4 stages, m = 8 micro-batches of 1: bubble (P - 1) / (V m); sends 2 (m + P - 2) V of
    one micro-batch's activations (8,192 tokens x 4,096 hidden bf16) over NVLink."""
    kw = dict(chips=32, global_batch=64, pipeline_parallel=4, micro_batch_size=1, **LLAMA)
    plain = model.simulate(**kw)
    inter = model.simulate(virtual_stages=2, **kw)
    m = 64 / 8
    assert plain.pipeline_bubble == pytest.approx(3 / m)
    assert inter.pipeline_bubble == pytest.approx(3 / (2 * m))
    assert inter.compute_s / (1 + inter.pipeline_bubble) == pytest.approx(
        plain.compute_s / (1 + plain.pipeline_bubble)
    )
    nbytes = 8192 * 4096 * 2
    sends = 2 * (m + 4 - 2)
    link = B200.link
    assert plain.pipeline_s == pytest.approx(sends * (link.alpha + nbytes / link.bandwidth))
    assert inter.pipeline_s == pytest.approx(2 * plain.pipeline_s)
    assert inter.virtual_stages == 2 and inter.step_time_s < plain.step_time_s


def test_virtual_stages_are_refused_without_a_pipeline_or_beyond_the_shortest_stage():
    kw = dict(chips=32, global_batch=64, **LLAMA)
    with pytest.raises(UserError, match=r"--virtual_stages \(2\) interleaves a pipeline"):
        model.simulate(virtual_stages=2, **kw)
    # 32 blocks over 4 stages: 8 a stage, so at most 8 chunks.
    with pytest.raises(UserError, match=r"exceeds the 8 blocks .* use at most 8"):
        model.simulate(virtual_stages=9, pipeline_parallel=4, **kw)
    with pytest.raises(UserError, match=r"--virtual_stages \(0\) must be a positive integer"):
        model.simulate(virtual_stages=0, pipeline_parallel=4, **kw)


def test_fsdp_gathers_the_weights_twice_and_recompute_adds_an_attention_forward():
    """FSDP: gather (forward), gather (backward), reduce-scatter = 1.5 x the all-reduce, same
    overlap; core-attention recomputation: + the attention's products / 3 at their own peak
    (BF16, half of the causal square)."""
    kw = dict(benchmark="gpt_oss_20b", system=B200, chips=8, global_batch=16,
              weight_update_sharding=True, precision="fp8", micro_batch_size=2)  # fmt: skip
    plain = model.simulate(**kw)
    fsdp = model.simulate(fsdp=True, **kw)
    assert fsdp.allreduce_s == pytest.approx(1.5 * plain.allreduce_s)
    exposed = fsdp.allreduce_s - min(0.8 * fsdp.allreduce_s, fsdp.compute_s * 2 / 3)
    assert fsdp.exposed_comm_s == pytest.approx(exposed)
    again = model.simulate(recompute_attention=True, **kw)
    shape = model.shape_of(model.benchmark_facts("gpt_oss_20b"))
    const = model.constants(B200, "gpt_oss_20b", shape, "fp8")
    extra = 2 * shape.attention_flops / 3 * 0.5 / (B200.peak("bf16") * const.efficiency)
    assert again.compute_s - plain.compute_s == pytest.approx(extra)  # 2 samples a chip


def test_expert_gradients_are_reduced_over_the_chips_holding_the_same_experts():
    """GPT-OSS on 2 B200 nodes, EP 8: the dense gradients are all-reduced over all 16 chips
    (8 a node), each expert's over the 2 chips that hold it (one a node, over the network);
    sharded, the experts' update is split 2 ways, the dense one 16."""
    kw = dict(benchmark="gpt_oss_20b", system=B200, chips=16, global_batch=16,
              expert_parallel=8, precision="fp8", weight_update_sharding=True)  # fmt: skip
    r = model.simulate(**kw)
    facts = model.benchmark_facts("gpt_oss_20b")
    shape = model.shape_of(facts)
    b, e = shape.blocks, shape.experts
    experts = e.layers(b.blocks) * e.num_experts * b.ffn_parameters
    dense = facts["trainable_parameters"] - experts
    hier = collectives.hierarchical_allreduce
    net, link = B200.network, B200.link
    dense_cost = hier(dense * 2, gpus_per_node=8, nodes=2, intra=link, inter=net)
    expert_cost = hier(experts / 8 * 2, gpus_per_node=1, nodes=2, intra=link, inter=net)
    assert r.allreduce_s == pytest.approx(dense_cost.total_s + expert_cost.total_s)
    per_byte = B200.optimizer_bytes_per_parameter / B200.memory_bandwidth
    assert r.weight_update_s == pytest.approx(dense * per_byte / 16 + experts / 8 * per_byte / 2)


def test_the_gradient_reduction_hides_only_under_the_last_micro_batchs_backward():
    """Accumulating m micro-batches, a gradient bucket is reduced only once the last one's
    backward has made it final (Megatron-core's `register_grad_ready`): the window that hides
    the reduction is 1/m of the step's backward. DeepSeek-V3 on 4,096 GB200 at the published
    layout (TP2 PP4 EP32, interleaved 4): 512 pipelines of 32 sequences, 32 micro-batches of 1
    (16 of 2 hide it under twice as much)."""
    system = systems.load("gb200-nvl72")
    r = model.simulate(
        benchmark="deepseekv3_671b", system=system, chips=4096, global_batch=16384,
        model_parallel=2, pipeline_parallel=4, expert_parallel=32, virtual_stages=4,
        weight_update_sharding=True, precision="fp8",
    )  # fmt: skip
    assert r.pipeline_bubble == pytest.approx(3 / (4 * 32))
    backward = r.compute_s / (1 + r.pipeline_bubble) * 2 / 3
    hidden = min(system.overlap_fraction * r.allreduce_s, backward / 32)
    assert r.exposed_comm_s == pytest.approx(r.allreduce_s - hidden)
    assert backward / 32 < system.overlap_fraction * r.allreduce_s < backward  # 1/m binds
    # Micro-batches of 2: 16 a step, twice the window.
    twos = model.simulate(
        benchmark="deepseekv3_671b", system=system, chips=4096, global_batch=16384,
        model_parallel=2, pipeline_parallel=4, expert_parallel=32, virtual_stages=4,
        weight_update_sharding=True, precision="fp8", micro_batch_size=2,
    )  # fmt: skip
    backward = twos.compute_s / (1 + twos.pipeline_bubble) * 2 / 3
    hidden = min(system.overlap_fraction * twos.allreduce_s, backward / 16)
    assert twos.exposed_comm_s == pytest.approx(twos.allreduce_s - hidden)
    assert twos.exposed_comm_s < r.exposed_comm_s
