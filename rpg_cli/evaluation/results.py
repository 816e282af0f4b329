"""An evaluation's results: the accuracy@k rows computed from one checkpoint's scored samples, and the
`EvalResult` that the job and `rpg eval` print. Shared by the job's loop (pipeline.py, from the files)
and the store side (recording.py, from the stored samples), so both say the same thing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rpg_cli.evaluation.metrics import maj_at_k, mean_at_k, pass_at_k_curve, std_at_k

METRICS = ("mean@k", "pass@k", "maj@k", "std@k")


@dataclass(frozen=True)
class EvalResult:
    run: str  # run name
    step: int
    benchmark: str
    k: int
    scorer: str
    values: dict[str, float | None]  # "mean@k" -> value, "pass@1" .. "pass@k", "maj@k", "std@k"


def compute_metrics(samples: Sequence[Sequence[tuple[str | None, bool]]]) -> list[tuple[str, int, float]]:
    """(metric, k, value) for n samples per problem: mean@n, pass@k for k = 1, 2, 4, ..., n, maj@n, std@n."""
    correct = [[c for _, c in problem] for problem in samples]
    answers = [[a for a, _ in problem] for problem in samples]
    n = len(correct[0])
    rows = [("mean@k", n, mean_at_k(correct))]
    rows += [("pass@k", k, value) for k, value in pass_at_k_curve(n, [sum(c) for c in correct]).items()]
    rows += [("maj@k", n, maj_at_k(answers, correct)), ("std@k", n, std_at_k(correct))]
    return rows


def result_values(rows: Sequence[tuple[str, int, float | None]], n: int) -> dict[str, float | None]:
    """(metric, k, value) rows as an EvalResult's values: pass@1 .. pass@n, and mean/maj/std at k = n."""
    values: dict[str, float | None] = {}
    for metric, k, value in rows:
        if metric == "pass@k" and k <= n:
            values[f"pass@{k}"] = value
        elif metric != "pass@k" and k == n:
            values[metric] = value
    return values
