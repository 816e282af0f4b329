"""Every algorithm rpg runs, one entry each: the spec fields it takes, its defaults and their sources, its
advantage estimator and policy loss, and what it becomes on verl (MATH.md sections 4 and 9).

Spec validation (`spec/models.py`) and the sweep's collapsing of axes (`spec/sweep.py`) read `applies` and
`NEUTRAL`; both backends read `loss_name`, `advantage`, `beta_in` and `verl_loss`; the report reads
`method_name`. Adding an algorithm is one `Algorithm(...)` line in `ALGORITHMS`, its loss function in
`losses.py` (its name in `LOSS_NAMES`) and its exactness test (ARCHITECTURE.md, "Recipes").

Plain data, no torch and nothing else of the project but `defaults`: `rpg sweep --dry-run` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rpg_cli.algorithms import defaults as d

KL_VARIANTS = ("fkl", "rkl", "ufkl", "urkl")

# Fields only some algorithms take, each with the value that means "not used": a spec that sets one where it
# does not apply is refused (one line naming this value), and a sweep axis over it collapses to it for the
# algorithms that do not take it (a kl axis crossed with grpo is one grpo run, not four).
NEUTRAL: dict[str, Any] = {
    "kl": "none",
    "beta": 0.0,
    "reference": "iterative",
    "kl_loss": None,
    "kl_correction": False,
    "kl_clamp": True,
    "clip.c": d.CLIP_C,
    "clip.clipped_weight_in_sg": False,
    "sapo": None,
    "loss": None,
    "loss_settings": {},
    "advantage": None,
}

# rpg's advantage estimators (`rpg_cli.algorithms.advantages`, MATH.md section 4) -> verl 0.9.1's
# (`algorithm.adv_estimator`, `algorithm.norm_adv_by_std_in_grpo`)
ADVANTAGES: dict[str, tuple[str, bool]] = {
    "grpo": ("grpo", True),  # group mean and std
    "rpg": ("grpo", False),  # group mean only (the paper's RPG runs; Dr. GRPO's)
    "reinforce_pp": ("reinforce_plus_plus", True),
    "reinforce_pp_baseline": ("reinforce_plus_plus_baseline", True),
    # leave-one-out group mean; verl's vectorized one gives a group of one advantage 0, as rpg does (its `rloo`: R)
    "rloo": ("rloo_vectorized", True),
}

# what `beta` weighs: a KL term inside the policy loss, or a k1 penalty folded into the reward
BetaIn = Literal["loss", "reward"]
ClipRule = Literal["required", "optional", "none"]

_SEQ_MEAN = "seq-mean-token-mean"
_KL_TERM = frozenset({"beta", "reference"})
_KL_LOSS = frozenset({"kl_loss", "reference"})  # a PPO-family loss without a KL term of its own


@dataclass(frozen=True)
class Algorithm:
    """One algorithm. `loss` and `display` may hold `{kl}`, the spec's KL variant (rpg, rpg_reinforce)."""

    name: str  # the spec's `algorithm`
    display: str  # the report's method name
    summary: str  # what it computes, exactly (docs, `rpg sweep --help`, the report's footnotes)
    loss: str  # the `policy_loss` name (`rpg_cli.algorithms.losses.LOSS_NAMES`)
    advantage: str  # a key of ADVANTAGES
    applies: frozenset[str] = frozenset()  # keys of NEUTRAL this algorithm takes
    clip: ClipRule = "required"
    beta_in: BetaIn | None = None  # None: the algorithm has no beta
    defaults: dict[str, Any] = field(default_factory=dict)  # spec values where a spec gives none
    sources: dict[str, str] = field(default_factory=dict)  # where each default comes from
    verl_loss: str | None = None  # verl 0.9.1's own registered policy loss, used on verl; None: rpg's plugin
    # the one loss_agg_mode the algorithm allows, where verl's function fixes its own aggregation; None: any
    fixed_agg: str | None = None

    def takes(self, path: str) -> bool:
        """Whether `path` (a NEUTRAL key) applies to this algorithm."""
        return path in self.applies

    def loss_name(self, kl: str = "none") -> str:
        return self.loss.format(kl=kl)

    def method_name(self, spec: Mapping[str, Any]) -> str:
        """The report's name of this algorithm as `spec` (a canonical spec dict) runs it."""
        loss = str(spec.get("loss") or "?")
        return self.display.format(kl=str(spec.get("kl", "")).upper(), loss=loss.rpartition(":")[2])


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        # ---- the paper's (MATH.md sections 1-4)
        Algorithm(
            "grpo",
            "GRPO",
            "dual-clip PPO on group-normalised advantages + beta * k3(pi_ref/pi_theta), not importance-weighted "
            "(kl_correction: weighted by w); clamped as verl's low_var_kl unless kl_clamp is false",
            "grpo",
            "grpo",
            _KL_TERM | {"kl_correction", "kl_clamp", "clip.c"},
            beta_in="loss",
        ),
        Algorithm(
            "dapo",
            "DAPO",
            "dual-clip PPO (clip-higher) on group-normalised advantages, no KL; dynamic sampling and overlong "
            "shaping on by default",
            "ppo",
            "grpo",
            frozenset({"clip.c"}),
            defaults={"dynamic_sampling": {}, "overlong": {}},
            sources={"dynamic_sampling": "DAPO (arXiv 2503.14476), section 3.2", "overlong": "DAPO, section 3.4"},
        ),
        Algorithm(
            "reinforce_pp",
            "REINFORCE++",
            "dual-clip PPO on REINFORCE++ returns, whitened over the batch; beta: k1 penalty in the reward",
            "ppo",
            "reinforce_pp",
            _KL_TERM | _KL_LOSS | {"clip.c"},
            beta_in="reward",
        ),
        Algorithm(
            "reinforce_pp_baseline",
            "REINFORCE++-Baseline",
            "dual-clip PPO on the group-mean-subtracted reward, whitened over the batch; beta: k1 in the reward",
            "ppo",
            "reinforce_pp_baseline",
            _KL_TERM | _KL_LOSS | {"clip.c"},
            beta_in="reward",
        ),
        Algorithm(
            "rpg",
            "RPG-{kl}",
            "fully differentiable RPG loss -w A + beta D_{kl} with RPG-Style Clip (paper Algorithm 1)",
            "rpg_{kl}",
            "rpg",
            _KL_TERM | {"kl", "clip.c"},
            clip="optional",
            beta_in="loss",
        ),
        Algorithm(
            "rpg_reinforce",
            "RPG-REINFORCE-{kl}",
            "REINFORCE-style RPG loss -SG(w A + beta C_{kl}) log pi_theta with RPG-Style Clip (Algorithm 2)",
            "rpg_reinforce_{kl}",
            "rpg",
            _KL_TERM | {"kl", "clip.c", "clip.clipped_weight_in_sg"},
            clip="optional",
            beta_in="loss",
        ),
        # ---- today's baselines (MATH.md section 9)
        Algorithm(
            "dr_grpo",
            "Dr. GRPO",
            "dual-clip PPO on group-mean-subtracted advantages (no std), token sums over a constant length "
            "(seq-mean-token-sum-norm), no KL",
            "ppo",
            "rpg",
            _KL_LOSS | {"clip.c"},
            defaults={"loss_agg_mode": "seq-mean-token-sum-norm"},
            sources={"loss_agg_mode": "Dr. GRPO (arXiv 2503.20783), section 3.2; verl's docs, algo/grpo.md"},
        ),
        Algorithm(
            "rloo",
            "RLOO",
            "dual-clip PPO on leave-one-out group baselines; beta: k1 penalty in the reward",
            "ppo",
            "rloo",
            _KL_TERM | _KL_LOSS | {"clip.c"},
            beta_in="reward",
        ),
        Algorithm(
            "gspo",
            "GSPO",
            "PPO clip on the sequence-level ratio (geometric mean of token ratios), sequence-mean aggregation",
            "gspo",
            "grpo",
            _KL_LOSS,
            defaults={
                "clip": {"eps_low": d.GSPO_EPS_LOW, "eps_high": d.GSPO_EPS_HIGH},
                "loss_agg_mode": "seq-mean-token-mean",
            },
            sources={"clip": d.SOURCES["gspo.clip"], "loss_agg_mode": d.SOURCES["gspo.loss_agg_mode"]},
            verl_loss="gspo",
        ),
        Algorithm(
            "cispo",
            "CISPO",
            "-SG(clip(w)) A log pi_theta: every token keeps its gradient, the clipped weight inside the stop-gradient",
            "cispo",
            "grpo",
            _KL_LOSS,
            defaults={"clip": {"eps_low": d.CISPO_EPS_LOW, "eps_high": d.CISPO_EPS_HIGH}},
            sources={"clip": d.SOURCES["cispo.clip"], "loss_agg_mode": d.SOURCES["cispo.loss_agg_mode"]},
            verl_loss="cispo",
        ),
        Algorithm(
            "gmpo",
            "GMPO",
            "-A x geometric mean over the sequence of token ratios clipped in log space, sequences averaged",
            "gmpo",
            "grpo",
            _KL_LOSS,
            defaults={"clip": {"eps_low": d.GMPO_LOG_CLIP, "eps_high": d.GMPO_LOG_CLIP}, "loss_agg_mode": _SEQ_MEAN},
            sources={"clip": d.SOURCES["gmpo.clip"], "loss_agg_mode": d.SOURCES["gmpo.loss_agg_mode"]},
            # not verl's geo_mean: it averages each micro-batch's sequences with no global-batch scaling, so its
            # gradient grows with the number of micro-batches; rpg's gmpo (the plugin) is verl's on one micro-batch
            verl_loss=None,
        ),
        Algorithm(
            "sapo",
            "SAPO",
            "-A x a sigmoid gate of w (temperatures tau_pos, tau_neg) in place of the clip, sequence-mean",
            "sapo",
            "grpo",
            _KL_LOSS | {"sapo"},
            clip="none",
            defaults={"clip": None, "sapo": {}, "loss_agg_mode": _SEQ_MEAN},
            sources={"sapo": d.SOURCES["sapo.tau"], "loss_agg_mode": d.SOURCES["sapo.loss_agg_mode"]},
            verl_loss="sapo",
            fixed_agg=_SEQ_MEAN,  # verl's sapo aggregates so whatever the mode
        ),
        # ---- a researcher's own (MATH.md section 11)
        Algorithm(
            "custom",
            "{loss}",
            "the spec's `loss` function (package.module:function) per token, aggregated by loss_agg_mode",
            "custom",
            "grpo",
            frozenset({"reference", "loss", "loss_settings", "advantage"}),  # a KL term is the function's own
            clip="none",
            defaults={"clip": None, "advantage": "grpo"},
        ),
    )
}

ALGORITHM_NAMES = tuple(ALGORITHMS)


def algorithm(name: str) -> Algorithm:
    """The table's entry for `name`; a KeyError names the allowed ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}") from None
