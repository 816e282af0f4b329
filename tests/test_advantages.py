"""Advantage estimators against hand-computed cases (MATH.md section 4)."""

from __future__ import annotations

import statistics

import pytest
import torch

from rpg_cli.algorithms import advantages as A

F64 = torch.float64


def test_grpo_advantage_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=F64)
    groups = ["a", "a", "a", "a", "b", "b"]
    adv = A.grpo_advantage(scores, groups)
    std_a = statistics.stdev([1, 0, 0, 1])  # unbiased
    std_b = statistics.stdev([1, 0])
    expected = [
        0.5 / (std_a + 1e-6),
        -0.5 / (std_a + 1e-6),
        -0.5 / (std_a + 1e-6),
        0.5 / (std_a + 1e-6),
        0.5 / (std_b + 1e-6),
        -0.5 / (std_b + 1e-6),
    ]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12)


def test_group_ids_as_tensor_or_list_agree():
    scores = torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0])
    as_list = A.grpo_advantage(scores, [7, 9, 7, 9, 9])
    as_tensor = A.grpo_advantage(scores, torch.tensor([7, 9, 7, 9, 9]))
    assert torch.equal(as_list, as_tensor)
    assert as_list[0] > 0 > as_list[2]


def test_degenerate_groups_get_zero_advantage():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.5])
    adv = A.grpo_advantage(scores, [0, 0, 0, 1])  # all-equal group, and a singleton
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert A.rpg_advantage(scores, [0, 0, 0, 1]).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_rpg_and_batch_mean_advantages():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = ["a", "a", "a", "b", "b", "b"]
    assert A.rpg_advantage(scores, groups).tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0, 0, 0])
    assert A.batch_mean_advantage(scores).tolist() == pytest.approx([1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_rloo_advantage_by_hand():
    """R_i minus the mean of the other rewards of its group; a group of one gets 0 (MATH.md section 9.2)."""
    scores = torch.tensor([1.0, 0.0, 0.5, 3.0, 2.0, 7.0], dtype=F64)
    groups = ["a", "b", "a", "a", "b", "c"]
    expected = [1 - (0.5 + 3) / 2, 0 - 2, 0.5 - (1 + 3) / 2, 3 - (1 + 0.5) / 2, 2 - 0, 0.0]
    assert A.rloo_advantage(scores, groups).tolist() == pytest.approx(expected, abs=1e-12)
    # n/(n-1) times the group-mean advantage, and zero-sum within each group
    rpg = A.rpg_advantage(scores, groups)
    assert A.rloo_advantage(scores, groups)[:5].tolist() == pytest.approx(
        (rpg[:5] * torch.tensor([1.5, 2, 1.5, 1.5, 2])).tolist()
    )
    assert A.rloo_advantage(scores, groups)[[0, 2, 3]].sum().item() == pytest.approx(0, abs=1e-12)


def whiten_by_hand(values):
    mean, var = statistics.mean(values), statistics.variance(values)
    return [(v - mean) / (var + 1e-8) ** 0.5 for v in values]


def test_reinforce_pp_by_hand():
    """Token reward -beta * (old - ref), plus R at the last valid token; returns summed to the end; whitened."""
    scores = torch.tensor([1.0, 0.0], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, float("nan")]], dtype=F64)
    ref = torch.tensor([[-1.1, -2.2, -3.3], [-1.5, -1.5, 0.0]], dtype=F64)  # k1 = old - ref
    beta = 0.1
    returns = A.reinforce_pp_returns(scores, mask, old, ref, beta)
    row0 = [1 - 0.01 - 0.02 - 0.03, 1 - 0.02 - 0.03, 1 - 0.03]
    row1 = [-0.05 - 0.05, -0.05]
    assert returns[0].tolist() == pytest.approx(row0)
    assert returns[1, :2].tolist() == pytest.approx(row1) and returns[1, 2] == 0
    adv = A.reinforce_pp_advantage(scores, mask, old, ref, beta)
    expected = whiten_by_hand(row0 + row1)
    assert adv[mask].tolist() == pytest.approx(expected, abs=1e-9)
    assert adv[1, 2] == 0


def test_reinforce_pp_without_kl_gives_every_token_the_return():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    returns = A.reinforce_pp_returns(torch.tensor([2.0, -1.0]), mask)
    assert returns.tolist() == [[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]]
    with pytest.raises(ValueError, match="needs old_log_prob and ref_log_prob"):
        A.reinforce_pp_returns(torch.tensor([2.0, -1.0]), mask, beta=0.1)


def test_reinforce_pp_baseline_by_hand():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=F64)
    groups = ["p", "p", "q", "q"]
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]], dtype=torch.bool)
    adv = A.reinforce_pp_baseline_advantage(scores, groups, mask)
    token_values = [0.5, 0.5, -0.5, 0.0, 0.0, 0.0]
    assert adv[mask].tolist() == pytest.approx(whiten_by_hand(token_values), abs=1e-9)


def test_dynamic_sampling_keeps_groups_with_signal_and_groups_of_one():
    # the paper's fork keeps `std > 0 or size == 1`: a lone response ("d") stays, uniform groups go
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    keep = A.dynamic_sampling_keep(scores, ["a", "a", "b", "b", "c", "c", "d"])
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert A.dynamic_sampling_keep(torch.tensor([0.0, 1.0]), [0, 1]).tolist() == [True, True]  # rollout_n = 1


def test_reward_kl_penalty_is_k1_on_valid_tokens_and_feeds_the_returns():
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, float("nan")]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    assert A.reward_kl_penalty(old, ref, mask).tolist() == [[0.5, -1.0, 0.0]]
    returns = A.reinforce_pp_returns(torch.tensor([1.0], dtype=F64), mask, old, ref, beta=0.1)
    assert returns[0].tolist() == pytest.approx([1.0 - 0.1 * (0.5 - 1.0), 1.0 - 0.1 * -1.0, 0.0])


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([50, 80, 90, 100])
    assert A.overlong_penalty(lengths, max_response_length=100, buffer=20).tolist() == pytest.approx([0, 0, -0.5, -1])
    assert A.overlong_penalty(lengths, 100, 20, penalty_factor=2.0).tolist() == pytest.approx([0, 0, -1, -2])
    with pytest.raises(ValueError, match="overlong buffer"):
        A.overlong_penalty(lengths, 100, 0)


def test_to_tokens_and_whiten_guards():
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    assert A.to_tokens(torch.tensor([2.0, 3.0]), mask).tolist() == [[2.0, 0.0], [3.0, 3.0]]
    with pytest.raises(ValueError, match="at least two valid tokens"):
        A.masked_whiten(torch.ones(1, 2), torch.tensor([[1, 0]], dtype=torch.bool))
    with pytest.raises(ValueError, match="group_ids has 2 entries, expected 3"):
        A.grpo_advantage(torch.zeros(3), [0, 1])
