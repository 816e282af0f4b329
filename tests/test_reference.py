"""The iterative reference: the `reference` spec field, its reset schedule (`ReferenceTracker`, shared by both
backends) and the KL it tracks (`reference_kl`)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import spec_dict

from rpg_cli.algorithms.kl import reference_kl
from rpg_cli.spec import DEFAULT_KL_EMA, Every, ExperimentSpec, ReferenceTracker, SpecError, load_sweep
from rpg_cli.spec.errors import _validate


def spec_with(reference) -> ExperimentSpec:
    return _validate(ExperimentSpec, spec_dict(reference=reference))


# ---------------------------------------------------------------- the spec field


@pytest.mark.parametrize(
    "reference, canonical",
    [
        ("iterative", "iterative"),
        ("frozen", "frozen"),
        ({"every": 5}, {"every": 5}),  # as before the KL target existed: the run ids of every-K runs are unchanged
        ({"kl_target": 0.05}, {"kl_target": 0.05, "ema": DEFAULT_KL_EMA}),  # the average's weight is spelled out
        ({"kl_target": 0.05, "ema": 0.3, "every": 20}, {"every": 20, "kl_target": 0.05, "ema": 0.3}),
    ],
)
def test_reference_forms_and_their_canonical_json(reference, canonical):
    spec = spec_with(reference)
    assert spec.canonical()["reference"] == canonical
    assert ExperimentSpec.model_validate_json(spec.canonical_json()) == spec  # spec.json reads back as the same run
    assert spec_with(canonical).run_id == spec.run_id


@pytest.mark.parametrize(
    "reference, message",
    [
        ({"kl_target": -1}, "reference.kl_target: got -1; allowed: > 0"),
        ({"kl_target": 0.1, "ema": 0}, "reference.ema: got 0; allowed: > 0"),
        ({"kl_target": 0.1, "ema": 1.5}, "reference.ema: got 1.5; allowed: <= 1"),
        ({"every": 0}, "reference.every: got 0; allowed: >= 1"),
        ({"every": True}, "reference.every: got True (bool)"),
        (
            {"every": 2, "ema": 0.1},
            "reference: got {'every': 2, 'ema': 0.1}: ema is the KL average's weight; allowed: ema with kl_target",
        ),
        ({}, "reference: got {}; allowed: iterative, frozen, {every: K}, {kl_target: kappa, ema: alpha}"),
        ({"kl": 0.1}, "reference.kl: unknown field; allowed: every, kl_target, ema"),
        ("sometimes", "reference: got 'sometimes'; allowed: iterative, frozen"),
    ],
)
def test_a_bad_reference_names_its_field_in_one_line(reference, message):
    with pytest.raises(SpecError) as caught:
        spec_with(reference)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_sweep_grid_of_references_is_checked_value_by_value(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        json.dumps({"name": "s", "base": spec_dict(), "grid": {"reference": ["frozen", {"kl_target": -0.5}]}})
    )
    with pytest.raises(SpecError, match=r"grid\.reference\[1\]\.kl_target: got -0\.5; allowed: > 0"):
        load_sweep(sweep)
    sweep.write_text(
        json.dumps(
            {
                "name": "s",
                "base": spec_dict(),
                "grid": {"reference": ["iterative", "frozen", {"every": 3}, {"kl_target": 0.1}]},
            }
        )
    )
    assert [s.reference for s in load_sweep(sweep).expand()] == [
        "iterative",
        "frozen",
        Every(every=3),
        Every(kl_target=0.1, ema=DEFAULT_KL_EMA),
    ]


# ---------------------------------------------------------------- the schedule


def schedule(reference, kls: dict[int, float] | None = None, steps: int = 8) -> list[dict[str, float]]:
    """Run the tracker as a trainer does; kls: the KL each step measures (after a reset: 0, as in a trainer)."""
    tracker = ReferenceTracker(spec_with(reference).reference)
    out = []
    for step in range(1, steps + 1):
        reset = tracker.begin_step(step)
        tracker.observe(0.0 if reset or step == 1 else (kls or {}).get(step, 0.0))
        out.append(tracker.metrics(step))
    return out


def column(rows, key):
    return [row[key] for row in rows]


def test_iterative_is_a_reset_every_step_and_frozen_none():
    iterative, frozen = schedule("iterative"), schedule("frozen", {s: 0.1 for s in range(9)})
    assert column(iterative, "ref/resets") == [0, 1, 2, 3, 4, 5, 6, 7]
    assert set(column(iterative, "ref/steps_since_reset")) == {0} and set(column(iterative, "ref/kl")) == {0.0}
    assert set(column(frozen, "ref/resets")) == {0} and column(frozen, "ref/steps_since_reset") == list(range(8))
    # frozen: the average is reported (DEFAULT_KL_EMA) and never resets anything
    assert column(frozen, "ref/kl_ema")[2] == pytest.approx(0.1 * DEFAULT_KL_EMA * (2 - DEFAULT_KL_EMA))


def test_every_k_resets_after_k_steps_with_the_same_reference():
    rows = schedule({"every": 3}, steps=10)
    assert column(rows, "ref/steps_since_reset") == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # resets before steps 4, 7, 10
    assert column(rows, "ref/resets")[-1] == 3


def test_kl_target_resets_the_step_after_the_average_exceeds_it():
    kls = {2: 0.04, 3: 0.04, 4: 0.04, 5: 0.04, 6: 0.04, 7: 0.04, 8: 0.04}
    rows = schedule({"kl_target": 0.05, "ema": 0.5}, kls)
    # ema: 0, .02, .03, .035, .0375, .03875, ... never above 0.05: no reset
    assert set(column(rows, "ref/resets")) == {0}
    assert column(rows, "ref/kl_ema")[3] == pytest.approx(0.035)
    kls = {2: 0.2, 3: 0.2, 4: 0.02, 5: 0.02, 6: 0.02, 7: 0.02, 8: 0.02}
    rows = schedule({"kl_target": 0.05, "ema": 0.5}, kls)
    # step 2: ema 0.1 > 0.05 -> reset before step 3 (the ema restarts from 0); then .01, .015, ... stays below
    assert column(rows, "ref/steps_since_reset") == [0, 1, 0, 1, 2, 3, 4, 5]
    assert column(rows, "ref/kl_ema")[2] == 0.0 and column(rows, "ref/resets")[-1] == 1


def test_every_and_kl_target_whichever_comes_first_and_the_count_restarts():
    kls = {2: 1.0}
    rows = schedule({"kl_target": 0.05, "ema": 1.0, "every": 4}, kls, steps=9)
    # the KL resets before step 3; the K count starts again there: next resets before 7 (3 + 4)
    assert column(rows, "ref/steps_since_reset") == [0, 1, 0, 1, 2, 3, 0, 1, 2]


def test_the_schedule_resumes_exactly_from_its_state():
    kls = {s: 0.03 * s for s in range(1, 13)}
    whole = schedule({"kl_target": 0.1, "ema": 0.3, "every": 5}, kls, steps=12)
    tracker = ReferenceTracker(Every(kl_target=0.1, ema=0.3, every=5))
    for step in range(1, 7):
        tracker.observe(0.0 if tracker.begin_step(step) or step == 1 else kls[step])
    resumed = ReferenceTracker(Every(kl_target=0.1, ema=0.3, every=5))
    resumed.load_state_dict(json.loads(json.dumps(tracker.state_dict())))  # through a checkpoint's JSON
    rows = []
    for step in range(7, 13):
        resumed.observe(0.0 if resumed.begin_step(step) else kls[step])
        rows.append(resumed.metrics(step))
    assert rows == whole[6:] and column(whole, "ref/resets")[-1] >= 2


# ---------------------------------------------------------------- the KL it tracks


def test_reference_kl_is_the_token_mean_of_k3_and_ignores_padding():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, float("-inf")], [-0.5, float("nan"), 0.0]])  # padding may hold anything
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_rho = torch.tensor([-0.5, 1.0, 0.0])
    expected = (log_rho.exp() - 1 - log_rho).mean()
    assert reference_kl(old, ref, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    assert reference_kl(old, old, mask).item() == 0.0
    assert reference_kl(old, ref, torch.zeros_like(mask)).item() == 0.0
    assert reference_kl(old.bfloat16(), ref.bfloat16(), mask).dtype == torch.float32  # bf16 log-probs upcast


def test_reference_kl_estimates_kl_from_the_sampling_policy_to_the_reference():
    g = torch.Generator().manual_seed(0)
    log_old = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    log_ref = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    exact = (log_old.exp() * (log_old - log_ref)).sum()  # KL(pi_old || pi_ref)
    tokens = torch.multinomial(log_old.exp(), 400_000, replacement=True, generator=g).view(400, 1000)
    estimate = reference_kl(log_old[tokens], log_ref[tokens], torch.ones_like(tokens))
    k3 = (log_ref - log_old).exp() - 1 - (log_ref - log_old)
    stderr = ((log_old.exp() * k3.square()).sum() - exact.square()).sqrt() / 400_000**0.5
    assert abs(estimate - exact) < 4 * stderr
