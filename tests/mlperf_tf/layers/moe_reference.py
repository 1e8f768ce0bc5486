"""A NumPy transcription of Flaxformer's token-choice masked router and MoE layer (one group).

Written from google/flaxformer `flaxformer/architectures/moe/routing.py`
(`TokensChooseMaskedRouter._compute_routing_instructions`, `_load_balancing_loss`,
`_router_z_loss`) and `moe_layers.py` (`MoeLayer._mask_and_dispatch_to_experts`: dispatch and
combine by einsum over the [T, E, C] masks), with `num_groups = 1`, no padding mask and no batch
prioritized routing. The "after" gates follow Mesh TensorFlow's `_top_2_gating`
(`mesh_tensorflow/transformer/moe.py`): each selected gate divided by the sum of the selected
gates. Deliberately plain loops and one-hot arithmetic, not the layer's index code.
"""

from __future__ import annotations

import numpy as np


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def one_hot(indices, depth):
    """Flax `jax.nn.one_hot`: all zeros for indices outside [0, depth)."""
    indices = np.asarray(indices)
    out = np.zeros(indices.shape + (depth,), np.float64)
    for pos in np.ndindex(indices.shape):
        i = indices[pos]
        if 0 <= i < depth:
            out[pos + (i,)] = 1.0
    return out


def route(logits, *, top_k, capacity, router_softmax="before"):
    """Returns (dispatch [T, E, C], combine [T, E, C], balance loss, z loss)."""
    logits = np.asarray(logits, np.float64)
    tokens, experts = logits.shape
    probs = softmax(logits)
    # top-k by probability, ties to the lower expert index (as lax.top_k)
    index = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # [T, k]
    # _load_balancing_loss: a token counts for each expert among its top k
    mask = one_hot(index, experts).max(axis=-2)  # [T, E]
    balance = np.mean(mask.mean(axis=0) * probs.mean(axis=0)) * experts**2
    # priority: choice-major order (all first choices before any second choice)
    flat = index.T.reshape(-1)  # [k * T]
    expert_mask = one_hot(flat, experts)
    priority = np.cumsum(expert_mask, axis=0) * expert_mask - 1.0
    priority = priority.reshape(top_k, tokens, experts).transpose(1, 0, 2).max(axis=1)  # [T, E]
    dispatch = one_hot(priority.astype(int), capacity)  # [T, E, C]
    if router_softmax == "after":
        selected = np.take_along_axis(probs, index, axis=-1).sum(axis=-1, keepdims=True)
        weights = probs / selected  # only read where dispatched (a selected expert)
    else:
        weights = probs
    combine = weights[..., None] * dispatch
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    z = np.mean(log_z**2)
    return dispatch, combine, balance, z


def relu_experts(expert_in, w_in, b_in, w_out, b_out):
    """Two-layer ReLU experts with biases (Flaxformer's `MlpBlock` as used by Switch/ST-MoE)."""
    hidden = np.maximum(np.einsum("ecd,edf->ecf", expert_in, w_in) + b_in[:, None, :], 0.0)
    return np.einsum("ecf,efd->ecd", hidden, w_out) + b_out[:, None, :]


def swiglu_experts(expert_in, w_gate, w_up, w_down):
    """SwiGLU experts, bias-free: Hugging Face transformers' Mixtral expert
    (`MixtralBlockSparseTop2MLP.forward`: `w2(act_fn(w1(x)) * w3(x))`, act_fn silu), with
    w1 = gate, w3 = up, w2 = down as [in, out] matrices."""
    gate = np.einsum("ecd,edf->ecf", expert_in, w_gate)
    silu = gate / (1.0 + np.exp(-gate))
    return np.einsum("ecf,efd->ecd", silu * np.einsum("ecd,edf->ecf", expert_in, w_up), w_down)


def moe_layer(x, router_kernel, *experts, top_k, capacity, router_softmax, expert_mlp="relu"):
    """The layer's output [T, d] and its routing (float64); `experts`: the expert weights of
    `relu_experts` or `swiglu_experts` (`expert_mlp`)."""
    x = np.asarray(x, np.float64)
    logits = x @ np.asarray(router_kernel, np.float64)
    dispatch, combine, balance, z = route(
        logits, top_k=top_k, capacity=capacity, router_softmax=router_softmax
    )
    expert_in = np.einsum("tec,td->ecd", dispatch, x)
    weights = [np.asarray(w, np.float64) for w in experts]
    mlp = {"relu": relu_experts, "swiglu": swiglu_experts}[expert_mlp]
    expert_out = mlp(expert_in, *weights)
    y = np.einsum("tec,ecd->td", combine, expert_out)
    return y, dispatch, combine, balance, z
