"""Tests of `mlperf_tf.rl.grpo` against a NumPy transcription of NeMo-RL's formulas (commit
3fca04c9b313d313302923a5bb6b0c8dc0340ed6): `calculate_baseline_and_std_per_prompt` and
`GRPOAdvantageEstimator` (per-prompt loop with the leave-one-out matrix), `ClippedPGLossFn`
(token level, forced on-policy ratio and the clipped one, tis / icepop / seq-mask-tis),
`compute_and_apply_seq_logprob_error_masking`, overlong filtering and grouped pass@k."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.config import ConfigError
from mlperf_tf.rl import grpo

pytestmark = pytest.mark.numerics


# --- NumPy transcriptions of NeMo-RL ------------------------------------------------------------


def np_masked_mean(values, mask, axis=None, normalizer=None):
    denom = mask.sum(axis=axis) if normalizer is None else normalizer
    return (values * mask).sum(axis=axis) / (denom + 1e-8)


def np_baseline_and_std(prompts, rewards, leave_one_out):
    """`calculate_baseline_and_std_per_prompt` with valid_mask all ones (as GRPO calls it)."""
    baseline = np.zeros_like(rewards)
    std = np.zeros_like(rewards)
    valid = np.ones_like(rewards)
    for prompt in np.unique(prompts):
        idx = np.nonzero(prompts == prompt)[0]
        n = len(idx)
        matrix = (1 - np.eye(n)) if leave_one_out else np.ones((n, n))
        if valid[idx].sum() <= 1:
            baseline[idx] = rewards[idx]
            continue
        num_valid = valid[idx].sum() - int(leave_one_out)
        b = matrix @ (rewards[idx] * valid[idx]) / num_valid
        sq = matrix @ (rewards[idx] ** 2 * valid[idx]) / num_valid
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.sqrt((sq - b**2) * (num_valid / (num_valid - 1)))
        baseline[idx] = b
        std[idx] = np.nan_to_num(s, nan=0.0)
    return baseline, std


def np_advantages(prompts, rewards, leave_one_out=True, normalize=True):
    baseline, std = np_baseline_and_std(prompts, rewards, leave_one_out)
    adv = rewards - baseline
    if normalize:
        nz = std > 0
        adv[nz] = adv[nz] / (std[nz] + 1e-6)
    return adv


def np_clipped_pg_loss(curr, gen, adv, token_mask, sample_mask, *, prev=None, force=True,
                       clip_lo=0.2, clip_hi=0.28, tis="seq-mask-tis", lo=0.999, hi=1.002):  # fmt: skip
    """`ClippedPGLossFn.__call__`, token level, KL 0, no dual clip (values only)."""
    mask = token_mask * sample_mask[:, None]
    valid = mask.sum()
    adv = adv[:, None] * np.ones_like(curr)
    if force:
        prev = curr.copy()
        ratios = np.ones_like(curr)
        clamped = ratios
    else:
        ratios = np.exp(curr - prev)
        clamped = np.clip(ratios, 1 - clip_lo, 1 + clip_hi)
    clip_loss = np.maximum(-adv * ratios, -adv * clamped)
    w = np.nan_to_num(np.exp(prev - gen), nan=0.0, posinf=0.0, neginf=0.0)
    if tis == "tis":
        w = np.clip(w, lo, hi)
    elif tis == "icepop":
        w = np.where((w >= lo) & (w <= hi), w, 0.0)
    elif tis == "seq-mask-tis":
        log_ratio = np.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0)
        geo = np.exp(np_masked_mean(log_ratio, token_mask, axis=-1))
        kept = ((geo >= lo) & (geo <= hi)).astype(np.float64)
        w = w * kept[:, None]
    return np_masked_mean(w * clip_loss, mask, normalizer=valid)


def np_seq_error_mask(gen, prev, token_mask, sample_mask, threshold):
    mask = token_mask * sample_mask[:, None]
    err = np.abs(gen - prev)
    denom = mask.sum(-1)
    seq = np.zeros_like(denom)
    ok = denom > 0
    seq[ok] = (np.exp(err * mask) * mask).sum(-1)[ok] / np.maximum(denom[ok], 1)
    return (seq <= threshold).astype(np.float64) * sample_mask


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("generations", [2, 3, 16])
def test_group_advantages_match_nemo_rl(leave_one_out, normalize, generations):
    rng = np.random.default_rng(generations)
    prompts_n = 5
    rewards = rng.integers(0, 2, size=(prompts_n, generations)).astype(np.float64)
    rewards[0] = 1.0  # a group with no spread
    rewards[1] = 0.0
    rewards[2, 0] = 0.37  # non-binary rewards too
    prompts = np.repeat(np.arange(prompts_n), generations)
    want = np_advantages(prompts, rewards.reshape(-1), leave_one_out, normalize)
    got = grpo.group_advantages(rewards, leave_one_out=leave_one_out, normalize=normalize)
    np.testing.assert_allclose(got.numpy().reshape(-1), want, atol=1e-5, rtol=1e-5)
    if normalize and generations == 16:
        assert np.abs(want).max() > 0.5  # the test sees real, normalized advantages


def test_leave_one_out_values_by_hand():
    # 4 generations, rewards 1 0 0 0: the first's baseline is 0, the others' 1/3.
    adv = grpo.group_advantages([[1.0, 0.0, 0.0, 0.0]], normalize=False).numpy()
    np.testing.assert_allclose(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3]], atol=1e-6)


def test_group_of_one_is_an_error():
    with pytest.raises(ConfigError, match="num_generations_per_prompt"):
        grpo.group_advantages([[1.0], [0.0]])


def _rollouts(seed, rollouts=6, length=7, spread=1e-3):
    rng = np.random.default_rng(seed)
    curr = -rng.uniform(0.1, 3.0, size=(rollouts, length))
    gen = curr + rng.normal(0.0, spread, size=curr.shape)
    token_mask = (rng.uniform(size=curr.shape) > 0.3).astype(np.float64)
    token_mask[:, 0] = 1.0
    sample_mask = np.ones(rollouts)
    sample_mask[-1] = 0.0
    adv = rng.normal(size=rollouts)
    return curr, gen, adv, token_mask, sample_mask


@pytest.mark.parametrize("tis", ["seq-mask-tis", "tis", "icepop", ""])
def test_forced_on_policy_loss_matches_nemo_rl(tis):
    curr, gen, adv, token_mask, sample_mask = _rollouts(2, rollouts=12, spread=4e-3)
    config = grpo.PolicyLossConfig(truncated_importance_sampling_type=tis)
    loss, metrics = grpo.clipped_policy_loss(curr, gen, adv, token_mask, sample_mask, config=config)
    want = np_clipped_pg_loss(curr, gen, adv, token_mask, sample_mask, tis=tis)
    np.testing.assert_allclose(loss.numpy(), want, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(metrics["probs_ratio"].numpy(), 1.0, atol=1e-6)


def test_seq_mask_tis_drops_whole_rollouts():
    curr, gen, adv, token_mask, sample_mask = _rollouts(2, rollouts=12, spread=4e-3)
    config = grpo.PolicyLossConfig()
    _, metrics = grpo.clipped_policy_loss(curr, gen, adv, token_mask, sample_mask, config=config)
    oob = metrics["is_oob_ratio"].numpy()
    assert 0.0 < oob < 1.0, oob  # some rollouts kept, some masked: both branches seen
    log_ratio = curr - gen
    geo = np.exp(np_masked_mean(log_ratio, token_mask, axis=-1))
    dropped = ~((geo >= 0.999) & (geo <= 1.002))
    np.testing.assert_allclose(oob, (dropped * sample_mask).sum() / sample_mask.sum(), atol=1e-6)


def test_clipped_ratio_loss_matches_nemo_rl():
    curr, gen, adv, token_mask, sample_mask = _rollouts(3)
    prev = curr + np.random.default_rng(4).normal(0.0, 0.3, size=curr.shape)  # ratios clip
    config = grpo.PolicyLossConfig(force_on_policy_ratio=False)
    loss, _ = grpo.clipped_policy_loss(
        curr, gen, adv, token_mask, sample_mask, config=config, prev_logprobs=prev
    )
    want = np_clipped_pg_loss(curr, gen, adv, token_mask, sample_mask, prev=prev, force=False)
    np.testing.assert_allclose(loss.numpy(), want, atol=1e-6, rtol=1e-5)


def test_forced_ratio_gradient_is_the_policy_gradient():
    """With the ratio forced to 1 and IS weights off, d loss / d logp_t = -A m_t / N."""
    curr, gen, adv, token_mask, sample_mask = _rollouts(5)
    config = grpo.PolicyLossConfig(
        truncated_importance_sampling_type="", use_importance_sampling_correction=False
    )
    x = tf.Variable(curr, dtype=tf.float32)
    with tf.GradientTape() as tape:
        loss, _ = grpo.clipped_policy_loss(x, gen, adv, token_mask, sample_mask, config=config)
    mask = token_mask * sample_mask[:, None]
    want = -adv[:, None] * mask / mask.sum()
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), want, atol=1e-6)


def test_logprob_error_mask_matches_nemo_rl():
    curr, gen, _, token_mask, sample_mask = _rollouts(6, spread=0.8)
    want = np_seq_error_mask(gen, curr, token_mask, sample_mask, 2.0)
    got = grpo.logprob_error_mask(gen, curr, token_mask, sample_mask, 2.0).numpy()
    assert 0 < want.sum() < sample_mask.sum()  # the threshold binds for some rollouts only
    np.testing.assert_array_equal(got, want)


def test_overlong_filter():
    got = grpo.overlong_filter([1.0, 1.0, 0.0, 1.0], [False, True, True, False]).numpy()
    np.testing.assert_array_equal(got, [1.0, 0.0, 0.0, 1.0])


def test_pass_at_k():
    rewards = np.array([[0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0.0, 0, 0, 0]])
    np.testing.assert_allclose(grpo.pass_at_k(rewards).numpy(), 0.5, atol=0)


def test_token_logprobs():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(2, 3, 5))
    tokens = rng.integers(0, 5, size=(2, 3))
    logp = logits / 0.5 - np.log(np.exp(logits / 0.5).sum(-1, keepdims=True))
    want = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
    got = grpo.token_logprobs(tf.constant(logits), tf.constant(tokens), temperature=0.5)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


@pytest.mark.parametrize(
    "field,value",
    [("ratio_clip_min", 1.5), ("reference_policy_kl_penalty", 0.1),
     ("truncated_importance_sampling_type", "bogus"),
     ("truncated_importance_sampling_ratio_min", 2.0)],
)  # fmt: skip
def test_bad_loss_settings_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        grpo.PolicyLossConfig(**{field: value})
