"""Answer scoring shared by training rewards and `rpg eval`, so both judge a response alike.

Scorers (every one returns {"score": +1.0 or -1.0, "acc": bool, "pred": extracted answer or None}):
  dapo         the paper's "Answer:" rule (rewards.dapo): verl `math_dapo` verdicts, in-process and fast.
  math_verify  HF math-verify, symbolic equivalence (`0.5` == `\\frac{1}{2}`), run in worker processes
               with a per-item timeout (rewards.math_verify_pool).

Which scorer judges a benchmark is decided in one place, `rpg_cli.benchmarks.SCORER_BY_BENCHMARK` (the
paper's choices), overridable per spec (`scorers:`) or per `rpg eval` (`--scorer`).

`compute_score` is verl's custom reward function entry:
  custom_reward_function.path=pkg://rpg_cli.rewards  custom_reward_function.name=compute_score
  (reward_kwargs: scorers, scorer, timeout, workers).
Importing this package is cheap: math-verify is only imported inside its worker processes.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rpg_cli.benchmarks import SCORERS, scorer_for
from rpg_cli.rewards.dapo import score_dapo

if TYPE_CHECKING:
    from rpg_cli.rewards.math_verify_pool import MathVerifyPool

DEFAULT_SCORER = "dapo"
DEFAULT_TIMEOUT_S = 5.0  # per item, math_verify only
DEFAULT_WORKERS = 2
DAPO_RULE_VERSION = "1"  # bump when the dapo rule's verdicts change
# bump when what rpg hands math-verify changes (2: the Answer: line boxed, so "1, 2" is the set {1, 2})
MATH_VERIFY_WRAP_VERSION = "2"

_pools: dict[int, MathVerifyPool] = {}
_pools_lock = threading.Lock()


def _check_scorer(scorer: str) -> None:
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose one of: {', '.join(SCORERS)}")


def shared_pool(workers: int = DEFAULT_WORKERS) -> MathVerifyPool:
    """The process-wide pool with `workers` processes, started on first use and reused after."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            from rpg_cli.rewards.math_verify_pool import MathVerifyPool

            pool = _pools[workers] = MathVerifyPool(workers=workers, timeout=DEFAULT_TIMEOUT_S)
            atexit.register(pool.close)
        return pool


def score(solution: str, ground_truth: str, scorer: str = DEFAULT_SCORER) -> dict:
    """Judge one response against its ground truth with the named scorer."""
    _check_scorer(scorer)
    if scorer == "dapo":
        return score_dapo(solution, ground_truth)
    return shared_pool().score_one(solution, ground_truth)


def score_batch(
    solutions: Sequence[str],
    ground_truths: Sequence[str],
    scorer: str = DEFAULT_SCORER,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = DEFAULT_WORKERS,
) -> list[dict]:
    """Judge pairs in order; math_verify spreads them over `workers` processes, `timeout` s per item."""
    _check_scorer(scorer)
    if len(solutions) != len(ground_truths):
        raise ValueError(f"{len(solutions)} solutions but {len(ground_truths)} ground truths")
    if scorer == "dapo":
        return [score_dapo(s, g) for s, g in zip(solutions, ground_truths)]
    return shared_pool(workers).score_many(solutions, ground_truths, timeout=timeout)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    scorer: str | None = None,
    scorers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    workers: int = DEFAULT_WORKERS,
    **kwargs: Any,
) -> dict:
    """verl's custom reward function: {"score", "acc", "pred"} for one rollout.

    The scorer is `scorer` when given (every source), else the spec's `scorers` override of the source's
    benchmark, else the table's (`rpg_cli.benchmarks.scorer_for`); a source with none fails loudly
    instead of being scored by a guessed rule. Other keyword arguments verl passes are accepted and
    ignored. `pred` is "" rather than None because verl skips its maj@N metric when any pred is None.
    """
    scorer = scorer or scorer_for(data_source, scorers)
    _check_scorer(scorer)
    if scorer == "dapo":
        result = score_dapo(solution_str, ground_truth)
    else:
        result = shared_pool(workers).score_one(solution_str, ground_truth, timeout=timeout)
    if result["pred"] is None:
        result["pred"] = ""
    return result


def scorer_version(scorer: str) -> str:
    """A label stored with every evaluation so that scores from different rules are never mixed."""
    _check_scorer(scorer)
    if scorer == "dapo":
        return f"dapo-{DAPO_RULE_VERSION}"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"math-verify-{version('math-verify')}+rpg{MATH_VERIFY_WRAP_VERSION}"
    except PackageNotFoundError:
        return "math-verify-missing"


__all__ = [
    "DEFAULT_SCORER",
    "SCORERS",
    "compute_score",
    "shared_pool",
    "score",
    "score_batch",
    "scorer_version",
]
