"""Reward arithmetic of every mode against values computed by hand.

Weights chosen unequal so a swapped weight shows: binary_weight 0.6, progress_weight 0.4,
vlm_reward_scale 0.5, confidence c = 0.8, progress p = 0.7.
"""

from __future__ import annotations

import pytest

from mmpipe.reward import ActionVerdict, ProgressEstimate, RewardConfig, combine

W = dict(binary_weight=0.6, progress_weight=0.4, vlm_reward_scale=0.5)

# (reasonable, prev_progress, mode) -> (action term, progress term, vlm_reward, reward), by hand:
#   vlm_reward = 0.6 * action + 0.4 * progress_term;  reward = 0.5 * vlm_reward
HAND = [
    # reasonable, progress rose 0.4 -> 0.7 (d = +0.3)
    (True, 0.4, "bonus_only", 0.8, 0.3, 0.60, 0.30),     # 0.48 + 0.12
    (True, 0.4, "symmetric", 0.8, 0.3, 0.60, 0.30),
    (True, 0.4, "penalty_only", 0.0, 0.0, 0.0, 0.0),     # no bonus, min(0, +0.3) = 0
    # unreasonable, progress fell 0.9 -> 0.7 (d = -0.2)
    (False, 0.9, "bonus_only", 0.0, 0.0, 0.0, 0.0),      # no penalty, max(0, -0.2) = 0
    (False, 0.9, "symmetric", -0.8, -0.2, -0.56, -0.28),  # -0.48 - 0.08
    (False, 0.9, "penalty_only", -0.8, -0.2, -0.56, -0.28),
    # unreasonable, progress rose 0.4 -> 0.7
    (False, 0.4, "bonus_only", 0.0, 0.3, 0.12, 0.06),
    (False, 0.4, "symmetric", -0.8, 0.3, -0.36, -0.18),   # -0.48 + 0.12
    (False, 0.4, "penalty_only", -0.8, 0.0, -0.48, -0.24),
    # reasonable, progress fell 0.9 -> 0.7
    (True, 0.9, "bonus_only", 0.8, 0.0, 0.48, 0.24),
    (True, 0.9, "symmetric", 0.8, -0.2, 0.40, 0.20),      # 0.48 - 0.08
    (True, 0.9, "penalty_only", 0.0, -0.2, -0.08, -0.04),
    # first evaluated frame of an episode: no previous progress, progress term 0
    (True, None, "bonus_only", 0.8, 0.0, 0.48, 0.24),
    (False, None, "symmetric", -0.8, 0.0, -0.48, -0.24),
    (True, None, "penalty_only", 0.0, 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("reasonable, prev, mode, action, term, vlm, reward", HAND)
def test_modes_by_hand(reasonable, prev, mode, action, term, vlm, reward):
    parts = combine(ActionVerdict(reasonable, 0.8), ProgressEstimate(0.7), prev, RewardConfig(mode=mode, **W))
    assert parts.binary == pytest.approx(action, abs=1e-12)
    assert parts.progress_term == pytest.approx(term, abs=1e-12)
    assert parts.vlm_reward == pytest.approx(vlm, abs=1e-12)
    assert parts.reward == pytest.approx(reward, abs=1e-12)
    assert parts.confidence == 0.8 and parts.baseline == 0.7


@pytest.mark.parametrize("mode", ["bonus_only", "symmetric", "penalty_only"])
def test_potential_term_by_hand(mode):
    cfg = RewardConfig(mode=mode, progress_term="potential", gamma=0.9, **W)
    action = {"bonus_only": 0.8, "symmetric": 0.8, "penalty_only": 0.0}[mode]
    # rise 0.4 -> 0.7: 0.9 * 0.7 - 0.4 = 0.23;  fall 0.9 -> 0.7: 0.63 - 0.9 = -0.27, unclipped in every mode
    for prev, term in ((0.4, 0.23), (0.9, -0.27)):
        parts = combine(ActionVerdict(True, 0.8), ProgressEstimate(0.7), prev, cfg)
        assert parts.progress_term == pytest.approx(term, abs=1e-12)
        assert parts.reward == pytest.approx(0.5 * (0.6 * action + 0.4 * term), abs=1e-12)


def test_potential_term_cannot_be_farmed():
    cycle = [0.3, 0.6, 0.3, 0.6, 0.3, 0.6, 0.3]  # progress oscillates and ends where it began

    def episode_sum(cfg):
        total, baseline = 0.0, None
        for p in cycle:
            parts = combine(None, ProgressEstimate(p), baseline, cfg)
            total, baseline = total + parts.progress_term, parts.baseline
        return total

    # The design's clipped delta pays every rise: 3 * 0.3.
    assert episode_sum(RewardConfig(mode="bonus_only")) == pytest.approx(0.9)
    # Potential-based (gamma 1): the terms telescope to p_last - p_first = 0.
    assert episode_sum(RewardConfig(mode="bonus_only", progress_term="potential", gamma=1.0)) == pytest.approx(0.0)


def test_invalid_parts_are_neutral():
    cfg = RewardConfig(mode="symmetric", **W)
    no_action = combine(None, ProgressEstimate(0.7), 0.4, cfg)
    assert (no_action.binary, no_action.confidence) == (0.0, None)
    assert no_action.reward == pytest.approx(0.5 * 0.4 * 0.3)
    no_progress = combine(ActionVerdict(False, 0.8), None, 0.4, cfg)
    assert no_progress.progress_term == 0.0 and no_progress.baseline == 0.4  # baseline kept for the next frame
    assert no_progress.reward == pytest.approx(0.5 * 0.6 * -0.8)
    nothing = combine(None, None, 0.4, cfg)
    assert (nothing.reward, nothing.vlm_reward, nothing.baseline) == (0.0, 0.0, 0.4)


def test_confidence_from_logprobs():
    cfg = RewardConfig(mode="symmetric", confidence="logprobs", **W)
    # c is the probability of the verdict given: P(true) for "reasonable", 1 - P(true) otherwise.
    assert combine(ActionVerdict(True, 0.8, p_true=0.6), None, None, cfg).binary == pytest.approx(0.6)
    assert combine(ActionVerdict(False, 0.8, p_true=0.6), None, None, cfg).binary == pytest.approx(-0.4)
    # No logprobs from the server: the stated confidence.
    assert combine(ActionVerdict(True, 0.8), None, None, cfg).binary == pytest.approx(0.8)


def test_defaults_are_the_designs():
    cfg = RewardConfig()
    assert (cfg.mode, cfg.binary_weight, cfg.progress_weight, cfg.vlm_reward_scale, cfg.progress_term) == (
        "bonus_only", 0.5, 0.5, 0.5, "delta")


@pytest.mark.parametrize("kwargs, needle", [
    ({"mode": "bonus"}, "RewardConfig.mode"),
    ({"progress_term": "diff"}, "RewardConfig.progress_term"),
    ({"confidence": "tokens"}, "RewardConfig.confidence"),
    ({"gamma": 1.5}, "RewardConfig.gamma"),
])
def test_config_errors_name_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        RewardConfig(**kwargs)
